"""The kubelet's device manager and pod-resources API over real unix sockets, with a small fake
device plugin written here (the gRPC server side) and real kubectl for what users see."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio
from kubesim_helpers import TEST_IMAGES, kubectl, needs_kubectl
from waiting import DEADLINE, eventually

import kubeletapi
import kubesim
from kubeletapi.deviceplugin.v1beta1 import api_pb2 as dp
from kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from kubeletapi.podresources.v1 import api_pb2 as pr
from kubeletapi.podresources.v1 import api_pb2_grpc as pr_grpc
from kubesim import KubeletConfig, PodContext

ROOT = Path(__file__).resolve().parents[2]
RESOURCE = "example.com/widget"
NODE = "node-1"


class FakePlugin(dp_grpc.DevicePluginServicer):
    """A device plugin serving `resource` on its own socket in a node's plugin directory."""

    def __init__(
        self,
        sim: kubesim.Cluster,
        devices: dict[str, str],
        *,
        node: str = NODE,
        resource: str = RESOURCE,
        endpoint: str = "widget.sock",
        preferred: list[str] | None = None,
        pre_start: bool = False,
        allocate_error: str | None = None,
        numa: dict[str, int] | None = None,
    ) -> None:
        self.sim = sim
        self.node = node
        self.resource = resource
        self.endpoint = endpoint
        self.devices = dict(devices)
        self.preferred = preferred
        self.pre_start = pre_start
        self.allocate_error = allocate_error
        self.numa = numa or {}
        self.allocate_calls: list[list[str]] = []
        self.preferred_calls: list[dp.ContainerPreferredAllocationRequest] = []
        self.pre_start_calls: list[list[str]] = []
        self.streams = 0
        self._watchers: set[asyncio.Queue[None]] = set()
        self._server: aio.Server | None = None

    @property
    def plugin_dir(self) -> Path:
        return self.sim.node_root(self.node) / kubeletapi.DEVICE_PLUGIN_PATH.lstrip("/")

    async def start(self) -> None:
        self._server = aio.server()
        dp_grpc.add_DevicePluginServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.plugin_dir / self.endpoint}")
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

    async def register(self, *, version: str = "v1beta1", resource: str | None = None) -> None:
        """Call Register on the node's kubelet.sock (raises the kubelet's refusal)."""
        async with aio.insecure_channel(f"unix://{self.plugin_dir / 'kubelet.sock'}") as channel:
            await dp_grpc.RegistrationStub(channel).Register(
                dp.RegisterRequest(
                    version=version,
                    endpoint=self.endpoint,
                    resource_name=resource or self.resource,
                    options=dp.DevicePluginOptions(
                        pre_start_required=self.pre_start,
                        get_preferred_allocation_available=self.preferred is not None,
                    ),
                )
            )

    def set_devices(self, devices: dict[str, str]) -> None:
        """Change the device list; every ListAndWatch stream sends it."""
        self.devices = dict(devices)
        for queue in self._watchers:
            queue.put_nowait(None)

    def _listing(self) -> dp.ListAndWatchResponse:
        devices = []
        for device_id, health in self.devices.items():
            device = dp.Device(ID=device_id, health=health)
            if device_id in self.numa:
                device.topology.nodes.append(dp.NUMANode(ID=self.numa[device_id]))
            devices.append(device)
        return dp.ListAndWatchResponse(devices=devices)

    async def GetDevicePluginOptions(
        self, request: dp.Empty, context: aio.ServicerContext
    ) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(
            pre_start_required=self.pre_start,
            get_preferred_allocation_available=self.preferred is not None,
        )

    async def ListAndWatch(
        self, request: dp.Empty, context: aio.ServicerContext
    ) -> AsyncIterator[dp.ListAndWatchResponse]:
        queue: asyncio.Queue[None] = asyncio.Queue()
        self._watchers.add(queue)
        self.streams += 1
        try:
            yield self._listing()
            while True:
                await queue.get()
                yield self._listing()
        finally:
            self.streams -= 1
            self._watchers.discard(queue)

    async def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: aio.ServicerContext
    ) -> dp.PreferredAllocationResponse:
        self.preferred_calls.extend(request.container_requests)
        return dp.PreferredAllocationResponse(
            container_responses=[dp.ContainerPreferredAllocationResponse(deviceIDs=self.preferred)]
        )

    async def Allocate(
        self, request: dp.AllocateRequest, context: aio.ServicerContext
    ) -> dp.AllocateResponse:
        if self.allocate_error is not None:
            await context.abort(grpc.StatusCode.UNKNOWN, self.allocate_error)
        responses = []
        for container in request.container_requests:
            ids = list(container.devices_ids)
            self.allocate_calls.append(ids)
            responses.append(
                dp.ContainerAllocateResponse(
                    envs={"WIDGETS": ",".join(ids), "SHARED": "from-plugin"},
                    mounts=[
                        dp.Mount(container_path="/opt/widget", host_path="/opt/w", read_only=True)
                    ],
                    devices=[
                        dp.DeviceSpec(
                            container_path=f"/dev/{i}", host_path=f"/dev/{i}", permissions="rw"
                        )
                        for i in ids
                    ],
                    annotations={"widget.example.com/ids": ",".join(ids)},
                    cdi_devices=[dp.CDIDevice(name=f"example.com/widget={i}") for i in ids],
                )
            )
        return dp.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: aio.ServicerContext
    ) -> dp.PreStartContainerResponse:
        self.pre_start_calls.append(list(request.devices_ids))
        return dp.PreStartContainerResponse()


