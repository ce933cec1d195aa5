"""The device-plugin/GFD configuration file (upstream `api/config/v1`), shared by node agents.

Parsing keeps upstream's quirks where they change behaviour: `version` must be `v1` (empty means
v1), resource renames other than `renameByDefault` and device selections other than `all` are
reset with a warning, and MPS defaults `failRequestsGreaterThanOne` to true.

Beyond upstream, a shortened form seen in widely copied guides is accepted as a documented
shorthand (see `expand_shorthand`): `sharing.timeSlicing.replicas: N` (or `sharing.mps.replicas`)
and a top-level `mig.strategy`. Each use is logged with the upstream spelling it stands for.

Also beyond upstream, which takes any positive count, replicas are bounded (MAX_REPLICAS,
MAX_MPS_REPLICAS; the node's total in `device_plugin.devices`, MAX_NODE_DEVICES): every replica
is one device in the list the plugin sends the kubelet, and a million of them never reach it.
"""

from __future__ import annotations

import copy
import logging
import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic

from gpu_operator.api import manifests

log = logging.getLogger(__name__)

RESOURCE_PREFIX = "nvidia.com/"
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


# What one node may advertise (docs/device-plugin.md, "Limits"). The kubelet reads a plugin's
# device list as one gRPC message and leaves gRPC's default 4 MiB receive limit in place; a
# device takes about 68 bytes of it (`GPU-<uuid>::<n>`, its health and NUMA node), so about
# 60,000 fit. A node advertises at most a quarter of that, all resources together.
MAX_NODE_DEVICES = 16_384
# Time-slicing replicas per GPU: 16 GPUs (a DGX-2, the most any DGX or HGX system has) times
# this is MAX_NODE_DEVICES. A GPU shared 1,024 ways gives each replica a 1/1,024
# time slice and, on an 80 GiB GPU, 80 MiB of memory.
MAX_REPLICAS = 1024
# MPS replicas per GPU: each gets 100/replicas percent of the GPU's threads
# (set_default_active_thread_percentage takes whole percents from 1), so at most 100.
MAX_MPS_REPLICAS = 100


class ConfigError(ValueError):
    """The configuration is invalid; the message names the field."""


class MigStrategy(StrEnum):
    NONE = "none"
    SINGLE = "single"
    MIXED = "mixed"


class SharingStrategy(StrEnum):
    NONE = "none"
    TIME_SLICING = "time-slicing"
    MPS = "mps"


def parse_duration(text: str) -> float | None:
    """A Go duration (`60s`, `1m30s`) in seconds; `infinite` gives None (label once, then idle)."""
    value = text.strip()
    if value == "infinite":
        return None
    if not value or _DURATION_PART.sub("", value):
        raise ValueError(f"invalid duration {text!r}: expected e.g. 60s, 5m or infinite")
    return sum(float(n) * _UNITS[u] for n, u in _DURATION_PART.findall(value))


class _Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", populate_by_name=True)


class _OpenModel(pydantic.BaseModel):
    # Flag sections grow upstream with every release; unknown flags are ignored, not fatal.
    model_config = pydantic.ConfigDict(extra="ignore", populate_by_name=True)


def _resource_name(value: str) -> str:
    name = value if value.startswith(RESOURCE_PREFIX) else RESOURCE_PREFIX + value
    suffix = name[len(RESOURCE_PREFIX) :]
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", suffix) or len(suffix) > 63:
        raise ValueError(f"invalid resource name {value!r}")
    return name


ResourceName = Annotated[str, pydantic.AfterValidator(_resource_name)]


def _too_many(value: int, limit: int, mps: bool = False) -> str:
    if mps:
        why = "each MPS replica gets 100/replicas percent of the GPU's threads, 1 at least"
    else:
        why = (
            "every replica is one device in the list the plugin sends the kubelet, and a node "
            f"advertises at most {MAX_NODE_DEVICES:,}"
        )
    return f"{value:,} replicas per GPU is more than the {limit:,} allowed ({why})"


