"""Issue 35, the per-node migration from the device plugin to DRA as an admin does it with the
real kubectl on the served demo (docs/dra.md, "Migrating from the device plugin"): a mixed fleet
under a ClusterPolicy; the stand-in for NVIDIA's DRA driver chart
(examples/dra-migration/kubelet-plugin-standin.yaml: our GPU kubelet plugin on the nodes labelled
nvidia.com/dra-kubelet-plugin=true, and the gpu.nvidia.com DeviceClass) applied with
`kubectl apply -f`; labelling one node moves it: our device plugin's pod leaves, the DRA plugin's
pod starts there and publishes the node's GPUs; a pod asking for nvidia.com/gpu lands on the other
node, a claim pod on the DRA node sees its GPU; removing the label moves the node back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from demo_served import run_kubectl, serve_demo
from kubesim_helpers import needs_kubectl
from waiting import eventually

import kubesim
from gpudemo import fleet

pytestmark = needs_kubectl
ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "examples" / "dra-migration" / "kubelet-plugin-standin.yaml"
DRA_NODE, OTHER = "t4-1", "dgx-a100-1"
CUDA = "nvcr.io/nvidia/cuda:12.6.0-base-ubuntu22.04"
PLUGIN_APP = "nvidia-device-plugin-daemonset"
DRA_APP = "nvidia-dra-driver-kubelet-plugin"
DRA_NS = "nvidia-dra-driver-gpu"

EXTENDED_POD = f"""apiVersion: v1
kind: Pod
metadata: {{name: extended, namespace: default}}
spec:
  restartPolicy: Never
  containers:
  - name: ctr
    image: {CUDA}
    command: ["nvidia-smi", "-L"]
    resources:
      limits: {{nvidia.com/gpu: 1}}
"""
CLAIM_POD = f"""apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: one-gpu, namespace: default}}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
---
apiVersion: v1
kind: Pod
metadata: {{name: claimed, namespace: default}}
spec:
  restartPolicy: Never
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: one-gpu
  containers:
  - name: ctr
    image: {CUDA}
    command: ["nvidia-smi", "-L"]
    resources:
      claims:
      - name: gpu
"""


def _pods_on(sim: kubesim.Cluster, namespace: str, app: str, node: str) -> list[dict[str, Any]]:
    return [
        p
        for p in sim.store.list("pods", namespace, label_selector=f"app={app}")
        if p["spec"].get("nodeName") == node and not p["metadata"].get("deletionTimestamp")
    ]


async def _kubectl(kc: Path, *args: str) -> str:
    code, out = await run_kubectl(kc, *args)
    assert code == 0, out
    return out


async def _apply(kc: Path, tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    await _kubectl(kc, "apply", "-f", str(path))


async def _succeeded(kc: Path, pod: str) -> None:
    code, out = await run_kubectl(
        kc, "wait", "--for=jsonpath={.status.phase}=Succeeded", f"pod/{pod}", "--timeout=90s",
        timeout=120,
    )  # fmt: skip
    if code != 0:
        _, described = await run_kubectl(kc, "describe", "pod", pod)
        raise AssertionError(out + described)


async def _allocatable_gpus(kc: Path, node: str) -> str:
    return await _kubectl(
        kc, "get", "node", node, "-o", r"jsonpath={.status.allocatable.nvidia\.com/gpu}"
    )


async def _slices(kc: Path, node: str) -> list[dict[str, Any]]:
    out = await _kubectl(
        kc, "get", "resourceslices", "--field-selector", f"spec.nodeName={node}", "-o", "yaml"
    )
    return list(yaml.safe_load(out)["items"])


async def test_one_node_moves_to_dra_and_back_with_kubectl(tmp_path: Path) -> None:
    async with serve_demo(tmp_path, fleet.resolve("small")) as (sim, _nodes, kc):
        assert _pods_on(sim, "gpu-operator", PLUGIN_APP, DRA_NODE)
        assert await _allocatable_gpus(kc, DRA_NODE) == "4"
        await _kubectl(kc, "apply", "-f", str(STANDIN))
        assert not _pods_on(sim, DRA_NS, DRA_APP, DRA_NODE)  # no node is labelled yet

        await _kubectl(kc, "label", "node", DRA_NODE, "nvidia.com/dra-kubelet-plugin=true")

        async def moved() -> bool:
            if _pods_on(sim, "gpu-operator", PLUGIN_APP, DRA_NODE):
                return False
            pods = _pods_on(sim, DRA_NS, DRA_APP, DRA_NODE)
            statuses = [s for p in pods for s in p["status"].get("containerStatuses") or []]
            if len(pods) != 1 or not statuses or not all(s.get("ready") for s in statuses):
                return False
            if await _allocatable_gpus(kc, DRA_NODE) not in ("", "0"):
                return False
            devices = [d for s in await _slices(kc, DRA_NODE) for d in s["spec"]["devices"]]
            return len(devices) == 4

        await eventually(moved, "t4-1 served by the DRA plugin, not the device plugin", timeout=120)
        label = await _kubectl(
            kc, "get", "node", DRA_NODE, "-L", "nvidia.com/gpu.deploy.device-plugin"
        )
        assert "false" in label.splitlines()[1], label
        out = await _kubectl(kc, "get", "resourceslices")
        assert f"{DRA_NODE}-gpu.nvidia.com" in out, out
        assert OTHER not in out, out  # the other node still has the device plugin only

        # nvidia.com/gpu goes to the device-plugin node; a claim to the DRA node.
        await _apply(kc, tmp_path, "extended", EXTENDED_POD)
        await _succeeded(kc, "extended")
        node = await _kubectl(kc, "get", "pod", "extended", "-o", "jsonpath={.spec.nodeName}")
        assert node == OTHER
        await _apply(kc, tmp_path, "claimed", CLAIM_POD)
        await _succeeded(kc, "claimed")
        node = await _kubectl(kc, "get", "pod", "claimed", "-o", "jsonpath={.spec.nodeName}")
        assert node == DRA_NODE
        logs = await _kubectl(kc, "logs", "claimed")
        lines = [line for line in logs.splitlines() if line.startswith("GPU ")]
        claims = yaml.safe_load(await _kubectl(kc, "get", "resourceclaims", "-o", "yaml"))
        (claim,) = claims["items"]
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        (device,) = [
            d for s in await _slices(kc, DRA_NODE) for d in s["spec"]["devices"]
            if d["name"] == result["device"]
        ]  # fmt: skip
        assert len(lines) == 1, logs
        assert device["attributes"]["uuid"]["string"] in lines[0], logs

        # Back: delete the claim pod, remove the label; the device plugin returns.
        await _kubectl(kc, "delete", "pod", "claimed", "--wait=true")
        await _kubectl(kc, "label", "node", DRA_NODE, "nvidia.com/dra-kubelet-plugin-")

        async def back() -> bool:
            return (
                not _pods_on(sim, DRA_NS, DRA_APP, DRA_NODE)
                and bool(_pods_on(sim, "gpu-operator", PLUGIN_APP, DRA_NODE))
                and await _allocatable_gpus(kc, DRA_NODE) == "4"
            )

        await eventually(back, "t4-1 back on the device plugin", timeout=120)