def config(**kw: Any) -> KubeletConfig:
    """An instant kubelet (no heartbeats); keywords override device-manager settings."""
    return KubeletConfig(instant=True, lease_interval=None, **kw)


@pytest.fixture
async def sim() -> AsyncIterator[kubesim.Cluster]:
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=config()) as cluster:
        yield cluster


@contextlib.asynccontextmanager
async def plugin(
    sim: kubesim.Cluster, devices: dict[str, str], **kw: Any
) -> AsyncIterator[FakePlugin]:
    """A started, registered fake plugin (stopped afterwards)."""
    await sim.start_device_manager(kw.get("node", NODE))
    fake = FakePlugin(sim, devices, **kw)
    await fake.start()
    try:
        await fake.register()
        yield fake
    finally:
        await fake.stop()


def healthy(*ids: str) -> dict[str, str]:
    return dict.fromkeys(ids, kubeletapi.HEALTHY)


def node_resource(
    sim: kubesim.Cluster, name: str = RESOURCE, node: str = NODE
) -> tuple[str | None, str | None]:
    status = (sim.store.get("nodes", node) or {}).get("status") or {}
    return (status.get("capacity") or {}).get(name), (status.get("allocatable") or {}).get(name)


async def wait_resource(sim: kubesim.Cluster, capacity: str, allocatable: str) -> None:
    await eventually(
        lambda: node_resource(sim) == (capacity, allocatable),
        f"{RESOURCE} capacity/allocatable {capacity}/{allocatable}",
        state=lambda: node_resource(sim),
    )


def pod(
    name: str, widgets: int, *, node: str = NODE, command: bool = False, **spec: Any
) -> dict[str, Any]:
    """A pod bound to a node (no scheduler) whose container asks for widgets."""
    container: dict[str, Any] = {
        "name": "main",
        "image": "example/app:1",
        "resources": {"limits": {RESOURCE: str(widgets)}},
    }
    if command:
        container["command"] = ["run-once"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never" if command else "Always",
            "containers": [container],
            **spec,
        },
    }


def phase(sim: kubesim.Cluster, name: str) -> str | None:
    obj = sim.store.get("pods", name, "default") or {}
    return (obj.get("status") or {}).get("phase")


async def wait_phase(sim: kubesim.Cluster, name: str, wanted: str) -> dict[str, Any]:
    await eventually(
        lambda: phase(sim, name) == wanted,
        f"pod {name} {wanted}",
        state=lambda: (sim.store.get("pods", name, "default") or {}).get("status"),
    )
    return sim.store.get("pods", name, "default") or {}


