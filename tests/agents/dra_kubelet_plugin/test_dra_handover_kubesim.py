"""Never both on one GPU: one node filled both ways at once while it moves from the device plugin
to DRA, on a mixed fleet (kubesim, mock GPUs, our device plugin and our DRA kubelet plugin over the
kubelet's real sockets).

Node `mover` (8 mock GPUs) runs the device plugin and four pods holding a GPU each through it.
Then, at once: the node is labelled for DRA, our DRA plugin starts there (its DaemonSet's pod),
the device plugin leaves it (the operator's `gpu.deploy.device-plugin=false`), and more
device-plugin pods and eight claim pods are created. A sampler checks, all along, that no GPU
UUID is handed out twice: the kubelet's device-plugin assignments plus the claims'
`status.allocation` results, per UUID, never above one. Node `steady` keeps the device plugin."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubesim_helpers import TEST_IMAGES
from waiting import DEADLINE, eventually, within

import kubeletapi
import kubesim
from gpu_operator.agents.device_plugin import manager
from gpu_operator.agents.device_plugin import settings as dp_settings
from gpu_operator.agents.dra_kubelet_plugin import plugin
from gpu_operator.api import keys
from gpu_operator.kube import client as kube_client
from gpu_operator.kube.resource_slices import SliceApi
from gpu_operator.nvml import mock
from kubesim import KubeletConfig

MOVER = "mover"
STEADY = "steady"
GPU = "nvidia.com/gpu"

CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}]},
}
TEMPLATE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "one-gpu", "namespace": "default"},
    "spec": {
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
            }
        }
    },
}


def dp_pod(name: str, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "cuda", "image": "example/app:1", "resources": {"limits": {GPU: "1"}}}
        ]
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def claim_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [
                {
                    "name": "main",
                    "image": "example/app:1",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


class DevicePlugin:
    def __init__(self, sim: kubesim.Cluster, node: str, machine: mock.MockMachine) -> None:
        root = sim.node_root(node)
        settings = dp_settings.build(
            None,
            {},
            kubelet_socket=root / kubeletapi.KUBELET_SOCKET.lstrip("/"),
            plugin_dir=root / kubeletapi.DEVICE_PLUGIN_PATH.lstrip("/"),
            cdi_root=root / "var/run/cdi",
            driver_root_view=root,
            dev_root_view=root,
            sys_root=root,
            mps_root_view=root / "run/nvidia/mps",
            recheck_interval=0.05,
            retry_interval=0.2,
            kubelet_poll_interval=0.05,
        )
        self.manager = manager.Manager(settings, machine.nvml)
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.manager.run(stop=self.stop, install_signals=False))

    async def started(self) -> None:
        await within(self.manager.state.serving.wait(), "the device plugin to serve", DEADLINE)

    async def leave(self) -> None:
        self.stop.set()
        await within(self.task, "the device plugin to stop", DEADLINE)


class DraPlugin:
    def __init__(self, sim: kubesim.Cluster, node: str, machine: mock.MockMachine) -> None:
        root = sim.node_root(node)
        settings = plugin.Settings(
            node_name=node,
            kubelet_root_view=root / "var/lib/kubelet",
            cdi_root=root / "var/run/cdi",
            driver_root_view=root,
            dev_root_view=root,
            sys_root=root,
            proc_root=root,
            rescan_interval=0.05,
            recheck_interval=0.1,
        )
        api = SliceApi(kube_client.connect(str(sim.kubeconfig_path)), node, "gpu.nvidia.com")
        self.plugin = plugin.Plugin(settings, machine.nvml, api, simulated=True)
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.task = asyncio.create_task(self.plugin.run(self.stop))
        await within(self.plugin.registered.wait(), "the DRA plugin to register", DEADLINE)

    async def leave(self) -> None:
        self.stop.set()
        if self.task is not None:
            await within(self.task, "the DRA plugin to stop", DEADLINE)


@pytest.fixture
async def sim() -> AsyncIterator[kubesim.Cluster]:
    config = KubeletConfig(
        instant=True, lease_interval=None, dra_plugin_watch_interval=0.02, dra_wiping_delay=60
    )
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=0, kubelet=config) as cluster:
        for node in (MOVER, STEADY):
            cluster.add_node(node)
            await cluster.start_device_manager(node)
            await cluster.start_dra_manager(node)
        cluster.store.create(CLASS)
        cluster.store.create(TEMPLATE)
        yield cluster


def handed_out(sim: kubesim.Cluster, dra_uuids: dict[str, str]) -> Counter[str]:
    """Per GPU UUID: device-plugin assignments (the kubelet's, as its checkpoint and the
    pod-resources API hold them) plus DRA allocations (claims' status.allocation)."""
    count: Counter[str] = Counter()
    for node in (MOVER, STEADY):
        dm = sim.device_manager(node)
        assert dm is not None
        for containers in list(dm.pod_devices.values()):
            for resources in containers.values():
                assigned = resources.get(GPU)
                if assigned is not None:
                    count.update(assigned.ids)
    for claim in sim.store.list("resourceclaims", "default"):
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") == "gpu.nvidia.com":
                count[dra_uuids[result["device"]]] += 1
    return count


def phase(sim: kubesim.Cluster, name: str) -> str:
    pod = sim.store.get("pods", name, "default")
    return str((pod.get("status") or {}).get("phase"))


def node_of(sim: kubesim.Cluster, name: str) -> str | None:
    return sim.store.get("pods", name, "default")["spec"].get("nodeName")


def published(sim: kubesim.Cluster) -> set[str]:
    return {
        d["name"]
        for s in sim.store.list("resourceslices")
        if s["spec"]["driver"] == "gpu.nvidia.com" and s["spec"]["nodeName"] == MOVER
        for d in s["spec"]["devices"]
    }


async def test_a_node_filled_both_ways_at_once_never_hands_a_gpu_out_twice(
    sim: kubesim.Cluster,
) -> None:
    mover = mock.MockMachine.from_preset("dgx-a100", seed=11)
    steady = mock.MockMachine.from_preset("dgx-a100", seed=22)
    dra_uuids = {f"gpu-{g.index}": g.uuid for g in mover.gpus}
    assert len(dra_uuids) == 8
    mover_dp = DevicePlugin(sim, MOVER, mover)
    steady_dp = DevicePlugin(sim, STEADY, steady)
    dra = DraPlugin(sim, MOVER, mover)
    worst: Counter[str] = Counter()
    stop_sampling = asyncio.Event()

    async def sample() -> None:
        while not stop_sampling.is_set():
            for uuid, n in handed_out(sim, dra_uuids).items():
                worst[uuid] = max(worst[uuid], n)
            await asyncio.sleep(0.005)

    sampler = asyncio.create_task(sample())
    try:
        await mover_dp.started()
        await steady_dp.started()
        alloc = lambda n: sim.store.get("nodes", n)["status"]["allocatable"].get(GPU)  # noqa: E731
        await eventually(lambda: alloc(MOVER) == "8" and alloc(STEADY) == "8", "8 GPUs each")
        held = [f"held-{i}" for i in range(4)]
        for name in held:
            sim.store.create(dp_pod(name, MOVER))
        await eventually(
            lambda: all(phase(sim, n) == "Running" for n in held),
            "held pods run",
            state=lambda: {n: sim.store.get("pods", n, "default").get("status") for n in held},
        )

        # All at once: the label, the DRA plugin's pod, the device plugin leaving, new pods.
        node = sim.store.get("nodes", MOVER)
        node["metadata"].setdefault("labels", {})[keys.DRA_NODE] = "true"
        sim.store.replace(sim.store.registry.resolve("nodes"), node, namespace="", name=MOVER)
        claimers = [f"claim-{i}" for i in range(8)]
        newcomers = [f"dp-{i}" for i in range(4)]

        async def create_pods() -> None:
            for a, b in zip(claimers, newcomers + newcomers, strict=True):
                sim.store.create(claim_pod(a))
                if a in {f"claim-{i}" for i in range(4)}:
                    sim.store.create(dp_pod(b))
                await asyncio.sleep(0)

        await asyncio.gather(dra.start(), create_pods(), mover_dp.leave())

        # The device plugin's pods keep their GPUs; DRA serves the other four.
        await eventually(lambda: alloc(MOVER) == "0", "mover's nvidia.com/gpu allocatable at 0")
        twice = lambda: {u: n for u, n in worst.items() if n > 1}  # noqa: E731
        await eventually(
            lambda: twice() or len(published(sim)) == 4, "the four free GPUs published"
        )
        assert not twice(), f"GPUs handed out twice: {twice()}"
        mover_dm = sim.device_manager(MOVER)
        assert mover_dm is not None
        dp_held = mover_dm.in_use(GPU)
        assert len(dp_held) == 4
        assert dra.plugin.handover.blocked is None
        assert len(dra.plugin.handover.reasons) == 4
        assert {dra_uuids[d] for d in published(sim)} == set(dra_uuids.values()) - dp_held
        await eventually(
            lambda: sum(phase(sim, n) == "Running" for n in claimers) == 4, "four claim pods run"
        )
        for name in newcomers:
            await eventually(lambda n=name: phase(sim, n) in ("Running", "Failed"), f"{name} ends")
            if phase(sim, name) == "Running":
                # Scheduled while the mover still offered nvidia.com/gpu, admitted by its kubelet.
                assert node_of(sim, name) in (STEADY, MOVER)

        # The held pods go: their GPUs are published and the other claim pods run.
        for name in held:
            sim.store.delete("pods", name, "default")
        await eventually(
            lambda: (
                len(published(sim))
                >= 8
                - sum(phase(sim, n) == "Running" and node_of(sim, n) == MOVER for n in newcomers)
            ),
            "the freed GPUs published",
        )
        running_dp_on_mover = sum(
            phase(sim, n) == "Running" and node_of(sim, n) == MOVER for n in newcomers
        )
        await eventually(
            lambda: sum(phase(sim, n) == "Running" for n in claimers) == 8 - running_dp_on_mover,
            "the claim pods run on the freed GPUs",
        )
    finally:
        stop_sampling.set()
        await sampler
        await dra.leave()
        await steady_dp.leave()
        with contextlib.suppress(Exception):
            await mover_dp.leave()
    seen_twice = {u: n for u, n in worst.items() if n > 1}
    assert not seen_twice, f"GPUs handed out twice: {seen_twice}"
    assert worst, "the sampler saw no allocation"
