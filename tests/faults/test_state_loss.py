"""The API server loses its state (an etcd restore): the operator notices and reconverges."""

from __future__ import annotations

from operator_harness import Env, policy


async def test_etcd_restore_reconverges_without_an_operator_restart(env: Env) -> None:
    env.sim.store.create(policy())
    backup = env.sim.faults.snapshot()  # before the operator wrote anything
    env.start_operator()
    await env.wait_ready()
    written = set(env.daemonsets())
    operator = env.operator
    env.sim.faults.restore_snapshot(backup)
    assert not env.daemonsets()
    assert not env.policy().get("status")
    await env.wait(lambda: set(env.daemonsets()) >= written, "DaemonSets back")
    await env.wait_ready()
    assert env.operators == [operator]