def held(sim: kubesim.Cluster, name: str) -> list[str]:
    """The widgets a pod's containers hold, from the node's device manager."""
    manager = sim.device_manager(NODE)
    assert manager is not None
    uid = (sim.store.get("pods", name, "default") or {})["metadata"]["uid"]
    return sorted(
        device
        for containers in [manager.pod_devices.get(uid, {})]
        for resources in containers.values()
        for assigned in resources.values()
        for device in assigned.ids
    )


def checkpoint(sim: kubesim.Cluster) -> dict[str, Any]:
    path = sim.node_root(NODE) / kubeletapi.CHECKPOINT_FILE.lstrip("/")
    result: dict[str, Any] = json.loads(path.read_text())
    return result


# ----- generated code ---------------------------------------------------------------------------


def test_generated_kubelet_api_modules_match_their_protos() -> None:
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpcio-tools (a dev dependency) is not installed")
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_kubelet_protos.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_kubelet_api_method_paths_are_the_kubelets() -> None:
    # The proto packages make the gRPC paths real kubelets and plugins use.
    registration = dp.DESCRIPTOR.services_by_name["Registration"]
    plugin_service = dp.DESCRIPTOR.services_by_name["DevicePlugin"]
    lister = pr.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert registration.full_name == "v1beta1.Registration"
    assert sorted(m.name for m in plugin_service.methods) == [
        "Allocate",
        "GetDevicePluginOptions",
        "GetPreferredAllocation",
        "ListAndWatch",
        "PreStartContainer",
    ]
    assert lister.full_name == "v1.PodResourcesLister"
    assert dp.ContainerAllocateResponse.DESCRIPTOR.fields_by_name["cdi_devices"].number == 5
    assert pr.DynamicResource.DESCRIPTOR.fields_by_name["claim_name"].number == 2


# ----- registration and capacity ---------------------------------------------------------------


async def test_registered_plugin_devices_become_node_capacity_and_allocatable(
    sim: kubesim.Cluster,
) -> None:
    async with plugin(sim, healthy("w0", "w1")) as fake:
        await wait_resource(sim, "2", "2")
        fake.set_devices(healthy("w0", "w1", "w2"))
        await wait_resource(sim, "3", "3")
        manager = sim.device_manager(NODE)
        assert manager is not None
        assert manager.devices(RESOURCE) == healthy("w0", "w1", "w2")


async def test_unhealthy_device_stays_in_capacity_and_leaves_allocatable(
    sim: kubesim.Cluster,
) -> None:
    async with plugin(sim, healthy("w0", "w1")) as fake:
        await wait_resource(sim, "2", "2")
        fake.set_devices({"w0": kubeletapi.HEALTHY, "w1": kubeletapi.UNHEALTHY})
        await wait_resource(sim, "2", "1")
        fake.set_devices(healthy("w0", "w1"))
        await wait_resource(sim, "2", "2")


async def test_plugin_that_goes_away_drops_allocatable_then_capacity_after_grace() -> None:
    cfg = config(device_plugin_grace_period=0.3)
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=cfg) as sim:
        # Every value the node goes through (the store calls this on each write): the 0.3 s of
        # the middle state may pass between two polls of a loaded machine.
        seen: list[tuple[str | None, str | None]] = []

        def record(_event: object) -> None:
            if not seen or seen[-1] != node_resource(sim):
                seen.append(node_resource(sim))

        unsubscribe = sim.store.subscribe(record, keys=[("", "nodes")])
        try:
            async with plugin(sim, healthy("w0", "w1")):
                await wait_resource(sim, "2", "2")
                del seen[:-1]  # from the healthy state on
            # Stream ended: the kubelet marks every device unhealthy and keeps capacity...
            # ...until the grace period ends; the resource then stays on the node at 0.
            await wait_resource(sim, "0", "0")
        finally:
            unsubscribe()
        assert seen == [("2", "2"), ("2", "0"), ("0", "0")]


