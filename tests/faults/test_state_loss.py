"""The API server loses its state (an etcd restore): the operator notices and reconverges."""

from __future__ import annotations

import time

from operator_harness import Env, policy


async def test_etcd_restore_reconverges_without_an_operator_restart(env: Env) -> None:
    env.sim.store.create(policy())
    backup = env.sim.faults.snapshot()  # before the operator wrote anything
    env.start_operator()
    await env.wait_ready()
    written = set(env.daemonsets())
    operator = env.operator
    env.sim.faults.restore_snapshot(backup)
    restored = time.monotonic()
    assert not env.daemonsets()
    assert not env.policy().get("status")
    await env.wait(lambda: set(env.daemonsets()) >= written, "DaemonSets back", timeout=10)
    await env.wait_ready(timeout=10)
    assert time.monotonic() - restored < 5.0
    assert env.operators == [operator]
