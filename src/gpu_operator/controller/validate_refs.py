"""Every ConfigMap a ClusterPolicy (or an NVIDIADriver) names, in one table, checked the same way
by every front door.

`references` is the table: for each field that names a ConfigMap, the operand states that mount
it and the keys their agents read. `check_facts` checks it against the operator's ConfigMap facts
(the controller, offline `render` and `images`): a ConfigMap that is missing, or lacks a key its
reader needs, holds back the states that mount it, with the fix; offline, a ConfigMap that was not
given is a warning. `check` is `validate`'s: the same table, plus the contents of the ConfigMaps it
was given (files, or read from the cluster), checked with the rules of the agents that read them.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpu_operator import api
from gpu_operator.agents import plugin_config
from gpu_operator.agents.dcgm_exporter import counters
from gpu_operator.agents.mig_manager import check as mig_check
from gpu_operator.api import manifests
from gpu_operator.operands import (
    config_manager,
    dcgm_exporter,
    device_plugin,
    driver,
    gpu_feature_discovery,
    mig_manager,
    mps_control_daemon,
    registry,
    vgpu_device_manager,
    vgpu_manager,
)
from gpu_operator.operands.facts import ClusterFacts

# The key the MIG manager reads from a custom ConfigMap (mounted as config.yaml).
MIG_CONFIG_KEY = "config.yaml"
# The key the MIG manager reads its host GPU clients from (GPU_CLIENTS_FILE).
MIG_CLIENTS_KEY = "clients.yaml"
# The key the vGPU device manager reads (CONFIG_FILE).
VGPU_CONFIG_KEY = "config.yaml"
PLUGIN_LABEL = config_manager.NODE_LABEL
# The NVIDIADriver reconciler's driver DaemonSets (not a ClusterPolicy state).
NVIDIADRIVER = "nvidiadriver"

# plugin: device-plugin configs, one per key; mig: a mig-parted file; metrics: the exporter's
# counters CSV; keys: the reader needs exactly `keys`; files: every key is mounted as a file.
RefKind = Literal["plugin", "mig", "metrics", "keys", "files"]


@dataclass(frozen=True)
class Ref:
    """A ConfigMap named by a policy field: who mounts it and which keys they read."""

    kind: RefKind
    path: str
    name: str
    states: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    default_key: str | None = None
    reader: str = "the operand"

    def wanted(self) -> str:
        """What the ConfigMap must hold, for a fix: `with key dcgm-metrics.csv`."""
        if self.kind == "plugin":
            if self.default_key:
                return f"with key {self.default_key} (a device-plugin config)"
            return "with one key per device-plugin config"
        if self.kind == "files":
            return "with one key per file to mount"
        if len(self.keys) == 1:
            return f"with key {self.keys[0]}"
        return "with keys " + " and ".join(self.keys)


@dataclass(frozen=True)
class Finding:
    """One problem or note about a reference: an Event reason, the full message, and the states
    it holds back (none for a note)."""

    reason: str
    message: str
    states: tuple[str, ...] = ()
    warning: bool = True


@dataclass
class FactsReport:
    """What `check_facts` found: problems hold their states back, notes do not."""

    problems: list[Finding] = field(default_factory=list)
    notes: list[Finding] = field(default_factory=list)

    @property
    def blocked(self) -> dict[str, str]:
        """State name -> why it waits (every problem of that state, joined)."""
        out: dict[str, str] = {}
        for problem in self.problems:
            for state in problem.states:
                out[state] = f"{out[state]}; {problem.message}" if state in out else problem.message
        return out


@dataclass
class Report:
    """Errors and warnings, each a full line naming the policy field or the ConfigMap key."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _get(doc: Any, *path: str) -> Any:
    for part in path:
        doc = doc.get(part) if isinstance(doc, dict) else None
    return doc


def _name(doc: Any, *path: str) -> str | None:
    value = _get(doc, *path)
    return value if isinstance(value, str) and value else None


@dataclass(frozen=True)
class _Row:
    """A ClusterPolicy field naming a ConfigMap read by known keys (or mounted file by file)."""

    kind: RefKind
    path: tuple[str, ...]
    states: tuple[str, ...]
    keys: tuple[str, ...]
    reader: str
    # The operator's own ConfigMap, used when the field is unset: the operator creates it.
    builtin: str | None = None


