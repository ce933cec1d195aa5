"""Who holds the node's GPUs now, from the kubelet's pod-resources API.

Rebinding a GPU under a running pod strands that pod: a container keeps a GPU the host driver no
longer serves, or a VM keeps a VFIO group the host takes back. Before moving devices between the
container stack and the VM stack, the VFIO manager waits until no pod holds a device of the stack
that is going away.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from pathlib import Path

import grpc.aio

from gpu_operator.agents.dcgm_exporter import podresources
from gpu_operator.agents.dcgm_exporter.attribution import Allocation

log = logging.getLogger("gpu_operator.agents.vfio_manager")

Predicate = Callable[[Allocation], bool]


def container_stack(allocation: Allocation) -> bool:
    """A device of the NVIDIA device plugin (`nvidia.com/gpu`, shared or MIG resources)."""
    name = allocation.resource
    return name in ("nvidia.com/gpu", "nvidia.com/gpu.shared") or name.startswith("nvidia.com/mig-")


def vm_devices(ids: Collection[str]) -> Predicate:
    """A device whose ID is one of `ids` (PCI addresses, mdev UUIDs) of any resource."""
    wanted = set(ids)
    return lambda allocation: allocation.device_id in wanted


class Holders:
    """Lists the pods holding matching devices (no socket: nobody is known to hold any)."""

    def __init__(self, socket: Path | None) -> None:
        self.socket = socket
        self._client = podresources.Client(str(socket)) if socket is not None else None

    async def allocations(self) -> list[Allocation]:
        """Every device the kubelet has assigned to a container (none if it cannot say)."""
        if self._client is None or self.socket is None or not self.socket.exists():
            return []
        try:
            return await self._client.list()
        except (grpc.aio.AioRpcError, OSError, TimeoutError) as err:
            log.warning("cannot list pod resources (%s); assuming no pod holds a GPU", err)
            return []

    async def pods(self, predicate: Predicate) -> list[str]:
        """`namespace/name` of each pod holding a matching device, sorted."""
        found = await self.allocations()
        return sorted({f"{a.namespace}/{a.pod}" for a in found if predicate(a)})

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
