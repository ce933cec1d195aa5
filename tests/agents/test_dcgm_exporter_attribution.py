"""Pod attribution: device ids -> entities (pure), the pod-resources client over real unix sockets
(a fake kubelet for the failure cases, kubesim's kubelet for the real thing), and the background
refresh that keeps scrapes away from the kubelet."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio
from waiting import DEADLINE, eventually

import kubeletapi
import kubesim
from gpu_operator.agents.dcgm_exporter import attribution, collector, exposition, podresources
from gpu_operator.agents.dcgm_exporter.attribution import Allocation, Topology
from gpu_operator.nvml import mock
from kubeletapi.deviceplugin.v1beta1 import api_pb2 as dp
from kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from kubeletapi.podresources.v1 import api_pb2 as pr
from kubeletapi.podresources.v1 import api_pb2_grpc as pr_grpc
from kubesim import KubeletConfig

NODE = "node-1"
TOPOLOGY = Topology(
    mig_keys={"MIG-aaaa": "2-1", "MIG-bbbb": "2-2"},
    index_keys={0: "GPU-0000", 1: "GPU-1111"},
)


# ----- device ids -> entity keys (pure) ----------------------------------------------------------


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        ("GPU-1111", ("GPU-1111", None)),
        ("GPU-1111::3", ("GPU-1111", "3")),
        ("MIG-aaaa", ("2-1", None)),
        ("MIG-bbbb::0", ("2-2", "0")),
        ("MIG-elsewhere", None),
        ("nvidia1", ("GPU-1111", None)),
        ("nvidia2/gi5", ("2-5", None)),
        ("nvidia0/vgpu3", ("GPU-0000", None)),
        ("nvidia9", None),
        ("something-else", None),
    ],
)
def test_device_ids_resolve_like_upstream(
    device_id: str, expected: tuple[str, str | None] | None
) -> None:
    assert attribution.device_key(device_id, TOPOLOGY) == expected


def test_only_gpu_resources_are_attributed() -> None:
    allocations = [
        Allocation("ns", "a", "c", "nvidia.com/gpu", "GPU-0000"),
        Allocation("ns", "b", "c", "nvidia.com/mig-1g.5gb", "MIG-aaaa"),
        Allocation("ns", "c", "c", "nvidia.com/gpu.shared", "GPU-1111::1"),
        Allocation("ns", "d", "c", "example.com/fpga", "GPU-1111"),
        Allocation("ns", "e", "c", "example.com/renamed-gpu", "GPU-1111::2"),
    ]
    found = attribution.holders(allocations, TOPOLOGY)
    assert {k: [h.pod for h in v] for k, v in found.items()} == {
        "GPU-0000": ["a"],
        "2-1": ["b"],
        "GPU-1111": ["c"],
    }
    extra = attribution.holders(allocations, TOPOLOGY, ["example.com/renamed-gpu"])
    assert [h.pod for h in extra["GPU-1111"]] == ["c", "e"]


def test_time_sliced_replicas_are_attributed_to_every_pod() -> None:
    allocations = [
        Allocation("team-b", "job-2", "main", "nvidia.com/gpu", "GPU-0000::2"),
        Allocation("team-a", "job-1", "main", "nvidia.com/gpu", "GPU-0000::0"),
        Allocation("team-a", "job-1", "main", "nvidia.com/gpu", "GPU-0000::1"),
    ]
    found = attribution.holders(allocations, TOPOLOGY)["GPU-0000"]
    assert [(h.namespace, h.pod, h.replica) for h in found] == [
        ("team-a", "job-1", "0"),
        ("team-a", "job-1", "1"),
        ("team-b", "job-2", "2"),
    ]
    assert [h.pod for h in attribution.one_per_container(found)] == ["job-1", "job-2"]


# ----- the client against a fake kubelet ---------------------------------------------------------


class FakeKubelet(pr_grpc.PodResourcesListerServicer):
    """A pod-resources server whose answer (or failure) a test sets."""

    def __init__(self) -> None:
        self.response = pr.ListPodResourcesResponse()
        self.error: grpc.StatusCode | None = None
        self.hang = asyncio.Event()
        self.hanging = False
        self.calls = 0

    async def List(
        self, request: pr.ListPodResourcesRequest, context: aio.ServicerContext
    ) -> pr.ListPodResourcesResponse:
        self.calls += 1
        if self.hanging:
            await self.hang.wait()
        if self.error is not None:
            await context.abort(self.error, "kubelet says no")
        return self.response


@contextlib.asynccontextmanager
async def fake_kubelet(socket: Path) -> AsyncIterator[FakeKubelet]:
    server = aio.server()
    kubelet = FakeKubelet()
    pr_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    try:
        yield kubelet
    finally:
        kubelet.hang.set()
        await server.stop(None)


def listing(*pods: tuple[str, str, str, str, list[str]]) -> pr.ListPodResourcesResponse:
    return pr.ListPodResourcesResponse(
        pod_resources=[
            pr.PodResources(
                name=name,
                namespace=ns,
                containers=[
                    pr.ContainerResources(
                        name=container,
                        devices=[pr.ContainerDevices(resource_name=resource, device_ids=ids)],
                    )
                ],
            )
            for ns, name, container, resource, ids in pods
        ]
    )


@pytest.fixture
def socket_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # AF_UNIX paths are short: keep the socket near the root of a fresh temp directory.
    return Path(tmp_path_factory.mktemp("pr")) / "k.sock"


async def test_list_flattens_every_device_of_every_container(socket_path: Path) -> None:
    async with fake_kubelet(socket_path) as kubelet:
        kubelet.response = listing(
            ("ml", "train", "main", "nvidia.com/gpu", ["GPU-a", "GPU-b"]),
            ("web", "nginx", "main", "cpu-only", []),
        )
        client = podresources.Client(str(socket_path))
        try:
            found = await client.list()
        finally:
            await client.close()
    assert found == [
        Allocation("ml", "train", "main", "nvidia.com/gpu", "GPU-a"),
        Allocation("ml", "train", "main", "nvidia.com/gpu", "GPU-b"),
    ]


async def test_an_answer_beyond_grpcs_default_4_mib_still_arrives(socket_path: Path) -> None:
    pods = [
        ("ns-" + "x" * 40, f"pod-{i:05d}-" + "y" * 40, "c", "nvidia.com/gpu", [f"GPU-{i}"])
        for i in range(60_000)
    ]
    async with fake_kubelet(socket_path) as kubelet:
        kubelet.response = listing(*pods)
        assert kubelet.response.ByteSize() > 4 * 1024 * 1024
        client = podresources.Client(str(socket_path))
        try:
            found = await client.list()
        finally:
            await client.close()
    assert len(found) == 60_000


async def test_a_failing_list_keeps_the_last_mapping_and_logs_once(
    socket_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with fake_kubelet(socket_path) as kubelet:
        kubelet.response = listing(("ml", "p", "c", "nvidia.com/gpu", ["GPU-a"]))
        client = podresources.Client(str(socket_path))
        mapper = podresources.PodMapper(client.list, socket_path=str(socket_path))
        try:
            assert await mapper.refresh()
            kubelet.error = grpc.StatusCode.RESOURCE_EXHAUSTED
            with caplog.at_level(logging.WARNING, "gpu_operator.agents.dcgm_exporter"):
                assert not await mapper.refresh()
                assert not await mapper.refresh()
        finally:
            await client.close()
    assert [a.pod for a in mapper.current] == ["p"]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "RESOURCE_EXHAUSTED: kubelet says no; keeping the last 1 allocations" in warnings[0]


async def test_a_missing_socket_means_no_attribution(tmp_path: Path) -> None:
    mapper = podresources.PodMapper(
        podresources.Client(str(tmp_path / "absent.sock")).list,
        socket_path=str(tmp_path / "absent.sock"),
    )
    assert not await mapper.refresh()
    assert mapper.current == ()
    assert mapper.last_error is not None
    assert "no pod-resources socket" in mapper.last_error


async def test_a_hanging_kubelet_never_delays_a_collection(socket_path: Path) -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    async with fake_kubelet(socket_path) as kubelet:
        kubelet.hanging = True
        # The List hangs for longer than the wait below: a collection that waited for it fails.
        client = podresources.Client(str(socket_path), timeout=3600)
        mapper = podresources.PodMapper(client.list, socket_path=str(socket_path))
        settings = collector.Settings(interval=3600, first_mapping_wait=0.1)
        exporter = collector.Collector(machine.nvml, settings, mapper)
        exporter.start()
        stop = asyncio.Event()
        task = asyncio.create_task(exporter.run(stop))
        try:
            await exporter.wait_for_collections(1, timeout=DEADLINE)
            assert kubelet.calls == 1  # the List is still outstanding
            assert b"DCGM_FI_DEV_GPU_TEMP" in exporter.text
        finally:
            stop.set()
            kubelet.hang.set()
            await task
            exporter.stop()
            await client.close()


# ----- kubesim's kubelet: device manager + pod-resources API -------------------------------------


class GpuPlugin(dp_grpc.DevicePluginServicer):
    """The smallest device plugin: advertises ids under one resource and allocates them."""

    def __init__(self, sim: kubesim.Cluster, resource: str, ids: list[str], endpoint: str):
        self.sim = sim
        self.resource = resource
        self.ids = ids
        self.endpoint = endpoint
        self.server: aio.Server | None = None

    @property
    def directory(self) -> Path:
        return self.sim.node_root(NODE) / kubeletapi.DEVICE_PLUGIN_PATH.lstrip("/")

    async def start(self) -> None:
        self.server = aio.server()
        dp_grpc.add_DevicePluginServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{self.directory / self.endpoint}")
        await self.server.start()
        async with aio.insecure_channel(f"unix://{self.directory / 'kubelet.sock'}") as channel:
            await dp_grpc.RegistrationStub(channel).Register(
                dp.RegisterRequest(
                    version="v1beta1", endpoint=self.endpoint, resource_name=self.resource
                )
            )

    async def GetDevicePluginOptions(
        self, request: dp.Empty, context: aio.ServicerContext
    ) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions()

    async def ListAndWatch(
        self, request: dp.Empty, context: aio.ServicerContext
    ) -> AsyncIterator[dp.ListAndWatchResponse]:
        yield dp.ListAndWatchResponse(
            devices=[dp.Device(ID=i, health=kubeletapi.HEALTHY) for i in self.ids]
        )
        await asyncio.Event().wait()

    async def Allocate(
        self, request: dp.AllocateRequest, context: aio.ServicerContext
    ) -> dp.AllocateResponse:
        return dp.AllocateResponse(
            container_responses=[dp.ContainerAllocateResponse() for _ in request.container_requests]
        )


def gpu_pod(name: str, resource: str, count: int, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": NODE,
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvcr.io/nvidia/cuda:12.4.0-base",
                    "resources": {"limits": {resource: str(count)}},
                }
            ],
        },
    }


@pytest.fixture
async def sim() -> AsyncIterator[kubesim.Cluster]:
    config = KubeletConfig(instant=True, lease_interval=None)
    async with kubesim.Cluster(nodes=1, kubelet=config) as cluster:
        await cluster.start_device_manager(NODE)
        yield cluster


async def running(sim: kubesim.Cluster, *names: str, namespace: str = "default") -> None:
    def all_running() -> bool:
        pods = [sim.store.get("pods", n, namespace) or {} for n in names]
        return all((p.get("status") or {}).get("phase") == "Running" for p in pods)

    await eventually(
        all_running,
        f"{names} running",
        state=lambda: {
            n: ((sim.store.get("pods", n, namespace) or {}).get("status") or {}).get("phase")
            for n in names
        },
    )


async def attributed_text(sim: kubesim.Cluster, machine: mock.MockMachine) -> str:
    socket = sim.node_root(NODE) / kubeletapi.POD_RESOURCES_SOCKET.lstrip("/")
    client = podresources.Client(str(socket))
    mapper = podresources.PodMapper(client.list, socket_path=str(socket))
    settings = collector.Settings(options=exposition.Options(hostname=NODE))
    exporter = collector.Collector(machine.nvml, settings, mapper)
    exporter.start()
    try:
        assert await mapper.refresh(), mapper.last_error
        return exporter.render_once().decode()
    finally:
        exporter.stop()
        await client.close()


def holders_by_gpu(text: str, metric: str = "DCGM_FI_DEV_GPU_TEMP") -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.startswith(metric + "{"):
            continue
        key = re.search(r'gpu="(\d+)"', line).group(1)  # type: ignore[union-attr]
        gi = re.search(r'GPU_I_ID="(\d+)"', line)
        if gi:
            key += f"-{gi.group(1)}"
        pod = re.search(r'namespace="([^"]+)",pod="([^"]+)"', line)
        out.setdefault(key, []).extend([f"{pod.group(1)}/{pod.group(2)}"] if pod else [])
    return out


async def test_kubesim_pod_resources_attribute_whole_gpus_to_their_pods(
    sim: kubesim.Cluster,
) -> None:
    machine = mock.MockMachine.from_preset("dgx-a100")
    uuids = [g.uuid for g in machine.gpus]
    plugin = GpuPlugin(sim, "nvidia.com/gpu", uuids, "nvidia-gpu.sock")
    await plugin.start()
    await sim.wait_for(
        lambda: (
            (sim.store.get("nodes", NODE) or {})["status"]["allocatable"].get("nvidia.com/gpu")
            == "8"
        ),
        timeout=DEADLINE,
        message="8 GPUs allocatable",
    )
    sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    sim.store.create(gpu_pod("trainer", "nvidia.com/gpu", 2, "ml"))
    sim.store.create(gpu_pod("notebook", "nvidia.com/gpu", 1))
    await running(sim, "trainer", namespace="ml")
    await running(sim, "notebook")
    manager = sim.device_manager(NODE)
    assert manager is not None
    text = await attributed_text(sim, machine)
    held = holders_by_gpu(text)
    assert sorted(p for pods in held.values() for p in pods) == [
        "default/notebook", "ml/trainer", "ml/trainer",
    ]  # fmt: skip
    assert sum(1 for pods in held.values() if not pods) == 5
    assert 'container="cuda"' in text
    assert plugin.server is not None
    await plugin.server.stop(None)


async def test_kubesim_pod_resources_attribute_mig_devices_and_shared_replicas(
    sim: kubesim.Cluster,
) -> None:
    machine = mock.MockMachine.from_preset("dgx-a100-mig-mixed")
    lib = machine.nvml()
    lib.init()
    gpu0 = lib.device_by_index(0)
    migs = [gpu0.mig_device_by_index(j) for j in range(4)]
    small = [m.uuid() for m in migs if m.name().endswith("MIG 1g.5gb")]
    small_gi = [m.gpu_instance_id() for m in migs if m.name().endswith("MIG 1g.5gb")]
    replicas = [f"{small[0]}::{n}" for n in range(2)]
    mig_plugin = GpuPlugin(sim, "nvidia.com/mig-1g.5gb", replicas, "mig.sock")
    await mig_plugin.start()
    await sim.wait_for(
        lambda: (
            (sim.store.get("nodes", NODE) or {})["status"]["allocatable"].get(
                "nvidia.com/mig-1g.5gb"
            )
            == "2"
        ),
        timeout=DEADLINE,
        message="2 MIG replicas allocatable",
    )
    sim.store.create(gpu_pod("infer-a", "nvidia.com/mig-1g.5gb", 1))
    sim.store.create(gpu_pod("infer-b", "nvidia.com/mig-1g.5gb", 1))
    await running(sim, "infer-a", "infer-b")
    text = await attributed_text(sim, machine)
    held = holders_by_gpu(text, "DCGM_FI_DEV_FB_USED")
    assert held[f"0-{small_gi[0]}"] == ["default/infer-a", "default/infer-b"]
    assert held[f"0-{small_gi[1]}"] == []
    assert mig_plugin.server is not None
    await mig_plugin.server.stop(None)
