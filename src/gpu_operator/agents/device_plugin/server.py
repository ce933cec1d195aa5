"""One device-plugin gRPC server (grpc.aio) per resource, and its registration with the kubelet.

`Endpoint` is the API plumbing any plugin reuses; `PluginServer` is the NVIDIA resource's.

Start: remove a stale socket, serve on `<plugin dir>/nvidia-<name>.sock`, dial it to be sure it
answers (5 s, as upstream), then call the kubelet's Register (`v1beta1`, the socket's file name,
`get_preferred_allocation_available`). ListAndWatch sends the full list at once and again after
every health change; Allocate and GetPreferredAllocation are the pure planners in `allocate` and
`preferred`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import grpc

import kubeletapi
from gpu_operator.agents.device_plugin import allocate as alloc
from gpu_operator.agents.device_plugin import preferred
from gpu_operator.agents.device_plugin.devices import Resource
from gpu_operator.agents.device_plugin.preferred import Links
from kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb
from kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

log = logging.getLogger("gpu_operator.agents.device_plugin")

DIAL_TIMEOUT = 5.0
OPTIONS = pb.DevicePluginOptions(get_preferred_allocation_available=True)


def _not_writable(folder: Path, err: OSError | None) -> str:
    why = f": {err.strerror}" if err is not None and err.strerror else ""
    return (
        f"cannot create the plugin socket in {folder}{why} (this process runs as uid "
        f"{os.geteuid()}; the kubelet's device-plugin folder belongs to root: run the plugin as "
        "root, securityContext runAsUser: 0)"
    )


class StartError(RuntimeError):
    """The plugin could not serve or register; the manager retries all plugins later."""


def _unix(path: Path) -> str:
    return f"unix://{path}"


async def dial(path: Path, timeout: float = DIAL_TIMEOUT) -> grpc.aio.Channel:
    """A channel to a unix socket that is known to answer (StartError after `timeout`)."""
    if not path.is_socket():
        raise StartError(f"cannot dial {path}: no such socket")
    channel = grpc.aio.insecure_channel(_unix(path))
    try:
        await asyncio.wait_for(channel.channel_ready(), timeout)
    except TimeoutError:
        await channel.close()
        raise StartError(f"cannot dial {path}: no answer within {timeout:.0f}s") from None
    except grpc.RpcError as err:
        await channel.close()
        raise StartError(f"cannot dial {path}: {err}") from None
    return channel


class Endpoint(pb_grpc.DevicePluginServicer):
    """The device-plugin API plumbing of one resource: serve on a socket, register with the
    kubelet, stream the device list (again after each `notify`), stop. Subclasses say which
    devices there are (`api_devices`) and answer Allocate; other plugins (such as the KubeVirt
    sandbox plugin) reuse it with their own devices and options."""

    def __init__(
        self,
        resource_name: str,
        socket: Path,
        kubelet_socket: Path | None,
        options: pb.DevicePluginOptions = OPTIONS,
    ) -> None:
        self.resource_name = resource_name
        self.socket = socket
        self.kubelet_socket = kubelet_socket
        self.plugin_options = options
        self._changed = asyncio.Condition()
        self._version = 0
        self._stopping = False
        self._server: grpc.aio.Server | None = None

    def api_devices(self) -> list[pb.Device]:
        """The devices as ListAndWatch sends them."""
        raise NotImplementedError

    async def notify(self) -> None:
        """The device list changed: every ListAndWatch stream sends it again."""
        async with self._changed:
            self._version += 1
            self._changed.notify_all()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Serve, self-dial and register (StartError on failure, with the socket removed)."""
        try:
            self.socket.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                self.socket.unlink()
        except PermissionError as err:
            raise StartError(_not_writable(self.socket.parent, err)) from None
        if not os.access(self.socket.parent, os.W_OK | os.X_OK):
            raise StartError(_not_writable(self.socket.parent, None))
        server = grpc.aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(self, server)
        try:
            server.add_insecure_port(_unix(self.socket))
        except RuntimeError as err:
            raise StartError(f"cannot listen on {self.socket}: {err}") from None
        await server.start()
        self._server = server
        try:
            channel = await dial(self.socket)
            await channel.close()
            log.info("serving %s on %s", self.resource_name, self.socket)
            if self.kubelet_socket is not None:
                await self.register()
        except BaseException:  # StartError, or cancelled while starting: leave no socket
            await self.stop()
            raise

    async def register(self) -> None:
        assert self.kubelet_socket is not None
        channel = await dial(self.kubelet_socket)
        try:
            stub = pb_grpc.RegistrationStub(channel)
            request = pb.RegisterRequest(
                version=kubeletapi.DEVICE_PLUGIN_VERSION,
                endpoint=self.socket.name,
                resource_name=self.resource_name,
                options=self.plugin_options,
            )
            await stub.Register(request, timeout=DIAL_TIMEOUT)
        except grpc.RpcError as err:
            raise StartError(f"registering {self.resource_name}: {err.details()}") from None
        finally:
            await channel.close()
        log.info("registered %s with the kubelet", self.resource_name)

    async def stop(self, grace: float = 0.5) -> None:
        """Stop serving, end ListAndWatch streams and remove the socket."""
        self._stopping = True
        await self.notify()
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    # -- the DevicePlugin service ----------------------------------------------------------

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> pb.DevicePluginOptions:
        return self.plugin_options

    async def ListAndWatch(
        self, request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        seen = self._version
        yield pb.ListAndWatchResponse(devices=self.api_devices())
        while not self._stopping:
            async with self._changed:
                await self._changed.wait_for(lambda last=seen: self._version != last)  # type: ignore[misc]
                seen = self._version
            if self._stopping:
                return
            yield pb.ListAndWatchResponse(devices=self.api_devices())

    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


class PluginServer(Endpoint):
    """Serves one NVIDIA resource; health changes come in through `set_health`."""

    def __init__(
        self,
        resource: Resource,
        options: alloc.AllocateOptions,
        *,
        plugin_dir: Path,
        kubelet_socket: Path | None,
        links: Links | None = None,
        allocation_policy: str = "distributed",
    ) -> None:
        super().__init__(resource.name, plugin_dir / resource.socket_name, kubelet_socket)
        self.resource = resource
        self.options = options
        self._links: Links = links or {}
        self._policy = allocation_policy
        self._unhealthy: set[str] = set()
        # Latencies of the last Allocate calls (seconds), for the bench and the health endpoint.
        self.allocate_seconds: list[float] = []

    # -- health ----------------------------------------------------------------------------

    def serves(self, uuid: str) -> bool:
        return any(d.uuid == uuid for d in self.resource.devices)

    async def set_health(self, uuids: Iterable[str], healthy: bool) -> bool:
        """Mark physical devices (and their replicas); True when this plugin's list changed."""
        mine = {u for u in uuids if self.serves(u)}
        before = set(self._unhealthy)
        if healthy:
            self._unhealthy -= mine
        else:
            self._unhealthy |= mine
        if self._unhealthy == before:
            return False
        await self.notify()
        return True

    def healthy(self, device_id: str) -> bool:
        device = self.resource.by_id()[device_id]
        return device.uuid not in self._unhealthy

    def api_devices(self) -> list[pb.Device]:
        out = []
        for d in self.resource.devices:
            health = kubeletapi.UNHEALTHY if d.uuid in self._unhealthy else kubeletapi.HEALTHY
            device = pb.Device(ID=d.id, health=health)
            if d.numa_node is not None:
                device.topology.nodes.append(pb.NUMANode(ID=d.numa_node))
            out.append(device)
        return out

    # -- the DevicePlugin service ----------------------------------------------------------

    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        response = pb.PreferredAllocationResponse()
        for req in request.container_requests:
            try:
                ids = preferred.preferred_allocation(
                    self.resource,
                    list(req.available_deviceIDs),
                    list(req.must_include_deviceIDs),
                    req.allocation_size,
                    self._links,
                    self._policy,
                )
            except preferred.PreferenceError as err:
                await context.abort(
                    grpc.StatusCode.UNKNOWN,
                    f"error getting list of preferred allocation devices: {err}",
                )
            response.container_responses.add(deviceIDs=ids)
        return response

    async def Allocate(
        self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocateResponse:
        started = time.perf_counter()
        try:
            results = alloc.allocate(
                self.resource,
                [list(r.devices_ids) for r in request.container_requests],
                self.options,
            )
        except alloc.AllocateError as err:
            log.warning("Allocate for %s refused: %s", self.resource.name, err)
            await context.abort(grpc.StatusCode.UNKNOWN, str(err))
        response = pb.AllocateResponse()
        for r in results:
            c = response.container_responses.add()
            c.envs.update(r.envs)
            c.annotations.update(r.annotations)
            for m in r.mounts:
                c.mounts.add(container_path=m.container_path, host_path=m.host_path,
                             read_only=m.read_only)  # fmt: skip
            for s in r.devices:
                c.devices.add(container_path=s.container_path, host_path=s.host_path,
                              permissions=s.permissions)  # fmt: skip
            for name in r.cdi_devices:
                c.cdi_devices.add(name=name)
        self.allocate_seconds = [*self.allocate_seconds[-999:], time.perf_counter() - started]
        return response
