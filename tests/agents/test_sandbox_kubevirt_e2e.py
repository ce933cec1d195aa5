"""VM workloads end to end on a demo fleet, driven with the real kubectl: the VFIO manager binds
the passthrough node's GPUs, the vGPU device manager creates vGPUs, the sandbox device plugin
advertises both, a pod shaped like KubeVirt's virt-launcher gets the VFIO devices and the
variables KubeVirt reads, and a node moves between the VM and container stacks and back without
a pod left holding a device of the other stack."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The kubectl helpers shared by the kubesim suites live beside them (no package to import from).
from kubesim_helpers import kubectl, needs_kubectl
from rich.console import Console
from waiting import DEADLINE, eventually, within

import kubesim
from gpu_operator.agents.pci import sysfs
from gpu_operator.api import keys, manifests
from gpu_operator.cli import render
from gpu_operator.controller.operator import Operator, Settings
from gpu_operator.kube import client as kube_client
from gpudemo import fleet, programs, session
from kubesim import KubeletConfig, PodContext

pytestmark = needs_kubectl
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kubevirt-vgpu.yaml"
PT, VGPU, CTR = "pt-1", "vgpu-1", "ctr-1"
KUBECTL_WAIT = f"--timeout={DEADLINE:g}s"  # `kubectl wait`'s deadline
PASSTHROUGH = "nvidia.com/GA100_A100_SXM4_40GB"
VIRT_LAUNCHER = "quay.io/kubevirt/virt-launcher:v1.5.0"
FLEET = fleet.parse(
    {
        "pools": [
            {"name": "pt", "machine": "dgx-a100", "workload": "vm-passthrough"},
            {"name": "vgpu", "machine": "t4x4", "workload": "vm-vgpu"},
            {"name": "ctr", "machine": "t4x4", "workload": "container"},
        ]
    },
    "vm-fleet",
)


@dataclass
class Cluster:
    sim: kubesim.Cluster
    launched: dict[str, PodContext] = field(default_factory=dict)

    def node(self, name: str) -> dict[str, Any]:
        return self.sim.store.get("nodes", name) or {}

    def labels(self, name: str) -> dict[str, str]:
        return dict(self.node(name)["metadata"].get("labels") or {})

    def allocatable(self, name: str) -> dict[str, str]:
        return dict((self.node(name).get("status") or {}).get("allocatable") or {})

    def drivers(self, name: str) -> set[str | None]:
        """The drivers the node's NVIDIA GPUs are bound to."""
        return {g.driver for g in sysfs.nvidia_gpus(sysfs.scan(self.sim.node_root(name)))}

    def pods(self, app: str, node: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.sim.store.list("pods", session.NAMESPACE, label_selector=f"app={app}")
            if p["spec"].get("nodeName") == node
        ]

    def summary(self) -> dict[str, Any]:
        """What a failed wait shows: each node's allocatable and its pods with their phases."""
        pods: dict[str, list[str]] = {}
        for p in self.sim.store.list("pods"):
            node = p["spec"].get("nodeName") or "(unscheduled)"
            phase = (p.get("status") or {}).get("phase")
            pods.setdefault(node, []).append(f"{p['metadata']['name']}: {phase}")
        return {
            name: {"allocatable": self.allocatable(name), "pods": pods.get(name, [])}
            for name in (PT, VGPU, CTR)
        }

    async def until(self, predicate: Any, what: str, timeout: float = DEADLINE) -> None:
        await eventually(predicate, what, timeout=timeout, state=self.summary)


def _example() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    documents = manifests.read(str(EXAMPLE))
    policy = next(d for d in documents if d["kind"] == "ClusterPolicy")
    objects = [session.with_namespace(d) for d in documents if d["kind"] == "ConfigMap"]
    return policy, objects