class ReplicatedResource(_Model):
    name: ResourceName
    rename: ResourceName | None = None
    devices: str | int | list[str] = "all"
    replicas: int = pydantic.Field(ge=2)

    @pydantic.field_validator("replicas")
    @classmethod
    def _at_most(cls, value: int) -> int:
        if value > MAX_REPLICAS:
            raise ValueError(_too_many(value, MAX_REPLICAS))
        return value

    @pydantic.field_validator("devices", mode="before")
    @classmethod
    def _devices(cls, value: Any) -> Any:
        if value == "all" or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            return value
        if isinstance(value, list) and value and all(isinstance(v, str | int) for v in value):
            return [str(v) for v in value]
        raise ValueError("expected 'all', a positive count, or a list of GPU indices or UUIDs")


class ReplicatedResources(_Model):
    rename_by_default: bool = pydantic.Field(default=False, alias="renameByDefault")
    fail_requests_greater_than_one: bool | None = pydantic.Field(
        default=None, alias="failRequestsGreaterThanOne"
    )
    resources: list[ReplicatedResource] = pydantic.Field(min_length=1)

    def _normalise(self, where: str) -> None:
        for r in self.resources:
            if r.rename is not None:
                log.warning("%s: rename of %s is not yet supported; ignoring it", where, r.name)
                r.rename = None
            if r.devices != "all":
                log.warning("%s: device selection for %s is not yet supported; using all",
                            where, r.name)  # fmt: skip
                r.devices = "all"
            if self.rename_by_default:
                r.rename = r.name + ".shared"

    def any_replicated(self) -> bool:
        return any(r.replicas > 1 for r in self.resources)


class Sharing(_Model):
    time_slicing: ReplicatedResources | None = pydantic.Field(default=None, alias="timeSlicing")
    mps: ReplicatedResources | None = None

    @pydantic.field_validator("mps")
    @classmethod
    def _mps_replicas(cls, value: ReplicatedResources | None) -> ReplicatedResources | None:
        for i, r in enumerate(value.resources if value is not None else ()):
            if r.replicas > MAX_MPS_REPLICAS:
                raise ValueError(
                    f"resources.{i}.replicas: {_too_many(r.replicas, MAX_MPS_REPLICAS, mps=True)}"
                )
        return value

    def strategy(self) -> SharingStrategy:
        if self.mps is not None and self.mps.any_replicated():
            return SharingStrategy.MPS
        if self.time_slicing is not None and self.time_slicing.any_replicated():
            return SharingStrategy.TIME_SLICING
        return SharingStrategy.NONE

    def replicated(self) -> ReplicatedResources | None:
        """The resources of the active sharing strategy, if any."""
        match self.strategy():
            case SharingStrategy.MPS:
                return self.mps
            case SharingStrategy.TIME_SLICING:
                return self.time_slicing
        return None


class ResourcePattern(_Model):
    pattern: str
    name: ResourceName


class Resources(_Model):
    gpus: list[ResourcePattern] = []
    mig: list[ResourcePattern] = []


