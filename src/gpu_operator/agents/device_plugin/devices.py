"""Devices and resource names: NVML facts in, the resources the plugin advertises out.

Pure. Naming follows upstream: every full GPU is `nvidia.com/gpu`; with MIG strategy `single` the
MIG devices take that name instead of their parents, with `mixed` each `nvidia.com/mig-<profile>`;
time-slicing and MPS replace each device by `replicas` copies `<UUID>::<n>`, optionally renamed
`<name>.shared`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.device_plugin.facts import GpuFacts, MigFacts, NodeFacts

log = logging.getLogger("gpu_operator.agents.device_plugin")

GPU_RESOURCE = pc.RESOURCE_PREFIX + "gpu"
REPLICA_SEPARATOR = "::"


class DeviceError(ValueError):
    """The node's GPUs do not fit the configuration (e.g. a MIG layout the strategy rejects)."""


@dataclass(frozen=True)
class Device:
    """One advertised device: a full GPU, a MIG device, or a replica of either."""

    id: str
    uuid: str
    index: str
    gpu: int
    paths: tuple[str, ...]
    memory_mib: int
    compute_capability: str
    numa_node: int | None = None
    replicas: int = 0
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    parent_uuid: str = ""

    @property
    def is_mig(self) -> bool:
        return self.gpu_instance_id is not None

    @property
    def is_replica(self) -> bool:
        return REPLICA_SEPARATOR in self.id


def physical_id(device_id: str) -> str:
    """The device UUID behind a replica ID (`GPU-x::3` -> `GPU-x`); other IDs are unchanged."""
    return device_id.split(REPLICA_SEPARATOR, 1)[0]


@dataclass(frozen=True)
class Resource:
    """One extended resource and its devices; the plugin runs one gRPC server per resource."""

    name: str
    devices: tuple[Device, ...]
    sharing: pc.SharingStrategy = pc.SharingStrategy.NONE
    fail_requests_greater_than_one: bool = False

    @property
    def short_name(self) -> str:
        return self.name.removeprefix(pc.RESOURCE_PREFIX)

    @property
    def socket_name(self) -> str:
        """`nvidia-gpu.sock`, `nvidia-mig-1g.5gb.sock`, `nvidia-gpu.shared.sock`."""
        return f"nvidia-{self.short_name}.sock"

    def by_id(self) -> dict[str, Device]:
        return {d.id: d for d in self.devices}


def gpu_device(gpu: GpuFacts) -> Device:
    major, minor = gpu.compute_capability
    return Device(
        id=gpu.uuid,
        uuid=gpu.uuid,
        index=str(gpu.index),
        gpu=gpu.index,
        paths=(f"/dev/nvidia{gpu.minor}",),
        memory_mib=gpu.memory_mib,
        compute_capability=f"{major}.{minor}",
        numa_node=gpu.numa_node,
        parent_uuid=gpu.uuid,
    )


def mig_device(gpu: GpuFacts, mig: MigFacts, minors: Mapping[str, int]) -> Device:
    """A MIG device: its parent's device node plus the GI and CI capability nodes."""
    gi_key = f"gpu{gpu.minor}/gi{mig.gpu_instance_id}/access"
    ci_key = f"gpu{gpu.minor}/gi{mig.gpu_instance_id}/ci{mig.compute_instance_id}/access"
    caps = []
    for key in (gi_key, ci_key):
        if key not in minors:
            raise DeviceError(f"MIG device {mig.uuid}: no capability minor for {key}")
        caps.append(f"/dev/nvidia-caps/nvidia-cap{minors[key]}")
    major, minor = gpu.compute_capability
    return Device(
        id=mig.uuid,
        uuid=mig.uuid,
        index=f"{gpu.index}:{mig.index}",
        gpu=gpu.index,
        paths=(f"/dev/nvidia{gpu.minor}", *caps),
        memory_mib=mig.memory_mib,
        compute_capability=f"{major}.{minor}",
        numa_node=gpu.numa_node,
        gpu_instance_id=mig.gpu_instance_id,
        compute_instance_id=mig.compute_instance_id,
        parent_uuid=gpu.uuid,
    )


def mig_resource_name(profile: str) -> str:
    """`nvidia.com/mig-<profile>` for whole-GPU-instance profiles (`+me` becomes `.me`)."""
    # A resource name must be a DNS subdomain, so upstream's default mixed-strategy rules replace
    # `+` with `.` (`1g.24gb+gfx` -> `mig-1g.24gb.gfx`, `+me.all` -> `.me.all`); `-me` stays.
    if "c." in profile:
        # Profiles with fewer compute slices than GPU slices (`1c.2g.10gb`) get no default rule.
        raise DeviceError(f"MIG profile '{profile}' does not match any resource patterns")
    return f"{pc.RESOURCE_PREFIX}mig-{profile.replace('+', '.')}"


