"""The kubelet's prober for runner containers (`kubesim.probes`) and the pod's projected token."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web
from kubesim_helpers import TEST_IMAGES, instant
from waiting import DEADLINE

import kubesim
from kubesim import PodContext, probes

IMAGE = "example/server:1"


def pod(name: str, **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": "node-1",
            "containers": [
                {"name": "server", "image": IMAGE,
                 "ports": [{"name": "health", "containerPort": 8081}], **container}
            ],
        },
    }  # fmt: skip


def ready(sim: kubesim.Cluster, name: str) -> bool:
    status = (sim.store.get("pods", name, namespace="default") or {}).get("status") or {}
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def events(sim: kubesim.Cluster, reason: str) -> list[str]:
    return [
        str(e.get("message"))
        for e in sim.store.list("events", namespace="default")
        if e.get("reason") == reason
    ]


class Server:
    """A program that serves /healthz on pod port 8081, healthy when told."""

    def __init__(self) -> None:
        self.healthy = False
        self.starts = 0

    async def run(self, ctx: PodContext) -> int:
        self.starts += 1

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(status=200 if self.healthy else 500, text="")

        app = web.Application()
        app.router.add_get("/healthz", healthz)
        await ctx.serve_port(8081, app)
        verdict = await probes.Prober(ctx, time_scale=0.01).run()
        return 137 if verdict is probes.Verdict.KILL else 0


# timeoutSeconds 100: 1 s at the servers' time scale (0.01), so that an answer a loaded machine
# is slow to give is not taken for a failure (the default 1 s would be 20 ms).
PROBE = {
    "httpGet": {"path": "/healthz", "port": "health"},
    "periodSeconds": 1,
    "timeoutSeconds": 100,
}


async def test_readiness_follows_the_http_probe_of_the_named_port() -> None:
    server = Server()
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=instant()) as sim:
        sim.register_pod_runner(server.run, image=IMAGE, reports_readiness=True)
        sim.store.create(pod("web", readinessProbe={**PROBE, "failureThreshold": 2}))
        await sim.wait_for(lambda: bool(events(sim, "Unhealthy")), timeout=DEADLINE)
        assert not ready(sim, "web")
        assert events(sim, "Unhealthy")[0] == (
            "Readiness probe failed: HTTP probe failed with statuscode: 500"
        )
        server.healthy = True
        await sim.wait_for(lambda: ready(sim, "web"), timeout=DEADLINE)
        server.healthy = False
        await sim.wait_for(lambda: not ready(sim, "web"), timeout=DEADLINE)
        assert server.starts == 1  # readiness never restarts a container


async def test_a_failing_liveness_probe_restarts_the_container() -> None:
    server = Server()
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=instant()) as sim:
        sim.register_pod_runner(server.run, image=IMAGE, reports_readiness=True)
        sim.store.create(pod("web", livenessProbe={**PROBE, "failureThreshold": 3}))

        def restarted() -> bool:
            status = (sim.store.get("pods", "web", namespace="default") or {}).get("status") or {}
            return any(c.get("restartCount", 0) >= 1 for c in status.get("containerStatuses") or [])

        await sim.wait_for(restarted, timeout=DEADLINE)
        assert "Container server failed liveness probe, will be restarted" in events(sim, "Killing")
        assert server.starts >= 2


async def test_startup_probe_holds_readiness_until_it_passes() -> None:
    server = Server()
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=instant()) as sim:
        sim.register_pod_runner(server.run, image=IMAGE, reports_readiness=True)
        # No readiness probe: ready as soon as the startup probe passes.
        sim.store.create(pod("web", startupProbe={**PROBE, "failureThreshold": 1000}))
        await sim.wait_for(lambda: bool(events(sim, "Unhealthy")), timeout=DEADLINE)
        assert not ready(sim, "web")
        assert events(sim, "Unhealthy")[0].startswith("Startup probe failed")
        server.healthy = True
        await sim.wait_for(lambda: ready(sim, "web"), timeout=DEADLINE)


async def test_a_port_nobody_serves_fails_like_a_refused_connection() -> None:
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=instant()) as sim:
        seen: list[tuple[bool, str]] = []

        async def silent(ctx: PodContext) -> int:
            prober = probes.Prober(ctx)
            seen.append(await prober.check(prober.probes["readiness"]))
            return 0

        sim.register_pod_runner(silent, image=IMAGE, reports_readiness=True)
        sim.store.create(pod("web", readinessProbe=PROBE, restartPolicy="Never"))
        await sim.wait_for(lambda: bool(seen), timeout=DEADLINE)
        ((ok, why),) = seen
        assert not ok
        assert why.endswith(':8081/healthz": dial tcp ' + why.split("//")[1].split("/")[0]
                            + ": connect: connection refused")  # fmt: skip


async def test_a_pods_projected_token_is_its_service_account_and_dies_with_the_pod() -> None:
    async with kubesim.Cluster(
        images=TEST_IMAGES, nodes=1, kubelet=instant(), authorization="rbac"
    ) as sim:
        sim.store.create(
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": "app", "namespace": "default"}}
        )  # fmt: skip
        spec = {**pod("web")["spec"], "serviceAccountName": "app"}
        token = sim.auth.token_for_pod(sim.store.create({**pod("web"), "spec": spec}))
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        url = f"{sim.url}/apis/authentication.k8s.io/v1/selfsubjectreviews"
        headers = {"Authorization": f"Bearer {token}"}
        ssl = sim.tls.client_context()
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=review, headers=headers, ssl=ssl) as response:
                assert response.status == 201
                info = (await response.json())["status"]["userInfo"]
            assert info["username"] == "system:serviceaccount:default:app"
            assert info["extra"]["authentication.kubernetes.io/pod-name"] == ["web"]
            sim.store.delete("pods", "web", namespace="default", grace=0)
            await sim.wait_for(
                lambda: sim.store.get("pods", "web", namespace="default") is None, timeout=DEADLINE
            )
            async with session.post(url, json=review, headers=headers, ssl=ssl) as response:
                assert response.status == 401
