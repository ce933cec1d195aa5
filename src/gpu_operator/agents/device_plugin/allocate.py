"""Allocate: device IDs in, what the runtime must inject into the container out.

Pure. One `ContainerAllocation` per container request, built as upstream does: CDI device names
first (annotations and/or CRI CDI devices), MPS pipe and shm mounts, then, unless every strategy
is a CDI one, `NVIDIA_VISIBLE_DEVICES` (envvar or volume-mounts), device specs and the
GDS/MOFED/GDRCopy switches.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gpu_operator.agents import cdi
from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.device_plugin.devices import REPLICA_SEPARATOR, Resource, physical_id

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
IMEX_CHANNELS = "NVIDIA_IMEX_CHANNELS"
# The volume-mounts strategy: the toolkit reads the device list from mount points under this root.
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
VOLUME_MOUNTS_HOST_PATH = "/dev/null"
CDI_VENDOR = "k8s.device-plugin.nvidia.com"
CDI_ANNOTATION_OWNER = "nvidia-device-plugin"
DEFAULT_CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
MPS_CONTAINER_ROOT = "/mps"
# Device nodes every GPU container needs besides its GPUs; passed only where present on the node.
CONTROL_DEVICE_NODES = cdi.CONTROL_DEVICE_NODES
CDI_STRATEGIES = frozenset({"cdi-annotations", "cdi-cri"})


class AllocateError(ValueError):
    """The kubelet asked for something the plugin cannot give; the message goes back over gRPC."""


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True)
class DeviceSpec:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass
class ContainerAllocation:
    """One ContainerAllocateResponse, as plain data."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    devices: list[DeviceSpec] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class AllocateOptions:
    """The Allocate-relevant settings, resolved once per plugin start."""

    device_list_strategies: tuple[str, ...] = ("envvar",)
    device_id_strategy: str = "uuid"
    pass_device_specs: bool = False
    dev_root: str = "/"
    cdi_annotation_prefix: str = DEFAULT_CDI_ANNOTATION_PREFIX
    gds: bool = False
    mofed: bool = False
    gdrcopy: bool = False
    # CDI classes besides `gpu` whose spec has devices (gds, mofed, gdrcopy are named only then).
    cdi_extra_classes: frozenset[str] = frozenset()
    imex_channels: tuple[str, ...] = ()
    # Host MPS root; set only when the resource is shared with MPS.
    mps_root: str | None = None
    present_control_nodes: frozenset[str] = frozenset()

    @property
    def cdi_enabled(self) -> bool:
        return any(s in CDI_STRATEGIES for s in self.device_list_strategies)

    @property
    def only_cdi(self) -> bool:
        return all(s in CDI_STRATEGIES for s in self.device_list_strategies)

    @classmethod
    def from_config(
        cls,
        config: pc.PluginConfig,
        resource: Resource,
        *,
        present_control_nodes: Iterable[str] = (),
        cdi_extra_classes: Iterable[str] = (),
        imex_channels: Sequence[str] = (),
    ) -> AllocateOptions:
        flags = config.flags
        mps = resource.sharing is pc.SharingStrategy.MPS
        return cls(
            device_list_strategies=tuple(flags.plugin.device_list_strategy),
            device_id_strategy=flags.plugin.device_id_strategy,
            pass_device_specs=flags.plugin.pass_device_specs,
            dev_root=flags.nvidia_dev_root or flags.nvidia_driver_root,
            cdi_annotation_prefix=flags.plugin.cdi_annotation_prefix,
            gds=flags.gds_enabled,
            mofed=flags.mofed_enabled,
            gdrcopy=flags.gdrcopy_enabled,
            cdi_extra_classes=frozenset(cdi_extra_classes),
            imex_channels=tuple(imex_channels),
            mps_root=flags.mps_root if mps else None,
            present_control_nodes=frozenset(present_control_nodes),
        )


def qualified_name(cdi_class: str, name: str) -> str:
    """A fully qualified CDI device name, `k8s.device-plugin.nvidia.com/gpu=<name>`."""
    return f"{CDI_VENDOR}/{cdi_class}={name}"


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def runtime_ids(resource: Resource, ids: Sequence[str], strategy: str) -> list[str]:
    """What the container runtime gets: UUIDs without replica suffixes, or device indices."""
    if strategy == "index":
        by_id = resource.by_id()
        return _unique(by_id[i].index for i in ids)
    return _unique(physical_id(i) for i in ids)


