"""What a container got from device plugins, as its runner sees it (`PodContext.allocation`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kubeletapi.deviceplugin.v1beta1 import api_pb2


@dataclass(frozen=True)
class Mount:
    """A host path the runtime mounts into the container."""

    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True)
class DeviceSpec:
    """A host device node the runtime exposes in the container."""

    container_path: str
    host_path: str
    permissions: str = ""


@dataclass(frozen=True)
class ContainerAllocation:
    """The devices of one container and what their plugins asked the runtime to add, merged over
    the container's resources as the kubelet merges them (the first value for a key wins)."""

    # Resource name -> device IDs, e.g. {"example.com/gpu": ("dev-0", "dev-1")}.
    device_ids: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    devices: tuple[DeviceSpec, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    # Fully qualified CDI device names ("vendor/class=name").
    cdi_devices: tuple[str, ...] = ()


def merge(
    assigned: Iterable[tuple[str, Iterable[str], api_pb2.ContainerAllocateResponse]],
) -> ContainerAllocation:
    """One container's allocation from (resource, device IDs, Allocate response) triples: envs,
    annotations, device specs (by container path), mounts (by container path) and CDI names
    are de-duplicated keeping the first, as the kubelet's run options are."""
    device_ids: dict[str, tuple[str, ...]] = {}
    envs: dict[str, str] = {}
    annotations: dict[str, str] = {}
    mounts: dict[str, Mount] = {}
    devices: dict[str, DeviceSpec] = {}
    cdi: dict[str, None] = {}
    for resource, ids, response in assigned:
        device_ids[resource] = tuple(ids)
        for key in sorted(response.envs):
            envs.setdefault(key, response.envs[key])
        for key in sorted(response.annotations):
            annotations.setdefault(key, response.annotations[key])
        for spec in response.devices:
            devices.setdefault(
                spec.container_path,
                DeviceSpec(spec.container_path, spec.host_path, spec.permissions),
            )
        for mount in response.mounts:
            mounts.setdefault(
                mount.container_path, Mount(mount.container_path, mount.host_path, mount.read_only)
            )
        for device in response.cdi_devices:
            cdi.setdefault(device.name, None)
    return ContainerAllocation(
        device_ids=MappingProxyType(device_ids),
        envs=MappingProxyType(envs),
        mounts=tuple(mounts.values()),
        devices=tuple(devices.values()),
        annotations=MappingProxyType(annotations),
        cdi_devices=tuple(cdi),
    )
