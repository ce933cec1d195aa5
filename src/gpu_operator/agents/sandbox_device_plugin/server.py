"""One sandbox plugin resource over the device-plugin API (the NVIDIA plugin's `Endpoint`)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from pathlib import Path

import grpc

import kubeletapi
from gpu_operator.agents.device_plugin.server import Endpoint
from gpu_operator.agents.pci import sysfs
from gpu_operator.agents.sandbox_device_plugin import allocate as alloc
from gpu_operator.agents.sandbox_device_plugin.discovery import Resource
from kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb

log = logging.getLogger("gpu_operator.agents.sandbox_device_plugin")
MAX_SOCKET_PATH = 100  # gRPC refuses unix socket paths over 105 bytes


def socket_path(plugin_dir: Path, name: str) -> Path:
    """`<dir>/kubevirt-<NAME>.sock`, shortened with a hash of the name where the whole path
    would not fit a unix socket address: long device names in a deep directory."""
    path = plugin_dir / name
    if len(str(path).encode()) <= MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    room = MAX_SOCKET_PATH - len(str(plugin_dir).encode()) - len(f"/-{digest}.sock")
    stem = name.removesuffix(".sock")[: max(room, 8)]
    return plugin_dir / f"{stem}-{digest}.sock"


class SandboxEndpoint(Endpoint):
    """Serves one passthrough or vGPU resource; health comes in through `set_health`."""

    def __init__(
        self, resource: Resource, *, root: Path, plugin_dir: Path, kubelet_socket: Path | None
    ) -> None:
        # Upstream offers a (NUMA-aware) preferred allocation for PCI devices, none for mdevs.
        options = pb.DevicePluginOptions(
            get_preferred_allocation_available=resource.kind == "passthrough"
        )
        super().__init__(
            resource.resource_name, socket_path(plugin_dir, resource.socket_name), kubelet_socket,
            options,
        )  # fmt: skip
        self.resource = resource
        self.root = root
        self.unhealthy: set[str] = set()

    async def set_health(self, ids: Iterable[str], healthy: bool) -> bool:
        """Mark devices; True when this resource's list changed."""
        mine = {i for i in ids if i in self.resource.by_id()}
        before = set(self.unhealthy)
        if healthy:
            self.unhealthy -= mine
        else:
            self.unhealthy |= mine
        if before == self.unhealthy:
            return False
        await self.notify()
        return True

    def api_devices(self) -> list[pb.Device]:
        return [
            pb.Device(
                ID=d.id,
                health=kubeletapi.UNHEALTHY if d.id in self.unhealthy else kubeletapi.HEALTHY,
            )
            for d in self.resource.devices
        ]

    def _groups_now(self) -> dict[str, int | None] | None:
        if self.resource.kind == "mdev":
            return None
        out: dict[str, int | None] = {}
        for device in self.resource.devices:
            function = sysfs.read_function(self.root, device.id)
            out[device.id] = function.iommu_group if function and function.nvidia else None
        return out

    async def Allocate(
        self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocateResponse:
        try:
            results = alloc.allocate(
                self.resource,
                [list(r.devices_ids) for r in request.container_requests],
                self._groups_now(),
            )
        except alloc.AllocateError as err:
            log.warning("Allocate for %s refused: %s", self.resource.resource_name, err)
            await context.abort(grpc.StatusCode.UNKNOWN, str(err))
        response = pb.AllocateResponse()
        for result in results:
            container = response.container_responses.add()
            container.envs.update(result.envs)
            for spec in result.devices:
                container.devices.add(
                    container_path=spec.container_path,
                    host_path=spec.host_path,
                    permissions=spec.permissions,
                )
        log.info(
            "allocated %s: %s",
            self.resource.resource_name,
            "; ".join(",".join(r.devices_ids) for r in request.container_requests),
        )
        return response

    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        # Without NUMA information upstream's choice is: the required devices, then the
        # kubelet's order.
        response = pb.PreferredAllocationResponse()
        for req in request.container_requests:
            chosen = list(dict.fromkeys(req.must_include_deviceIDs))
            if len(chosen) > req.allocation_size:
                await context.abort(
                    grpc.StatusCode.UNKNOWN,
                    f"number of MustIncludeDeviceIDs ({len(chosen)}) exceeds allocation size "
                    f"({req.allocation_size})",
                )
            for device_id in req.available_deviceIDs:
                if len(chosen) >= req.allocation_size:
                    break
                if device_id not in chosen:
                    chosen.append(device_id)
            response.container_responses.add(deviceIDs=chosen)
        return response