def _check_mig_layout(node: NodeFacts, strategy: pc.MigStrategy) -> None:
    enabled = [g for g in node.gpus if g.mig_enabled]
    for g in enabled:
        if g.migs:
            continue
        detail = f"device {g.index} has an invalid MIG configuration"
        if strategy is pc.MigStrategy.SINGLE:
            raise DeviceError(
                "invalid MIG configuration: at least one device with migEnabled=true was not "
                f"configured correctly: {detail}"
            )
        log.warning("GPU %d has MIG enabled but no MIG devices: it offers nothing", g.index)
    if strategy is not pc.MigStrategy.SINGLE:
        return
    attributes = {m.attributes for g in enabled for m in g.migs}
    if len(attributes) > 1:
        raise DeviceError(
            "invalid MIG configuration: more than one MIG device type present on node"
        )
    if enabled and len(enabled) != len(node.gpus):
        raise DeviceError(
            "all devices on the node must be configured with the same migEnabled value"
        )


def base_devices(node: NodeFacts, strategy: pc.MigStrategy) -> dict[str, list[Device]]:
    """Devices per resource name before sharing (raises DeviceError for rejected layouts)."""
    resources: dict[str, list[Device]] = {}
    if strategy is not pc.MigStrategy.NONE:
        _check_mig_layout(node, strategy)
    for g in node.gpus:
        if not g.mig_enabled or strategy is pc.MigStrategy.NONE:
            resources.setdefault(GPU_RESOURCE, []).append(gpu_device(g))
            continue
        for m in g.migs:
            name = (
                GPU_RESOURCE if strategy is pc.MigStrategy.SINGLE else mig_resource_name(m.profile)
            )
            resources.setdefault(name, []).append(mig_device(g, m, node.mig_minors))
    return resources


def replicate(devices: Iterable[Device], replicas: int) -> list[Device]:
    """`replicas` copies of each device, IDs `<UUID>::0` .. `<UUID>::<replicas-1>`."""
    return [
        replace(d, id=f"{d.id}{REPLICA_SEPARATOR}{n}", replicas=replicas)
        for d in devices
        for n in range(replicas)
    ]


def advertised_count(base: Mapping[str, list[Device]], config: pc.PluginConfig) -> dict[str, int]:
    """Per resource name, how many devices `config` makes of the node's `base` devices."""
    counts = {name: len(devices) for name, devices in base.items() if devices}
    replicated = config.sharing.replicated()
    for r in replicated.resources if replicated is not None else ():
        if base.get(r.name):
            counts.pop(r.name, None)
            name = r.rename or r.name
            counts[name] = counts.get(name, 0) + len(base[r.name]) * r.replicas
    return counts


def check_node_total(base: Mapping[str, list[Device]], config: pc.PluginConfig) -> None:
    """DeviceError when the node would advertise more than pc.MAX_NODE_DEVICES devices."""
    counts = advertised_count(base, config)
    total = sum(counts.values())
    if total <= pc.MAX_NODE_DEVICES:
        return
    shown = ", ".join(f"{name} {n:,}" for name, n in sorted(counts.items()))
    raise DeviceError(
        f"this node would advertise {total:,} devices ({shown}), more than the "
        f"{pc.MAX_NODE_DEVICES:,} one node may advertise (the kubelet reads each resource's "
        "device list as one gRPC message of at most 4 MiB): lower the replicas in "
        "sharing.timeSlicing or sharing.mps"
    )


def build_resources(node: NodeFacts, config: pc.PluginConfig) -> tuple[Resource, ...]:
    """The resources this node advertises under `config`, GPUs first, each with devices;
    DeviceError when they would be more than pc.MAX_NODE_DEVICES."""
    base = base_devices(node, config.flags.mig_strategy)
    check_node_total(base, config)
    sharing = config.sharing.strategy()
    replicated = config.sharing.replicated()
    out: dict[str, Resource] = {}
    shared: set[str] = set()
    if replicated is not None:
        fail_gt_one = bool(replicated.fail_requests_greater_than_one)
        for r in replicated.resources:
            devices = base.get(r.name)
            if not devices:
                continue
            if sharing is pc.SharingStrategy.MPS and any(d.is_mig for d in devices):
                raise DeviceError("sharing using MPS is not supported for MIG devices")
            shared.add(r.name)
            name = r.rename or r.name
            existing = list(out[name].devices) if name in out else []
            out[name] = Resource(
                name, tuple(existing + replicate(devices, r.replicas)), sharing, fail_gt_one
            )
    for name, devices in base.items():
        if name in shared or not devices:
            continue
        existing = list(out[name].devices) if name in out else []
        out[name] = Resource(name, tuple(existing + devices))
    return tuple(sorted(out.values(), key=lambda r: (r.name != GPU_RESOURCE, r.name)))