async def test_registration_refusals_carry_the_kubelets_messages(sim: kubesim.Cluster) -> None:
    await sim.start_device_manager(NODE)
    fake = FakePlugin(sim, healthy("w0"))
    await fake.start()
    try:
        cases = [
            (
                {"version": "v1alpha1"},
                'requested API version "v1alpha1" is not supported by kubelet. '
                'Supported versions are ["v1beta1"]',
            ),
            ({"resource": "widget"}, 'the ResourceName "widget" is invalid'),
            (
                {"resource": "kubernetes.io/widget"},
                'the ResourceName "kubernetes.io/widget" is invalid',
            ),
            (
                {"resource": "Example.com/widget"},
                'the ResourceName "Example.com/widget" is invalid',
            ),
        ]
        for kwargs, message in cases:
            with pytest.raises(aio.AioRpcError) as caught:
                await fake.register(**kwargs)
            assert caught.value.code() == grpc.StatusCode.UNKNOWN
            assert caught.value.details() == message
        missing = FakePlugin(sim, healthy("w0"), endpoint="missing.sock")
        manager = sim.device_manager(NODE)
        assert manager is not None
        # A missing socket never answers: fail the dial after 1 s instead of the default 10.
        # (Only here: a dial of a live plugin on a loaded machine must not time out.)
        manager.dial_timeout = 1.0
        with pytest.raises(aio.AioRpcError) as caught:
            await missing.register()
        assert caught.value.details() == "failed to dial device plugin: context deadline exceeded"
        assert node_resource(sim) == (None, None)
    finally:
        await fake.stop()


async def test_second_registration_of_a_resource_takes_over_from_the_first(
    sim: kubesim.Cluster,
) -> None:
    # kubelet 1.35 accepts the newest registration of a resource name (a restarted plugin
    # must get back in) and stops following the previous plugin.
    async with plugin(sim, healthy("w0", "w1")) as first:
        await wait_resource(sim, "2", "2")
        async with plugin(sim, healthy("w0", "w1", "w2"), endpoint="widget-2.sock") as second:
            await wait_resource(sim, "3", "3")
            await sim.wait_for(
                lambda: first.streams == 0, timeout=DEADLINE, message="first stream closed"
            )
            assert second.streams == 1
            first.set_devices(healthy("w0"))  # the old plugin no longer counts
            second.set_devices(healthy("w0", "w1", "w2", "w3"))
            await wait_resource(sim, "4", "4")


# ----- admission ---------------------------------------------------------------------------------


async def test_allocation_reaches_the_runner_with_envs_mounts_devices_and_cdi(
    sim: kubesim.Cluster,
) -> None:
    seen: list[PodContext] = []

    async def runner(ctx: PodContext) -> int:
        seen.append(ctx)
        return 0

    sim.register_pod_runner(runner, image="example/app")
    async with plugin(sim, healthy("w0", "w1", "w2")) as fake:
        await wait_resource(sim, "3", "3")
        manifest = pod("app", 2, command=True)
        manifest["spec"]["containers"][0]["env"] = [{"name": "SHARED", "value": "from-pod"}]
        sim.store.create(manifest)
        await wait_phase(sim, "app", "Succeeded")
    (ctx,) = seen
    allocation = ctx.allocation
    assert allocation is not None
    assert dict(allocation.device_ids) == {RESOURCE: ("w0", "w1")}
    assert fake.allocate_calls == [["w0", "w1"]]
    assert allocation.envs["WIDGETS"] == "w0,w1"
    assert [(m.container_path, m.host_path, m.read_only) for m in allocation.mounts] == [
        ("/opt/widget", "/opt/w", True)
    ]
    assert [(d.container_path, d.permissions) for d in allocation.devices] == [
        ("/dev/w0", "rw"),
        ("/dev/w1", "rw"),
    ]
    assert allocation.annotations == {"widget.example.com/ids": "w0,w1"}
    assert allocation.cdi_devices == ("example.com/widget=w0", "example.com/widget=w1")
    # The runtime adds the plugin's variables; the container's own setting wins.
    assert ctx.env["WIDGETS"] == "w0,w1"
    assert ctx.env["SHARED"] == "from-pod"


