"""The scheduler: each filter, kube-scheduler's FailedScheduling message, requests accounting,
retries when the cluster changes, scoring, and the real kubectl against it."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubesim_helpers import TEST_IMAGES, instant, kubectl, needs_kubectl
from waiting import DEADLINE, eventually

import kubesim
from kubesim import KubeletConfig, quantity
from kubesim.controllers import scheduling
from kubesim.controllers.scheduler import Scheduler, backoff_seconds, feasible_nodes_to_find

CUDA = "nvcr.io/nvidia/cuda:12.6.0-base-ubuntu22.04"


@pytest.fixture
async def cluster() -> AsyncIterator[kubesim.Cluster]:
    async with kubesim.Cluster(images=TEST_IMAGES, kubelet=instant()) as sim:
        yield sim


def pod(name: str, *, requests: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A Pod manifest with one container, optional requests, and extra spec fields."""
    container: dict[str, Any] = {"name": "main", "image": "example/app:1"}
    if requests:
        container["resources"] = {"requests": requests}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [container], **spec},
    }


def gpu_pod(name: str, gpus: int) -> dict[str, Any]:
    """A pod asking `gpus` GPUs through a limit only (the request defaults from it)."""
    manifest = pod(name)
    manifest["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return manifest


def get(sim: kubesim.Cluster, name: str) -> dict[str, Any]:
    found = sim.store.get("pods", name, "default")
    assert found is not None, name
    return found


def node_of(sim: kubesim.Cluster, name: str) -> str | None:
    return (get(sim, name).get("spec") or {}).get("nodeName")


def scheduled_condition(sim: kubesim.Cluster, name: str) -> dict[str, Any]:
    conditions = (get(sim, name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "PodScheduled"), {})


def events(sim: kubesim.Cluster, name: str, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for e in sim.store.list("events", "default")
        if e["involvedObject"]["name"] == name and e["reason"] == reason
    ]


async def bound(sim: kubesim.Cluster, *names: str) -> None:
    await eventually(
        lambda: all(node_of(sim, n) for n in names),
        f"{names} bound",
        state=lambda: {n: scheduled_condition(sim, n) for n in names},
    )


async def unschedulable(sim: kubesim.Cluster, name: str) -> str:
    await eventually(
        lambda: scheduled_condition(sim, name).get("reason") == "Unschedulable",
        f"{name} unschedulable",
        state=lambda: scheduled_condition(sim, name),
    )
    return str(scheduled_condition(sim, name)["message"])


# ----- requests and capacity ---------------------------------------------------------------------


async def test_gpu_pod_lands_only_on_a_node_with_free_gpus(cluster: kubesim.Cluster) -> None:
    cluster.add_node("cpu-1")
    cluster.add_node("cpu-2")
    cluster.add_node("gpu-1", capacity={"nvidia.com/gpu": "8"})
    for index in range(3):
        cluster.store.create(gpu_pod(f"train-{index}", 2))
    await bound(cluster, "train-0", "train-1", "train-2")
    assert {node_of(cluster, f"train-{i}") for i in range(3)} == {"gpu-1"}


async def test_ten_eight_gpu_pods_on_48_gpus_run_six_and_explain_the_rest(
    cluster: kubesim.Cluster,
) -> None:
    for index in range(6):
        cluster.add_node(f"gpu-{index}", capacity={"nvidia.com/gpu": "8"})
    for index in range(10):
        cluster.store.create(gpu_pod(f"big-{index}", 8))
    await cluster.wait_for(
        lambda: sum(1 for i in range(10) if node_of(cluster, f"big-{i}")) == 6,
        DEADLINE,
        "six bound",
    )
    await cluster.settle(timeout=DEADLINE)
    pending = [f"big-{i}" for i in range(10) if not node_of(cluster, f"big-{i}")]
    assert len(pending) == 4
    message = await unschedulable(cluster, pending[0])
    assert message == (
        "0/6 nodes are available: 6 Insufficient nvidia.com/gpu. preemption: 0/6 nodes are "
        "available: 6 No preemption victims found for incoming pod."
    )
    assert sorted(node_of(cluster, f"big-{i}") or "" for i in range(10))[4:] == [
        f"gpu-{i}" for i in range(6)
    ]
    # Deleting a running pod frees its GPUs for exactly one waiting pod.
    running = next(f"big-{i}" for i in range(10) if node_of(cluster, f"big-{i}"))
    freed_node = node_of(cluster, running)
    cluster.store.delete("pods", running, "default")
    await cluster.wait_for(
        lambda: sum(1 for name in pending if node_of(cluster, name)) == 1,
        DEADLINE,
        "one rescheduled",
    )
    await cluster.settle(timeout=DEADLINE)
    assert [node_of(cluster, name) for name in pending if node_of(cluster, name)] == [freed_node]


async def test_resources_nobody_has_leave_the_pod_pending(cluster: kubesim.Cluster) -> None:
    cluster.add_node("node-1")
    manifest = pod("rdma")
    manifest["spec"]["containers"][0]["resources"] = {
        "limits": {"rdma/ib": "8"},
        "requests": {"rdma/ib": "8"},
    }
    cluster.store.create(manifest)
    assert await unschedulable(cluster, "rdma") == (
        "0/1 nodes are available: 1 Insufficient rdma/ib. preemption: 0/1 nodes are "
        "available: 1 Preemption is not helpful for scheduling."
    )
    assert get(cluster, "rdma")["status"]["phase"] == "Pending"
    [event] = events(cluster, "rdma", "FailedScheduling")
    assert event["type"] == "Warning"
    assert event["source"]["component"] == "default-scheduler"


async def test_effective_request_is_max_of_containers_and_init_plus_overhead(
    cluster: kubesim.Cluster,
) -> None:
    cluster.add_node("small", capacity={"cpu": "4"})
    spec = {
        "initContainers": [
            {"name": "setup", "image": "i", "resources": {"requests": {"cpu": "3"}}}
        ],
        "containers": [
            {"name": "a", "image": "a", "resources": {"limits": {"cpu": "1"}}},
            {"name": "b", "image": "b", "resources": {"requests": {"cpu": "500m"}}},
        ],
        "overhead": {"cpu": "250m"},
    }
    assert scheduling.pod_requests(spec) == {"cpu": 3250}
    # On the server a pod's overhead comes from its RuntimeClass (set at admission).
    cluster.store.create(
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "kata"},
            "handler": "kata",
            "overhead": {"podFixed": {"cpu": "250m"}},
        }
    )
    through_class = {k: v for k, v in spec.items() if k != "overhead"}
    through_class["runtimeClassName"] = "kata"
    first = pod("first")
    first["spec"] = dict(through_class)
    second = pod("second")
    second["spec"] = dict(through_class)
    cluster.store.create(first)
    await bound(cluster, "first")
    cluster.store.create(second)
    assert (await unschedulable(cluster, "second")).startswith(
        "0/1 nodes are available: 1 Insufficient cpu."
    )


