"""Check a mig-parted config without a node: its format, and every entry with a device filter
against the catalogued GPU that filter names (what `gpu-operator validate` runs on a MIG config
ConfigMap or file). Entries without a filter apply to whatever GPU a node has, so only the MIG
manager on that node can refuse them; here a config no catalogued GPU accepts gets a warning,
but a profile name no catalogued GPU offers at all is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpu_operator.agents.mig_manager import config as cfg
from gpu_operator.agents.mig_manager import planner, profiles
from gpu_operator.nvml import catalog


@dataclass
class Report:
    """Errors (the file cannot work as written) and warnings (it may, on GPUs we do not know)."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def is_mig_parted(document: Any) -> bool:
    """A bare mig-parted document (`version`, `mig-configs`), not a Kubernetes object."""
    return isinstance(document, dict) and "mig-configs" in document and "kind" not in document


def config_map_entries(obj: Any) -> list[tuple[str, str]]:
    """The `data` keys of a ConfigMap whose text looks like a mig-parted file, with that text."""
    if not isinstance(obj, dict) or obj.get("kind") != "ConfigMap":
        return []
    data = obj.get("data")
    if not isinstance(data, dict):
        return []
    return [
        (str(key), text)
        for key, text in data.items()
        if isinstance(text, str) and "mig-configs" in text
    ]


def check(data: Any, source: str) -> Report:
    """Check one decoded mig-parted document; messages name the source, config and entry."""
    report = Report()
    try:
        parsed = cfg.parse(data, source)
    except cfg.ConfigError as err:
        report.errors.append(str(err))
        return report
    known = _catalogued_profiles()
    for name, entries in parsed.configs.items():
        unknown = _unknown_profiles(source, name, entries, known)
        report.errors.extend(unknown)
        if unknown:
            continue
        report.errors.extend(_filtered_entry_errors(source, name, entries))
        if not _accepted_anywhere(name, entries):
            report.warnings.append(
                f"{source}: mig-configs.{name}: no GPU in the catalog can apply it "
                f"(known MIG GPUs: {', '.join(m.key for m in catalog.mig_capable_models())})"
            )
    return report


def _catalogued_profiles() -> set[str]:
    return {name for model in catalog.mig_capable_models() for name in profiles.known_names(model)}


def _unknown_profiles(
    source: str, name: str, entries: tuple[cfg.Entry, ...], known: set[str]
) -> list[str]:
    # A profile no catalogued GPU offers fails on every node we know (mig-parted refuses it),
    # unlike a combination no GPU can hold, which may suit a GPU we do not know (a warning).
    return [
        f"{source}: mig-configs.{name}[{entry.index}].mig-devices.{profile.name}: unknown MIG "
        f"profile {profile.name!r}: no GPU in the catalog offers it"
        for entry in entries
        for profile in entry.mig_devices
        if profile.name not in known
    ]


def _filtered_entry_errors(source: str, name: str, entries: tuple[cfg.Entry, ...]) -> list[str]:
    errors = []
    for entry in entries:
        if not entry.mig_enabled:
            continue
        for device_id in entry.device_filter:
            model = catalog.for_pci_device_id(device_id.packed)
            if model is None or not model.mig_capable:
                continue  # a GPU we know nothing about: the node's manager will tell
            gpu = planner.GpuState(
                0, model, pci_device_id=device_id.packed, pci_subsystem_id=device_id.subsystem or 0
            )
            try:
                planner.plan_node(name, [entry], [gpu])
            except planner.PlanError as err:
                errors.append(f"{source}: {err} (device-filter {device_id})")
    return errors


def _accepted_anywhere(name: str, entries: tuple[cfg.Entry, ...]) -> bool:
    for model in catalog.mig_capable_models():
        ids = (model.pci_device_id, *model.pci_aliases)
        for pci_id in ids:
            try:
                plan = planner.plan_node(
                    name, entries, [planner.GpuState(0, model, pci_device_id=pci_id)]
                )
            except planner.PlanError:
                continue
            if plan.gpus:
                return True
    return False
