"""The GPU-pod journey of the seed documents on the demo cluster, driven with the real kubectl:
nvidia-smi in a GPU pod, Pending beyond capacity, exec, time-slicing through the config manager,
MIG mixed, and a health fault with recovery. The device plugin, GFD and config manager are the
real agents on each node's mock GPUs."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from waiting import DEADLINE, eventually, within

import kubesim
from gpudemo import fleet, programs, session

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".tools" / "bin" / "kubectl"
pytestmark = pytest.mark.skipif(
    not KUBECTL.exists(), reason="kubectl not installed (scripts/setup)"
)

CUDA = "nvcr.io/nvidia/cuda:12.6.0-base-ubuntu22.04"
SEED_OVERRIDES = json.dumps(
    {
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "nvidia-smi",
                    "image": CUDA,
                    "command": ["nvidia-smi"],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        }
    }
)
# The time-slicing ConfigMap exactly as the seed documents show it (the shorthand form).
SEED_CONFIG = "version: v1\nsharing:\n  timeSlicing:\n    replicas: 4\nmig:\n  strategy: mixed\n"
GPU_ROW = re.compile(r"^\|\s+(\d+)\s+(NVIDIA|Tesla)\S* .*\|", re.MULTILINE)


@dataclass
class Served:
    sim: kubesim.Cluster
    nodes: programs.Programs
    kubeconfig: Path

    async def kubectl(self, *args: str, check: bool = True) -> tuple[int, str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        proc = await asyncio.create_subprocess_exec(
            str(KUBECTL), *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
        )  # fmt: skip
        # Longer than DEADLINE: a `kubectl wait --timeout` within it says what it waited for.
        out, _ = await within(proc.communicate(), f"kubectl {' '.join(args)}", 2 * DEADLINE)
        text = out.decode()
        code = proc.returncode or 0
        if check:
            assert code == 0, text
        return code, text

    def node(self, name: str) -> dict[str, Any]:
        return self.sim.store.get("nodes", name) or {}

    def allocatable(self, name: str, resource: str = "nvidia.com/gpu") -> str | None:
        return ((self.node(name).get("status") or {}).get("allocatable") or {}).get(resource)

    def labels(self, name: str) -> dict[str, str]:
        return dict((self.node(name).get("metadata") or {}).get("labels") or {})

    def pod(self, name: str, namespace: str = "default") -> dict[str, Any]:
        return self.sim.store.get("pods", name, namespace) or {}

    async def phase(self, name: str, *phases: str) -> str:
        def reached() -> bool:
            return (self.pod(name).get("status") or {}).get("phase") in phases

        await eventually(
            reached, f"pod {name} {phases}", state=lambda: self.pod(name).get("status")
        )
        return str(self.pod(name)["status"]["phase"])

    async def running(self, name: str) -> None:
        def up() -> bool:
            statuses = (self.pod(name).get("status") or {}).get("containerStatuses") or []
            return bool(statuses) and all("running" in (s.get("state") or {}) for s in statuses)

        await eventually(up, f"pod {name} running", state=lambda: self.pod(name).get("status"))

    def operand_pod(self, app_prefix: str, node: str) -> str:
        for pod in self.sim.store.list("pods", session.NAMESPACE):
            app = (pod["metadata"].get("labels") or {}).get("app", "")
            if app.startswith(app_prefix) and pod["spec"].get("nodeName") == node:
                return str(pod["metadata"]["name"])
        raise AssertionError(f"no {app_prefix} pod on {node}")


@asynccontextmanager
async def served(
    pools: list[dict[str, Any]], tmp_path: Path, **extra: Any
) -> AsyncIterator[Served]:
    """The demo on these pools, converged and serving kubectl until the block ends."""
    ready: asyncio.Future[tuple[kubesim.Cluster, programs.Programs]] = (
        asyncio.get_running_loop().create_future()
    )
    buffer = io.StringIO()
    options = session.Options(
        fleet=fleet.parse({"pools": pools}, "journey.yaml"),
        serve=True,
        kubeconfig_out=tmp_path / "kubeconfig",
        timing=programs.Timing(scale=0.0),
        timeout=DEADLINE,  # for convergence
        live=False,
        on_serving=lambda sim, nodes: ready.set_result((sim, nodes)),
        **extra,
    )
    task = asyncio.ensure_future(session.run(options, Console(file=buffer, width=200)))
    try:
        done, _ = await asyncio.wait(
            {task, ready}, timeout=2 * DEADLINE, return_when="FIRST_COMPLETED"
        )
        assert ready in done, buffer.getvalue()
        sim, nodes = ready.result()
        yield Served(sim, nodes, tmp_path / "kubeconfig")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _gpu_pod(name: str, gpus: int, resource: str = "nvidia.com/gpu") -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "containers": [
                    {
                        "name": "work",
                        "image": CUDA,
                        "command": ["sleep", "infinity"],
                        "resources": {"limits": {resource: str(gpus)}},
                    }
                ]
            },
        }
    )


# Also through the chart with every operand that has an agent of ours on our image (its
# NVIDIA-named entry points; docs/image.md): the journey must not tell the difference.
BUILTIN = {"install": "helm", "sets": ["agents.builtin=true"]}
OUR_IMAGE = "ghcr.io/gpu-operator-py/gpu-operator"


@pytest.mark.parametrize("install", [{}, BUILTIN], ids=["default", "agents-builtin"])
async def test_the_seed_journey_runs_nvidia_smi_on_one_gpu_and_exec_sees_only_its_gpus(
    tmp_path: Path, install: dict[str, Any]
) -> None:
    pools = [{"name": "a100", "machine": "dgx-a100"}, {"name": "cpu"}]
    async with served(pools, tmp_path, **install) as demo:
        assert demo.allocatable("a100-1") == "8"
        if install:
            plugin = demo.pod(
                demo.operand_pod("nvidia-device-plugin-daemonset", "a100-1"), session.NAMESPACE
            )
            images = {c["image"].split(":")[0] for c in plugin["spec"]["containers"]}
            assert images == {OUR_IMAGE}
        # The seed documents' verification step, as typed.
        await demo.kubectl(
            "run", "nvidia-smi", "--restart=Never", f"--image={CUDA}",
            f"--overrides={SEED_OVERRIDES}",
        )  # fmt: skip
        assert await demo.phase("nvidia-smi", "Succeeded", "Failed") == "Succeeded"
        _, table = await demo.kubectl("logs", "nvidia-smi")
        assert [m.group(1) for m in GPU_ROW.finditer(table)] == ["0"], table
        assert "NVIDIA A100-SXM4-40GB" in table
        # The driver the driver DaemonSet's image loaded (the chart's default, 595.91.07).
        assert "Driver Version: 595.91.07" in table
        assert "CUDA Version: 13.2" in table  # what the 595 branch reports
        assert "40960MiB" in table
        assert "No running processes found" in table
        _, listing = await demo.kubectl("get", "pod", "nvidia-smi")
        assert "Completed" in listing

        # More GPUs than any node has free: Pending with the scheduler's message.
        big = tmp_path / "big.json"
        big.write_text(_gpu_pod("too-big", 9))
        await demo.kubectl("create", "-f", str(big))
        await demo.kubectl(
            "wait", "pod/too-big", "--for=condition=PodScheduled=false", f"--timeout={DEADLINE:g}s"
        )
        _, events = await demo.kubectl(
            "get", "events", "--field-selector", "involvedObject.name=too-big"
        )
        assert "FailedScheduling" in events
        assert "Insufficient nvidia.com/gpu" in events

        # exec into a running two-GPU pod: nvidia-smi -L lists only its GPUs.
        two = tmp_path / "two.json"
        two.write_text(_gpu_pod("two-gpus", 2))
        await demo.kubectl("create", "-f", str(two))
        await demo.running("two-gpus")
        _, listed = await demo.kubectl("exec", "two-gpus", "--", "nvidia-smi", "-L")
        lines = listed.splitlines()
        assert [line.split(":")[0] for line in lines] == ["GPU 0", "GPU 1"], listed
        uuids = {line.split("UUID: ")[1].rstrip(")") for line in lines}
        machine = demo.nodes.node("a100-1").machine
        assert machine is not None
        assert uuids <= {g.uuid for g in machine.gpus}

        # A container without GPUs has no nvidia-smi at all.
        await demo.kubectl("run", "plain", f"--image={CUDA}", "--", "sleep", "infinity")
        await demo.running("plain")
        code, out = await demo.kubectl("exec", "plain", "--", "nvidia-smi", check=False)
        assert code == 126
        assert 'exec: "nvidia-smi": executable file not found in $PATH' in out


async def test_an_xid_drops_allocatable_and_a_gpu_reset_brings_it_back(tmp_path: Path) -> None:
    pools = [{"name": "t4", "machine": "t4x4"}]
    async with served(pools, tmp_path) as demo:
        assert demo.allocatable("t4-1") == "4"
        driver = demo.operand_pod("nvidia-driver-daemonset", "t4-1")
        _, out = await demo.kubectl(
            "exec", "-n", session.NAMESPACE, driver, "--", "demo-gpu-fault", "xid", "2", "48"
        )
        assert "XID 48 raised on GPU 2" in out
        await demo.sim.wait_for(
            lambda: demo.allocatable("t4-1") == "3", DEADLINE, "GPU 2 unhealthy"
        )
        _, described = await demo.kubectl("describe", "node", "t4-1")
        assert "GPUUnhealthy" in described
        _, reset = await demo.kubectl(
            "exec", "-n", session.NAMESPACE, driver, "--", "nvidia-smi", "-r", "-i", "2"
        )
        assert "was successfully reset" in reset
        await demo.sim.wait_for(
            lambda: demo.allocatable("t4-1") == "4", DEADLINE, "GPU 2 recovered"
        )
        _, described = await demo.kubectl("describe", "node", "t4-1")
        assert "GPUHealthy" in described


async def test_the_seed_time_slicing_config_makes_four_replicas_per_gpu(tmp_path: Path) -> None:
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "device-plugin-config"},
        "data": {
            "config.yaml": SEED_CONFIG,
            "two": SEED_CONFIG.replace("replicas: 4", "replicas: 2"),
        },
    }
    policy = {**session.DEFAULT_POLICY, "spec": {**session.DEFAULT_POLICY["spec"]}}
    policy["spec"].pop("mig")  # MIG_STRATEGY from the policy would win over the file
    policy["spec"]["devicePlugin"] = {
        "enabled": True,
        "config": {"name": "device-plugin-config", "default": "config.yaml"},
    }
    pools = [{"name": "t4", "machine": "t4x4"}]
    async with served(pools, tmp_path, policy=policy, objects=[config_map]) as demo:
        assert demo.allocatable("t4-1") == "16"
        labels = demo.labels("t4-1")
        assert labels["nvidia.com/gpu.replicas"] == "4"
        assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
        assert labels["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"

        # Another named config for this node: plugin and GFD reload and agree.
        await demo.kubectl("label", "node", "t4-1", "nvidia.com/device-plugin.config=two")
        await demo.sim.wait_for(lambda: demo.allocatable("t4-1") == "8", DEADLINE, "2 replicas")
        await demo.sim.wait_for(
            lambda: demo.labels("t4-1").get("nvidia.com/gpu.replicas") == "2", DEADLINE, "GFD"
        )

        # A name the ConfigMap lacks: an Event, and the node keeps its last good config.
        await demo.kubectl(
            "label", "node", "t4-1", "nvidia.com/device-plugin.config=typo", "--overwrite"
        )

        async def rejected() -> str:
            _, text = await demo.kubectl("describe", "node", "t4-1")
            return text

        await demo.sim.wait_for(
            lambda: any(
                e.get("reason") == "DevicePluginConfigRejected"
                for e in demo.sim.store.list("events", session.NAMESPACE)
            ),
            DEADLINE,
            "rejection event",
        )
        described = await rejected()
        assert "DevicePluginConfigRejected" in described
        assert "nvidia.com/device-plugin.config=typo names a config that does not exist" in (
            described
        )
        assert demo.allocatable("t4-1") == "8"

        # Two pods share one GPU's replicas; each sees exactly one GPU.
        for name in ("share-a", "share-b"):
            manifest = tmp_path / f"{name}.json"
            manifest.write_text(_gpu_pod(name, 1))
            await demo.kubectl("create", "-f", str(manifest))
            await demo.running(name)
            _, listed = await demo.kubectl("exec", name, "--", "nvidia-smi", "-L")
            assert listed.count("GPU 0: Tesla T4") == 1, listed


async def test_mig_mixed_advertises_profiles_and_a_pod_sees_its_mig_device(
    tmp_path: Path,
) -> None:
    policy = {**session.DEFAULT_POLICY, "spec": {**session.DEFAULT_POLICY["spec"]}}
    policy["spec"]["mig"] = {"strategy": "mixed"}
    pools = [{"name": "mig", "machine": "dgx-a100-mig-mixed"}]
    async with served(pools, tmp_path, policy=policy) as demo:
        assert demo.allocatable("mig-1", "nvidia.com/mig-1g.5gb") == "16"
        assert demo.allocatable("mig-1", "nvidia.com/mig-3g.20gb") == "8"
        assert demo.labels("mig-1")["nvidia.com/mig.strategy"] == "mixed"
        await demo.kubectl(
            "run", "mig", "--restart=Never", f"--image={CUDA}",
            "--overrides=" + json.dumps({"spec": {"restartPolicy": "Never", "containers": [{
                "name": "mig", "image": CUDA, "command": ["nvidia-smi", "-L"],
                "resources": {"limits": {"nvidia.com/mig-1g.5gb": "1"}},
            }]}}),
        )  # fmt: skip
        assert await demo.phase("mig", "Succeeded", "Failed") == "Succeeded"
        _, listed = await demo.kubectl("logs", "mig")
        lines = listed.splitlines()
        assert len(lines) == 2, listed
        assert lines[0].startswith("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-")
        assert re.fullmatch(r"  MIG 1g\.5gb      Device  0: \(UUID: MIG-[0-9a-f-]+\)", lines[1])


async def test_mps_sharing_runs_the_control_daemon_and_shares_each_gpu(tmp_path: Path) -> None:
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "device-plugin-config"},
        "data": {"mps": "version: v1\nsharing:\n  mps:\n    replicas: 2\n"},
    }
    policy = {**session.DEFAULT_POLICY, "spec": {**session.DEFAULT_POLICY["spec"]}}
    policy["spec"].pop("mig")
    policy["spec"]["devicePlugin"] = {
        "enabled": True,
        "config": {"name": "device-plugin-config", "default": "mps"},
    }
    pools = [{"name": "t4", "machine": "t4x4"}]
    async with served(pools, tmp_path, policy=policy, objects=[config_map]) as demo:
        assert demo.allocatable("t4-1") == "8"
        labels = demo.labels("t4-1")
        assert labels["nvidia.com/gpu.sharing-strategy"] == "mps"
        assert labels["nvidia.com/mps.capable"] == "true"
        daemon = demo.operand_pod("nvidia-device-plugin-mps-control-daemon", "t4-1")
        _, log = await demo.kubectl(
            "logs", "-n", session.NAMESPACE, daemon, "-c", "mps-control-daemon-ctr"
        )
        assert "MPS daemons ready" in log
        manifest = tmp_path / "mps.json"
        manifest.write_text(_gpu_pod("mps-work", 1))
        await demo.kubectl("create", "-f", str(manifest))
        await demo.running("mps-work")
        _, listed = await demo.kubectl("exec", "mps-work", "--", "nvidia-smi", "-L")
        assert listed.count("GPU 0: Tesla T4") == 1, listed
        manager = demo.sim.device_manager("t4-1")
        assert manager is not None
        allocation = manager.allocation(demo.pod("mps-work")["metadata"]["uid"], "work")
        assert allocation is not None
        assert allocation.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