_TABLE = (
    _Row("metrics", ("dcgmExporter", "config", "name"), (dcgm_exporter.NAME,),
         (dcgm_exporter.METRICS_KEY,), "the DCGM exporter"),
    _Row("mig", ("migManager", "config", "name"), (mig_manager.NAME,), (MIG_CONFIG_KEY,),
         "the MIG manager", mig_manager.MIG_CONFIG_CM),
    _Row("keys", ("migManager", "gpuClientsConfig", "name"), (mig_manager.NAME,),
         (MIG_CLIENTS_KEY,), "the MIG manager", mig_manager.GPU_CLIENTS_CM),
    _Row("files", ("vgpuManager", "kernelModuleConfig", "name"), (vgpu_manager.NAME,), (),
         "the vGPU manager"),
    _Row("keys", ("vgpuDeviceManager", "config", "name"), (vgpu_device_manager.NAME,),
         (VGPU_CONFIG_KEY,), "the vGPU device manager", vgpu_device_manager.DEVICES_CM),
)  # fmt: skip
# The device-plugin ConfigMap is mounted by the three pods that run the config manager.
PLUGIN_STATES = (device_plugin.NAME, gpu_feature_discovery.NAME, mps_control_daemon.NAME)


def references(policy: Mapping[str, Any]) -> list[Ref]:
    """Every ConfigMap a ClusterPolicy document names, with the states that mount it.

    The operator's own defaults (`default-mig-parted-config`, `default-gpu-clients`,
    `default-vgpu-devices-config`) are the operator's to create and are left out; a Secret
    (`licensingConfig.secretName`) is no ConfigMap."""
    spec = policy.get("spec")
    refs: list[Ref] = []
    plugin = _name(spec, "devicePlugin", "config", "name")
    if plugin:
        default = _name(spec, "devicePlugin", "config", "default")
        refs.append(
            Ref("plugin", "spec.devicePlugin.config.name", plugin, PLUGIN_STATES,
                default_key=default, reader="the config manager")
        )  # fmt: skip
    refs += _driver_refs(_get(spec, "driver"), "spec.driver", (driver.NAME,), nvidiadriver=False)
    for row in _TABLE:
        name = _name(spec, *row.path)
        if name and name != row.builtin:
            path = "spec." + ".".join(row.path)
            refs.append(Ref(row.kind, path, name, row.states, row.keys, reader=row.reader))
    return refs


def _driver_refs(
    section: Any, prefix: str, states: tuple[str, ...], *, nvidiadriver: bool
) -> list[Ref]:
    """The driver's ConfigMaps; an NVIDIADriver spells a few fields differently."""
    refs: list[Ref] = []
    reader = "the driver container"
    repo = _name(section, "repoConfig", "name" if nvidiadriver else "configMapName")
    if repo:
        field_ = "repoConfig.name" if nvidiadriver else "repoConfig.configMapName"
        refs.append(Ref("files", f"{prefix}.{field_}", repo, states, reader=reader))
    for part in ("certConfig", "kernelModuleConfig"):
        name = _name(section, part, "name")
        if name:
            refs.append(Ref("files", f"{prefix}.{part}.name", name, states, reader=reader))
    topology_field = (
        ("virtualTopologyConfig", "name") if nvidiadriver else ("virtualTopology", "config")
    )
    topology = _name(section, *topology_field)
    if topology:
        refs.append(
            Ref(
                "keys",
                f"{prefix}.{'.'.join(topology_field)}",
                topology,
                states,
                (driver.TOPOLOGY_KEY,),
                reader=reader,
            )
        )
    licensing = _get(section, "licensingConfig")
    config_field = "name" if nvidiadriver else "configMapName"
    licence = _name(licensing, config_field)
    if licence and not _name(licensing, "secretName"):
        nls = _get(licensing, "nlsEnabled")
        # An NVIDIADriver's unset nlsEnabled means enabled; a ClusterPolicy's means disabled.
        wants_token = nls is True or (nvidiadriver and nls is None)
        keys = (driver.GRIDD_CONF, driver.NLS_TOKEN) if wants_token else (driver.GRIDD_CONF,)
        refs.append(
            Ref(
                "keys",
                f"{prefix}.licensingConfig.{config_field}",
                licence,
                states,
                keys,
                reader=reader,
            )
        )
    return refs


def nvidiadriver_references(driver_doc: Mapping[str, Any]) -> list[Ref]:
    """Every ConfigMap an NVIDIADriver document names (its driver DaemonSets mount them)."""
    return _driver_refs(driver_doc.get("spec"), "spec", (NVIDIADRIVER,), nvidiadriver=True)


def references_of(doc: Mapping[str, Any]) -> list[Ref]:
    """The table for a ClusterPolicy or an NVIDIADriver document; [] for other kinds."""
    if doc.get("kind") == "ClusterPolicy":
        return references(doc)
    if doc.get("kind") == "NVIDIADriver":
        return nvidiadriver_references(doc)
    return []


# ----- messages ---------------------------------------------------------------------------------


