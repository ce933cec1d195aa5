"""One node's device manager: the kubelet side of the device-plugin API (v1beta1).

Plugins register on the node's `/var/lib/kubelet/device-plugins/kubelet.sock`; the manager dials
each one back on its own socket, follows its ListAndWatch stream into the node's capacity and
allocatable, picks and allocates devices for containers at pod admission, and keeps what each
container got in the kubelet's checkpoint file, as kubelet 1.35's device manager does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

import kubeletapi
from kubeletapi.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from kubeletapi.podresources.v1 import api_pb2 as podresources_pb2
from kubesim import errors, quantity
from kubesim.controllers.volumes import resolve_within
from kubesim.devicemanager import checkpoint
from kubesim.devicemanager.allocation import ContainerAllocation, merge
from kubesim.devicemanager.podresources import serve_pod_resources
from kubesim.node_managers import node_pods
from kubesim.store import Store
from kubesim.validation import syntax

log = logging.getLogger("kubesim.devicemanager")
NODE_KEY = ("", "nodes")
# The kubelet files devices without NUMA topology under this node ID.
NO_TOPOLOGY = -1
# sockaddr_un.sun_path holds 108 bytes, the last one a NUL.
MAX_SOCKET_PATH = 107
ADMISSION_ERROR = "UnexpectedAdmissionError"

_GO_CODES = {
    grpc.StatusCode.OK: "OK",
    grpc.StatusCode.CANCELLED: "Canceled",
    grpc.StatusCode.UNKNOWN: "Unknown",
    grpc.StatusCode.INVALID_ARGUMENT: "InvalidArgument",
    grpc.StatusCode.DEADLINE_EXCEEDED: "DeadlineExceeded",
    grpc.StatusCode.NOT_FOUND: "NotFound",
    grpc.StatusCode.ALREADY_EXISTS: "AlreadyExists",
    grpc.StatusCode.PERMISSION_DENIED: "PermissionDenied",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "ResourceExhausted",
    grpc.StatusCode.FAILED_PRECONDITION: "FailedPrecondition",
    grpc.StatusCode.ABORTED: "Aborted",
    grpc.StatusCode.OUT_OF_RANGE: "OutOfRange",
    grpc.StatusCode.UNIMPLEMENTED: "Unimplemented",
    grpc.StatusCode.INTERNAL: "Internal",
    grpc.StatusCode.UNAVAILABLE: "Unavailable",
    grpc.StatusCode.DATA_LOSS: "DataLoss",
    grpc.StatusCode.UNAUTHENTICATED: "Unauthenticated",
}


def go_rpc_error(exc: aio.AioRpcError) -> str:
    """A failed call as Go's gRPC client prints it (`rpc error: code = Unknown desc = ...`), the
    form in which the kubelet quotes plugin errors."""
    code = _GO_CODES.get(exc.code(), str(exc.code()))
    return f"rpc error: code = {code} desc = {exc.details() or ''}"


def go_quote(text: str) -> str:
    """A string as Go's `%q` prints it (close enough for the printable names seen here)."""
    return json.dumps(text, ensure_ascii=False)


def is_extended_resource_name(name: str) -> bool:
    """The kubelet's test for a resource a device plugin may serve: domain-prefixed, outside
    `kubernetes.io/`, and a qualified name once quota's `requests.` prefix is added."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    return not syntax.qualified_name("requests." + name)


def check_socket_path(path: Path) -> None:
    """Refuse a unix socket path the kernel cannot bind, with a hint instead of a bare EINVAL."""
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH:
        raise ValueError(
            f"unix socket path {path} is {size} bytes, over the {MAX_SOCKET_PATH}-byte AF_UNIX "
            "limit: give the cluster a shorter work_dir"
        )


class AdmissionError(Exception):
    """A pod the device manager cannot admit; `message` is what the kubelet reports."""

    reason = ADMISSION_ERROR

    def __init__(self, detail: str) -> None:
        self.detail = detail
        self.message = f"Allocate failed due to {detail}, which is unexpected"
        super().__init__(self.message)


class PreStartError(Exception):
    """A PreStartContainer call failed: the container cannot be created (yet)."""


class _AllocationError(Exception):
    """A device manager error, later wrapped into the kubelet's admission message."""


