"""The config generated from a node's own GPUs when no config file is given (upstream's
hardware-generated config, MIG manager 0.14+ with GPU Operator 26.x).

Input: each MIG-capable GPU's GPU-instance profiles as NVML reports them (profile id, slices,
memory, how many fit), so the configs are named after what the driver really offers: an H200
gets `all-1g.18gb`, `all-1g.35gb`, ..., `all-7g.141gb`. Output: `all-disabled`, `all-enabled`,
one `all-<profile>` per profile (a `+` written `.`, as upstream names configs) at the profile's
maximum count, and `all-balanced` (2 x 1g + 1 x 2g + 1 x 3g on 7-slice GPUs, 2 x 1g + 1 x 2g on
4-slice ones). Entries carry a device filter (the GPU's own PCI id) only on nodes with several
kinds of MIG GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from gpu_operator.nvml import catalog

HEADER = (
    "# DO NOT EDIT: generated from this node's GPU hardware by the MIG manager.\n"
    "# Copy it into a ConfigMap named by migManager.config.name to customise it.\n"
)
# all-balanced by GPU size (compute slices): count per plain 1g/2g/3g profile size.
BALANCED = {7: {1: 2, 2: 1, 3: 1}, 4: {1: 2, 2: 1}}
_PLAIN = (catalog.GI_PROFILE_1_SLICE, catalog.GI_PROFILE_2_SLICE, catalog.GI_PROFILE_3_SLICE)


class GenerationError(RuntimeError):
    """The GPUs cannot describe their MIG profiles (some drivers report none): no config."""


@dataclass(frozen=True)
class Profile:
    """One GPU-instance profile as NVML reports it, named as NVML tools name it."""

    profile_id: int
    name: str
    slice_count: int
    instance_count: int


@dataclass(frozen=True)
class GpuProfiles:
    """A MIG-capable GPU: its PCI id and the GPU-instance profiles its driver offers."""

    index: int
    pci_device_id: int
    profiles: tuple[Profile, ...]

    @property
    def compute_slices(self) -> int:
        return max((p.slice_count for p in self.profiles), default=0)

    @property
    def kind(self) -> tuple[int, tuple[Profile, ...]]:
        return (self.pci_device_id, self.profiles)


def from_model(model: catalog.GpuModel, index: int = 0) -> GpuProfiles:
    """What NVML reports for a catalogued model (the mock serves exactly this table)."""
    profiles = tuple(
        Profile(p.profile_id, p.name, p.slice_count, p.instance_count)
        for p in sorted(model.mig_profiles, key=lambda p: p.profile_id)
    )
    return GpuProfiles(index, model.pci_device_id, profiles)


def config_name(profile_name: str) -> str:
    """`all-1g.5gb`, `all-1g.5gb.me` (a `+` becomes `.` in config names, as upstream)."""
    return "all-" + profile_name.replace("+", ".")


def generate(gpus: Sequence[GpuProfiles | catalog.GpuModel]) -> dict[str, Any]:
    """The mig-parted document for a node with these MIG-capable GPUs (models are read as the
    mock serves them; GPUs without MIG are left out)."""
    kinds: list[GpuProfiles] = []
    for item in gpus:
        if isinstance(item, catalog.GpuModel):
            if not item.mig_capable:
                continue
            item = from_model(item)
        if not item.profiles:
            raise GenerationError(f"GPU {item.index} reports no MIG profiles")
        if item.kind not in [k.kind for k in kinds]:
            kinds.append(item)
    mixed = len(kinds) > 1
    configs: dict[str, list[dict[str, Any]]] = {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
    }
    per_profile: dict[str, list[dict[str, Any]]] = {}
    balanced: list[dict[str, Any]] = []
    for gpu in kinds:
        for profile in sorted(gpu.profiles, key=lambda p: (p.slice_count, p.profile_id)):
            per_profile.setdefault(config_name(profile.name), []).append(
                _entry(gpu, mixed, {profile.name: profile.instance_count})
            )
        plain = {p.slice_count: p.name for p in gpu.profiles if p.profile_id in _PLAIN}
        layout = BALANCED.get(gpu.compute_slices, {})
        if layout and all(size in plain for size in layout):
            balanced.append(_entry(gpu, mixed, {plain[s]: n for s, n in layout.items()}))
    configs.update(per_profile)
    if balanced:
        configs["all-balanced"] = balanced
    return {"version": "v1", "mig-configs": configs}


def _entry(gpu: GpuProfiles, mixed: bool, devices: dict[str, int]) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    if mixed:
        entry["device-filter"] = [f"0x{gpu.pci_device_id:08X}"]
    entry.update({"devices": "all", "mig-enabled": True, "mig-devices": devices})
    return entry


def to_yaml(document: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
