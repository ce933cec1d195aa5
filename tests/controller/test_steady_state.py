"""The operator's steady state (issue 32): nothing but Lease renewals, one PUT every retry
period (2 s: 30 a minute, NVIDIA's operator's figure), while nothing changes."""

from __future__ import annotations

import asyncio

from operator_harness import Env, policy

LEASE = ("update", "leases.coordination.k8s.io")


async def test_steady_state_sends_only_lease_puts(env: Env) -> None:
    env.sim.store.create(policy())
    operator = env.start_operator(leader_elect=True, identity="steady")
    await env.wait_ready()
    assert operator.elector is not None
    assert operator.elector.is_leader.is_set()
    await env.sim.settle(60)
    await asyncio.sleep(1.0)  # the last status write's window closes
    window = 10.0
    before = env.sim.stats.snapshot()
    await asyncio.sleep(window)
    sent = env.sim.stats.since(before)
    assert set(sent) <= {LEASE}, sent  # no list, no get, no other write
    # One renewal per 2 s retry period (a loaded machine may renew less often, never more).
    assert 1 <= sent.get(LEASE, 0) <= window / 2 + 1, sent
