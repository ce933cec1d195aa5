"""Values a fleet needs that the chart's defaults lack, chosen before the demo installs anything.

The chart's defaults suit plain GPU nodes. Some fleets need more: the device plugin refuses a node
whose GPUs carry several MIG device types under `mig.strategy=single` (the chart's default), and
nodes that register with a startup taint get neither NFD labels nor operands until the readiness
gate is on. The demo picks such values where the install leaves them unset, prints which and
why, and warns where the install sets them otherwise (values the user passes always win).

`plan` is pure (the fleet and what the install sets in, choices and warnings out); the rest reads
what an install sets and applies the choices to the demo's options. An install that turns the
operator's driver off gets GPU pools with a preinstalled driver instead (`fit_fleet`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from gpu_operator.api import keys
from gpu_operator.nodes import gate
from gpu_operator.nvml import catalog, machines
from gpudemo import fleet as fleet_mod
from gpudemo.cluster import Options

MIG_STRATEGY = "mig.strategy"
STARTUP_TAINT = "operator.startupTaint"
SANDBOX = "sandboxWorkloads.enabled"
NFD_TOLERATIONS = "node-feature-discovery.worker.tolerations"
# Taint effects that keep pods without a toleration off a node.
BLOCKING = ("NoSchedule", "NoExecute")
VM_POLICY = "examples/kubevirt-vgpu.yaml"


@dataclass(frozen=True)
class Asked:
    """What the install sets itself; None: left to the default (the chart's, or the built-in
    ClusterPolicy's)."""

    mig_strategy: str | None = None
    startup_taint: str | None = None
    sandbox: bool | None = None
    # NFD's worker tolerations as the install sets them (None: the chart's defaults).
    nfd_tolerations: tuple[Mapping[str, Any], ...] | None = None


@dataclass(frozen=True)
class Choice:
    """One value the demo sets for the fleet (a Helm values key) and why."""

    key: str
    value: Any
    why: str
    # How the value is printed when not as itself (a long list).
    summary: str = ""

    @property
    def shown(self) -> str:
        if self.summary:
            return f"{self.key}: {self.summary}"
        if isinstance(self.value, str):
            return f"{self.key}={self.value}"
        return f"{self.key}={json.dumps(self.value, separators=(',', ':'))}"


@dataclass(frozen=True)
class Fit:
    choices: tuple[Choice, ...] = ()
    warnings: tuple[str, ...] = ()

    def lines(self, setting: str) -> list[str]:
        """What the demo prints under the fleet; `setting` says how the choices are passed."""
        out = []
        if self.choices:
            out.append(
                f"values for this fleet ({setting}; the defaults do not fit it, values you pass"
                " win):"
            )
            out += [f"  {c.shown}: {c.why}" for c in self.choices]
        out += [f"warning: {w}" for w in self.warnings]
        return out


# ----- the planner ----------------------------------------------------------------------------


def single_strategy_refuses(spec: machines.MachineSpec) -> str:
    """Why the device plugin's `single` MIG strategy refuses a node with these GPUs ("" when it
    accepts them): every GPU must have MIG on with one MIG device type, or every GPU MIG off."""
    enabled = [g for g in spec.gpus if g.mig_enabled]
    if not enabled:
        return ""
    if any(not g.mig_devices for g in enabled):
        return "GPUs with MIG enabled but no MIG devices"
    profiles = sorted(
        {catalog.model(g.model).mig_profile(d).name for g in enabled for d in g.mig_devices}
    )
    if len(profiles) > 1:
        return f"several MIG device types on one node ({', '.join(profiles)})"
    if len(enabled) != len(spec.gpus):
        return "GPUs with MIG enabled next to GPUs without on one node"
    return ""


def _blocking(pool: fleet_mod.Pool) -> list[fleet_mod.Taint]:
    return [t for t in pool.taints if t.effect in BLOCKING]


def _tolerates(tolerations: Sequence[Mapping[str, Any]], taint: gate.StartupTaint) -> bool:
    for t in tolerations:
        effect = t.get("effect") or ""
        if effect and effect != taint.effect:
            continue
        if t.get("operator") == "Exists" and t.get("key") in (None, "", taint.key):
            return True
        if t.get("key") == taint.key and t.get("value", "") == taint.value:
            return True
    return False


def plan(
    fleet: fleet_mod.Fleet,
    asked: Asked,
    *,
    nfd_pods: bool,
    chart_nfd_tolerations: Sequence[Mapping[str, Any]] = (),
) -> Fit:
    """The values `fleet` needs on top of what the install sets. `nfd_pods`: NFD runs as pods
    (installed with helm), so its worker must tolerate the nodes' taints to label them."""
    choices: list[Choice] = []
    warnings: list[str] = []

    refused = [
        (pool, why)
        for pool in fleet.pools
        if pool.machine is not None and pool.count > 0
        for why in [single_strategy_refuses(machines.preset(pool.machine))]
        if why
    ]
    if refused:
        named = "; ".join(f"node pool {p.name} ({p.machine}) has {why}" for p, why in refused)
        if asked.mig_strategy is None:
            choices.append(
                Choice(
                    MIG_STRATEGY,
                    "mixed",
                    f"{named}, which the device plugin refuses under mig.strategy=single "
                    "(each MIG device type becomes its own resource nvidia.com/mig-<profile>)",
                )
            )
        elif asked.mig_strategy == "single":
            warnings.append(
                f"mig.strategy=single (set by the install) does not fit this fleet: {named}; the "
                "device plugin refuses such a node (invalid MIG configuration) and the demo "
                "never becomes ready there: use mig.strategy=mixed"
            )

    gpu_taints: dict[tuple[str, str], tuple[fleet_mod.Taint, list[str]]] = {}
    for pool in fleet.pools:
        if pool.machine is None or pool.count == 0:
            continue
        for taint in _blocking(pool):
            gpu_taints.setdefault((taint.key, taint.effect), (taint, []))[1].append(pool.name)
    gated: gate.StartupTaint | None = None
    if asked.startup_taint:
        try:
            gated = gate.StartupTaint.parse(asked.startup_taint, STARTUP_TAINT)
        except ValueError as err:
            warnings.append(str(err))
    elif gpu_taints:
        taint, pools = next(iter(gpu_taints.values()))
        gated = gate.StartupTaint(taint.key, taint.effect, taint.value)
        choices.append(
            Choice(
                STARTUP_TAINT,
                str(gated),
                (
                    f"node pools {', '.join(pools)} register their"
                    if len(pools) > 1
                    else f"node pool {pools[0]} registers its"
                )
                + f" nodes with taint {taint}, which keeps every operand off them: the "
                "operator's readiness gate tolerates it and removes it once a node validated",
            )
        )
    for (key, effect), (taint, pools) in gpu_taints.items():
        if gated is None or (key, effect) != (gated.key, gated.effect):
            warnings.append(
                f"taint {taint} of node pool(s) {', '.join(pools)} is neither the readiness "
                f"gate's ({STARTUP_TAINT}) nor tolerated by the operands: those nodes never get "
                "their GPUs; add a toleration to daemonsets.tolerations"
            )
    tainted = [p for p in fleet.pools if _blocking(p) and p.count > 0]
    if nfd_pods and tainted:
        current = (
            list(asked.nfd_tolerations)
            if asked.nfd_tolerations is not None
            else list(chart_nfd_tolerations)
        )
        missing: list[dict[str, str]] = []
        for pool in tainted:
            for taint in _blocking(pool):
                wanted = gate.StartupTaint(taint.key, taint.effect, taint.value)
                if not _tolerates([*current, *missing], wanted):
                    missing.append(wanted.toleration())
        if missing and asked.nfd_tolerations is None:
            added = ", ".join(f"{t['key']} (Exists, {t['effect']})" for t in missing)
            choices.append(
                Choice(
                    NFD_TOLERATIONS,
                    [*current, *missing],
                    "NFD's worker must run on the tainted nodes to label them",
                    summary=f"the chart's {len(current)} tolerations + {added}",
                )
            )
        elif missing:
            warnings.append(
                f"{NFD_TOLERATIONS} (set by the install) does not tolerate "
                f"{', '.join(t['key'] for t in missing)}: NFD never labels those nodes"
            )

    vm_pools = [
        p.name
        for p in fleet.pools
        if p.machine is not None
        and p.workload in (keys.WORKLOAD_VM_PASSTHROUGH, keys.WORKLOAD_VM_VGPU)
    ]
    if vm_pools and not asked.sandbox:
        warnings.append(
            f"node pool(s) {', '.join(vm_pools)} ask for VM workloads "
            f"({keys.GPU_WORKLOAD_CONFIG}) but sandbox workloads are off "
            f"({SANDBOX}=false): their GPUs go to containers. For VMs: --policy {VM_POLICY}"
        )
    return Fit(tuple(choices), tuple(warnings))


# ----- what an install sets -------------------------------------------------------------------


def _dig(data: object, dotted: str) -> tuple[bool, Any]:
    node = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _truthy(value: object) -> bool:
    return value is True or str(value).strip().lower() == "true"


def asked_from_values(values: Sequence[Path], sets: Sequence[str]) -> Asked:
    """What `helm install -f VALUES --set SETS` sets of the keys the fit looks at (later files
    and `--set` win, as in helm)."""
    found: dict[str, Any] = {}
    keys_ = (MIG_STRATEGY, STARTUP_TAINT, SANDBOX, NFD_TOLERATIONS)
    for path in values:
        try:
            data = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError):
            continue  # helm reports an unreadable values file itself
        for key in keys_:
            present, value = _dig(data, key)
            if present:
                found[key] = value
    for item in sets:
        for assignment in item.split(","):
            key, sep, value = assignment.partition("=")
            if sep and key.strip() in keys_:
                found[key.strip()] = value
    tolerations = found.get(NFD_TOLERATIONS)
    taint = str(found.get(STARTUP_TAINT) or "").strip()
    return Asked(
        mig_strategy=str(found[MIG_STRATEGY]) if MIG_STRATEGY in found else None,
        # An empty startupTaint turns the gate off, as the chart's default does.
        startup_taint=taint or None,
        sandbox=_truthy(found[SANDBOX]) if SANDBOX in found else None,
        nfd_tolerations=(
            tuple(t for t in tolerations if isinstance(t, Mapping))
            if isinstance(tolerations, list)
            else None
        ),
    )