def _in(namespace: str | None) -> str:
    return f" in namespace {namespace}" if namespace else " in the operator's namespace"


def not_found(ref: Ref, namespace: str | None) -> str:
    """The problem and its fix, as the status, Events and `validate --kubeconfig` say it."""
    where = _in(namespace)
    return (
        f"{ref.path}: ConfigMap {ref.name} not found{where}: create ConfigMap {ref.name}{where} "
        f"{ref.wanted()}"
    )


def not_given(ref: Ref, namespace: str | None) -> str:
    """Offline: a ConfigMap the input did not hold is unknown, not missing."""
    rendered = ""
    if ref.kind == "files":
        rendered = "; its file mounts are left out of the rendered DaemonSet"
    return (
        f"{ref.path}: ConfigMap {ref.name} was not given (pass it with -f to check it){rendered}; "
        f"the operator waits until ConfigMap {ref.name} exists{_in(namespace)} {ref.wanted()}"
    )


def key_problems(ref: Ref, keys: Sequence[str], namespace: str | None) -> list[str]:
    """What the ConfigMap lacks for its reader; [] when its keys will do."""
    held = ", ".join(keys) if keys else "none"
    where = f"ConfigMap {ref.name}{_in(namespace)}"
    if ref.kind == "plugin":
        if not keys:
            return [
                f"{ref.path}: {where} has no keys: the config manager refuses an empty "
                f"ConfigMap: add one key per device-plugin config"
            ]
        if ref.default_key and ref.default_key not in keys:
            return [
                f"spec.devicePlugin.config.default: {ref.default_key} is not a key of {where} "
                f"(its keys: {held}): the config manager has no config of that name for nodes "
                f"without the {PLUGIN_LABEL} label: set spec.devicePlugin.config.default to one "
                f"of its keys, or add key {ref.default_key} to ConfigMap {ref.name}"
            ]
        return []
    problems = []
    for key in ref.keys:
        if key in keys:
            continue
        close = difflib.get_close_matches(key, list(keys), n=1, cutoff=0.5)
        fix = (
            f"rename key {close[0]} to {key}" if close else f"add key {key} to ConfigMap {ref.name}"
        )
        problems.append(
            f"{ref.path}: {where} has no key {key} (its keys: {held}): {ref.reader} reads "
            f"key {key} only: {fix}"
        )
    return problems


def unused_note(ref: Ref, keys: Sequence[str] | None, labels: Mapping[str, int]) -> list[str]:
    """The operator's view of a device-plugin ConfigMap without a default: unused when no GPU
    node carries the label (every node gets the empty config), and labels naming no key."""
    hint = f"one of its keys ({', '.join(keys)})" if keys else "one of its keys"
    if not labels:
        return [
            f"{ref.path}: ConfigMap {ref.name} is not used: spec.devicePlugin.config.default is "
            f"not set and no GPU node carries the label {PLUGIN_LABEL}, so every node gets the "
            "empty config, the device plugin's built-in defaults (the operator runs the config "
            "manager with FALLBACK_STRATEGIES=empty: even a single key is not picked): set "
            f"spec.devicePlugin.config.default to {hint}, or label nodes {PLUGIN_LABEL}=<key>"
        ]
    if keys is None:
        return []
    notes = []
    for value, count in sorted(labels.items()):
        if value not in keys:
            notes.append(
                f"{ref.path}: {count} GPU node(s) carry {PLUGIN_LABEL}={value}, which names no "
                f"key of ConfigMap {ref.name} (its keys: {', '.join(keys) or 'none'}): they do "
                "not get it (the config manager records DevicePluginConfigRejected Events on "
                f"them): set the label to {hint}"
            )
    return notes


def unused_warning(ref: Ref, keys: Sequence[str] | None) -> str:
    """`validate`'s version (no node labels known): who gets the ConfigMap without a default."""
    hint = f"one of its keys ({', '.join(keys)})" if keys else "one of its keys"
    return (
        f"spec.devicePlugin.config.default is not set: ConfigMap {ref.name} is used only on "
        f"nodes labelled {PLUGIN_LABEL}=<key>; every other node gets the empty config, the "
        "device plugin's built-in defaults, even when the ConfigMap has a single key (the "
        "operator runs the config manager with FALLBACK_STRATEGIES=empty): set "
        f"spec.devicePlugin.config.default to {hint}, or label the nodes"
    )


# ----- the operator's check (ConfigMap facts) ---------------------------------------------------


def _enabled_states(policy: api.ClusterPolicy, facts: ClusterFacts) -> set[str]:
    return {state.name for state in registry.STATES if state.enabled(policy, facts)}