@contextlib.asynccontextmanager
async def vm_fleet() -> AsyncIterator[Cluster]:
    """The fleet under the kubevirt-vgpu example, converged, with a runner standing in for
    KubeVirt's virt-launcher (it records what the kubelet gave each pod)."""
    policy, objects = _example()
    kubelet = KubeletConfig(start_delay=0, init_container_duration=0, lease_interval=None)
    # The example's vGPU manager image is the user's own build, pushed to their registry.
    async with kubesim.Cluster(kubelet=kubelet, images=["registry.example.com/nvidia/*"]) as sim:
        cluster = Cluster(sim)

        async def virt_launcher(ctx: PodContext) -> int:
            cluster.launched[ctx.name] = ctx
            await ctx.stopping.wait()
            return 0

        async def env(run: kubesim.ProgramRun) -> int:
            run.stdout.write("".join(f"{k}={v}\n" for k, v in sorted(run.view.env.items())))
            return 0

        sim.register_pod_runner(virt_launcher, image=VIRT_LAUNCHER)
        # The launcher image has `env` (for `kubectl exec`); kubesim has no images.
        sim.register_program("env", env, available=lambda view: view.container_name == "compute")
        nodes = programs.Programs(sim, programs.Timing(scale=0.0))
        nodes.register()
        demo = session.Demo(
            session.Options(fleet=FLEET, policy=policy), Console(file=io.StringIO())
        )
        demo.populate(sim, nodes)
        client = kube_client.connect(str(sim.kubeconfig_path))
        operator = Operator(
            client,
            Settings(namespace=session.NAMESPACE, operator_env=render.DEFAULT_OPERATOR_ENV),
        )
        task = asyncio.create_task(operator.run())
        try:
            await within(operator.ready.wait(), "the operator to be ready")
            for obj in objects:
                sim.store.create(obj)
            sim.store.create(policy)
            await eventually(
                lambda: demo.snapshot(sim).converged,
                "demo convergence",
                interval=0.1,
                state=cluster.summary,
            )
            await cluster.until(
                lambda: (
                    cluster.allocatable(PT).get(PASSTHROUGH) == "8"
                    and cluster.allocatable(VGPU).get("nvidia.com/GRID_T4-4Q") == "16"
                ),
                "passthrough and vGPU resources advertised",
            )
            yield cluster
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()


