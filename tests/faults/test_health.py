"""/healthz and /readyz turn unhealthy: a stuck work loop, broken watches, a lost lease."""

from __future__ import annotations

import time

from aiohttp.test_utils import TestClient, TestServer
from operator_harness import Env, policy

from gpu_operator.controller import endpoints, health


async def test_broken_watches_make_the_operator_unready(env: Env) -> None:
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    rt = env.operator.runtime
    app = endpoints.health_app(lambda: health.readiness(rt), lambda: health.liveness(rt))
    async with TestClient(TestServer(app)) as http:
        response = await http.get("/readyz")
        assert response.status == 200, await response.text()
        env.sim.faults.add(verb="watch", code=500)
        env.sim.faults.drop_watches()
        nodes = rt.caches.informers["nodes"]
        await env.wait(lambda: nodes.down_since is not None, "the node watch down")
        # Within the grace period a reconnecting watch is no reason to go unready.
        assert health.readiness(rt)[0]
        later = time.monotonic() + health.WATCH_GRACE + 1
        ready, why = health.readiness(rt, now=later)
        assert not ready, why
        assert "nodes" in why, why
        env.sim.faults.clear()
        await env.wait(lambda: nodes.down_since is None, "the node watch back")
        response = await http.get("/readyz")
        assert response.status == 200, await response.text()


async def test_a_stuck_reconcile_fails_liveness(env: Env) -> None:
    env.sim.store.create(policy())
    env.start_operator(stuck_after=0.5)
    await env.wait_ready()
    rt = env.operator.runtime
    app = endpoints.health_app(lambda: health.readiness(rt), lambda: health.liveness(rt))
    async with TestClient(TestServer(app)) as http:
        assert (await http.get("/healthz")).status == 200
        # Every status write now hangs for ten times the stuck limit: the policy's pass cannot
        # finish (and the teardown waits out only this much for the hanging write).
        rule = env.sim.faults.add(
            verb="patch", resource="clusterpolicies.nvidia.com/status", latency=5, error_rate=0
        )
        env.sim.store.patch(
            "clusterpolicies.nvidia.com", "cluster-policy", {"spec": {"gfd": {"enabled": False}}}
        )
        await env.wait(lambda: not health.liveness(rt)[0], "liveness failing")
        response = await http.get("/healthz")
        assert response.status == 503
        assert "stuck" in await response.text()
        assert "policy" in await response.text()
        env.sim.faults.remove(rule)
