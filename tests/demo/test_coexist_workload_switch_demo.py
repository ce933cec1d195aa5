"""Issue 30 item 2, as the admin did it with the real kubectl on the served demo: a container GPU
node under a ClusterPolicy with sandbox workloads is switched to `vm-passthrough` and back. Our
device plugin leaves the node and the kubelet keeps its GPUs as capacity with nothing allocatable
for its 5-minute grace period: that is never "another device plugin", so no
`CoexistenceConflict` (nor, on the way back, a `PreinstalledDriver`) Event, no coexistence
sentence in the ClusterPolicy status, and the node is back on our driver and plugin at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from demo_served import run_kubectl, serve_demo
from kubesim_helpers import needs_kubectl
from waiting import eventually

import kubesim
from gpu_operator.api import keys, manifests
from gpu_operator.controller import nodelabels
from gpudemo import fleet

pytestmark = needs_kubectl
ROOT = Path(__file__).resolve().parents[2]
NODE = "t4-1"
GPU = "nvidia.com/gpu"
PLUGIN = keys.DEPLOY_PREFIX + "device-plugin"
PLUGIN_APP = "nvidia-device-plugin-daemonset"
REASONS = (nodelabels.COEXIST_REASON, nodelabels.PREINSTALLED_REASON)


def _policy() -> dict[str, Any]:
    """The KubeVirt passthrough example: sandbox workloads on (our node opts into containers)."""
    documents = manifests.read(str(ROOT / "examples" / "kubevirt-passthrough.yaml"))
    return next(d for d in documents if d["kind"] == "ClusterPolicy")


def _gpus(sim: kubesim.Cluster) -> tuple[str | None, str | None]:
    status = (sim.store.get("nodes", NODE) or {}).get("status") or {}
    return (status.get("capacity") or {}).get(GPU), (status.get("allocatable") or {}).get(GPU)


def _state(sim: kubesim.Cluster) -> str:
    policy = sim.store.get("clusterpolicies.nvidia.com", "cluster-policy") or {}
    return str((policy.get("status") or {}).get("state") or "")


def _plugin_pods(sim: kubesim.Cluster) -> list[str]:
    return [
        p["metadata"]["name"]
        for p in sim.store.list("pods", "gpu-operator", label_selector=f"app={PLUGIN_APP}")
        if p["spec"].get("nodeName") == NODE
    ]


async def _no_findings(kubeconfig: Path) -> None:
    """What the admin looked at: the Ready message and the node's Warning Events."""
    code, message = await run_kubectl(
        kubeconfig, "get", "clusterpolicy", "cluster-policy",
        "-o", 'jsonpath={.status.conditions[?(@.type=="Ready")].message}',
    )  # fmt: skip
    assert code == 0, message
    assert "coexistence" not in message, message
    for reason in REASONS:
        code, out = await run_kubectl(
            kubeconfig, "get", "events", "-A", "--field-selector", f"reason={reason}",
            "-o", "name",
        )  # fmt: skip
        assert code == 0, out
        assert not out.strip(), f"{reason} Events: {out}"


async def test_switching_a_node_to_vm_passthrough_and_back_shows_no_foreign_plugin(
    tmp_path: Path,
) -> None:
    chosen = fleet.parse({"pools": [{"name": "t4", "machine": "t4x4", "workload": "container"}]})
    async with serve_demo(tmp_path, chosen, policy=_policy()) as (sim, _, kubeconfig):
        await eventually(lambda: _gpus(sim) == ("4", "4"), "our plugin serving t4-1's GPUs")

        code, out = await run_kubectl(
            kubeconfig, "label", "node", NODE, "--overwrite",
            f"{keys.GPU_WORKLOAD_CONFIG}={keys.WORKLOAD_VM_PASSTHROUGH}",
        )  # fmt: skip
        assert code == 0, out
        # Our plugin leaves; the kubelet keeps its capacity with nothing allocatable.
        await eventually(
            lambda: not _plugin_pods(sim) and _gpus(sim) == ("4", "0") and _state(sim) == "ready",
            "t4-1 on vm-passthrough, our plugin's GPUs left behind, the policy ready",
            state=lambda: (_plugin_pods(sim), _gpus(sim), _state(sim)),
        )
        assert PLUGIN not in sim.store.get("nodes", NODE)["metadata"]["labels"]
        await _no_findings(kubeconfig)

        code, out = await run_kubectl(
            kubeconfig, "label", "node", NODE, "--overwrite",
            f"{keys.GPU_WORKLOAD_CONFIG}={keys.WORKLOAD_CONTAINER}",
        )  # fmt: skip
        assert code == 0, out

        def back() -> bool:
            labels = sim.store.get("nodes", NODE)["metadata"]["labels"]
            return (
                labels.get(keys.DEPLOY_DRIVER) == "true"
                and labels.get(PLUGIN) == "true"
                and _gpus(sim) == ("4", "4")
                and _state(sim) == "ready"
            )

        # Well inside the kubelet's grace period: the left-over capacity must not hold it up.
        await eventually(
            back, "t4-1 back on our driver and plugin, serving its GPUs",
            state=lambda: (sim.store.get("nodes", NODE)["metadata"]["labels"], _gpus(sim),
                           _state(sim)),
        )  # fmt: skip
        await _no_findings(kubeconfig)