class PluginFlags(_OpenModel):
    pass_device_specs: bool = pydantic.Field(default=False, alias="passDeviceSpecs")
    device_list_strategy: list[Literal["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"]] = (
        pydantic.Field(default=["envvar"], alias="deviceListStrategy")
    )
    device_id_strategy: Literal["uuid", "index"] = pydantic.Field(
        default="uuid", alias="deviceIDStrategy"
    )
    cdi_annotation_prefix: str = pydantic.Field(default="cdi.k8s.io/", alias="cdiAnnotationPrefix")
    nvidia_ctk_path: str = pydantic.Field(default="/usr/bin/nvidia-ctk", alias="nvidiaCTKPath")
    container_driver_root: str = pydantic.Field(default="/driver-root", alias="containerDriverRoot")
    shared_devices_allocation_policy: Literal["distributed", "packed"] = pydantic.Field(
        default="distributed", alias="sharedDevicesAllocationPolicy"
    )

    @pydantic.field_validator("device_list_strategy", mode="before")
    @classmethod
    def _string_or_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class GfdFlags(_OpenModel):
    oneshot: bool = False
    no_timestamp: bool = pydantic.Field(default=False, alias="noTimestamp")
    sleep_interval: str = pydantic.Field(default="60s", alias="sleepInterval")
    output_file: str = pydantic.Field(
        default="/etc/kubernetes/node-feature-discovery/features.d/gfd", alias="outputFile"
    )
    machine_type_file: str = pydantic.Field(
        default="/sys/class/dmi/id/product_name", alias="machineTypeFile"
    )
    imex_nodes_config_file: str | None = pydantic.Field(default=None, alias="imexNodesConfigFile")

    @pydantic.field_validator("sleep_interval")
    @classmethod
    def _duration(cls, value: str) -> str:
        parse_duration(value)
        return value

    @property
    def sleep_seconds(self) -> float | None:
        return parse_duration(self.sleep_interval)


class Flags(_OpenModel):
    mig_strategy: MigStrategy = pydantic.Field(default=MigStrategy.NONE, alias="migStrategy")
    fail_on_init_error: bool = pydantic.Field(default=True, alias="failOnInitError")
    nvidia_driver_root: str = pydantic.Field(default="/", alias="nvidiaDriverRoot")
    nvidia_dev_root: str | None = pydantic.Field(default=None, alias="nvidiaDevRoot")
    mps_root: str = pydantic.Field(default="", alias="mpsRoot")
    gds_enabled: bool = pydantic.Field(default=False, alias="gdsEnabled")
    mofed_enabled: bool = pydantic.Field(default=False, alias="mofedEnabled")
    gdrcopy_enabled: bool = pydantic.Field(default=False, alias="gdrcopyEnabled")
    use_node_feature_api: bool = pydantic.Field(default=True, alias="useNodeFeatureAPI")
    device_discovery_strategy: Literal["auto", "nvml", "tegra", "vfio"] = pydantic.Field(
        default="auto", alias="deviceDiscoveryStrategy"
    )
    plugin: PluginFlags = PluginFlags()
    gfd: GfdFlags = GfdFlags()


class Imex(_Model):
    channel_ids: list[int] = pydantic.Field(default=[], alias="channelIDs")
    required: bool = False

    @pydantic.field_validator("channel_ids")
    @classmethod
    def _only_channel_zero(cls, value: list[int]) -> list[int]:
        if value not in ([], [0]):
            raise ValueError("only [] or [0] are supported")
        return value


class PluginConfig(_Model):
    """A whole config file; build it with `load`, `parse` or `PluginConfig()` for defaults."""

    version: Literal["v1"] = "v1"
    flags: Flags = Flags()
    resources: Resources = Resources()
    sharing: Sharing = Sharing()
    imex: Imex = Imex()

    @pydantic.field_validator("version", mode="before")
    @classmethod
    def _empty_is_v1(cls, value: Any) -> Any:
        return "v1" if value in (None, "") else value

    @pydantic.model_validator(mode="after")
    def _semantics(self) -> PluginConfig:
        if self.resources.gpus or self.resources.mig:
            log.warning("resources: custom resource names are not yet supported; ignoring them")
            self.resources = Resources()
        if self.sharing.time_slicing is not None:
            self.sharing.time_slicing._normalise("sharing.timeSlicing")
        if self.sharing.mps is not None:
            self.sharing.mps._normalise("sharing.mps")
            if self.sharing.mps.fail_requests_greater_than_one is None:
                self.sharing.mps.fail_requests_greater_than_one = True
        mps = self.sharing.strategy() is SharingStrategy.MPS
        if mps and self.flags.mig_strategy is MigStrategy.MIXED:
            raise ValueError("flags.migStrategy: mixed cannot be combined with sharing.mps")
        return self


DEFAULT_SHARED_RESOURCE = RESOURCE_PREFIX + "gpu"