def test_sidecars_add_to_every_later_init_container_and_to_the_pod() -> None:
    spec = {
        "initContainers": [
            {
                "name": "proxy",
                "image": "p",
                "restartPolicy": "Always",
                "resources": {"requests": {"memory": "1Gi"}},
            },
            {"name": "migrate", "image": "m", "resources": {"requests": {"memory": "3Gi"}}},
        ],
        "containers": [{"name": "app", "image": "a", "resources": {"requests": {"memory": "1Gi"}}}],
    }
    # max(app + proxy = 2Gi, migrate + proxy = 4Gi)
    assert scheduling.pod_requests(spec) == {"memory": 4 * 2**30}


def test_quantities_parse_like_the_api() -> None:
    assert quantity.milli("500m") == 500
    assert quantity.milli("2") == 2000
    assert quantity.milli("0.1") == 100
    assert quantity.units("64Gi") == 64 * 2**30
    assert quantity.units("1e3") == 1000
    assert quantity.units("1.5k") == 1500
    assert quantity.units("100m") == 1  # rounded up, as Value() does
    with pytest.raises(ValueError, match="quantities must match"):
        quantity.parse("lots")


def test_feasible_node_count_follows_the_adaptive_percentage() -> None:
    assert feasible_nodes_to_find(50) == 50
    assert feasible_nodes_to_find(200) == 100
    assert feasible_nodes_to_find(5000) == 500
    assert feasible_nodes_to_find(100_000) == 5000


# ----- filters and the FailedScheduling message -------------------------------------------------