async def test_preferred_allocation_is_asked_for_and_honoured(sim: kubesim.Cluster) -> None:
    async with plugin(sim, healthy("w0", "w1", "w2", "w3"), preferred=["w3", "w1"]) as fake:
        await wait_resource(sim, "4", "4")
        sim.store.create(pod("app", 2))
        await wait_phase(sim, "app", "Running")
        assert held(sim, "app") == ["w1", "w3"]
        (request,) = fake.preferred_calls
        assert list(request.available_deviceIDs) == ["w0", "w1", "w2", "w3"]
        assert list(request.must_include_deviceIDs) == []
        assert request.allocation_size == 2


async def test_plugin_without_preferred_allocation_gets_the_kubelets_choice(
    sim: kubesim.Cluster,
) -> None:
    async with plugin(sim, healthy("w2", "w0", "w1")) as fake:
        await wait_resource(sim, "3", "3")
        sim.store.create(pod("app", 2))
        await wait_phase(sim, "app", "Running")
        assert fake.preferred_calls == []
        assert held(sim, "app") == ["w0", "w1"]


async def test_allocate_error_rejects_the_pod_with_unexpected_admission_error(
    sim: kubesim.Cluster,
) -> None:
    async with plugin(sim, healthy("w0"), allocate_error="widget w0 is on fire"):
        await wait_resource(sim, "1", "1")
        sim.store.create(pod("app", 1))
        obj = await wait_phase(sim, "app", "Failed")
    message = (
        "Allocate failed due to rpc error: code = Unknown desc = widget w0 is on fire, "
        "which is unexpected"
    )
    status = obj["status"]
    assert status["reason"] == "UnexpectedAdmissionError"
    assert status["message"] == f"Pod was rejected: {message}"
    assert "containerStatuses" not in status
    events = [
        e for e in sim.store.list("events", "default") if e["reason"] == "UnexpectedAdmissionError"
    ]
    assert [(e["type"], e["message"]) for e in events] == [("Warning", message)]
    assert held(sim, "app") == []


async def test_too_few_free_devices_reject_the_pod_with_the_kubelets_message(
    sim: kubesim.Cluster,
) -> None:
    async with plugin(sim, healthy("w0", "w1")):
        await wait_resource(sim, "2", "2")
        sim.store.create(pod("first", 1))
        await wait_phase(sim, "first", "Running")
        sim.store.create(pod("second", 2))  # bound directly: no scheduler to keep it Pending
        obj = await wait_phase(sim, "second", "Failed")
    assert obj["status"]["message"] == (
        f"Pod was rejected: Allocate failed due to requested number of devices unavailable for "
        f"{RESOURCE}. Requested: 2, Available: 1, which is unexpected"
    )


async def test_devices_are_freed_when_a_pod_ends_or_is_deleted(sim: kubesim.Cluster) -> None:
    async with plugin(sim, healthy("w0")):
        await wait_resource(sim, "1", "1")
        sim.store.create(pod("once", 1, command=True))
        await wait_phase(sim, "once", "Succeeded")
        assert held(sim, "once") == []
        sim.store.create(pod("server", 1))
        await wait_phase(sim, "server", "Running")
        assert held(sim, "server") == ["w0"]
        sim.store.delete("pods", "server", "default")
        await sim.wait_for(
            lambda: sim.store.get("pods", "server", "default") is None, timeout=DEADLINE
        )
        sim.store.create(pod("next", 1))
        await wait_phase(sim, "next", "Running")
        assert held(sim, "next") == ["w0"]
        entries = checkpoint(sim)["Data"]["PodDeviceEntries"]
        assert [(e["ContainerName"], e["DeviceIDs"]) for e in entries] == [("main", {"-1": ["w0"]})]


