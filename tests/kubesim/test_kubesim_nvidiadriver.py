"""NVIDIADriver objects as a user drives them: real kubectl against kubesim, the operator running
as the chart's ServiceAccount under RBAC."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubesim_helpers import TEST_IMAGES, instant, kubectl, needs_kubectl
from waiting import DEADLINE, eventually

import kubesim
from gpu_operator.api import crds, keys
from gpu_operator.api.images import IMAGE_ENV
from gpu_operator.controller.operator import Operator, Settings
from gpu_operator.kube import client as kube_client

pytestmark = needs_kubectl

NAMESPACE = "gpu-operator"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "nvidiadriver-per-pool.yaml"
OPERATOR_ENV = {name: f"registry.local/{name.lower()}:v1" for name in set(IMAGE_ENV.values())}
UBUNTU = {
    "feature.node.kubernetes.io/pci-10de.present": "true",
    keys.NFD_OS_ID: "ubuntu",
    keys.NFD_OS_VERSION_ID: "22.04",
    keys.NFD_KERNEL_FULL: "6.8.0-52-generic",
}
A100 = {
    **UBUNTU,
    keys.GPU_PRODUCT: "NVIDIA-A100-SXM4-80GB",
    "nvidia.com/gpu.compute.major": "8",
    "nvidia.com/gpu.compute.minor": "0",
}
T4 = {**UBUNTU, keys.GPU_PRODUCT: "Tesla-T4", "nvidia.com/gpu.family": "turing"}


@pytest.fixture
async def cluster(chart_rbac: Callable[..., Path] | None) -> AsyncIterator[kubesim.Cluster]:
    mode = "rbac" if chart_rbac is not None else "open"
    async with kubesim.Cluster(images=TEST_IMAGES, kubelet=instant(), authorization=mode) as sim:
        sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for crd in crds.all_crds().values():
            sim.store.create(crd)
        sim.add_node("a100-1", labels=A100)
        sim.add_node("t4-1", labels=T4)
        sim.add_node("t4-2", labels=T4)
        yield sim


@pytest.fixture
async def operator(
    cluster: kubesim.Cluster, chart_rbac: Callable[..., Path] | None
) -> AsyncIterator[Operator]:
    kubeconfig = chart_rbac(cluster) if chart_rbac is not None else cluster.kubeconfig_path
    client = kube_client.connect(str(kubeconfig))
    running = Operator(client, Settings(namespace=NAMESPACE, operator_env=OPERATOR_ENV))
    task = asyncio.create_task(running.run())
    yield running
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await client.close()
    refused = [f"{u.name}: {a.verb} {a.combined_resource}" for u, a in cluster.auth.denials]
    assert not refused, refused


async def get_json(sim: kubesim.Cluster, *args: str) -> Any:
    return json.loads(await kubectl(sim, "get", *args, "-o", "json"))


async def error_reason(sim: kubesim.Cluster, name: str) -> str:
    path = '{.status.conditions[?(@.type=="Error")].reason}'
    return await kubectl(sim, "get", "nvidiadriver", name, "-o", f"jsonpath={path}")


def table(text: str) -> dict[str, list[str]]:
    lines = text.strip().splitlines()
    return {line.split()[0]: line.split() for line in lines}


def kubesim_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def state(sim: kubesim.Cluster, name: str) -> str | None:
    found = sim.store.get("nvidiadrivers.nvidia.com", name) or {}
    value = (found.get("status") or {}).get("state")
    return str(value) if value else None


async def wait_states(sim: kubesim.Cluster, timeout: float = DEADLINE, **wanted: str) -> None:
    await eventually(
        lambda: all(state(sim, n.replace("_", "-")) == s for n, s in wanted.items()),
        f"NVIDIADriver states {wanted}",
        timeout=timeout,
        state=lambda: {
            d["metadata"]["name"]: (d.get("status") or {}).get("state")
            for d in sim.store.list("nvidiadrivers.nvidia.com")
        },
    )


async def test_kubectl_apply_per_pool_example_shows_printer_columns_and_pools(
    cluster: kubesim.Cluster, operator: Operator
) -> None:
    out = await kubectl(cluster, "apply", "-f", str(EXAMPLE))
    assert "nvidiadriver.nvidia.com/a100-pool created" in out
    await wait_states(cluster, default="ready", a100_pool="ready")
    rows = table(await kubectl(cluster, "get", "nvidiadrivers"))
    assert rows["NAME"] == ["NAME", "STATUS", "DEFAULT", "AGE"]
    assert rows["default"][1:3] == ["ready", "true"]
    assert rows["a100-pool"][1:3] == ["ready", "false"]
    short = table(await kubectl(cluster, "get", "nvd"))
    assert set(short) == {"NAME", "default", "a100-pool"}
    nodes = table(await kubectl(cluster, "get", "nodes", "-L", keys.DRIVER_OWNER, "--no-headers"))
    assert nodes["a100-1"][-1] == "a100-pool"
    assert nodes["t4-1"][-1] == "default"
    daemonsets = await get_json(cluster, "daemonsets", "-n", NAMESPACE)
    images = sorted(
        d["spec"]["template"]["spec"]["containers"][0]["image"]
        for d in daemonsets["items"]
        if d["metadata"]["name"].startswith("nvidia-gpu-driver-")
    )
    assert images == [
        "nvcr.io/nvidia/driver:570.195.03-ubuntu22.04",
        "nvcr.io/nvidia/driver:595.91.07-ubuntu22.04",
    ]
    message = await kubectl(
        cluster, "get", "nvidiadriver", "default",
        "-o", 'jsonpath={.status.conditions[?(@.type=="Ready")].message}',
    )  # fmt: skip
    assert "driver ready on 2 node(s) in 1 pool(s): ubuntu22.04 (2)" in message


CONFLICTING = """
apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata:
  name: a100-canary
