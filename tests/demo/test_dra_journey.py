"""The DRA journey on the served demo with a GPUCluster (examples/gpucluster-dra.yaml on the `dra`
fleet), driven with the real kubectl as the Kubernetes and NVIDIA DRA docs write it: the
ResourceSlices list every mock GPU and MIG device with its attributes; a ResourceClaimTemplate for
one GPU and a pod that runs `nvidia-smi -L` and sees exactly its claim's GPU; two containers
sharing one claim; a MIG device claimed by profile; a time-sliced claim. The kubelet plugin is
our agent in the DaemonSet's pods (gpudemo/agent_pods.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from demo_served import run_kubectl, serve_demo
from kubesim_helpers import KUBECTL

from gpu_operator import nvml
from gpu_operator.api import manifests
from gpudemo import fleet

pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl not installed")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gpucluster-dra.yaml"
CUDA = "nvcr.io/nvidia/cuda:12.6.0-base-ubuntu22.04"


def _template(name: str, cls: str = "gpu.nvidia.com", selector: str = "", config: str = "") -> str:
    text = f"""apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: {name}, namespace: default}}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: {cls}
"""
    if selector:
        text += f"""          selectors:
          - cel: {{expression: '{selector}'}}
"""
    return text + config


def _pod(name: str, template: str, containers: tuple[str, ...] = ("ctr",)) -> str:
    ctrs = "".join(
        f"""  - name: {c}
    image: {CUDA}
    command: ["nvidia-smi", "-L"]
    resources:
      claims:
      - name: gpu