def validate_request(resource: Resource, ids: Sequence[str]) -> None:
    """Upstream's checks, in its order: the shared request size, then unknown IDs."""
    if (
        resource.fail_requests_greater_than_one
        and any(REPLICA_SEPARATOR in i for i in ids)
        and len(ids) > 1
    ):
        raise AllocateError(
            f"request for '{resource.name}: {len(ids)}' too large: "
            "maximum request size for shared resources is 1"
        )
    known = resource.by_id()
    for i in ids:
        if i not in known:
            raise AllocateError(
                f"invalid allocation request for '{resource.name}': unknown device: {i}"
            )


def _device_paths(resource: Resource, ids: Sequence[str]) -> list[str]:
    by_id = resource.by_id()
    return _unique(p for i in ids for p in by_id[i].paths)


def _host(dev_root: str, path: str) -> str:
    root = dev_root.rstrip("/")
    return f"{root}{path}" if root else path


def _cdi(
    out: ContainerAllocation, names: list[str], opts: AllocateOptions, response_id: str
) -> None:
    devices = [qualified_name("gpu", n) for n in names]
    devices += [qualified_name("imex-channel", c) for c in opts.imex_channels]
    for enabled, cdi_class in (
        (opts.gds, "gds"),
        (opts.mofed, "mofed"),
        (opts.gdrcopy, "gdrcopy"),
    ):
        if enabled and cdi_class in opts.cdi_extra_classes:
            devices.append(qualified_name(cdi_class, "all"))
    if not devices:
        return
    if "cdi-annotations" in opts.device_list_strategies:
        key = f"{opts.cdi_annotation_prefix}{CDI_ANNOTATION_OWNER}_{response_id}"
        out.annotations[key] = ",".join(devices)
    if "cdi-cri" in opts.device_list_strategies:
        out.cdi_devices.extend(devices)


def _mps(out: ContainerAllocation, resource: Resource, mps_root: str) -> None:
    pipe = f"{MPS_CONTAINER_ROOT}/{resource.name}/pipe"
    root = mps_root.rstrip("/")
    out.envs["CUDA_MPS_PIPE_DIRECTORY"] = pipe
    out.mounts.append(Mount(pipe, f"{root}/{resource.name}/pipe"))
    out.mounts.append(Mount("/dev/shm", f"{root}/shm"))


def allocate_container(
    resource: Resource, ids: Sequence[str], opts: AllocateOptions, response_id: str
) -> ContainerAllocation:
    """The response for one container request (raises AllocateError for a bad request)."""
    validate_request(resource, ids)
    names = runtime_ids(resource, ids, opts.device_id_strategy)
    out = ContainerAllocation()
    if opts.cdi_enabled:
        _cdi(out, names, opts, response_id)
    if opts.mps_root is not None:
        _mps(out, resource, opts.mps_root)
    if opts.only_cdi:
        return out
    if "envvar" in opts.device_list_strategies:
        out.envs[VISIBLE_DEVICES] = ",".join(names)
        if opts.imex_channels:
            out.envs[IMEX_CHANNELS] = ",".join(opts.imex_channels)
    if "volume-mounts" in opts.device_list_strategies:
        out.envs[VISIBLE_DEVICES] = VOLUME_MOUNTS_ROOT
        out.mounts.extend(
            Mount(f"{VOLUME_MOUNTS_ROOT}/{n}", VOLUME_MOUNTS_HOST_PATH) for n in names
        )
        out.mounts.extend(
            Mount(f"{VOLUME_MOUNTS_ROOT}/imex/{c}", VOLUME_MOUNTS_HOST_PATH)
            for c in opts.imex_channels
        )
    if opts.pass_device_specs:
        paths = [p for p in CONTROL_DEVICE_NODES if p in opts.present_control_nodes]
        paths += _device_paths(resource, ids)
        out.devices.extend(DeviceSpec(p, _host(opts.dev_root, p)) for p in _unique(paths))
    if opts.gds:
        out.envs["NVIDIA_GDS"] = "enabled"
    if opts.mofed:
        out.envs["NVIDIA_MOFED"] = "enabled"
    if opts.gdrcopy:
        out.envs["NVIDIA_GDRCOPY"] = "enabled"
    return out


def allocate(
    resource: Resource,
    requests: Sequence[Sequence[str]],
    opts: AllocateOptions,
    new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
) -> list[ContainerAllocation]:
    """Responses for every container request of one Allocate call, in request order."""
    return [allocate_container(resource, ids, opts, new_id()) for ids in requests]