class _RegistrationError(Exception):
    """A registration the kubelet refuses; the text is its gRPC error description."""


@dataclass
class _Assigned:
    """One container's devices of one resource and the plugin's Allocate answer for them."""

    by_numa: dict[int, list[str]]
    response: api_pb2.ContainerAllocateResponse

    @property
    def ids(self) -> list[str]:
        return [device for ids in self.by_numa.values() for device in ids]


@dataclass
class _Resource:
    """What the manager knows of one resource name."""

    devices: dict[str, api_pb2.Device] = field(default_factory=dict)
    healthy: set[str] = field(default_factory=set)
    unhealthy: set[str] = field(default_factory=set)
    client: PluginClient | None = None
    options: api_pb2.DevicePluginOptions | None = None
    # Set when the plugin went away (or before it re-registers after a kubelet restart): the
    # resource is dropped once the grace period has passed since then.
    stopped_at: float | None = None
    expiry: asyncio.TimerHandle | None = None


class PluginClient:
    """The kubelet's connection to one registered plugin."""

    def __init__(self, manager: DeviceManager, resource: str, socket_path: Path) -> None:
        self.manager = manager
        self.resource = resource
        self.socket_path = socket_path
        self.channel = aio.insecure_channel(f"unix://{socket_path}")
        self.stub = api_pb2_grpc.DevicePluginStub(self.channel)
        self.options = api_pb2.DevicePluginOptions()
        self.task: asyncio.Task[None] | None = None

    async def connect(self, timeout: float) -> None:
        """Dial the plugin and read its options, as Register does before answering."""
        try:
            await asyncio.wait_for(self.channel.channel_ready(), timeout)
        except TimeoutError:
            await self.close()
            raise _RegistrationError(
                "failed to dial device plugin: context deadline exceeded"
            ) from None
        try:
            self.options = await self.stub.GetDevicePluginOptions(api_pb2.Empty())
        except aio.AioRpcError as exc:
            await self.close()
            raise _RegistrationError(
                f"failed to get device plugin options: {go_rpc_error(exc)}"
            ) from None

    def start(self) -> None:
        """Follow the plugin's ListAndWatch stream in the background."""
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            async for response in self.stub.ListAndWatch(api_pb2.Empty()):
                self.manager.devices_listed(self, list(response.devices))
        except aio.AioRpcError as exc:
            log.info("ListAndWatch ended for %s on %s: %s", self.resource, self.manager.node, exc)
        finally:
            self.manager.plugin_gone(self)

    async def close(self) -> None:
        """Stop following the plugin and close the connection."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task
        await self.channel.close()


class _RegistrationServicer(api_pb2_grpc.RegistrationServicer):
    def __init__(self, manager: DeviceManager) -> None:
        self.manager = manager

    async def Register(
        self, request: api_pb2.RegisterRequest, context: aio.ServicerContext
    ) -> api_pb2.Empty:
        try:
            await self.manager.register(request)
        except _RegistrationError as exc:
            # A plain error from the kubelet's handler reaches the plugin as code Unknown.
            await context.abort(grpc.StatusCode.UNKNOWN, str(exc))
        return api_pb2.Empty()


class DeviceManager:
    """The device manager of one node's kubelet (see the module docstring)."""

    def __init__(
        self,
        node: str,
        root: Path,
        store: Store,
        *,
        dial_timeout: float = 10.0,
        grace_period: float = 300.0,
    ) -> None:
        self.node = node
        self.root = root
        self.store = store
        self.dial_timeout = dial_timeout
        self.grace_period = grace_period
        self.plugin_dir = resolve_within(root, kubeletapi.DEVICE_PLUGIN_PATH)
        self.socket_path = self.plugin_dir / "kubelet.sock"
        self.checkpoint_path = self.plugin_dir / Path(kubeletapi.CHECKPOINT_FILE).name
        self.pod_resources_path = resolve_within(root, kubeletapi.POD_RESOURCES_SOCKET)
        self.resources: dict[str, _Resource] = {}
        # Pod UID -> container name -> resource -> devices and Allocate response.
        self.pod_devices: dict[str, dict[str, dict[str, _Assigned]]] = {}
        # Resource names this manager has written into the node's status.
        self._published: set[str] = set()
        self._admission = asyncio.Lock()
        self._server: aio.Server | None = None
        self._pod_resources: aio.Server | None = None
        self._stopping = False
        # Replaced plugins being disconnected (referenced so the tasks are not collected).
        self._closing: set[asyncio.Task[None]] = set()
        # Registrations accepted so far (for tests and diagnostics).
        self.registrations = 0
        # The kubelet's DRA manager's view of a container's prepared claims (pod, container ->
        # [(claim info, [(driver, prepared device)])]), for the pod-resources API; None: no DRA.
        self.claim_source: Callable[[dict[str, Any], dict[str, Any]], list[Any]] | None = None

    # ----- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Clean the plugin directory, restore the checkpoint, serve kubelet.sock and the
        pod-resources socket."""
        check_socket_path(self.socket_path)
        check_socket_path(self.pod_resources_path)
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.pod_resources_path.parent.mkdir(parents=True, exist_ok=True)
        self._remove_sockets()
        self._restore()
        server = aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(_RegistrationServicer(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        with contextlib.suppress(FileNotFoundError):
            self.pod_resources_path.unlink()
        self._pod_resources = await serve_pod_resources(self, self.pod_resources_path)
        self._publish()

    async def stop(self) -> None:
        """Stop serving, disconnect plugins and remove the kubelet's sockets (the checkpoint
        stays, as it does when a kubelet stops)."""
        self._stopping = True
        for state in self.resources.values():
            if state.expiry is not None:
                state.expiry.cancel()
        clients = [s.client for s in self.resources.values() if s.client is not None]
        for client in clients:
            await client.close()
        for task in list(self._closing):
            await task
        for server in (self._server, self._pod_resources):
            if server is not None:
                await server.stop(None)
        self._server = self._pod_resources = None
        for path in (self.socket_path, self.pod_resources_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def _remove_sockets(self) -> None:
        """The kubelet removes every socket in the plugin directory when it starts (plugins
        watch for a new kubelet.sock and register again); other files stay."""
        with contextlib.suppress(FileNotFoundError):
            for entry in self.plugin_dir.iterdir():
                if entry.is_socket():
                    with contextlib.suppress(FileNotFoundError):
                        entry.unlink()

    def _restore(self) -> None:
        """Read the checkpoint: devices of pods still active on the node stay assigned, and
        each registered resource waits (capacity 0) for its plugin to register again."""
        try:
            entries, registered = checkpoint.read(self.checkpoint_path)
        except checkpoint.CheckpointError as exc:
            log.error("continuing without the device checkpoint of %s: %s", self.node, exc)
            return
        active = {pod["metadata"].get("uid") for pod in self.pods(active_only=True)}
        for entry in entries:
            if entry.pod_uid in active:
                containers = self.pod_devices.setdefault(entry.pod_uid, {})
                containers.setdefault(entry.container, {})[entry.resource] = _Assigned(
                    {k: list(v) for k, v in entry.devices.items()}, entry.response
                )
        for name in registered:
            state = self.resources.setdefault(name, _Resource())
            self._stop_endpoint(name, state)
        self._published.update(registered)

    # ----- registration -------------------------------------------------------------------------

    async def register(self, request: api_pb2.RegisterRequest) -> None:
        """Accept a plugin: check the version and name, dial it back, read its options and
        follow its device list. A later registration of the same resource takes over."""
        if request.version not in kubeletapi.SUPPORTED_VERSIONS:
            supported = "[" + " ".join(go_quote(v) for v in kubeletapi.SUPPORTED_VERSIONS) + "]"
            raise _RegistrationError(
                f"requested API version {go_quote(request.version)} is not supported by "
                f"kubelet. Supported versions are {supported}"
            )
        name = request.resource_name
        if not is_extended_resource_name(name):
            raise _RegistrationError(f"the ResourceName {go_quote(name)} is invalid")
        socket_path = resolve_within(self.root, kubeletapi.DEVICE_PLUGIN_PATH + request.endpoint)
        try:
            check_socket_path(socket_path)
        except ValueError as exc:
            raise _RegistrationError(f"failed to dial device plugin: {exc}") from None
        client = PluginClient(self, name, socket_path)
        await client.connect(self.dial_timeout)
        if self._stopping:
            await client.close()
            raise _RegistrationError("kubelet is shutting down")
        state = self.resources.setdefault(name, _Resource())
        previous = state.client
        state.client = client
        state.options = client.options
        state.stopped_at = None
        if state.expiry is not None:
            state.expiry.cancel()
            state.expiry = None
        self.registrations += 1
        client.start()
        if previous is not None:
            # The newest registration wins; the replaced plugin is no longer followed.
            task = asyncio.get_running_loop().create_task(previous.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        log.info("device plugin for %s registered on %s (%s)", name, self.node, request.endpoint)

    def devices_listed(self, client: PluginClient, devices: list[api_pb2.Device]) -> None:
        """A ListAndWatch update: the plugin's full device list replaces the previous one."""
        state = self.resources.get(client.resource)
        if state is None or state.client is not client or self._stopping:
            return
        state.devices = {device.ID: device for device in devices}
        state.healthy = {d.ID for d in devices if d.health == kubeletapi.HEALTHY}
        state.unhealthy = set(state.devices) - state.healthy
        self._write_checkpoint()
        self._publish()

    def plugin_gone(self, client: PluginClient) -> None:
        """The plugin's stream ended: its devices turn unhealthy (allocatable 0, capacity kept)
        until it registers again or the grace period ends."""
        state = self.resources.get(client.resource)
        if state is None or state.client is not client or self._stopping:
            return
        state.client = None
        state.unhealthy |= state.healthy
        state.healthy = set()
        self._stop_endpoint(client.resource, state)
        self._publish()

    def _stop_endpoint(self, name: str, state: _Resource) -> None:
        state.stopped_at = time.monotonic()
        if state.expiry is not None:
            state.expiry.cancel()
        state.expiry = asyncio.get_running_loop().call_later(
            self.grace_period, self._expire, name, state
        )

    def _expire(self, name: str, state: _Resource) -> None:
        """Forget a resource whose plugin stayed away for the grace period; the node keeps it
        with capacity 0, as the kubelet marks resources that were served by a plugin."""
        if self.resources.get(name) is not state or state.client is not None or self._stopping:
            return
        del self.resources[name]
        self._write_checkpoint()
        self._publish()

    # ----- node status --------------------------------------------------------------------------

    def capacity(self) -> tuple[dict[str, int], dict[str, int]]:
        """Capacity (all devices) and allocatable (healthy ones) per resource."""
        capacity: dict[str, int] = {}
        allocatable: dict[str, int] = {}
        for name, state in self.resources.items():
            capacity[name] = len(state.healthy) + len(state.unhealthy)
            allocatable[name] = len(state.healthy)
        return capacity, allocatable

    def devices(self, resource: str) -> dict[str, str]:
        """The devices of a resource as last listed by its plugin: ID -> health."""
        state = self.resources.get(resource)
        if state is None:
            return {}
        healthy = dict.fromkeys(sorted(state.healthy), kubeletapi.HEALTHY)
        return healthy | dict.fromkeys(sorted(state.unhealthy), kubeletapi.UNHEALTHY)

    def _publish(self) -> None:
        """Write the device resources into the node's status.capacity and allocatable."""
        if self._stopping:
            return
        stored = self.store.peek(NODE_KEY, "", self.node)
        if stored is None:
            return
        capacity, allocatable = self.capacity()
        self._published.update(capacity)
        status = stored.obj.get("status") or {}
        old_capacity = status.get("capacity") or {}
        old_allocatable = status.get("allocatable") or {}
        changes = {
            name: (str(capacity.get(name, 0)), str(allocatable.get(name, 0)))
            for name in sorted(self._published)
        }
        if all(
            old_capacity.get(name) == c and old_allocatable.get(name) == a
            for name, (c, a) in changes.items()
        ):
            return
        obj = stored.copy()
        new_status = obj.setdefault("status", {})
        new_capacity = new_status.setdefault("capacity", {})
        new_allocatable = new_status.setdefault("allocatable", {})
        for name, (c, a) in changes.items():
            new_capacity[name] = c
            new_allocatable[name] = a
        try:
            self.store.replace(
                self.store.registry.resolve("nodes"),
                obj,
                namespace="",
                name=self.node,
                subresource="status",
            )
        except errors.ApiError as exc:
            log.warning("device capacity of %s not written: %s", self.node, exc.message)

    # ----- allocation ---------------------------------------------------------------------------

    def serves(self, resource: str) -> bool:
        """Whether the manager handles a resource: registered by a plugin (now or in the grace
        period) or still held by a container."""
        if resource in self.resources:
            return True
        if "/" not in resource:
            return False  # cpu, memory, pods...: never a plugin's
        return any(
            resource in resources
            for containers in self.pod_devices.values()
            for resources in containers.values()
        )

    def wants_devices(self, pod: dict[str, Any]) -> bool:
        """Whether any container of a pod has a limit on a resource this manager handles."""
        spec = pod.get("spec") or {}
        for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            limits = (container.get("resources") or {}).get("limits") or {}
            if any(self.serves(name) for name in limits):
                return True
        return pod["metadata"].get("uid") in self.pod_devices

    async def admit(self, pod: dict[str, Any]) -> dict[str, ContainerAllocation]:
        """Allocate devices to every container of a pod (init containers first, their devices
        reusable by later containers); returns each device-holding container's allocation.
        Raises AdmissionError with the kubelet's message when a container cannot get its
        devices, and then holds nothing for the pod."""
        uid: str = pod["metadata"]["uid"]
        spec = pod.get("spec") or {}
        async with self._admission:
            reuse: dict[str, set[str]] = {}
            try:
                for container in spec.get("initContainers") or []:
                    await self._allocate_container(uid, container, reuse)
                    assigned = self.pod_devices.get(uid, {}).get(container.get("name", ""), {})
                    for resource, devices in assigned.items():
                        if container.get("restartPolicy") == "Always":
                            # A sidecar keeps its devices for the pod's lifetime.
                            reuse.get(resource, set()).difference_update(devices.ids)
                        else:
                            reuse.setdefault(resource, set()).update(devices.ids)
                for container in spec.get("containers") or []:
                    await self._allocate_container(uid, container, reuse)
                    assigned = self.pod_devices.get(uid, {}).get(container.get("name", ""), {})
                    for resource, devices in assigned.items():
                        reuse.get(resource, set()).difference_update(devices.ids)
            except _AllocationError as exc:
                self.pod_devices.pop(uid, None)
                self._write_checkpoint()
                raise AdmissionError(str(exc)) from None
            self._write_checkpoint()
        result = {}
        for name in self.pod_devices.get(uid, {}):
            allocation = self.allocation(uid, name)
            if allocation is not None:
                result[name] = allocation
        return result

    def allocation(self, uid: str, container: str) -> ContainerAllocation | None:
        """What a container of a pod got from device plugins (None: no devices)."""
        assigned = self.pod_devices.get(uid, {}).get(container)
        if not assigned:
            return None
        return merge(
            (resource, assigned[resource].ids, assigned[resource].response)
            for resource in sorted(assigned)
        )

    def release(self, uid: str) -> None:
        """Free a pod's devices (it ended or is gone)."""
        if self.pod_devices.pop(uid, None) is not None:
            self._write_checkpoint()

    def in_use(self, resource: str) -> set[str]:
        """Devices of a resource assigned to some container."""
        return {
            device
            for containers in self.pod_devices.values()
            for resources in containers.values()
            if resource in resources
            for device in resources[resource].ids
        }

    async def _allocate_container(
        self, uid: str, container: dict[str, Any], reuse: dict[str, set[str]]
    ) -> None:
        name = container.get("name", "")
        limits = (container.get("resources") or {}).get("limits") or {}
        for resource in sorted(limits):
            if not self.serves(resource):
                continue
            needed = quantity.units(limits[resource])
            chosen = await self._devices_to_allocate(
                uid, name, resource, needed, reuse.get(resource, set())
            )
            if not chosen:
                continue
            state = self.resources.get(resource)
            client = state.client if state is not None else None
            if client is None:
                raise _AllocationError(f"unknown Device Plugin {resource}")
            request = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=chosen)]
            )
            try:
                response = await client.stub.Allocate(request)
            except aio.AioRpcError as exc:
                raise _AllocationError(go_rpc_error(exc)) from None
            if not response.container_responses:
                raise _AllocationError(
                    "no containers return in allocation response "
                    "&AllocateResponse{ContainerResponses:[]*ContainerAllocateResponse{},}"
                )
            by_numa: dict[int, list[str]] = {}
            for device_id in chosen:
                device = state.devices.get(device_id) if state is not None else None
                nodes = list(device.topology.nodes) if device is not None else []
                for numa in [n.ID for n in nodes] or [NO_TOPOLOGY]:
                    by_numa.setdefault(numa, []).append(device_id)
            containers = self.pod_devices.setdefault(uid, {})
            containers.setdefault(name, {})[resource] = _Assigned(
                by_numa, response.container_responses[0]
            )

    async def _devices_to_allocate(
        self, uid: str, container: str, resource: str, needed: int, reusable: set[str]
    ) -> list[str]:
        """The kubelet's device choice for one container and resource (no topology manager:
        no device is NUMA-aligned): reusable init-container devices first, then the plugin's
        preferred ones, then the rest in ID order."""
        existing = self.pod_devices.get(uid, {}).get(container, {}).get(resource)
        if existing is not None:
            if len(existing.ids) != needed:
                raise _AllocationError(
                    f"pod {go_quote(uid)} container {go_quote(container)} changed request for "
                    f"resource {go_quote(resource)} from {len(existing.ids)} to {needed}"
                )
            return []  # a container that starts again keeps its devices
        state = self.resources.get(resource)
        if state is None:
            raise _AllocationError(f"cannot allocate unregistered device {resource}")
        if not state.healthy:
            raise _AllocationError(
                f"no healthy devices present; cannot allocate unhealthy devices {resource}"
            )
        if needed == 0:
            return []
        required = needed
        chosen: list[str] = []

        def take(candidates: list[str]) -> bool:
            nonlocal needed
            for device in candidates:
                if device in chosen:
                    continue
                chosen.append(device)
                needed -= 1
                if needed == 0:
                    return True
            return False

        if take(sorted(reusable)):
            return chosen
        available = state.healthy - self.in_use(resource) - set(chosen)
        if len(available) < needed:
            raise _AllocationError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {needed}, Available: {len(available)}"
            )
        preferred = await self._preferred(
            resource, state, available | set(chosen), chosen, required
        )
        if take([d for d in preferred if d in available]):
            return chosen
        if take(sorted(available)):
            return chosen
        raise _AllocationError(
            "unexpectedly allocated less resources than required. "
            f"Requested: {required}, Got: {required - needed}"
        )

    async def _preferred(
        self, resource: str, state: _Resource, available: set[str], must: list[str], size: int
    ) -> list[str]:
        """The plugin's GetPreferredAllocation answer, when it offers the call."""
        if state.options is None or not state.options.get_preferred_allocation_available:
            return []
        if state.client is None:
            raise _AllocationError(
                f"endpoint not found in cache for a registered resource: {resource}"
            )
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=sorted(available),
                    must_include_deviceIDs=list(must),
                    allocation_size=size,
                )
            ]
        )
        try:
            response = await state.client.stub.GetPreferredAllocation(request)
        except aio.AioRpcError as exc:
            raise _AllocationError(
                f"device plugin GetPreferredAllocation rpc failed with err: {go_rpc_error(exc)}"
            ) from None
        if response.container_responses:
            return list(response.container_responses[0].deviceIDs)
        return []

    async def pre_start(self, uid: str, container: dict[str, Any]) -> None:
        """Call PreStartContainer for each of a container's resources whose plugin asked for
        it; raises PreStartError with the kubelet's message when a call fails."""
        name = container.get("name", "")
        limits = (container.get("resources") or {}).get("limits") or {}
        for resource in sorted(limits):
            if not self.serves(resource) or quantity.units(limits[resource]) == 0:
                continue
            state = self.resources.get(resource)
            if state is None:
                raise PreStartError(
                    f"endpoint not found in cache for a registered resource: {resource}"
                )
            if state.options is None or not state.options.pre_start_required:
                continue
            assigned = self.pod_devices.get(uid, {}).get(name, {}).get(resource)
            if assigned is None:
                raise PreStartError(
                    f"no devices found allocated in local cache for pod {uid}, container "
                    f"{name}, resource {resource}"
                )
            if state.client is None:
                raise PreStartError(
                    "device plugin PreStartContainer rpc failed with err: endpoint for "
                    f"{resource} has been stopped"
                )
            request = api_pb2.PreStartContainerRequest(devices_ids=assigned.ids)
            try:
                await state.client.stub.PreStartContainer(
                    request, timeout=kubeletapi.PRE_START_CONTAINER_TIMEOUT
                )
            except aio.AioRpcError as exc:
                raise PreStartError(
                    f"device plugin PreStartContainer rpc failed with err: {go_rpc_error(exc)}"
                ) from None

    # ----- pods and checkpoint ------------------------------------------------------------------

    def dynamic_resources(
        self, pod: dict[str, Any], container: dict[str, Any]
    ) -> list[podresources_pb2.DynamicResource]:
        """A container's prepared DRA claims, as the pod-resources API reports them."""
        if self.claim_source is None:
            return []
        return [
            podresources_pb2.DynamicResource(
                claim_name=info.name,
                claim_namespace=info.namespace,
                claim_resources=[
                    podresources_pb2.ClaimResource(
                        cdi_devices=[
                            podresources_pb2.CDIDevice(name=cdi) for cdi in device.cdi_device_ids
                        ],
                        driver_name=driver,
                        pool_name=device.pool,
                        device_name=device.device,
                    )
                    for driver, device in devices
                ],
            )
            for info, devices in self.claim_source(pod, container)
        ]

    def pods(self, *, active_only: bool = False) -> list[dict[str, Any]]:
        """The pods bound to this node (active: not Succeeded or Failed)."""
        return node_pods(self.store, self.node, active_only=active_only)

    def _write_checkpoint(self) -> None:
        entries = [
            checkpoint.Entry(uid, container, resource, assigned.by_numa, assigned.response)
            for uid, containers in self.pod_devices.items()
            for container, resources in containers.items()
            for resource, assigned in resources.items()
        ]
        registered = {name: sorted(state.healthy) for name, state in self.resources.items()}
        try:
            checkpoint.write(self.checkpoint_path, entries, registered)
        except OSError as exc:
            log.error("device checkpoint of %s not written: %s", self.node, exc)