def asked_from_policy(
    policy: Mapping[str, Any], settings: Mapping[str, Any], *, builtin: bool
) -> Asked:
    """What an in-process install sets: the ClusterPolicy (the demo's built-in one leaves the MIG
    strategy to the fit) and the operator's settings."""
    spec = policy.get("spec") or {}
    mig = spec.get("mig") or {}
    sandbox = spec.get("sandboxWorkloads") or {}
    taint = settings.get("startup_taint")
    return Asked(
        mig_strategy=None if builtin else str(mig.get("strategy") or "single"),
        startup_taint=str(taint) if taint is not None else None,
        sandbox=bool(sandbox.get("enabled")),
    )


def chart_nfd_tolerations(chart: Path) -> list[dict[str, Any]]:
    """NFD's worker tolerations in the chart's values.yaml ([] when it has none)."""
    try:
        data = yaml.safe_load((chart / "values.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return []
    present, value = _dig(data, NFD_TOLERATIONS)
    return [dict(t) for t in value if isinstance(t, Mapping)] if present and value else []


# ----- applying the choices -------------------------------------------------------------------


@dataclass
class Applied:
    options: Options
    lines: list[str] = field(default_factory=list)


def for_helm(options: Options, chart: Path) -> Applied:
    """The options with the fleet's values as `--set`/`--set-json` items of `helm install`."""
    fitted = plan(
        options.fleet,
        asked_from_values(options.values, options.sets),
        nfd_pods=True,
        chart_nfd_tolerations=chart_nfd_tolerations(chart),
    )
    sets = list(options.sets)
    set_json = list(options.set_json)
    for choice in fitted.choices:
        if isinstance(choice.value, str):
            sets.append(f"{choice.key}={choice.value}")
        else:
            set_json.append(f"{choice.key}={json.dumps(choice.value, separators=(',', ':'))}")
    return Applied(
        replace(options, sets=sets, set_json=set_json),
        fitted.lines("passed to helm install as --set/--set-json"),
    )


def for_in_process(options: Options, builtin_policy: Mapping[str, Any]) -> Applied:
    """The options with the fleet's values in the ClusterPolicy and the operator's settings."""
    builtin = options.policy is builtin_policy
    if options.policy.get("kind") == "GPUCluster":  # the DRA stack: no MIG strategy to fit
        return Applied(options)
    fitted = plan(
        options.fleet,
        asked_from_policy(options.policy, options.operator_settings, builtin=builtin),
        nfd_pods=False,
    )
    policy = options.policy
    settings = dict(options.operator_settings)
    for choice in fitted.choices:
        if choice.key == MIG_STRATEGY:
            policy = copy.deepcopy(dict(policy))
            policy["spec"]["mig"] = {**(policy["spec"].get("mig") or {}), "strategy": choice.value}
        elif choice.key == STARTUP_TAINT:
            settings["startup_taint"] = gate.StartupTaint.parse(choice.value, STARTUP_TAINT)
    return Applied(
        replace(options, policy=policy, operator_settings=settings),
        fitted.lines("set in the built-in ClusterPolicy and the operator's settings"),
    )


# ----- the operator's driver off: GPU pools bring their own ----------------------------------


def driver_disabled(policy: Mapping[str, Any] | None, values: Sequence[Path] = ()) -> bool:
    """Whether an install turns the operator's driver off: a ClusterPolicy with
    `driver.enabled: false`, or Helm values files (the last one that says wins)."""
    if policy is not None:
        spec = policy.get("spec") or {}
        section = spec.get("driver") if isinstance(spec, Mapping) else None
        if isinstance(section, Mapping) and section.get("enabled") is False:
            return True
    disabled = False
    for path in values:
        try:
            data = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError):
            continue  # helm reports an unreadable values file itself
        section = data.get("driver") if isinstance(data, Mapping) else None
        if isinstance(section, Mapping) and "enabled" in section:
            disabled = section["enabled"] is False
    return disabled


def with_host_drivers(fleet: fleet_mod.Fleet) -> tuple[fleet_mod.Fleet, list[str]]:
    """The fleet with the container GPU pools given a preinstalled driver (for an install whose
    driver is off: nothing else would ever load one there), and the pools changed."""
    changed: list[str] = []
    pools = []
    for pool in fleet.pools:
        container = pool.workload in (None, "container")
        if pool.machine is not None and pool.driver == "operator" and container:
            pool = pool.model_copy(update={"driver": "preinstalled"})
            changed.append(pool.name)
        pools.append(pool)
    return fleet.model_copy(update={"pools": pools}), changed


def fit_fleet(options: Options, console: Console) -> Options:
    """Demo options whose fleet fits the install: with the operator's driver off, GPU pools
    bring their own driver (and the console says so)."""
    if not driver_disabled(options.policy, options.values):
        return options
    fleet, changed = with_host_drivers(options.fleet)
    if changed:
        console.print(
            f"note: the install turns the operator's driver off (driver.enabled=false), so the "
            f"GPU pools {', '.join(changed)} come with a preinstalled driver "
            f"{fleet_mod.DEFAULT_HOST_DRIVER}",
            markup=False,
            highlight=False,
        )
        options.fleet = fleet
    return options
