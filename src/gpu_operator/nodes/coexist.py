"""Coexistence detector: per GPU node, what already there would fight the operator's operands.

Three cases (docs/coexistence.md):
- managed-driver: the cloud installs the NVIDIA driver (a GKE node with
  `cloud.google.com/gke-gpu-driver-version` other than `disabled`, or a label rule the admin adds
  for AKS node pools created without `--gpu-driver none`), or NFD's NodeFeature for the node lists
  the `nvidia` kernel module as loaded while the operator never deployed its driver there (an AKS
  node image that brings the driver, a hand-installed one). Two drivers on one host never work.
- foreign-device-plugin: `nvidia.com/gpu` capacity on a node where our device plugin has not
  been deployed: someone else's plugin (AKS managed GPU pools, a hand-installed DaemonSet)
  advertises the GPUs, and it found a working driver. Two plugins for one resource make the
  kubelet keep only the last registration and break the other's allocations.
- dra-driver: ResourceSlices of NVIDIA's DRA driver (`gpu.nvidia.com`) for the node. DRA and the
  device plugin on one node admit the same GPU twice (NVIDIA/aicr PR #332).

Each case has an action: `adapt` (skip only what would fight: the operator's driver is treated
as pre-installed, its device plugin is not deployed), `refuse` (no operand on the node at all) or
`ignore` (the old behaviour). The default is `adapt` for every case: it removes exactly the
component that would fight and keeps the rest of the node's chain (toolkit, GFD, exporter).
Pure: facts in, findings and deploy-label overrides out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gpu_operator.api import keys

Action = Literal["adapt", "refuse", "ignore"]
Case = Literal["managed-driver", "foreign-device-plugin", "dra-driver"]
ACTIONS: tuple[Action, ...] = ("adapt", "refuse", "ignore")
CASES: tuple[Case, ...] = ("managed-driver", "foreign-device-plugin", "dra-driver")
# The extended resource a device plugin (ours or anyone's) advertises whole GPUs as.
GPU_RESOURCE = "nvidia.com/gpu"
# The DRA driver name of NVIDIA's GPU DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu).
DRA_DRIVER = "gpu.nvidia.com"
# GKE installs the driver itself unless the node pool says `gpu-driver-version=disabled`.
GKE_DRIVER_LABEL = "cloud.google.com/gke-gpu-driver-version"
ENV_PREFIX = "COEXIST_"
ENV_LABELS = "COEXIST_MANAGED_DRIVER_LABELS"
DEVICE_PLUGIN = "device-plugin"
DRIVER = "driver"
# NFD's kernel feature that lists the loaded modules (nfd-worker reads /proc/modules): a "flags"
# feature whose element keys are module names with empty values. NFD publishes no module version.
LOADED_MODULE_FEATURE = "kernel.loadedmodule"
NVIDIA_MODULE = "nvidia"


def nvidia_loaded(features: Mapping[str, object]) -> bool:
    """Whether a NodeFeature's `spec.features` lists the `nvidia` kernel module as loaded."""
    flags = features.get("flags")
    feature = flags.get(LOADED_MODULE_FEATURE) if isinstance(flags, Mapping) else None
    elements = feature.get("elements") if isinstance(feature, Mapping) else None
    return isinstance(elements, Mapping) and NVIDIA_MODULE in elements


@dataclass(frozen=True)
class LabelRule:
    """`key` (present), `key=value` or `key!=value` (present with another value)."""

    key: str
    value: str | None = None
    negate: bool = False

    @classmethod
    def parse(cls, text: str, source: str = ENV_LABELS) -> LabelRule:
        text = text.strip()
        negate = "!=" in text
        key, sep, value = text.partition("!=" if negate else "=")
        if not key or (sep and not value):
            raise ValueError(f"{source}: {text!r} is not KEY, KEY=VALUE or KEY!=VALUE")
        return cls(key.strip(), value.strip() if sep else None, negate)

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.key not in labels:
            return False
        if self.value is None:
            return True
        return (labels[self.key] != self.value) if self.negate else labels[self.key] == self.value

    def __str__(self) -> str:
        if self.value is None:
            return self.key
        return f"{self.key}{'!=' if self.negate else '='}{self.value}"


