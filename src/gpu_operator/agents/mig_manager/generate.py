"""The config generated from a node's own GPUs when no config file is given (upstream's
hardware-generated config): `all-disabled`, `all-enabled`, `all-<profile>` at the profile's
maximum count, and `all-balanced`; entries carry a device filter only on mixed-model nodes."""

from __future__ import annotations

from collections.abc import Sequence
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


def config_name(profile: catalog.MigProfile) -> str:
    """`all-1g.5gb`, `all-1g.5gb.me` (a `+` becomes `.` in config names, as upstream)."""
    return f"all-{profile.resource_name}"


def generate(models: Sequence[catalog.GpuModel]) -> dict[str, Any]:
    """The mig-parted document for a node with GPUs of these models (in index order)."""
    capable: list[catalog.GpuModel] = []
    for model in models:
        if model.mig_capable and model not in capable:
            capable.append(model)
    mixed = len(capable) > 1
    configs: dict[str, list[dict[str, Any]]] = {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
    }
    per_profile: dict[str, list[dict[str, Any]]] = {}
    balanced: list[dict[str, Any]] = []
    for model in capable:
        for profile in sorted(model.mig_profiles, key=lambda p: (p.slice_count, p.profile_id)):
            per_profile.setdefault(config_name(profile), []).append(
                _entry(model, mixed, {profile.name: profile.instance_count})
            )
        plain = {p.slice_count: p.name for p in model.mig_profiles if p.profile_id in _PLAIN}
        layout = BALANCED.get(model.mig_compute_slices, {})
        if layout and all(size in plain for size in layout):
            balanced.append(_entry(model, mixed, {plain[s]: n for s, n in layout.items()}))
    configs.update(per_profile)
    if balanced:
        configs["all-balanced"] = balanced
    return {"version": "v1", "mig-configs": configs}


def _entry(model: catalog.GpuModel, mixed: bool, devices: dict[str, int]) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    if mixed:
        entry["device-filter"] = [model.pci_device_id_hex]
    entry.update({"devices": "all", "mig-enabled": True, "mig-devices": devices})
    return entry


def to_yaml(document: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