def check_facts(policy: api.ClusterPolicy, facts: ClusterFacts) -> FactsReport:
    """Check every reference of an enabled state against the ConfigMap facts (pure)."""
    out = FactsReport()
    enabled = _enabled_states(policy, facts)
    namespace = facts.namespace
    for ref in references(policy.to_dict()):
        states = tuple(s for s in ref.states if s in enabled)
        if not states:
            continue
        found = facts.config_map_keys.get(ref.name)
        keys = tuple(found) if found is not None else None
        if keys is None and facts.config_maps_complete:
            out.problems.append(Finding("ConfigMapNotFound", not_found(ref, namespace), states))
        elif keys is None:
            out.notes.append(Finding("ConfigMapNotGiven", not_given(ref, namespace)))
        else:
            for message in key_problems(ref, keys, namespace):
                out.problems.append(Finding("ConfigMapKeyMissing", message, states))
        if ref.kind == "plugin" and not ref.default_key and facts.plugin_config_labels is not None:
            for message in unused_note(ref, keys, facts.plugin_config_labels):
                out.notes.append(Finding("DevicePluginConfigUnused", message))
    return out


# ----- validate's check (ConfigMap objects) -----------------------------------------------------


def _data(config_map: Mapping[str, Any]) -> dict[str, Any]:
    data = config_map.get("data")
    return data if isinstance(data, dict) else {}


def config_map_keys(config_map: Mapping[str, Any]) -> list[str]:
    """Every key of a ConfigMap object (data and binaryData), sorted."""
    binary = config_map.get("binaryData")
    return sorted(
        {*map(str, _data(config_map)), *(map(str, binary) if isinstance(binary, dict) else ())}
    )


def _check_mig(where: str, config_map: Mapping[str, Any], out: Report) -> None:
    text = _data(config_map).get(MIG_CONFIG_KEY)
    if not isinstance(text, str):
        return  # reported as a missing key
    source = f"{where}: data.{MIG_CONFIG_KEY}"
    try:
        parsed = manifests.parse(text, source)
    except manifests.ManifestError as err:
        out.errors.append(str(err))
        return
    report = mig_check.check(parsed[0] if len(parsed) == 1 else parsed, source)
    out.errors.extend(report.errors)
    out.warnings.extend(report.warnings)


def _check_plugin(where: str, config_map: Mapping[str, Any], out: Report) -> None:
    for key, text in _data(config_map).items():
        source = f"{where}: data.{key}"
        if not isinstance(text, str):
            out.errors.append(f"{source}: expected a YAML document as a string")
            continue
        try:
            parsed = manifests.parse(text, source)
            plugin_config.parse(parsed[0] if parsed else None, source)
        except (manifests.ManifestError, plugin_config.ConfigError) as err:
            out.errors.append(str(err))


def _check_metrics(where: str, config_map: Mapping[str, Any], out: Report) -> None:
    text = _data(config_map).get(dcgm_exporter.METRICS_KEY)
    if not isinstance(text, str):
        return  # reported as a missing key
    try:
        counters.parse(text, f"{where}: data.{dcgm_exporter.METRICS_KEY}")
    except counters.CsvError as err:
        out.errors.append(str(err))


def check(
    doc: Mapping[str, Any],
    config_maps: Mapping[str, Mapping[str, Any]],
    *,
    complete: bool,
    namespace: str | None = None,
    policy: api.ClusterPolicy | None = None,
) -> Report:
    """Check the ConfigMaps a ClusterPolicy or NVIDIADriver document names among `config_maps`
    (by name). With `complete` (read from the cluster) a missing one is an error; otherwise it
    was just not given. `policy` (the validated model) leaves out the references of disabled
    states."""
    out = Report()
    enabled = _enabled_states(policy, ClusterFacts()) if policy is not None else None
    for ref in references_of(doc):
        if enabled is not None and not any(s in enabled for s in ref.states):
            continue
        config_map = config_maps.get(ref.name)
        if config_map is None:
            if ref.kind == "plugin" and not ref.default_key:
                out.warnings.append(unused_warning(ref, None))
            if complete:
                out.errors.append(not_found(ref, namespace))
            continue
        keys = config_map_keys(config_map)
        if ref.kind == "plugin" and not ref.default_key:
            out.warnings.append(unused_warning(ref, keys))
        meta = config_map.get("metadata")
        found_in = meta.get("namespace") if isinstance(meta, dict) else None
        out.errors.extend(key_problems(ref, keys, namespace or found_in or None))
        where = f"ConfigMap/{ref.name}"
        if ref.kind == "mig":
            _check_mig(where, config_map, out)
        elif ref.kind == "plugin":
            _check_plugin(where, config_map, out)
        elif ref.kind == "metrics":
            _check_metrics(where, config_map, out)
    return out