spec:
  default: false
  driverType: gpu
  repository: nvcr.io/nvidia
  image: driver
  version: "580.105.08"
  nodeSelector:
    nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB
"""


async def test_a_conflict_shows_in_both_objects_status_with_kubectl(
    cluster: kubesim.Cluster, operator: Operator
) -> None:
    await kubectl(cluster, "apply", "-f", str(EXAMPLE))
    await wait_states(cluster, default="ready", a100_pool="ready")
    await kubectl(cluster, "apply", "-f", "-", stdin=CONFLICTING)
    await wait_states(cluster, a100_pool="notReady", a100_canary="notReady")
    for name in ("a100-pool", "a100-canary"):
        assert await error_reason(cluster, name) == "ConflictingNodeSelector"
        message = await kubectl(
            cluster, "get", "nvidiadriver", name,
            "-o", 'jsonpath={.status.conditions[?(@.type=="Error")].message}',
        )  # fmt: skip
        assert "a100-1" in message
    rows = table(await kubectl(cluster, "get", "nvidiadrivers"))
    assert rows["a100-pool"][1] == "notReady"
    assert rows["a100-canary"][1] == "notReady"
    # The node keeps the driver it has: a selector mistake never tears a running driver down.
    nodes = table(await kubectl(cluster, "get", "nodes", "-L", keys.DRIVER_OWNER, "--no-headers"))
    assert nodes["a100-1"][-1] == "a100-pool"
    described = await kubectl(cluster, "describe", "nvidiadriver", "a100-canary")
    assert "ConflictingNodeSelector" in described
    await kubectl(cluster, "delete", "nvidiadriver", "a100-canary")
    await wait_states(cluster, a100_pool="ready")


POLICY = """
apiVersion: nvidia.com/v1
kind: ClusterPolicy
metadata:
  name: cluster-policy
spec:
  operator: {}
  daemonsets: {}
  driver:
    repository: nvcr.io/nvidia
    image: driver
    version: "570.195.03"
  toolkit: {}
  devicePlugin: {}
  dcgmExporter: {}
  dcgm:
    enabled: false
  nodeStatusExporter: {}
  gfd: {}
"""


async def test_hand_over_from_the_cluster_policy_keeps_identical_driver_pods(
    cluster: kubesim.Cluster, operator: Operator
) -> None:
    await kubectl(cluster, "apply", "-f", "-", stdin=POLICY)

    def policy_ready() -> bool:
        found = cluster.store.get("clusterpolicies.nvidia.com", "cluster-policy") or {}
        return bool((found.get("status") or {}).get("state") == "ready")

    await cluster.wait_for(policy_ready, DEADLINE, "ClusterPolicy ready")
    pods = await get_json(
        cluster, "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=nvidia-driver"
    )
    before = {p["spec"]["nodeName"]: p["metadata"]["uid"] for p in pods["items"]}
    assert set(before) == {"a100-1", "t4-1", "t4-2"}
    created = max(p["metadata"]["creationTimestamp"] for p in pods["items"])
    # kubesim's DaemonSet controller keeps the older of two pods on a node by creation time
    # (whole seconds): let the clock pass the driver pods' second.
    await cluster.wait_for(lambda: kubesim_now() > created, DEADLINE, "a second passed")
    # The per-pool example: the default pool says what the policy said, the A100 pool does not.
    await kubectl(cluster, "apply", "-f", str(EXAMPLE))
    await wait_states(cluster, default="ready")
    # Ready means every node of the pool runs one up-to-date pod of the pool's DaemonSet.
    pods = await get_json(
        cluster, "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=nvidia-driver"
    )
    live = [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
    after = {p["spec"]["nodeName"]: p for p in live if p["spec"]["nodeName"] != "a100-1"}
    assert len([p for p in live if p["spec"]["nodeName"] != "a100-1"]) == 2
    for node in ("t4-1", "t4-2"):
        pod = after[node]
        assert pod["metadata"]["uid"] == before[node], f"{node}: driver pod was replaced"
        owner = pod["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "DaemonSet"
        assert owner["name"].startswith("nvidia-gpu-driver-ubuntu22.04-")
    # About the cluster-scoped NVIDIADriver: in `default`, as client-go records such Events.
    events = await kubectl(cluster, "get", "events", "-n", "default",
                           "--field-selector", "reason=DriverPodsAdopted")  # fmt: skip
    assert "without a restart" in events
    # The A100 pool runs another driver: that node goes through the upgrade flow instead.
    labels = cluster.store.get("nodes", "a100-1")["metadata"]["labels"]
    assert labels.get(keys.DRIVER_OWNER) == "a100-pool"
