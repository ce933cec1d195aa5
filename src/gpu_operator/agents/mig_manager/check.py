"""Check a mig-parted config without a node: its format, and every entry with a device filter
against the catalogued GPU that filter names (what `gpu-operator validate` runs on a MIG config
ConfigMap or file). Entries without a filter apply to whatever GPU a node has, so only the MIG
manager on that node can refuse them; here a config no catalogued GPU accepts gets a warning,
but a profile name no catalogued GPU offers at all is an error. Which GPU indices a node has is
only known there too (the manager fails a config naming one it lacks), but an index no node can
have, 32 or more, gets a warning here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from gpu_operator.agents.mig_manager import config as cfg
from gpu_operator.agents.mig_manager import planner, profiles
from gpu_operator.nvml import catalog

# NVIDIA's driver handles at most 32 GPUs in one system (NV_MAX_DEVICES in its nvlimits.h), so
# no node has a GPU index of 32 or more.
MAX_GPUS_PER_NODE = 32


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
        report.warnings.extend(_impossible_indices(source, name, entries))
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


def _impossible_indices(source: str, name: str, entries: tuple[cfg.Entry, ...]) -> list[str]:
    warnings = []
    for entry in entries:
        if entry.devices == cfg.ALL:
            continue
        beyond = sorted({i for i in entry.devices if i >= MAX_GPUS_PER_NODE})
        if beyond:
            label = "GPU index" if len(beyond) == 1 else "GPU indices"
            warnings.append(
                f"{source}: mig-configs.{name}[{entry.index}].devices: {label} "
                f"{', '.join(map(str, beyond))} cannot exist (NVIDIA's driver handles at most "
                f"{MAX_GPUS_PER_NODE} GPUs in one system): the MIG manager fails this config on "
                "every node"
            )
    return warnings


def _possible(entries: tuple[cfg.Entry, ...]) -> tuple[cfg.Entry, ...]:
    """The entries without the indices no node can have (those are warned about)."""
    return tuple(
        e
        if e.devices == cfg.ALL
        else replace(e, devices=tuple(i for i in e.devices if i < MAX_GPUS_PER_NODE))
        for e in entries
    )


def _node(
    model: catalog.GpuModel, entries: tuple[cfg.Entry, ...], pci_id: int, subsystem: int = 0
) -> list[planner.GpuState]:
    """A made-up node of `model` GPUs with every index the entries name (one GPU at least)."""
    named = [i for e in entries if e.devices != cfg.ALL for i in e.devices]
    return [
        planner.GpuState(i, model, pci_device_id=pci_id, pci_subsystem_id=subsystem)
        for i in range(max(named, default=0) + 1)
    ]


def _filtered_entry_errors(source: str, name: str, entries: tuple[cfg.Entry, ...]) -> list[str]:
    errors = []
    for entry in _possible(entries):
        if not entry.mig_enabled:
            continue
        for device_id in entry.device_filter:
            model = catalog.for_pci_device_id(device_id.packed)
            if model is None or not model.mig_capable:
                continue  # a GPU we know nothing about: the node's manager will tell
            node = _node(model, (entry,), device_id.packed, device_id.subsystem or 0)
            try:
                planner.plan_node(name, [entry], node)
            except planner.PlanError as err:
                errors.append(f"{source}: {err} (device-filter {device_id})")
    return errors


def _accepted_anywhere(name: str, entries: tuple[cfg.Entry, ...]) -> bool:
    possible = _possible(entries)
    for model in catalog.mig_capable_models():
        ids = (model.pci_device_id, *model.pci_aliases)
        for pci_id in ids:
            try:
                plan = planner.plan_node(name, possible, _node(model, possible, pci_id))
            except planner.PlanError:
                continue
            if plan.gpus:
                return True
    return False