async def test_init_container_devices_are_reused_by_the_app_container(
    sim: kubesim.Cluster,
) -> None:
    async with plugin(sim, healthy("w0", "w1", "w2")) as fake:
        await wait_resource(sim, "3", "3")
        init = {
            "name": "setup",
            "image": "example/setup:1",
            "resources": {"limits": {RESOURCE: "2"}},
        }
        sim.store.create(pod("app", 2, initContainers=[init]))
        await wait_phase(sim, "app", "Running")
        # The app container takes the init container's devices instead of new ones.
        assert fake.allocate_calls == [["w0", "w1"], ["w0", "w1"]]
        sim.store.create(pod("other", 1))
        await wait_phase(sim, "other", "Running")
        assert held(sim, "other") == ["w2"]


async def test_pre_start_container_is_called_when_the_plugin_asks(sim: kubesim.Cluster) -> None:
    async with plugin(sim, healthy("w0", "w1"), pre_start=True) as fake:
        await wait_resource(sim, "2", "2")
        sim.store.create(pod("app", 1))
        await wait_phase(sim, "app", "Running")
        assert fake.pre_start_calls == [["w0"]]


async def test_failing_pre_start_holds_the_container_in_create_container_config_error(
    sim: kubesim.Cluster,
) -> None:
    class Flaky(FakePlugin):
        failing = True

        async def PreStartContainer(
            self, request: dp.PreStartContainerRequest, context: aio.ServicerContext
        ) -> dp.PreStartContainerResponse:
            if self.failing:
                await context.abort(grpc.StatusCode.UNKNOWN, "widget not reset")
            return await super().PreStartContainer(request, context)

    await sim.start_device_manager(NODE)
    fake = Flaky(sim, healthy("w0"), pre_start=True)
    await fake.start()
    try:
        await fake.register()
        await wait_resource(sim, "1", "1")
        sim.store.create(pod("app", 1))

        def waiting() -> dict[str, Any]:
            statuses = (sim.store.get("pods", "app", "default") or {}).get("status", {})
            for status in statuses.get("containerStatuses") or []:
                return dict((status.get("state") or {}).get("waiting") or {})
            return {}

        await sim.wait_for(
            lambda: waiting().get("reason") == "CreateContainerConfigError", timeout=DEADLINE
        )
        assert waiting()["message"] == (
            "device plugin PreStartContainer rpc failed with err: "
            "rpc error: code = Unknown desc = widget not reset"
        )
        fake.failing = False
        await wait_phase(sim, "app", "Running")
        assert fake.pre_start_calls == [["w0"]]
    finally:
        await fake.stop()


async def test_checkpoint_file_records_devices_and_allocate_responses(
    sim: kubesim.Cluster,
) -> None:
    async with plugin(sim, healthy("w0", "w1"), numa={"w1": 1}, preferred=["w1"]):
        await wait_resource(sim, "2", "2")
        sim.store.create(pod("app", 1))
        obj = await wait_phase(sim, "app", "Running")
    document = checkpoint(sim)
    assert sorted(document) == ["Checksum", "Data"]
    assert document["Data"]["RegisteredDevices"] == {RESOURCE: ["w0", "w1"]}
    (entry,) = document["Data"]["PodDeviceEntries"]
    assert entry["PodUID"] == obj["metadata"]["uid"]
    assert (entry["ContainerName"], entry["ResourceName"]) == ("main", RESOURCE)
    assert entry["DeviceIDs"] == {"1": ["w1"]}
    response = dp.ContainerAllocateResponse()
    response.ParseFromString(base64.b64decode(entry["AllocResp"]))
    assert response.envs["WIDGETS"] == "w1"


