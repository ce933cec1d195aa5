"""Feature gates and NVIDIA's opaque device configs (`GpuConfig`, `MigDeviceConfig`). Pure.

Facts carried from NVIDIA's driver: the configs are `resource.nvidia.com/v1beta1` objects passed
as opaque parameters for driver `gpu.nvidia.com`; `sharing.strategy` is `TimeSlicing` (with
`timeSlicingConfig.interval`: Default, Short, Medium, Long) or `MPS` (with `mpsConfig`:
`defaultActiveThreadPercentage` 0-100, pinned-memory limits). Time-slicing needs the plugin's
`TimeSlicingSettings` gate and MPS its `MPSSupport` gate (both alpha, off by default); with the
gate off the strategy is refused. `DynamicMIG` and `NVMLDeviceHealthCheck` are the other gates
that matter to this plugin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

API_VERSION = "resource.nvidia.com/v1beta1"
GPU_CONFIG = "GpuConfig"
MIG_CONFIG = "MigDeviceConfig"
TIME_SLICING = "TimeSlicing"
MPS = "MPS"
INTERVALS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}

TIME_SLICING_GATE = "TimeSlicingSettings"
MPS_GATE = "MPSSupport"
DYNAMIC_MIG_GATE = "DynamicMIG"
HEALTH_GATE = "NVMLDeviceHealthCheck"
# NVIDIA's gates with their defaults (the ones this plugin reads, and the others it accepts).
DEFAULT_GATES: Mapping[str, bool] = {
    TIME_SLICING_GATE: False,
    MPS_GATE: False,
    DYNAMIC_MIG_GATE: False,
    HEALTH_GATE: False,
    "IMEXDaemonsWithDNSNames": True,
    "PassthroughSupport": False,
    "ComputeDomainCliques": True,
    "CrashOnNVLinkFabricErrors": True,
    "DeviceMetadata": False,
}


class ConfigError(ValueError):
    """A feature-gate string or an opaque config the plugin refuses (the message says why)."""


def parse_gates(text: str) -> dict[str, bool]:
    """`A=true,B=false` over the defaults; unknown names and values are refused."""
    gates = dict(DEFAULT_GATES)
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name, value = name.strip(), value.strip().lower()
        if name not in DEFAULT_GATES:
            raise ConfigError(
                f"--feature-gates: unrecognized feature gate {name!r} "
                f"(known: {', '.join(sorted(DEFAULT_GATES))})"
            )
        if not sep or value not in ("true", "false"):
            raise ConfigError(f"--feature-gates: {part!r}: expected {name}=true or {name}=false")
        gates[name] = value == "true"
    if gates[DYNAMIC_MIG_GATE] and gates[MPS_GATE]:
        raise ConfigError(f"feature gate {DYNAMIC_MIG_GATE} is mutually exclusive with {MPS_GATE}")
    return gates


@dataclass(frozen=True)
class Sharing:
    """The effective sharing of a device: none, time-slicing (interval) or MPS (settings)."""

    strategy: str = ""
    interval: str = "Default"
    mps: Mapping[str, Any] = field(default_factory=dict)


def parse(parameters: Any, gates: Mapping[str, bool], *, mig: bool) -> Sharing:
    """The sharing an opaque config asks for; ConfigError names the field and the fix."""
    if not isinstance(parameters, dict):
        raise ConfigError("opaque parameters must be an object (a GpuConfig or MigDeviceConfig)")
    api_version = parameters.get("apiVersion")
    kind = parameters.get("kind")
    if api_version != API_VERSION or kind not in (GPU_CONFIG, MIG_CONFIG):
        raise ConfigError(
            f"unsupported opaque config {api_version}/{kind}: expected apiVersion "
            f"{API_VERSION} with kind {GPU_CONFIG} or {MIG_CONFIG}"
        )
    if kind == GPU_CONFIG and mig:
        raise ConfigError(f"a {GPU_CONFIG} cannot configure a MIG device: use a {MIG_CONFIG}")
    if kind == MIG_CONFIG and not mig:
        raise ConfigError(f"a {MIG_CONFIG} cannot configure a full GPU: use a {GPU_CONFIG}")
    unknown = set(parameters) - {"apiVersion", "kind", "sharing"}
    if unknown:
        raise ConfigError(f"{kind}: unknown field(s) {', '.join(sorted(unknown))}")
    sharing = parameters.get("sharing")
    if sharing is None:
        return default_sharing(gates, mig=mig)
    if not isinstance(sharing, dict):
        raise ConfigError(f"{kind}.sharing must be an object")
    strategy = sharing.get("strategy")
    if strategy == TIME_SLICING:
        if not gates.get(TIME_SLICING_GATE):
            raise ConfigError(_gate_off(TIME_SLICING, TIME_SLICING_GATE))
        if sharing.get("mpsConfig") is not None:
            raise ConfigError(f"cannot use mpsConfig with the {TIME_SLICING!r} strategy")
        interval = (sharing.get("timeSlicingConfig") or {}).get("interval") or "Default"
        if interval not in INTERVALS:
            raise ConfigError(
                f"unknown time-slice interval: {interval}, supported time-slice intervals: "
                + ", ".join(INTERVALS)
            )
        return Sharing(TIME_SLICING, interval=str(interval))
    if strategy == MPS:
        if not gates.get(MPS_GATE):
            raise ConfigError(_gate_off(MPS, MPS_GATE))
        if sharing.get("timeSlicingConfig") is not None:
            raise ConfigError(f"cannot use timeSlicingConfig with the {MPS!r} strategy")
        mps = sharing.get("mpsConfig") or {}
        if not isinstance(mps, dict):
            raise ConfigError("mpsConfig must be an object")
        unknown_mps = set(mps) - set(MPS_FIELDS)
        if unknown_mps:
            raise ConfigError(
                f"mpsConfig: unknown field(s) {', '.join(sorted(unknown_mps))} "
                f"(known: {', '.join(MPS_FIELDS)})"
            )
        threads = mps.get("defaultActiveThreadPercentage")
        if threads is not None and not (isinstance(threads, int) and 0 <= threads <= 100):
            raise ConfigError("mpsConfig.defaultActiveThreadPercentage must be 0 to 100")
        if mps.get("defaultPinnedDeviceMemoryLimit") is not None:
            _megabytes(
                "mpsConfig.defaultPinnedDeviceMemoryLimit", mps["defaultPinnedDeviceMemoryLimit"]
            )
        per_device = mps.get("defaultPerDevicePinnedMemoryLimit") or {}
        if not isinstance(per_device, dict):
            raise ConfigError("mpsConfig.defaultPerDevicePinnedMemoryLimit must be a map")
        for key, value in per_device.items():
            _megabytes(f"mpsConfig.defaultPerDevicePinnedMemoryLimit[{key}]", value)
        return Sharing(MPS, mps=dict(mps))
    raise ConfigError(
        f"unknown GPU sharing strategy: {strategy}, supported GPU sharing strategies: "
        f"{TIME_SLICING}, {MPS}"
    )


MPS_FIELDS = (
    "defaultActiveThreadPercentage",
    "defaultPinnedDeviceMemoryLimit",
    "defaultPerDevicePinnedMemoryLimit",
)
_UNITS = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip


def _megabytes(where: str, value: Any) -> str:
    """A pinned-memory quantity as the MPS control daemon takes it: whole MiB, `<n>M`."""
    text = str(value).strip()
    number, factor = text, 1
    for unit in sorted(_UNITS, key=len, reverse=True):
        if text.endswith(unit):
            number, factor = text[: -len(unit)], _UNITS[unit]
            break
    try:
        size = int(Decimal(number) * factor)
    except (InvalidOperation, ValueError):
        raise ConfigError(f"{where}: {value!r} is not a memory quantity (e.g. 10Gi)") from None
    mib = size // 2**20
    if mib <= 0:
        raise ConfigError(f"{where}: {value!r} is too low (at least 1Mi)")
    return f"{mib}M"


def mps_commands(mps: Mapping[str, Any], uuids: Sequence[str]) -> list[str]:
    """The commands an MPS control daemon for a claim's GPUs (`uuids`, in the claim's order)
    gets after it starts: NVIDIA's defaults, the pinned-memory limit per GPU by UUID (the
    default for every GPU, overridden per GPU by UUID or by index among the claim's GPUs), and
    the active-thread percentage."""
    limits: dict[str, str] = {}
    default = mps.get("defaultPinnedDeviceMemoryLimit")
    if default is not None:
        mb = _megabytes("mpsConfig.defaultPinnedDeviceMemoryLimit", default)
        limits = dict.fromkeys(uuids, mb)
    for key, value in (mps.get("defaultPerDevicePinnedMemoryLimit") or {}).items():
        where = f"mpsConfig.defaultPerDevicePinnedMemoryLimit[{key}]"
        key = str(key)
        if key in uuids:
            uuid = key
        elif key.isdigit() and int(key) < len(uuids):
            uuid = uuids[int(key)]
        else:
            raise ConfigError(
                f"{where}: no such device in the claim (use a GPU UUID of the claim or an index "
                f"0-{len(uuids) - 1} among its GPUs)"
            )
        limits[uuid] = _megabytes(where, value)
    commands = [
        f"set_default_device_pinned_mem_limit {u} {limits[u]}" for u in uuids if u in limits
    ]
    threads = mps.get("defaultActiveThreadPercentage")
    if threads is not None:
        commands.append(f"set_default_active_thread_percentage {threads}")
    return commands


def default_sharing(gates: Mapping[str, bool], *, mig: bool) -> Sharing:
    """Without a config: time-slicing at the default interval on full GPUs when the
    TimeSlicingSettings gate is on (as NVIDIA's default GpuConfig), else nothing."""
    if gates.get(TIME_SLICING_GATE) and not mig:
        return Sharing(TIME_SLICING)
    return Sharing()


def _gate_off(strategy: str, gate: str) -> str:
    return (
        f"{strategy!r} is selected as the GPU sharing strategy, but the {gate!r} feature gate "
        f"is not enabled (start the plugin with --feature-gates={gate}=true)"
    )