def _launcher(name: str, node: str, resource: str) -> str:
    """A pod shaped like the one KubeVirt makes for a VM with one host device."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "default",
                "labels": {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": name},
            },
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [
                    {
                        "name": "compute",
                        "image": VIRT_LAUNCHER,
                        "command": ["/usr/bin/virt-launcher-monitor"],
                        "resources": {"limits": {resource: "1"}, "requests": {resource: "1"}},
                    }
                ],
            },
        }
    )


def _gpu_pod(name: str, node: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [
                    {
                        "name": "cuda",
                        "image": "nvcr.io/nvidia/cuda:12.8.1-base-ubi9",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ],
            },
        }
    )


async def test_a_virt_launcher_pod_gets_the_vfio_devices_and_the_variables_kubevirt_reads() -> None:
    async with vm_fleet() as c:
        root = c.sim.node_root(PT)
        assert c.drivers(PT) == {"vfio-pci"}
        groups = {f.address: f.iommu_group for f in sysfs.nvidia_gpus(sysfs.scan(root))}
        assert all((root / "dev" / "vfio" / str(g)).exists() for g in groups.values())
        # No GFD labels on VM nodes, and no container resources there.
        assert keys.GPU_PRODUCT not in c.labels(PT)
        assert "nvidia.com/gpu" not in c.allocatable(PT)
        assert c.labels(CTR)[keys.GPU_PRODUCT] == "Tesla-T4"

        await kubectl(c.sim, "apply", "-f", "-", stdin=_launcher("vm-a", PT, PASSTHROUGH))
        await kubectl(
            c.sim, "apply", "-f", "-", stdin=_launcher("vm-b", VGPU, "nvidia.com/GRID_T4-4Q")
        )
        await kubectl(
            c.sim,
            "wait",
            "--for=condition=Ready",
            "pod/vm-a",
            "pod/vm-b",
            KUBECTL_WAIT,
        )
        passthrough = c.launched["vm-a"].allocation
        assert passthrough is not None
        (address,) = passthrough.device_ids[PASSTHROUGH]
        assert passthrough.envs == {"PCI_RESOURCE_NVIDIA_COM_GA100_A100_SXM4_40GB": address}
        assert [(d.container_path, d.host_path, d.permissions) for d in passthrough.devices] == [
            ("/dev/vfio/vfio", "/dev/vfio/vfio", "mrw"),
            (f"/dev/vfio/{groups[address]}", f"/dev/vfio/{groups[address]}", "mrw"),
        ]
        vgpu = c.launched["vm-b"].allocation
        assert vgpu is not None
        (uuid,) = vgpu.device_ids["nvidia.com/GRID_T4-4Q"]
        assert vgpu.envs == {"MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-4Q": uuid}
        assert [d.host_path for d in vgpu.devices] == ["/dev/vfio"]
        assert (c.sim.node_root(VGPU) / "sys/bus/mdev/devices" / uuid).exists()
        # What a user sees: the allocation in the container's environment, through kubectl.
        env = await kubectl(c.sim, "exec", "vm-a", "--", "env")
        assert f"PCI_RESOURCE_NVIDIA_COM_GA100_A100_SXM4_40GB={address}" in env
        # A kubelet restart: the plugin registers again and the resource comes back.
        await c.sim.restart_kubelet(PT)
        assert c.allocatable(PT).get(PASSTHROUGH) == "0"
        await c.until(
            lambda: c.allocatable(PT).get(PASSTHROUGH) == "8", "registered again after restart"
        )


async def test_a_node_moves_to_the_container_stack_and_back_with_no_pod_holding_the_other() -> None:
    async with vm_fleet() as c:
        await kubectl(c.sim, "apply", "-f", "-", stdin=_launcher("vm-a", PT, PASSTHROUGH))
        await kubectl(c.sim, "wait", "--for=condition=Ready", "pod/vm-a", KUBECTL_WAIT)

        await kubectl(
            c.sim, "label", "node", PT, "nvidia.com/gpu.workload.config=container", "--overwrite"
        )
        # The VM still holds a GPU: the container stack's driver waits and the GPUs stay on
        # vfio, so no container can get a GPU the VM has.
        await c.until(lambda: c.pods("nvidia-driver-daemonset", PT), "a driver pod on the node")
        await c.until(lambda: not c.pods("nvidia-vfio-manager", PT), "the VFIO manager gone")
        assert "vfio-pci" in c.drivers(PT)
        assert c.allocatable(PT).get("nvidia.com/gpu") in (None, "0")
        await kubectl(c.sim, "delete", "pod", "vm-a", "--wait=true")
        await c.until(
            lambda: c.allocatable(PT).get("nvidia.com/gpu") == "8",
            "nvidia.com/gpu advertised again",
        )
        assert c.drivers(PT) == {"nvidia"}
        assert c.allocatable(PT).get(PASSTHROUGH) in (None, "0")
        assert not c.pods("nvidia-sandbox-device-plugin-daemonset", PT)
        out = await kubectl(
            c.sim, "get", "node", PT, "-o", r"jsonpath={.status.allocatable.nvidia\.com/gpu}"
        )
        assert out == "8"

        # And back, with a container holding a GPU: the VFIO manager waits for it.
        await kubectl(c.sim, "apply", "-f", "-", stdin=_gpu_pod("cuda", PT))
        await kubectl(c.sim, "wait", "--for=condition=Ready", "pod/cuda", KUBECTL_WAIT)
        await kubectl(
            c.sim,
            "label",
            "node",
            PT,
            "nvidia.com/gpu.workload.config=vm-passthrough",
            "--overwrite",
        )
        await c.until(lambda: c.pods("nvidia-vfio-manager", PT), "a VFIO manager pod")
        await c.until(
            lambda: not c.pods("nvidia-device-plugin-daemonset", PT), "the device plugin gone"
        )
        await c.until(
            lambda: any(
                "waiting for 1 pod(s) holding container-stack GPUs: default/cuda"
                in e.get("message", "")
                for e in c.sim.store.list("events", session.NAMESPACE)
                if e.get("reason") == "GPUsInUse"
            ),
            "a GPUsInUse Event naming the pod",
        )
        assert "vfio-pci" not in c.drivers(PT)
        events = await kubectl(
            c.sim, "get", "events", "-n", session.NAMESPACE,
            "--field-selector", f"reason=GPUsInUse,involvedObject.name={PT}",
        )  # fmt: skip
        assert "holding container-stack GPUs: default/cuda" in events
        await kubectl(c.sim, "delete", "pod", "cuda", "--wait=true")
        await c.until(
            lambda: c.allocatable(PT).get(PASSTHROUGH) == "8",
            "the passthrough resource back",
        )
        assert c.drivers(PT) == {"vfio-pci"}
        assert c.allocatable(PT).get("nvidia.com/gpu") in (None, "0")


async def test_relabelling_a_vgpu_node_recreates_its_vgpus_and_a_bad_config_fails_clearly() -> None:
    async with vm_fleet() as c:
        await kubectl(c.sim, "label", "node", VGPU, "nvidia.com/vgpu.config=T4-1Q", "--overwrite")
        await c.until(
            lambda: (
                c.allocatable(VGPU).get("nvidia.com/GRID_T4-1Q") == "64"
                and c.labels(VGPU).get("nvidia.com/vgpu.config.state") == "success"
            ),
            "64 T4-1Q vGPUs advertised",
        )
        assert c.allocatable(VGPU).get("nvidia.com/GRID_T4-4Q") in (None, "0")
        assert c.labels(VGPU)["nvidia.com/gpu.deploy.sandbox-device-plugin"] == "true"

        await kubectl(c.sim, "label", "node", VGPU, "nvidia.com/vgpu.config=A100-4C", "--overwrite")
        await c.until(
            lambda: c.labels(VGPU).get("nvidia.com/vgpu.config.state") == "failed",
            "the A100 config refused on T4s",
        )
        events = await kubectl(
            c.sim, "get", "events", "-n", session.NAMESPACE,
            "--field-selector", "reason=VgpuConfigFailed", "-o", "jsonpath={.items[*].message}",
        )  # fmt: skip
        assert "vGPU type A100-4C is not supported on GPU 0" in events
        assert "supported: T4-1Q" in events
        # Nothing was touched: the previous vGPUs stay and stay advertised.
        assert len(sysfs.mdevs(c.sim.node_root(VGPU))) == 64
        assert c.allocatable(VGPU).get("nvidia.com/GRID_T4-1Q") == "64"
