"""/healthz and /readyz turn unhealthy: a stuck work loop, broken watches, a lost lease."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

import aiohttp
from operator_harness import Env, policy

from gpu_operator import http_endpoint
from gpu_operator.controller import endpoints, health


@contextlib.asynccontextmanager
async def serving(routes: http_endpoint.Respond) -> AsyncIterator[aiohttp.ClientSession]:
    """The routes served as the operator serves them, and a client for them."""
    endpoint = await endpoints.serve(routes, "127.0.0.1:0", "health endpoint")
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{endpoint.port}") as http:
            yield http
    finally:
        await endpoint.aclose()


async def test_broken_watches_make_the_operator_unready(env: Env) -> None:
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    rt = env.operator.runtime
    routes = endpoints.health_routes(lambda: health.readiness(rt), lambda: health.liveness(rt))
    async with serving(routes) as http:
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
    routes = endpoints.health_routes(lambda: health.readiness(rt), lambda: health.liveness(rt))
    async with serving(routes) as http:
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