def expand_shorthand(data: dict[str, Any], source: str = "config") -> dict[str, Any]:
    """The upstream form of a document that uses the shorthand; anything else is returned as is.

    `sharing.<timeSlicing|mps>.replicas: N` stands for one resource `nvidia.com/gpu` with N
    replicas (MIG resources are not replicated by it), and a top-level `mig.strategy` for
    `flags.migStrategy`. Mixing a shorthand with the long form it replaces is an error, so a
    value is never silently dropped.
    """
    sharing = data.get("sharing")
    mig = data.get("mig")
    uses_replicas = isinstance(sharing, dict) and any(
        isinstance(sharing.get(k), dict) and "replicas" in sharing[k]
        for k in ("timeSlicing", "mps")
    )
    if not uses_replicas and mig is None:
        return data
    expanded = copy.deepcopy(data)
    used: list[str] = []
    for key in ("timeSlicing", "mps"):
        section = (expanded.get("sharing") or {}).get(key)
        if not isinstance(section, dict) or "replicas" not in section:
            continue
        if "resources" in section:
            raise ConfigError(
                f"{source}: sharing.{key}: give either the shorthand `replicas` or `resources`, "
                f"not both (upstream form: sharing.{key}.resources: [{{name: nvidia.com/gpu, "
                "replicas: N}])"
            )
        replicas = section.pop("replicas")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 2:
            raise ConfigError(
                f"{source}: sharing.{key}.replicas: expected an integer of at least 2, "
                f"got {_clipped(replicas)}"
            )
        limit = MAX_MPS_REPLICAS if key == "mps" else MAX_REPLICAS
        if replicas > limit:
            raise ConfigError(
                f"{source}: sharing.{key}.replicas: {_too_many(replicas, limit, key == 'mps')}"
            )
        section["resources"] = [{"name": DEFAULT_SHARED_RESOURCE, "replicas": replicas}]
        used.append(
            f"sharing.{key}.replicas: {replicas} means sharing.{key}.resources: "
            f"[{{name: {DEFAULT_SHARED_RESOURCE}, replicas: {replicas}}}]"
        )
    if mig is not None:
        if not isinstance(mig, dict) or set(mig) != {"strategy"}:
            raise ConfigError(
                f"{source}: mig: the shorthand takes only `mig.strategy` (none, single or "
                "mixed); upstream spells it flags.migStrategy"
            )
        flags = expanded.setdefault("flags", {})
        if not isinstance(flags, dict):
            raise ConfigError(f"{source}: flags: expected a mapping")
        strategy = mig["strategy"]
        if "migStrategy" in flags and flags["migStrategy"] != strategy:
            raise ConfigError(
                f"{source}: mig.strategy ({strategy!r}) contradicts flags.migStrategy "
                f"({flags['migStrategy']!r}); keep only flags.migStrategy"
            )
        flags["migStrategy"] = strategy
        del expanded["mig"]
        used.append(f"mig.strategy: {strategy} means flags.migStrategy: {strategy}")
    log.warning(
        "%s uses the shorthand form, which NVIDIA's plugin does not read: %s",
        source,
        "; ".join(used),
    )
    return expanded


def _clipped(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def parse(data: Any, source: str = "config") -> PluginConfig:
    """Validate an already-decoded config document; ConfigError names the offending field."""
    if data is None:
        return PluginConfig()
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    if data.get("version") not in (None, "", "v1"):
        raise ConfigError(f"{source}: version: unknown version {data['version']!r} (expected v1)")
    data = expand_shorthand(data, source)
    try:
        return PluginConfig.model_validate(data)
    except pydantic.ValidationError as err:
        raise ConfigError(f"{source}: {manifests.field_errors(err)}") from None


def load(path: str | Path) -> PluginConfig:
    """Read a YAML or JSON config file."""
    try:
        data = manifests.load_one(path)
    except manifests.ManifestError as err:
        raise ConfigError(str(err)) from None
    return parse(data, str(path))