@dataclass(frozen=True)
class CoexistPolicy:
    """The action per case and the labels that mark a cloud-managed driver."""

    managed_driver: Action = "adapt"
    foreign_device_plugin: Action = "adapt"
    dra_driver: Action = "adapt"
    managed_driver_labels: tuple[LabelRule, ...] = (LabelRule(GKE_DRIVER_LABEL, "disabled", True),)

    def action(self, case: Case) -> Action:
        action: Action = getattr(self, case.replace("-", "_"))
        return action

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> CoexistPolicy:
        """COEXIST_MANAGED_DRIVER, COEXIST_FOREIGN_DEVICE_PLUGIN, COEXIST_DRA_DRIVER (adapt, refuse
        or ignore) and COEXIST_MANAGED_DRIVER_LABELS (comma-separated rules, added to GKE's)."""
        values: dict[str, object] = {}
        for case in CASES:
            name = ENV_PREFIX + case.replace("-", "_").upper()
            raw = environ.get(name, "").strip().lower()
            if not raw:
                continue
            if raw not in ACTIONS:
                raise ValueError(f"{name}={raw!r}: expected one of {', '.join(ACTIONS)}")
            values[case.replace("-", "_")] = raw
        extra = environ.get(ENV_LABELS, "")
        rules = tuple(LabelRule.parse(part) for part in extra.split(",") if part.strip())
        if rules:
            values["managed_driver_labels"] = (*cls.managed_driver_labels, *rules)
        return cls(**values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class NodeFacts:
    """What the detector reads about one node: labels (all of them, cloud labels included), the
    advertised `nvidia.com/gpu` capacity, and the DRA GPU ResourceSlices that name the node."""

    labels: Mapping[str, str]
    gpu_capacity: int = 0
    dra_slices: Sequence[str] = ()
    # The operator's label ledger says it deployed its device plugin here (`true`): the capacity
    # is then ours even while the plugin is paused or restarting (the kubelet keeps capacity).
    plugin_ledgered: bool = False
    # Where NFD saw the `nvidia` kernel module loaded on the node ("" if it did not), e.g.
    # "NodeFeature gpu-operator/t4-1".
    driver_loaded: str = ""
    # The operator deployed its own driver here (ledger entry or label `true`): a loaded module
    # is then its own driver's, now or after a restart, and never a finding.
    driver_ledgered: bool = False


@dataclass(frozen=True)
class Finding:
    """One thing that would fight the operator on a node, the evidence, and what is done."""

    case: Case
    action: Action
    evidence: str

    @property
    def message(self) -> str:
        what = {
            "adapt": {
                "managed-driver": "the operator treats the driver as pre-installed here",
                "foreign-device-plugin": "the operator's device plugin and driver stay off here",
                "dra-driver": "the operator's device plugin stays off here",
            }[self.case],
            "refuse": "the operator deploys nothing on this node",
            "ignore": "ignored (COEXIST_* says so): operands are deployed anyway",
        }[self.action]
        return f"{self.case}: {self.evidence}; {what}"


@dataclass
class Outcome:
    """Findings for one node and the deploy-label values they impose (suffix -> value)."""

    findings: list[Finding] = field(default_factory=list)
    overrides: dict[str, str] = field(default_factory=dict)
    refused: bool = False


# What the driver manager writes into the deploy labels it pauses.
PAUSED = "paused-for-driver-upgrade"


def _our_plugin_deployed(labels: Mapping[str, str]) -> bool:
    # Once the operator deployed its device plugin here, the capacity is (also) ours: the
    # detector only judges a node before that. A plugin paused for a driver (re)install
    # (`paused-for-driver-upgrade`, or a value with that suffix) is still ours.
    value = labels.get(keys.DEPLOY_PREFIX + DEVICE_PLUGIN, "")
    return value == "true" or PAUSED in value


def detect(node: NodeFacts, policy: CoexistPolicy) -> Outcome:
    """The findings on one GPU node and the deploy labels they impose."""
    found: list[Finding] = []
    driver_evidence = []
    rules = [r for r in policy.managed_driver_labels if r.matches(node.labels)]
    if rules:
        shown = ", ".join(f"{r.key}={node.labels[r.key]}" for r in rules)
        driver_evidence.append(f"the node's labels say the cloud installs the driver ({shown})")
    if node.driver_loaded and not node.driver_ledgered:
        driver_evidence.append(
            f"NFD saw the kernel module {NVIDIA_MODULE} loaded ({node.driver_loaded}, "
            f"{LOADED_MODULE_FEATURE}) although the operator never deployed its driver here: "
            "a preinstalled or cloud-managed driver"
        )
    if driver_evidence:
        evidence = "; ".join(driver_evidence)
        found.append(Finding("managed-driver", policy.managed_driver, evidence))
    if node.gpu_capacity > 0 and not node.plugin_ledgered and not _our_plugin_deployed(node.labels):
        found.append(Finding(
            "foreign-device-plugin", policy.foreign_device_plugin,
            f"the node already advertises {node.gpu_capacity} {GPU_RESOURCE} while the "
            "operator's device plugin is not deployed there (another device plugin runs)",
        ))  # fmt: skip
    if node.dra_slices:
        found.append(Finding(
            "dra-driver", policy.dra_driver,
            f"ResourceSlice(s) of the DRA driver {DRA_DRIVER} name this node "
            f"({', '.join(sorted(node.dra_slices)[:3])}): DRA and the device plugin on one node "
            "admit the same GPU twice",
        ))  # fmt: skip
    out = Outcome(findings=found)
    for finding in found:
        if finding.action == "refuse":
            out.refused = True
        elif finding.action == "adapt":
            if finding.case in ("managed-driver", "foreign-device-plugin"):
                out.overrides[DRIVER] = keys.DRIVER_PREINSTALLED
            if finding.case in ("foreign-device-plugin", "dra-driver"):
                out.overrides[DEVICE_PLUGIN] = "false"
    return out


def adapted_preinstalled(labels: Mapping[str, str], outcome: Outcome) -> bool:
    """Whether the node's `pre-installed` driver label is the detector's doing (and still
    warranted): then the ClusterPolicy status reports the finding, not a conflict."""
    return outcome.overrides.get(DRIVER) == keys.DRIVER_PREINSTALLED and (
        labels.get(keys.DEPLOY_DRIVER) == keys.DRIVER_PREINSTALLED
    )


def summary(findings: Mapping[str, Sequence[Finding]], shown: int = 3) -> str:
    """One status sentence: per case, the nodes and what was done ("" when none)."""
    by_case: dict[tuple[Case, Action], list[str]] = {}
    for node, items in sorted(findings.items()):
        for finding in items:
            by_case.setdefault((finding.case, finding.action), []).append(node)
    parts = []
    for (case, action), nodes in sorted(by_case.items()):
        names = ", ".join(nodes[:shown]) + (
            f" and {len(nodes) - shown} more" if len(nodes) > shown else ""
        )
        parts.append(f"{case} on {len(nodes)} node(s) ({names}): {action}")
    return ("coexistence: " + "; ".join(parts) + " (see node events)") if parts else ""