"""
        for c in containers
    )
    return f"""apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  restartPolicy: Never
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: {template}
  containers:
{ctrs}"""


async def _apply(kubeconfig: Path, text: str, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    code, out = await run_kubectl(kubeconfig, "apply", "-f", str(path))
    assert code == 0, out


async def _finished(kubeconfig: Path, pod: str) -> None:
    code, out = await run_kubectl(
        kubeconfig, "wait", "--for=jsonpath={.status.phase}=Succeeded", f"pod/{pod}",
        "--timeout=60s", timeout=90,
    )  # fmt: skip
    if code != 0:
        _, described = await run_kubectl(kubeconfig, "describe", "pod", pod)
        raise AssertionError(out + described)


async def _allocated(kubeconfig: Path, pod: str) -> list[dict[str, Any]]:
    """The allocation results of the claim made for the pod."""
    code, out = await run_kubectl(kubeconfig, "get", "resourceclaims", "-o", "yaml")
    assert code == 0, out
    for claim in yaml.safe_load(out)["items"]:
        owners = claim["metadata"].get("ownerReferences") or []
        if any(o.get("name") == pod for o in owners):
            return list(claim["status"]["allocation"]["devices"]["results"])
    raise AssertionError(f"no claim of pod {pod}: {out}")


def _gpu_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("GPU ")]


async def test_dra_journey_on_the_served_demo(tmp_path: Path) -> None:
    (cluster,) = [d for d in manifests.read(str(EXAMPLE)) if d.get("kind") == "GPUCluster"]
    async with serve_demo(tmp_path, fleet.resolve("dra"), policy=cluster) as (_sim, nodes, kc):
        # Every mock GPU and MIG device is in a slice of its node, with NVIDIA's attributes.
        code, out = await run_kubectl(kc, "get", "resourceslices", "-o", "yaml")
        assert code == 0, out
        published: dict[str, dict[str, dict[str, Any]]] = {}
        for item in yaml.safe_load(out)["items"]:
            assert item["spec"]["driver"] == "gpu.nvidia.com"
            devices = published.setdefault(item["spec"]["nodeName"], {})
            devices.update({d["name"]: d for d in item["spec"]["devices"]})
        uuids: dict[str, dict[str, str]] = {}  # node -> device -> uuid
        for node, sim_node in nodes.nodes.items():
            machine = sim_node.machine
            if machine is None:
                assert node not in published
                continue
            lib = machine.nvml()
            lib.init()
            wanted: set[str] = set()
            for gpu in machine.gpus:
                handle = lib.device_by_index(gpu.index)
                if gpu.model.mig_capable and handle.mig_mode().current:
                    for i in range(handle.max_mig_device_count()):
                        try:
                            wanted.add(handle.mig_device_by_index(i).uuid())
                        except nvml.NvmlError:
                            continue  # an empty slot
                else:
                    wanted.add(gpu.uuid)
            lib.shutdown()
            devices = published[node]
            got = {d["attributes"]["uuid"]["string"] for d in devices.values()}
            assert got == wanted, node
            uuids[node] = {n: d["attributes"]["uuid"]["string"] for n, d in devices.items()}
            for device in devices.values():
                attrs = device["attributes"]
                wanted_attrs = {"productName", "architecture", "cudaComputeCapability"}
                wanted_attrs |= {"driverVersion", "resource.kubernetes.io/pciBusID"}
                assert wanted_attrs <= set(attrs)
                assert "memory" in device["capacity"]
                if attrs["type"]["string"] == "mig":
                    assert "profile" in attrs
                    assert "parentUUID" in attrs
        code, out = await run_kubectl(kc, "get", "resourceslices")
        assert code == 0, out
        assert "a100-mig-1-gpu.nvidia.com" in out, out
        assert "t4-1-gpu.nvidia.com" in out, out

        # One GPU from a template: nvidia-smi lists exactly the claim's GPU.
        await _apply(kc, _template("one-gpu") + "---\n" + _pod("one", "one-gpu"), tmp_path, "one")
        await _finished(kc, "one")
        (result,) = await _allocated(kc, "one")
        code, logs = await run_kubectl(kc, "logs", "one")
        assert code == 0, logs
        (line,) = _gpu_lines(logs)
        assert uuids[result["pool"]][result["device"]] in line, (result, logs)

        # Two containers share one claim: both see the same single GPU.
        await _apply(kc, _pod("shared", "one-gpu", ("first", "second")), tmp_path, "shared")
        await _finished(kc, "shared")
        (result,) = await _allocated(kc, "shared")
        seen = []
        for ctr in ("first", "second"):
            code, logs = await run_kubectl(kc, "logs", "shared", "-c", ctr)
            assert code == 0, logs
            (line,) = _gpu_lines(logs)
            seen.append(line)
        assert seen[0] == seen[1]
        assert uuids[result["pool"]][result["device"]] in seen[0]

        # A MIG device by profile (the mig.nvidia.com class): the container sees that device.
        profile = 'device.attributes["gpu.nvidia.com"].profile == "1g.5gb"'
        await _apply(
            kc, _template("mig-1g", "mig.nvidia.com", profile) + "---\n" + _pod("mig", "mig-1g"),
            tmp_path, "mig",
        )  # fmt: skip
        await _finished(kc, "mig")
        (result,) = await _allocated(kc, "mig")
        assert result["pool"] == "a100-mig-1", result
        assert "-mig-1g5gb-" in result["device"], result
        code, logs = await run_kubectl(kc, "logs", "mig")
        assert code == 0, logs
        assert len(_gpu_lines(logs)) == 1, logs
        mig_lines = [line for line in logs.splitlines() if line.strip().startswith("MIG ")]
        assert len(mig_lines) == 1, logs
        assert "1g.5gb" in mig_lines[0], logs
        assert uuids["a100-mig-1"][result["device"]] in mig_lines[0], logs

        # Time-slicing (the example turns the TimeSlicingSettings gate on): the plugin sets the
        # claimed GPU's time-slice and the pod sees that one GPU.
        sliced = """      config:
      - opaque:
          driver: gpu.nvidia.com
          parameters:
            apiVersion: resource.nvidia.com/v1beta1
            kind: GpuConfig
            sharing:
              strategy: TimeSlicing
              timeSlicingConfig: {interval: Long}
"""
        await _apply(
            kc, _template("sliced", config=sliced) + "---\n" + _pod("sliced", "sliced"),
            tmp_path, "sliced",
        )  # fmt: skip
        await _finished(kc, "sliced")
        (result,) = await _allocated(kc, "sliced")
        uuid = uuids[result["pool"]][result["device"]]
        code, logs = await run_kubectl(kc, "logs", "sliced")
        assert code == 0, logs
        (line,) = _gpu_lines(logs)
        assert uuid in line, logs
        code, plugin_logs = await run_kubectl(
            kc, "-n", "gpu-operator", "logs", "-l", "app=nvidia-dra-driver-kubelet-plugin",
            "-c", "gpus", "--tail=-1",
        )  # fmt: skip
        assert f"GPU {uuid}: time-slice Long" in plugin_logs, plugin_logs