async def test_failed_scheduling_message_counts_each_filters_first_reason(
    cluster: kubesim.Cluster,
) -> None:
    pool = {"pool": "a"}
    cluster.add_node("cordoned", labels=pool)
    cluster.store.patch("nodes", "cordoned", {"spec": {"unschedulable": True}})
    cluster.add_node(
        "tainted",
        labels=pool,
        taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}],
    )
    cluster.add_node("down", labels=pool)
    cluster.set_node_ready("down", False)
    cluster.add_node("other-pool", labels={"pool": "b"})
    cluster.add_node("ports", labels=pool)
    cluster.add_node("small", labels=pool, capacity={"cpu": "1"})
    cluster.add_node("busy", labels=pool, capacity={"cpu": "4"})
    cluster.add_node("full", labels=pool, capacity={"pods": "1"})
    web = pod("web", nodeName="ports")
    web["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    cluster.store.create(web)
    cluster.store.create(pod("hog", requests={"cpu": "3"}, nodeName="busy"))
    cluster.store.create(pod("tenant", nodeName="full"))
    wanted = pod("wanted", requests={"cpu": "2"}, nodeSelector=pool)
    wanted["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    cluster.store.create(wanted)
    message = await unschedulable(cluster, "wanted")
    assert message == (
        "0/8 nodes are available: 1 Too many pods, "
        "1 node(s) didn't have free ports for the requested pod ports, "
        "1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had untolerated taint {dedicated: gpu}, "
        "1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }, "
        "1 node(s) were unschedulable, 2 Insufficient cpu. "
        "preemption: 0/8 nodes are available: 3 No preemption victims found for incoming pod, "
        "5 Preemption is not helpful for scheduling."
    )
    [event] = events(cluster, "wanted", "FailedScheduling")
    assert event["message"] == message
    # Freeing the busy node's CPU is what makes room: the pod is retried and lands there.
    cluster.store.delete("pods", "hog", "default")
    await bound(cluster, "wanted")
    assert node_of(cluster, "wanted") == "busy"
    assert scheduled_condition(cluster, "wanted")["status"] == "True"
    [scheduled] = events(cluster, "wanted", "Scheduled")
    assert scheduled["message"] == "Successfully assigned default/wanted to busy"


async def test_preemption_policy_never_is_reported(cluster: kubesim.Cluster) -> None:
    cluster.add_node("node-1", capacity={"cpu": "1"})
    cluster.store.create(pod("greedy", requests={"cpu": "2"}, preemptionPolicy="Never"))
    assert await unschedulable(cluster, "greedy") == (
        "0/1 nodes are available: 1 Insufficient cpu. "
        "preemption: not eligible due to preemptionPolicy=Never."
    )


async def test_no_nodes_at_all(cluster: kubesim.Cluster) -> None:
    cluster.store.create(pod("lonely"))
    assert await unschedulable(cluster, "lonely") == "no nodes available to schedule pods"
    cluster.add_node("late")
    await bound(cluster, "lonely")


async def test_node_gaining_capacity_retries_waiting_pods(cluster: kubesim.Cluster) -> None:
    cluster.add_node("gpu-1")
    cluster.store.create(gpu_pod("train", 1))
    await unschedulable(cluster, "train")
    attempts = len(events(cluster, "train", "FailedScheduling"))
    # Writes that cannot undo an Insufficient verdict (an annotation, a label) are no reason
    # for a new attempt.
    cluster.store.patch("nodes", "gpu-1", {"metadata": {"annotations": {"seen": "1"}}})
    cluster.store.patch("nodes", "gpu-1", {"metadata": {"labels": {"gpu": "soon"}}})
    await cluster.settle(timeout=DEADLINE)
    failed = events(cluster, "train", "FailedScheduling")
    assert len(failed) == attempts
    assert failed[0].get("count", 1) == 1
    # The device plugin advertising GPUs is what lets the pod in.
    cluster.store.patch(
        "nodes",
        "gpu-1",
        {"status": {"capacity": {"nvidia.com/gpu": "4"}, "allocatable": {"nvidia.com/gpu": "4"}}},
        status=True,
    )
    await bound(cluster, "train")


async def test_taints_and_tolerations(cluster: kubesim.Cluster) -> None:
    cluster.add_node("plain")
    cluster.store.patch("nodes", "plain", {"spec": {"unschedulable": True}})
    cluster.add_node("gpu", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    cluster.add_node("evicting", taints=[{"key": "maint", "value": "x", "effect": "NoExecute"}])
    cluster.store.create(pod("intolerant"))
    assert (await unschedulable(cluster, "intolerant")).startswith(
        "0/3 nodes are available: 1 node(s) had untolerated taint {maint: x}, "
        "1 node(s) had untolerated taint {nvidia.com/gpu: }, 1 node(s) were unschedulable."
    )
    tolerant = pod(
        "tolerant",
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    )
    cluster.store.create(tolerant)
    await bound(cluster, "tolerant")
    assert node_of(cluster, "tolerant") == "gpu"
    cordon_proof = pod(
        "cordon-proof",
        tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}],
    )
    cluster.store.create(cordon_proof)
    await bound(cluster, "cordon-proof")
    assert node_of(cluster, "cordon-proof") == "plain"


async def test_prefer_no_schedule_only_steers(cluster: kubesim.Cluster) -> None:
    cluster.add_node("a", taints=[{"key": "spot", "effect": "PreferNoSchedule"}])
    cluster.add_node("b")
    cluster.store.create(pod("first"))
    await bound(cluster, "first")
    assert node_of(cluster, "first") == "b"
    cluster.store.patch("nodes", "b", {"spec": {"unschedulable": True}})
    cluster.store.create(pod("second"))
    await bound(cluster, "second")
    assert node_of(cluster, "second") == "a"


async def test_required_node_affinity_operators_and_match_fields(
    cluster: kubesim.Cluster,
) -> None:
    cluster.add_node("old", labels={"gen": "3"})
    cluster.add_node("new", labels={"gen": "5"})
    cluster.add_node("bare")

    def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
        required = {"nodeSelectorTerms": list(terms)}
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}

    cases = {
        "gt": ({"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["4"]}]}, "new"),
        "lt": ({"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["4"]}]}, "old"),
        "absent": ({"matchExpressions": [{"key": "gen", "operator": "DoesNotExist"}]}, "bare"),
        "notin": (
            {"matchExpressions": [{"key": "gen", "operator": "NotIn", "values": ["3", "5"]}]},
            "bare",
        ),
        "named": (
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["old"]}]},
            "old",
        ),
    }
    for name, (term, _) in cases.items():
        cluster.store.create(pod(name, affinity=affinity(term)))
    await bound(cluster, *cases)
    assert {name: node_of(cluster, name) for name in cases} == {
        name: expected for name, (_, expected) in cases.items()
    }
    pinned = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gone"]}]}
    cluster.store.create(pod("pinned", affinity=affinity(pinned)))
    assert (await unschedulable(cluster, "pinned")).startswith(
        "0/3 nodes are available: 3 node(s) didn't satisfy plugin(s) [NodeAffinity]."
    )
    # Either term may match (terms are ORed).
    either = affinity(
        {"matchExpressions": [{"key": "gen", "operator": "In", "values": ["9"]}]},
        {"matchExpressions": [{"key": "gen", "operator": "Exists"}]},
    )
    cluster.store.create(pod("either", affinity=either))
    await bound(cluster, "either")
    assert node_of(cluster, "either") in ("old", "new")


async def test_not_ready_nodes_get_no_new_pods(cluster: kubesim.Cluster) -> None:
    cluster.add_node("sick")
    cluster.set_node_ready("sick", False)
    cluster.store.create(pod("waiting"))
    assert "node.kubernetes.io/not-ready" in await unschedulable(cluster, "waiting")
    cluster.set_node_ready("sick", True)
    await bound(cluster, "waiting")


async def test_host_ports_conflict_only_on_the_same_protocol_and_address(
    cluster: kubesim.Cluster,
) -> None:
    cluster.add_node("node-1")

    def with_port(name: str, **port: Any) -> dict[str, Any]:
        manifest = pod(name)
        manifest["spec"]["containers"][0]["ports"] = [{"containerPort": 53, **port}]
        return manifest

    cluster.store.create(with_port("dns-tcp", hostPort=53))
    cluster.store.create(with_port("dns-udp", hostPort=53, protocol="UDP"))
    await bound(cluster, "dns-tcp", "dns-udp")
    cluster.store.create(with_port("clash", hostPort=53, hostIP="10.0.0.9"))
    assert "1 node(s) didn't have free ports" in await unschedulable(cluster, "clash")
    cluster.store.delete("pods", "dns-tcp", "default")
    await bound(cluster, "clash")


async def test_pods_beyond_the_pod_count_wait(cluster: kubesim.Cluster) -> None:
    cluster.add_node("tiny", capacity={"pods": "2"})
    for name in ("a", "b", "c"):
        cluster.store.create(pod(name))
    await cluster.wait_for(
        lambda: sum(1 for n in "abc" if node_of(cluster, n)) == 2, DEADLINE, "two bound"
    )
    waiting = next(n for n in "abc" if not node_of(cluster, n))
    assert (await unschedulable(cluster, waiting)).startswith(
        "0/1 nodes are available: 1 Too many pods."
    )


async def test_preset_node_name_and_other_schedulers_bypass_the_scheduler(
    cluster: kubesim.Cluster,
) -> None:
    cluster.add_node("node-1", capacity={"cpu": "1"})
    cluster.store.create(pod("pinned", requests={"cpu": "8"}, nodeName="node-1"))
    cluster.store.create(pod("custom", schedulerName="my-scheduler"))
    gated = pod("gated", schedulingGates=[{"name": "example.com/wait"}])
    cluster.store.create(gated)
    await cluster.settle(timeout=DEADLINE)
    assert node_of(cluster, "pinned") == "node-1"
    assert node_of(cluster, "custom") is None
    assert node_of(cluster, "gated") is None
    assert not events(cluster, "custom", "FailedScheduling")
    assert not events(cluster, "pinned", "Scheduled")


async def test_least_allocated_spreads_pods(cluster: kubesim.Cluster) -> None:
    for index in range(3):
        cluster.add_node(f"node-{index}")
    for index in range(6):
        cluster.store.create(pod(f"web-{index}"))
    await bound(cluster, *[f"web-{i}" for i in range(6)])
    placed = [node_of(cluster, f"web-{i}") for i in range(6)]
    assert sorted(placed) == ["node-0", "node-0", "node-1", "node-1", "node-2", "node-2"]


async def test_finished_pods_give_their_resources_back() -> None:
    config = KubeletConfig(lease_interval=None, command_duration=0.3)
    async with kubesim.Cluster(images=TEST_IMAGES, kubelet=config) as sim:
        sim.add_node("gpu-1", capacity={"nvidia.com/gpu": "1"})
        for name in ("job-a", "job-b"):
            manifest = gpu_pod(name, 1)
            manifest["spec"]["restartPolicy"] = "Never"
            manifest["spec"]["containers"][0]["command"] = ["nvidia-smi"]
            sim.store.create(manifest)
            if name == "job-a":
                await bound(sim, "job-a")
        assert "1 Insufficient nvidia.com/gpu" in await unschedulable(sim, "job-b")
        await sim.wait_for(
            lambda: all(
                get(sim, n)["status"].get("phase") == "Succeeded" for n in ("job-a", "job-b")
            ),
            DEADLINE,
            "both jobs done",
        )


# ----- the real kubectl --------------------------------------------------------------------------


def nvidia_smi_overrides(name: str) -> str:
    container = {
        "name": name,
        "image": CUDA,
        "command": ["nvidia-smi"],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    return json.dumps({"spec": {"containers": [container]}})


@needs_kubectl
async def test_kubectl_run_nvidia_smi_lands_on_a_gpu_node_and_completes() -> None:
    config = KubeletConfig(lease_interval=None, command_duration=0.3)
    async with kubesim.Cluster(images=TEST_IMAGES, kubelet=config) as sim:
        sim.add_node("cpu-1")
        sim.add_node("gpu-1", capacity={"nvidia.com/gpu": "8"})
        out = await kubectl(
            sim,
            "run",
            "nvidia-smi",
            "--restart=Never",
            f"--image={CUDA}",
            f"--overrides={nvidia_smi_overrides('nvidia-smi')}",
        )
        assert "pod/nvidia-smi created" in out
        await sim.wait_for(
            lambda: get(sim, "nvidia-smi")["status"].get("phase") == "Succeeded",
            DEADLINE,
            "nvidia-smi succeeded",
        )
        assert node_of(sim, "nvidia-smi") == "gpu-1"
        assert "Completed" in await kubectl(sim, "get", "pod", "nvidia-smi")
        listed = await kubectl(
            sim, "get", "events", "--field-selector", "involvedObject.name=nvidia-smi"
        )
        for reason in ("Scheduled", "Pulling", "Pulled", "Created", "Started"):
            assert reason in listed, listed


@needs_kubectl
async def test_kubectl_describe_shows_why_extra_gpu_pods_wait() -> None:
    async with kubesim.Cluster(images=TEST_IMAGES, kubelet=instant()) as sim:
        sim.add_node("cpu-1")
        sim.add_node("gpu-1", capacity={"nvidia.com/gpu": "2"})
        for index in range(3):
            await kubectl(
                sim,
                "run",
                f"smi-{index}",
                "--restart=Always",
                f"--image={CUDA}",
                f"--overrides={nvidia_smi_overrides(f'smi-{index}')}",
            )
        await sim.wait_for(
            lambda: sum(1 for i in range(3) if node_of(sim, f"smi-{i}")) == 2, DEADLINE, "two bound"
        )
        waiting = next(f"smi-{i}" for i in range(3) if not node_of(sim, f"smi-{i}"))
        await unschedulable(sim, waiting)
        described = " ".join((await kubectl(sim, "describe", "pod", waiting)).split())
        assert "Warning FailedScheduling" in described
        assert (
            "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are "
            "available: 1 No preemption victims found for incoming pod, 1 Preemption is not "
            "helpful for scheduling." in described
        ), described
        assert "Status: Pending" in described
        running = next(f"smi-{i}" for i in range(3) if node_of(sim, f"smi-{i}"))
        described = " ".join((await kubectl(sim, "describe", "pod", running)).split())
        assert f"Successfully assigned default/{running} to gpu-1" in described
        assert "Normal Started" in described


async def test_a_label_change_retries_pods_waiting_for_that_label(
    cluster: kubesim.Cluster,
) -> None:
    cluster.add_node("node-1")
    cluster.store.create(pod("picky", nodeSelector={"disk": "ssd"}))
    assert "1 node(s) didn't match Pod's node affinity/selector" in await unschedulable(
        cluster, "picky"
    )
    cluster.store.patch("nodes", "node-1", {"metadata": {"labels": {"disk": "ssd"}}})
    await bound(cluster, "picky")


# ----- the scheduling queue: backoff and queueing hints ------------------------------------------


def scheduler_of(sim: kubesim.Cluster) -> Scheduler:
    found = sim.controllers["scheduler"]
    assert isinstance(found, Scheduler)
    return found


def test_backoff_doubles_from_one_second_to_ten() -> None:
    assert [backoff_seconds(n) for n in range(7)] == [0, 1, 2, 4, 8, 10, 10]


async def test_a_pod_waiting_for_gpus_is_tried_again_only_when_gpus_free_up(
    cluster: kubesim.Cluster,
) -> None:
    for name in ("gpu-1", "gpu-2"):
        cluster.add_node(name, capacity={"nvidia.com/gpu": "1"})
    cluster.store.create(gpu_pod("first", 1))
    cluster.store.create(gpu_pod("second", 1))
    cluster.store.create(pod("web", requests={"cpu": "100m"}))
    await bound(cluster, "first", "second", "web")
    cluster.store.create(gpu_pod("waiting", 1))
    assert "2 Insufficient nvidia.com/gpu" in await unschedulable(cluster, "waiting")
    await cluster.settle(timeout=DEADLINE)
    scheduler = scheduler_of(cluster)
    passes = scheduler.filter_passes
    # None of these can give the pod a GPU: no new attempt, not one node filtered for it.
    cluster.store.delete("pods", "web", "default")
    cluster.store.patch("nodes", "gpu-1", {"metadata": {"labels": {"rack": "r1"}}})
    cluster.store.patch("nodes", "gpu-2", {"spec": {"unschedulable": True}})
    await cluster.settle(timeout=DEADLINE)
    assert scheduler.filter_passes == passes
    assert not node_of(cluster, "waiting")
    # A GPU pod leaving a cordoned node: NodeResourcesFit's hint looks at resources only (as
    # kube-scheduler's), so the pod is tried once more (both nodes filtered) and stays Pending.
    cluster.store.delete("pods", "second", "default")
    await cluster.settle(timeout=DEADLINE)
    assert passes < scheduler.filter_passes <= passes + 2
    assert not node_of(cluster, "waiting")
    # The GPU pod leaving a schedulable node is what lets it in.
    cluster.store.delete("pods", "first", "default")
    await bound(cluster, "waiting")
    assert node_of(cluster, "waiting") == "gpu-1"


async def test_uncordoning_a_node_moves_a_waiting_pod_back(cluster: kubesim.Cluster) -> None:
    cluster.add_node("gpu-1", capacity={"nvidia.com/gpu": "1"})
    cluster.store.patch("nodes", "gpu-1", {"spec": {"unschedulable": True}})
    cluster.store.create(gpu_pod("waiting", 1))
    assert "1 node(s) were unschedulable" in await unschedulable(cluster, "waiting")
    cluster.store.patch("nodes", "gpu-1", {"spec": {"unschedulable": None}})
    await bound(cluster, "waiting")


async def test_an_uncordon_moves_a_pod_back_though_the_node_still_lacks_its_gpus(
    cluster: kubesim.Cluster,
) -> None:
    # As in a driver upgrade: the node is cordoned and its GPU still held when the pod is
    # tried, then uncordoned before the GPU frees. NodeUnschedulable's hint moves the pod back
    # on the uncordon (its own plugin passes now); that attempt fails on NodeResourcesFit,
    # whose hint then moves it back when the GPU frees.
    cluster.add_node("gpu-1", capacity={"nvidia.com/gpu": "1"})
    cluster.store.create(gpu_pod("first", 1))
    await bound(cluster, "first")
    cluster.store.patch("nodes", "gpu-1", {"spec": {"unschedulable": True}})
    cluster.store.create(gpu_pod("waiting", 1))
    assert "1 node(s) were unschedulable" in await unschedulable(cluster, "waiting")
    cluster.store.patch("nodes", "gpu-1", {"spec": {"unschedulable": None}})
    await eventually(
        lambda: "Insufficient nvidia.com/gpu" in scheduled_condition(cluster, "waiting")["message"],
        "tried again after the uncordon",
        state=lambda: scheduled_condition(cluster, "waiting"),
    )
    cluster.store.delete("pods", "first", namespace="default")
    await bound(cluster, "waiting")


async def test_a_hinted_pod_waits_out_its_backoff_while_others_queue(
    cluster: kubesim.Cluster,
) -> None:
    cluster.add_node("gpu-1", capacity={"nvidia.com/gpu": "1"})
    cluster.store.create(gpu_pod("first", 1))
    await bound(cluster, "first")
    cluster.store.create(gpu_pod("waiting", 1))
    await unschedulable(cluster, "waiting")
    await cluster.settle(timeout=DEADLINE)
    scheduler = scheduler_of(cluster)
    key = ("default", "waiting")
    waiting = scheduler.unschedulable[key]
    assert waiting.attempts == 1
    assert 0 < waiting.backoff_until - time.monotonic() <= 1.0
    # A hint while another pod is queued (activeQ not empty) moves the pod to backoffQ: it is
    # tried when its backoff ends, not before.
    scheduler.enqueue(("default", "someone-else"))
    scheduler._requeue(key, waiting)
    assert key not in scheduler._pending
    assert key in scheduler._timers
    await eventually(lambda: scheduler.attempts.get(key) == 2, "tried again")
    assert time.monotonic() >= waiting.backoff_until
    assert scheduler.unschedulable[key].backoff_until - time.monotonic() > 1.0  # now 2 s


async def test_a_hinted_pod_is_tried_at_once_when_nothing_else_waits(
    cluster: kubesim.Cluster,
) -> None:
    cluster.add_node("gpu-1", capacity={"nvidia.com/gpu": "1"})
    cluster.store.create(gpu_pod("first", 1))
    await bound(cluster, "first")
    cluster.store.create(gpu_pod("waiting", 1))
    await unschedulable(cluster, "waiting")
    await cluster.settle(timeout=DEADLINE)
    key = ("default", "waiting")
    # Backing off for an hour: only SchedulerPopFromBackoffQ (an empty activeQ takes the pod
    # from backoffQ) lets the freed GPU in within the test's deadline.
    scheduler_of(cluster).unschedulable[key].backoff_until = time.monotonic() + 3600
    cluster.store.delete("pods", "first", "default")
    await bound(cluster, "waiting")
    assert key not in scheduler_of(cluster).attempts
