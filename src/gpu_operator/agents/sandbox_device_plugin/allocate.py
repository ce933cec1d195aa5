"""Allocate for the sandbox plugin (pure): the VFIO device nodes and KubeVirt's variables.

Passthrough devices (and vendor-VFIO vGPUs, which are passed through as VFs): device specs
`/dev/vfio/vfio` and `/dev/vfio/<IOMMU group>` of each requested device (`mrw`, once each), and
`PCI_RESOURCE_NVIDIA_COM_<NAME uppercased>` listing the requested addresses in request order.
Mediated devices: the `/dev/vfio` directory and `MDEV_PCI_RESOURCE_NVIDIA_COM_<NAME>` listing the
UUIDs. An unknown device ID, or a device whose IOMMU group changed since discovery, is refused
with upstream's message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpu_operator.agents.sandbox_device_plugin.discovery import Resource

GPU_PREFIX = "PCI_RESOURCE_NVIDIA_COM"
VGPU_PREFIX = "MDEV_PCI_RESOURCE_NVIDIA_COM"
VFIO_DIR = "/dev/vfio"
PERMISSIONS = "mrw"


class AllocateError(ValueError):
    """The kubelet asked for a device this plugin cannot give."""


@dataclass(frozen=True)
class DeviceSpec:
    container_path: str
    host_path: str
    permissions: str = PERMISSIONS


@dataclass(frozen=True)
class ContainerAllocation:
    envs: dict[str, str] = field(default_factory=dict)
    devices: tuple[DeviceSpec, ...] = ()


def env_name(resource: Resource) -> str:
    if resource.kind == "mdev":
        return f"{VGPU_PREFIX}_{resource.name}"
    return f"{GPU_PREFIX}_{resource.name.upper()}"


def allocate(
    resource: Resource,
    requests: Sequence[Sequence[str]],
    groups_now: Mapping[str, int | None] | None = None,
) -> list[ContainerAllocation]:
    """One answer per container request. `groups_now` is each device's IOMMU group as sysfs
    shows it now (None: not checked)."""
    known = resource.by_id()
    out = []
    for ids in requests:
        for device_id in ids:
            device = known.get(device_id)
            if device is None:
                raise AllocateError(f"invalid allocation request: unknown device: {device_id}")
            if groups_now is not None and groups_now.get(device_id) != device.iommu_group:
                raise AllocateError(f"invalid allocation request: unknown device: {device_id}")
        if resource.kind == "mdev":
            specs: tuple[DeviceSpec, ...] = (DeviceSpec(VFIO_DIR, VFIO_DIR),)
        else:
            paths = [f"{VFIO_DIR}/vfio"]
            for device_id in ids:
                group_path = f"{VFIO_DIR}/{known[device_id].iommu_group}"
                if group_path not in paths:
                    paths.append(group_path)
            specs = tuple(DeviceSpec(p, p) for p in paths)
        envs = {env_name(resource): ",".join(ids)} if ids else {}
        out.append(ContainerAllocation(envs, specs))
    return out