async def test_corrupt_checkpoint_is_ignored_after_a_kubelet_restart(sim: kubesim.Cluster) -> None:
    async with plugin(sim, healthy("w0")) as fake:
        await wait_resource(sim, "1", "1")
        sim.store.create(pod("holder", 1))
        await wait_phase(sim, "holder", "Running")
        path = sim.node_root(NODE) / kubeletapi.CHECKPOINT_FILE.lstrip("/")
        document = json.loads(path.read_text())
        document["Checksum"] += 1
        path.write_text(json.dumps(document))
        await sim.restart_kubelet(NODE)
        await fake.stop()
        await fake.start()
        await fake.register()
        manager = sim.device_manager(NODE)
        assert manager is not None
        # Without the checkpoint nothing zeroed the node's figures: wait for the new listing.
        await sim.wait_for(lambda: manager.devices(RESOURCE) == healthy("w0"), timeout=DEADLINE)
        # The kubelet goes on without the checkpoint: it no longer knows w0 is taken.
        sim.store.create(pod("newcomer", 1))
        await wait_phase(sim, "newcomer", "Running")
        assert held(sim, "newcomer") == ["w0"]


async def test_allocations_survive_a_plugin_restart(sim: kubesim.Cluster) -> None:
    async with plugin(sim, healthy("w0", "w1")):
        await wait_resource(sim, "2", "2")
        sim.store.create(pod("holder", 1))
        await wait_phase(sim, "holder", "Running")
        assert held(sim, "holder") == ["w0"]
    await wait_resource(sim, "2", "0")
    # The plugin comes back (new process, same socket name): w0 is still the holder's.
    async with plugin(sim, healthy("w0", "w1")):
        await wait_resource(sim, "2", "2")
        sim.store.create(pod("newcomer", 1))
        await wait_phase(sim, "newcomer", "Running")
        assert held(sim, "newcomer") == ["w1"]
        assert held(sim, "holder") == ["w0"]


async def test_kubelet_restart_recreates_its_socket_and_keeps_allocations_from_checkpoint(
    sim: kubesim.Cluster,
) -> None:
    async with plugin(sim, healthy("w0", "w1")) as fake:
        await wait_resource(sim, "2", "2")
        sim.store.create(pod("holder", 1))
        await wait_phase(sim, "holder", "Running")
        socket = fake.plugin_dir / "kubelet.sock"
        before = socket.stat()
        await sim.restart_kubelet(NODE)
        after = socket.stat()
        # A new socket (inode numbers may be reused, so the change time tells them apart).
        assert socket.is_socket()
        assert (after.st_ino, after.st_ctime_ns) != (before.st_ino, before.st_ctime_ns)
        # The plugin's socket was cleaned up with the old kubelet's; a real plugin restarts its
        # server and registers again when it sees the new kubelet.sock.
        assert not (fake.plugin_dir / fake.endpoint).exists()
        await wait_resource(sim, "0", "0")
        await fake.stop()
        await fake.start()
        await fake.register()
        await wait_resource(sim, "2", "2")
        sim.store.create(pod("newcomer", 1))
        await wait_phase(sim, "newcomer", "Running")
        assert held(sim, "newcomer") == ["w1"]
        assert held(sim, "holder") == ["w0"]
    (starting,) = [e for e in sim.store.list("events", "default") if e["reason"] == "Starting"]
    assert starting["count"] == 2  # node registration and the restart, aggregated


# ----- pod resources -----------------------------------------------------------------------------


async def test_pod_resources_list_get_and_allocatable(sim: kubesim.Cluster) -> None:
    async with plugin(sim, healthy("w0", "w1", "w2"), numa={"w0": 0, "w1": 1}):
        await wait_resource(sim, "3", "3")
        sim.store.create(pod("app", 2))
        sim.store.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "plain", "namespace": "default"},
                "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "example/p:1"}]},
            }
        )
        await wait_phase(sim, "app", "Running")
        await wait_phase(sim, "plain", "Running")
        path = sim.node_root(NODE) / kubeletapi.POD_RESOURCES_SOCKET.lstrip("/")
        async with aio.insecure_channel(f"unix://{path}") as channel:
            lister = pr_grpc.PodResourcesListerStub(channel)
            listed = await lister.List(pr.ListPodResourcesRequest())
            got = await lister.Get(
                pr.GetPodResourcesRequest(pod_name="app", pod_namespace="default")
            )
            allocatable = await lister.GetAllocatableResources(pr.AllocatableResourcesRequest())
            with pytest.raises(aio.AioRpcError) as caught:
                await lister.Get(
                    pr.GetPodResourcesRequest(pod_name="nope", pod_namespace="default")
                )
    by_pod = {p.name: p for p in listed.pod_resources}
    assert sorted(by_pod) == ["app", "plain"]
    assert [c.name for c in by_pod["plain"].containers] == ["c"]
    assert list(by_pod["plain"].containers[0].devices) == []
    devices = got.pod_resources.containers[0].devices
    # Grouped per NUMA node, as the kubelet reports them.
    assert [
        (d.resource_name, list(d.device_ids), [n.ID for n in d.topology.nodes]) for d in devices
    ] == [
        (RESOURCE, ["w0"], [0]),
        (RESOURCE, ["w1"], [1]),
    ]
    assert [
        (list(d.device_ids), [n.ID for n in d.topology.nodes]) for d in allocatable.devices
    ] == [
        (["w0"], [0]),
        (["w1"], [1]),
        (["w2"], []),
    ]
    assert caught.value.details() == "pod nope in namespace default not found"


