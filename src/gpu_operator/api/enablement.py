"""Which operands are on: upstream's meaning of an unset `enabled` per ClusterPolicy section."""

from __future__ import annotations

from typing import Final

from gpu_operator.api.clusterpolicy import CDIConfigSpec, ClusterPolicySpec, HostPathsSpec

# The value an unset (nil) `enabled` stands for, per section (upstream IsEnabled()).
ENABLED_WHEN_UNSET: Final[dict[str, bool]] = {
    "driver": True,
    "toolkit": True,
    "devicePlugin": True,
    "dcgm": True,
    "dcgmExporter": True,
    "gfd": True,
    "migManager": True,
    "cdi": True,
    "nodeStatusExporter": False,
    "psp": False,
    "psa": False,
    "gds": False,
    "gdrcopy": False,
    "sandboxWorkloads": False,
    "vfioManager": False,
    "vgpuManager": False,
    "vgpuDeviceManager": False,
    "sandboxDevicePlugin": False,
    "kataSandboxDevicePlugin": False,
    "kataManager": False,
    "ccManager": False,
}


def is_enabled(spec: ClusterPolicySpec, section: str) -> bool:
    """Whether a section is on: its explicit `enabled`, else upstream's default for it."""
    if section not in ENABLED_WHEN_UNSET:
        raise KeyError(f"{section!r} is not a ClusterPolicy section with an enabled flag")
    value = getattr(spec, section)
    enabled = None if value is None else value.enabled
    return ENABLED_WHEN_UNSET[section] if enabled is None else bool(enabled)


def cdi(spec: ClusterPolicySpec) -> CDIConfigSpec:
    """The CDI settings with CRD defaults filled in."""
    return spec.cdi or CDIConfigSpec()


def nri_plugin_enabled(spec: ClusterPolicySpec) -> bool:
    """NRI injection is in effect only together with CDI (the chart drops it otherwise)."""
    return is_enabled(spec, "cdi") and cdi(spec).nriPluginEnabled


def host_paths(spec: ClusterPolicySpec) -> HostPathsSpec:
    """The host paths with CRD defaults filled in; an empty string also means the default, as
    upstream's transforms read it."""
    given = spec.hostPaths or HostPathsSpec()
    empty = {name for name, value in given if value == ""}
    if not empty:
        return given
    defaults = HostPathsSpec()
    return given.model_copy(update={name: getattr(defaults, name) for name in empty})


def sandbox_enabled(spec: ClusterPolicySpec) -> bool:
    return is_enabled(spec, "sandboxWorkloads")


def rdma_enabled(spec: ClusterPolicySpec) -> bool:
    rdma = spec.driver.rdma
    return bool(rdma and rdma.enabled)


def mig_strategy(spec: ClusterPolicySpec) -> str | None:
    """The MIG strategy, or None when unset (operands then monitor all devices)."""
    return spec.mig.strategy if spec.mig else None
