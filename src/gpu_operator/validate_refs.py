"""The ConfigMaps a ClusterPolicy refers to, checked with the rules of the agents that read them.

`gpu-operator validate` hands in the ConfigMaps it was given (files, or read from the cluster);
the MIG manager's custom config must hold a mig-parted file under `config.yaml`, and every key of
the device-plugin ConfigMap is a plugin config, with `devicePlugin.config.default` among them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.agents import plugin_config
from gpu_operator.agents.mig_manager import check as mig_check
from gpu_operator.api import manifests

# The key the MIG manager reads from a custom ConfigMap (mounted as config.yaml).
MIG_CONFIG_KEY = "config.yaml"


@dataclass(frozen=True)
class Ref:
    """A ConfigMap named by a policy field."""

    kind: str  # "mig" or "plugin"
    path: str
    name: str
    default_key: str | None = None


@dataclass
class Report:
    """Errors and warnings, each a full line naming the policy field or the ConfigMap key."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _get(doc: Any, *path: str) -> Any:
    for part in path:
        doc = doc.get(part) if isinstance(doc, dict) else None
    return doc


def references(policy: Mapping[str, Any]) -> list[Ref]:
    """The MIG and device-plugin ConfigMaps a ClusterPolicy document names."""
    refs = []
    mig = _get(policy, "spec", "migManager", "config", "name")
    if isinstance(mig, str) and mig and mig != "default-mig-parted-config":
        refs.append(Ref("mig", "spec.migManager.config.name", mig))
    plugin = _get(policy, "spec", "devicePlugin", "config")
    if isinstance(plugin, dict) and isinstance(plugin.get("name"), str) and plugin["name"]:
        default = plugin.get("default")
        refs.append(
            Ref(
                "plugin",
                "spec.devicePlugin.config.name",
                plugin["name"],
                default if isinstance(default, str) and default else None,
            )
        )
    return refs


def _data(config_map: Mapping[str, Any]) -> dict[str, Any]:
    data = config_map.get("data")
    return data if isinstance(data, dict) else {}


def _check_mig(ref: Ref, where: str, config_map: Mapping[str, Any], out: Report) -> None:
    text = _data(config_map).get(MIG_CONFIG_KEY)
    if not isinstance(text, str):
        out.errors.append(
            f"{where}: data.{MIG_CONFIG_KEY}: required: the MIG manager reads its config from "
            f"this key ({ref.path} names this ConfigMap)"
        )
        return
    source = f"{where}: data.{MIG_CONFIG_KEY}"
    try:
        parsed = manifests.parse(text, source)
    except manifests.ManifestError as err:
        out.errors.append(str(err))
        return
    report = mig_check.check(parsed[0] if len(parsed) == 1 else parsed, source)
    out.errors.extend(report.errors)
    out.warnings.extend(report.warnings)


def _check_plugin(ref: Ref, where: str, config_map: Mapping[str, Any], out: Report) -> None:
    data = _data(config_map)
    if not data:
        out.errors.append(f"{where}: data: no device-plugin config in it ({ref.path})")
    for key, text in data.items():
        source = f"{where}: data.{key}"
        if not isinstance(text, str):
            out.errors.append(f"{source}: expected a YAML document as a string")
            continue
        try:
            parsed = manifests.parse(text, source)
            plugin_config.parse(parsed[0] if parsed else None, source)
        except (manifests.ManifestError, plugin_config.ConfigError) as err:
            out.errors.append(str(err))
    if ref.default_key is not None and ref.default_key not in data:
        keys = ", ".join(sorted(map(str, data))) or "none"
        out.errors.append(
            f"spec.devicePlugin.config.default: {ref.default_key!r} is not a key of "
            f"{where} (keys: {keys})"
        )


def check(
    policy: Mapping[str, Any],
    config_maps: Mapping[str, Mapping[str, Any]],
    *,
    complete: bool,
    namespace: str | None = None,
) -> Report:
    """Check the ConfigMaps `policy` refers to among `config_maps` (by name). With `complete`
    (read from the cluster) a missing one is an error; otherwise it was just not given."""
    out = Report()
    for ref in references(policy):
        where = f"ConfigMap/{ref.name}"
        config_map = config_maps.get(ref.name)
        if config_map is None:
            if complete:
                out.errors.append(
                    f"{ref.path}: ConfigMap {ref.name!r} not found in namespace "
                    f"{namespace or '<unknown>'}: the operand pods cannot start without it"
                )
            continue
        if ref.kind == "mig":
            _check_mig(ref, where, config_map, out)
        else:
            _check_plugin(ref, where, config_map, out)
    return out
