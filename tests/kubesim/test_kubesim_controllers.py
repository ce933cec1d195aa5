"""Controllers, kubelet simulator, pod runners, faults and stats."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from kubesim_helpers import CM, TEST_IMAGES, Api, configmap, daemonset, instant
from waiting import DEADLINE, within

import kubesim
from kubesim import KubeletConfig, PodContext

DS = "/apis/apps/v1/namespaces/default/daemonsets"


def ds_status(sim: kubesim.Cluster, name: str) -> dict[str, Any]:
    return dict((sim.store.get("daemonsets", name, "default") or {}).get("status") or {})


def pods_of(sim: kubesim.Cluster, app: str) -> list[dict[str, Any]]:
    return sim.store.list("pods", "default", label_selector=f"app={app}")


async def test_daemonset_runs_one_pod_per_eligible_node(api: Api, sim: kubesim.Cluster) -> None:
    sim.add_node("gpu-1", labels={"kind": "gpu"})
    sim.add_node("tainted", labels={"kind": "gpu"}, taints=[{"key": "x", "effect": "NoSchedule"}])
    sim.add_node("cordoned", labels={"kind": "gpu"})
    await api.ok(
        "PATCH",
        "/api/v1/nodes/cordoned",
        {"spec": {"unschedulable": True}},
        ctype="application/merge-patch+json",
    )
    await api.ok("POST", DS, daemonset("d", nodeSelector={"kind": "gpu"}))
    await sim.wait_for(lambda: ds_status(sim, "d").get("numberAvailable") == 2, DEADLINE)
    assert sorted(p["spec"]["nodeName"] for p in pods_of(sim, "d")) == ["cordoned", "gpu-1"]
    status = ds_status(sim, "d")
    assert status == {
        "currentNumberScheduled": 2,
        "desiredNumberScheduled": 2,
        "numberMisscheduled": 0,
        "numberReady": 2,
        "numberAvailable": 2,
        "observedGeneration": 1,
        "updatedNumberScheduled": 2,
    }
    pod = pods_of(sim, "d")[0]
    assert pod["metadata"]["labels"]["controller-revision-hash"]
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"
    tolerated = {t["key"] for t in pod["spec"]["tolerations"]}
    assert "node.kubernetes.io/unschedulable" in tolerated


async def test_daemonset_honours_tolerations_and_node_affinity(
    api: Api, sim: kubesim.Cluster
) -> None:
    sim.add_node("t", taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}])
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.io/hostname",
                                "operator": "In",
                                "values": ["t", "node-1"],
                            }
                        ]
                    }
                ]
            }
        }
    }
    manifest = daemonset(
        "d",
        affinity=affinity,
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "x"}],
    )
    await api.ok("POST", DS, manifest)
    await sim.wait_for(lambda: ds_status(sim, "d").get("numberAvailable") == 2, DEADLINE)
    assert sorted(p["spec"]["nodeName"] for p in pods_of(sim, "d")) == ["node-1", "t"]


async def test_daemonset_removes_pods_from_nodes_that_stop_matching(
    api: Api, sim: kubesim.Cluster
) -> None:
    sim.add_node("n", labels={"run": "yes"})
    await api.ok("POST", DS, daemonset("d", nodeSelector={"run": "yes"}))
    await sim.wait_for(lambda: len(pods_of(sim, "d")) == 1, DEADLINE)
    await api.ok(
        "PATCH",
        "/api/v1/nodes/n",
        {"metadata": {"labels": {"run": None}}},
        ctype="application/merge-patch+json",
    )
    await sim.wait_for(lambda: not pods_of(sim, "d"), DEADLINE)
    await sim.wait_for(lambda: ds_status(sim, "d").get("desiredNumberScheduled") == 0, DEADLINE)


async def test_daemonset_rolling_update_respects_max_unavailable(
    api: Api, sim: kubesim.Cluster
) -> None:
    for index in range(3):
        sim.add_node(f"extra-{index}")
    await api.ok("POST", DS, daemonset("d"))
    await sim.wait_for(lambda: ds_status(sim, "d").get("numberAvailable") == 5, DEADLINE)
    old_hash = pods_of(sim, "d")[0]["metadata"]["labels"]["controller-revision-hash"]
    sim.kubelet.config.instant = False
    sim.kubelet.config.ready_delay = 0.05
    peak_unavailable = 0

    def progress() -> bool:
        nonlocal peak_unavailable
        status = ds_status(sim, "d")
        peak_unavailable = max(peak_unavailable, status.get("numberUnavailable", 0))
        # The status of the new generation: right after the patch it still counts the old one.
        return (
            status.get("observedGeneration") == 2
            and status.get("updatedNumberScheduled") == 5
            and status.get("numberAvailable") == 5
        )

    patch = {
        "spec": {"template": {"spec": {"containers": [{"name": "main", "image": "example/d:2"}]}}}
    }
    await api.ok("PATCH", f"{DS}/d", patch, ctype="application/strategic-merge-patch+json")
    await sim.wait_for(progress, DEADLINE)
    assert peak_unavailable == 1
    hashes = {p["metadata"]["labels"]["controller-revision-hash"] for p in pods_of(sim, "d")}
    assert old_hash not in hashes
    revisions = sim.store.list("controllerrevisions", "default")
    assert sorted(r["revision"] for r in revisions) == [1, 2]


async def test_daemonset_on_delete_keeps_old_pods(api: Api, sim: kubesim.Cluster) -> None:
    manifest = daemonset("d")
    manifest["spec"]["updateStrategy"] = {"type": "OnDelete"}
    await api.ok("POST", DS, manifest)
    await sim.wait_for(lambda: ds_status(sim, "d").get("numberAvailable") == 2, DEADLINE)
    patch = {
        "spec": {"template": {"spec": {"containers": [{"name": "main", "image": "example/d:2"}]}}}
    }
    await api.ok("PATCH", f"{DS}/d", patch, ctype="application/strategic-merge-patch+json")
    await sim.wait_for(lambda: ds_status(sim, "d").get("observedGeneration") == 2, DEADLINE)
    await sim.settle(timeout=DEADLINE)
    assert ds_status(sim, "d")["updatedNumberScheduled"] == 0
    victim = pods_of(sim, "d")[0]["metadata"]["name"]
    sim.store.delete("pods", victim, "default", grace=0)
    await sim.wait_for(lambda: ds_status(sim, "d").get("updatedNumberScheduled") == 1, DEADLINE)


async def test_deployment_creates_replicaset_and_pods(api: Api, sim: kubesim.Cluster) -> None:
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "nginx:1"}]},
            },
        },
    }
    await api.ok("POST", "/apis/apps/v1/namespaces/default/deployments", deploy)

    def available() -> bool:
        status = (sim.store.get("deployments", "web", "default") or {}).get("status") or {}
        return bool(status.get("availableReplicas") == 3)

    await sim.wait_for(available, DEADLINE)
    assert len(sim.store.list("replicasets", "default")) == 1
    assert {p["spec"]["nodeName"] for p in pods_of(sim, "web")} == {"node-1", "node-2"}


async def test_kubelet_runs_init_containers_then_becomes_ready() -> None:
    config = KubeletConfig(
        init_container_duration=0.01, start_delay=0.01, ready_delay=0.01, lease_interval=None
    )
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=config) as sim:
        seen: list[str] = []

        async def init_runner(ctx: PodContext) -> int:
            seen.append(ctx.container_name)
            return 0

        sim.register_pod_runner(init_runner, image="example/init-*")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {
                "nodeName": "node-1",
                "initContainers": [
                    {"name": "i1", "image": "example/init-a:1"},
                    {"name": "i2", "image": "example/init-b:1"},
                ],
                "containers": [{"name": "c", "image": "example/app:1"}],
            },
        }
        sim.store.create(pod)
        await sim.wait_for(lambda: _ready(sim, "p"), DEADLINE)
        assert seen == ["i1", "i2"]
        status = sim.store.get("pods", "p", "default")["status"]  # type: ignore[index]
        assert [s["state"]["terminated"]["exitCode"] for s in status["initContainerStatuses"]] == [
            0,
            0,
        ]
        assert status["phase"] == "Running"
        assert status["podIP"]


def _ready(sim: kubesim.Cluster, name: str) -> bool:
    pod = sim.store.get("pods", name, "default") or {}
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


async def test_pod_runner_controls_readiness_exit_codes_and_restarts(sim: kubesim.Cluster) -> None:
    started: list[PodContext] = []

    async def agent(ctx: PodContext) -> int:
        started.append(ctx)
        await asyncio.Event().wait()
        return 0

    sim.register_pod_runner(agent, image="example/agent")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "a", "namespace": "default"},
        "spec": {
            "nodeName": "node-1",
            "containers": [
                {
                    "name": "agent",
                    "image": "example/agent:v3",
                    "readinessProbe": {"exec": {"command": ["true"]}},
                    "env": [
                        {
                            "name": "NODE_NAME",
                            "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                        }
                    ],
                }
            ],
        },
    }
    sim.store.create(pod)
    await sim.wait_for(lambda: len(started) == 1, DEADLINE)
    ctx = started[0]
    assert ctx.env == {"NODE_NAME": "node-1"}
    assert ctx.node_name == "node-1"
    await sim.settle(timeout=DEADLINE)
    assert not _ready(sim, "a")
    ctx.set_ready(True)
    await sim.wait_for(lambda: _ready(sim, "a"), DEADLINE)
    ctx.exit(3)
    await sim.wait_for(lambda: len(started) == 2, DEADLINE)
    status = sim.store.get("pods", "a", "default")["status"]["containerStatuses"][0]  # type: ignore[index]
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 3


async def test_pod_runner_talks_to_the_api_as_a_node_program() -> None:
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=instant()) as sim:

        async def labeller(ctx: PodContext) -> None:
            async with aiohttp.ClientSession(base_url=ctx.url) as session:
                patch = {"metadata": {"labels": {"example.com/seen": "true"}}}
                await session.patch(
                    f"/api/v1/nodes/{ctx.node_name}",
                    json=patch,
                    headers={"Content-Type": "application/merge-patch+json"},
                )
                status = {
                    "status": {
                        "capacity": {"example.com/widget": "4"},
                        "allocatable": {"example.com/widget": "4"},
                    }
                }
                await session.patch(
                    f"/api/v1/nodes/{ctx.node_name}/status",
                    json=status,
                    headers={"Content-Type": "application/merge-patch+json"},
                )
            await ctx.stopping.wait()

        sim.register_pod_runner(labeller, label_selector="app=labeller")
        await _post_daemonset(sim, daemonset("labeller"))

        def labelled() -> bool:
            node = sim.store.get("nodes", "node-1") or {}
            return (
                node["metadata"]["labels"].get("example.com/seen") == "true"
                and node["status"]["capacity"].get("example.com/widget") == "4"
            )

        await sim.wait_for(labelled, DEADLINE)
        assert ctx_kubeconfig_exists(sim)


def ctx_kubeconfig_exists(sim: kubesim.Cluster) -> bool:
    return sim.kubeconfig_path.exists() and sim.url in sim.kubeconfig_path.read_text()


async def _post_daemonset(sim: kubesim.Cluster, manifest: dict[str, Any]) -> None:
    sim.store.create(manifest)


async def test_object_runner_gets_start_and_stop(sim: kubesim.Cluster) -> None:
    events: list[str] = []

    class Runner:
        async def start(self, ctx: PodContext) -> None:
            events.append(f"start {ctx.name}")

        async def stop(self, ctx: PodContext) -> None:
            events.append(f"stop {ctx.name}")

    sim.register_pod_runner(Runner(), image="example/obj:1")
    sim.store.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "o", "namespace": "default"},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "example/obj:1"}]},
        }
    )
    await sim.wait_for(lambda: events == ["start o"], DEADLINE)
    sim.store.delete("pods", "o", "default")
    await sim.wait_for(lambda: sim.store.get("pods", "o", "default") is None, DEADLINE)
    assert events == ["start o", "stop o"]


async def test_nodes_report_status_and_can_be_made_not_ready(sim: kubesim.Cluster) -> None:
    node = sim.add_node("custom", capacity={"cpu": "4"}, node_info={"kernelVersion": "5.15.0"})
    assert node["status"]["capacity"]["cpu"] == "4"
    assert node["status"]["nodeInfo"]["kernelVersion"] == "5.15.0"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert sim.store.get("leases", "custom", "kube-node-lease") is not None
    sim.set_node_ready("custom", False)
    node = sim.store.get("nodes", "custom") or {}
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"
    assert {t["key"] for t in node["spec"]["taints"]} == {"node.kubernetes.io/not-ready"}
    sim.set_node_ready("custom", True)
    assert "taints" not in (sim.store.get("nodes", "custom") or {})["spec"]


async def test_node_leases_are_renewed() -> None:
    async with kubesim.Cluster(
        images=TEST_IMAGES, nodes=1, kubelet=KubeletConfig(instant=True, lease_interval=0.02)
    ) as sim:
        first = sim.store.get("leases", "node-1", "kube-node-lease")["metadata"]["resourceVersion"]  # type: ignore[index]
        await sim.wait_for(
            lambda: (
                sim.store.get("leases", "node-1", "kube-node-lease")["metadata"]["resourceVersion"]
                != first
            ),
            DEADLINE,  # type: ignore[index]
        )


async def test_removed_nodes_lose_their_pods(api: Api, sim: kubesim.Cluster) -> None:
    await api.ok("POST", DS, daemonset("d"))
    await sim.wait_for(lambda: len(pods_of(sim, "d")) == 2, DEADLINE)
    sim.remove_node("node-2")
    await sim.wait_for(
        lambda: [p["spec"]["nodeName"] for p in pods_of(sim, "d")] == ["node-1"], DEADLINE
    )


async def test_node_loss_marks_node_unreachable(sim: kubesim.Cluster) -> None:
    sim.faults.lose_node("node-1")
    node = sim.store.get("nodes", "node-1") or {}
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "Unknown"
    assert "node.kubernetes.io/unreachable" in {t["key"] for t in node["spec"]["taints"]}


# ----- faults and stats -----------------------------------------------------------------------


async def test_fault_error_rate_and_latency(api: Api, sim: kubesim.Cluster) -> None:
    rule = sim.faults.add(verb="get", resource="configmaps", code=503)
    await api.ok("POST", CM, configmap("c"))
    status, body = await api.req("GET", f"{CM}/c")
    assert status == 503
    assert body["kind"] == "Status"
    sim.faults.remove(rule)
    sim.faults.add(verb="get", resource="configmaps", error_rate=0.0, latency=0.05)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await api.ok("GET", f"{CM}/c")
    assert loop.time() - start >= 0.05


async def test_drop_watches_ends_streams(api: Api, sim: kubesim.Cluster) -> None:
    async with api.session.get(CM, params={"watch": "true", "resourceVersion": "1"}) as resp:
        await sim.wait_for(lambda: sim.store.watcher_count() == 1, DEADLINE)
        assert sim.faults.drop_watches() == 1
        assert await within(resp.read(), "the dropped watch to end") == b""


async def test_expire_next_watch_forces_gone(api: Api, sim: kubesim.Cluster) -> None:
    sim.faults.expire_next_watch()
    async with api.session.get(CM, params={"watch": "true"}) as resp:
        line = await within(resp.content.readline(), "the 410 event")
    assert b'"code":410' in line


async def test_stats_count_requests_by_verb_and_resource(api: Api, sim: kubesim.Cluster) -> None:
    before = sim.stats.snapshot()
    await api.ok("GET", "/api/v1/nodes")
    await api.ok("GET", "/api/v1/nodes/node-1")
    await api.ok("PATCH", "/api/v1/nodes/node-1/status", {}, ctype="application/merge-patch+json")
    async with api.session.get(CM, params={"watch": "true", "timeoutSeconds": "0.01"}) as resp:
        await resp.read()
    assert sim.stats.since(before) == {
        ("list", "nodes"): 1,
        ("get", "nodes"): 1,
        ("patch", "nodes/status"): 1,
        ("watch", "configmaps"): 1,
    }
    assert sim.stats.writes() >= 1