# ----- lifecycle and limits ----------------------------------------------------------------------


async def test_device_manager_starts_with_a_runner_pod_and_never_without_filesystems() -> None:
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=2, kubelet=config()) as sim:
        assert sim.device_manager("node-1") is None
        socket = sim.node_root("node-1") / kubeletapi.KUBELET_SOCKET.lstrip("/")
        assert not socket.exists()

        async def runner(ctx: PodContext) -> int:
            assert Path(ctx.host_path(kubeletapi.KUBELET_SOCKET)).is_socket()
            return 0

        sim.register_pod_runner(runner, image="example/agent")
        manifest = pod("agent", 0, command=True)
        manifest["spec"]["containers"][0]["image"] = "example/agent:1"
        sim.store.create(manifest)
        await wait_phase(sim, "agent", "Succeeded")
        assert sim.device_manager("node-1") is not None
        assert sim.device_manager("node-2") is None
    async with kubesim.Cluster(
        images=TEST_IMAGES, nodes=1, kubelet=config(), node_filesystems=False
    ) as bare:
        with pytest.raises(RuntimeError, match="node_filesystems=False"):
            await bare.start_device_manager("node-1")


async def test_too_long_socket_path_is_refused_with_a_hint(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 80)
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=config(), work_dir=deep) as sim:
        with pytest.raises(ValueError, match="AF_UNIX limit: give the cluster a shorter work_dir"):
            await sim.start_device_manager(NODE)


async def test_default_work_dir_is_short_enough_for_node_sockets(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    long_tmp = tmp_path / ("t" * 60)
    long_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long_tmp))
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=config()) as sim:
        manager = await sim.start_device_manager(NODE)
        assert manager.socket_path.is_socket()
        assert not str(manager.socket_path).startswith(str(long_tmp))


# ----- real kubectl ------------------------------------------------------------------------------


@needs_kubectl
async def test_kubectl_shows_device_capacity_and_rejected_pods(sim: kubesim.Cluster) -> None:
    async with plugin(sim, healthy("w0", "w1"), allocate_error="no widgets today"):
        await wait_resource(sim, "2", "2")
        described = await kubectl(sim, "describe", "node", NODE)
        capacity = described.split("Capacity:")[1].split("Allocatable:")[0]
        allocatable = described.split("Allocatable:")[1].split("System Info:")[0]
        assert re.search(rf"^\s+{re.escape(RESOURCE)}:\s+2$", capacity, re.MULTILINE)
        assert re.search(rf"^\s+{re.escape(RESOURCE)}:\s+2$", allocatable, re.MULTILINE)
        sim.store.create(pod("app", 1))
        await wait_phase(sim, "app", "Failed")
        table = await kubectl(sim, "get", "pod", "app")
        assert "UnexpectedAdmissionError" in table.splitlines()[1]
        described_pod = await kubectl(sim, "describe", "pod", "app")
        assert (
            "Allocate failed due to rpc error: code = Unknown desc = no widgets today"
            in described_pod
        )
