"""Coexistence detector: per GPU node, what already there would fight the operator's operands.

Three cases (docs/coexistence.md):
- managed-driver: the cloud installs the NVIDIA driver (a GKE node with
  `cloud.google.com/gke-gpu-driver-version` other than `disabled`, or a label rule the admin adds
  for AKS node pools created without `--gpu-driver none`), or NFD's NodeFeature for the node lists
  the `nvidia` kernel module as loaded while the operator never deployed its driver there (an AKS
  node image that brings the driver, a hand-installed one). Two drivers on one host never work.
- foreign-device-plugin: a device plugin that is not ours serves `nvidia.com/gpu` on a node where
  our device plugin has not been deployed: a GKE node whose labels say GKE runs its own plugin,
  a label rule the admin adds (AKS managed GPU pools), or allocatable `nvidia.com/gpu` (a plugin
  registered with the kubelet now) with no pod of our plugin on the node, for longer than the
  kubelet takes to report a plugin that left. Capacity without allocatable is what a plugin
  that went away leaves behind for the kubelet's grace period (ours after `helm uninstall` or
  a switch to a VM workload): never a finding. Two plugins for one resource make the kubelet
  keep only the last registration and break the other's allocations.
- dra-driver: ResourceSlices of NVIDIA's DRA driver (`gpu.nvidia.com`) for the node. DRA and the
  device plugin on one node admit the same GPU twice (NVIDIA/aicr PR #332). On a node the admin
  moved to DRA (`nvidia.com/dra-kubelet-plugin=true`) the slices are expected; there the finding
  is a device plugin that still serves `nvidia.com/gpu` beside them.

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
ENV_PLUGIN_LABELS = "COEXIST_FOREIGN_DEVICE_PLUGIN_LABELS"
# GKE runs its own device plugin (a kube-system DaemonSet) on every node with an accelerator
# unless the node carries `gke-no-default-nvidia-gpu-device-plugin=true` (the label GKE's and
# NVIDIA's docs give node pools that run NVIDIA's operator).
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
GKE_NO_PLUGIN_LABEL = "gke-no-default-nvidia-gpu-device-plugin"
# How long a node must serve GPUs with none of our plugin in sight before that is a foreign
# plugin: the kubelet writes its node status every 10 s by default, so allocatable GPUs may still
# show for that long after our plugin's pod is gone. Twice that.
CONFIRM_AFTER = 20.0
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
    # Label rules that mark pools whose cloud runs its own device plugin (GKE's is built in).
    foreign_plugin_labels: tuple[LabelRule, ...] = ()
    # Seconds a node must serve GPUs with none of our plugin in sight to be a foreign plugin.
    confirm_after: float = CONFIRM_AFTER

    def action(self, case: Case) -> Action:
        action: Action = getattr(self, case.replace("-", "_"))
        return action

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> CoexistPolicy:
        """COEXIST_MANAGED_DRIVER, COEXIST_FOREIGN_DEVICE_PLUGIN, COEXIST_DRA_DRIVER (adapt, refuse
        or ignore), COEXIST_MANAGED_DRIVER_LABELS (comma-separated rules, added to GKE's) and
        COEXIST_FOREIGN_DEVICE_PLUGIN_LABELS (comma-separated rules, added to GKE's check)."""
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
        extra = environ.get(ENV_PLUGIN_LABELS, "")
        plugin_rules = tuple(
            LabelRule.parse(part, ENV_PLUGIN_LABELS) for part in extra.split(",") if part.strip()
        )
        if plugin_rules:
            values["foreign_plugin_labels"] = plugin_rules
        return cls(**values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class NodeFacts:
    """What the detector reads about one node: labels (all of them, cloud labels included), the
    advertised `nvidia.com/gpu` capacity and allocatable, and the DRA GPU ResourceSlices that
    name the node."""

    labels: Mapping[str, str]
    gpu_capacity: int = 0
    # The kubelet counts a plugin's healthy devices as allocatable while the plugin is registered;
    # when a plugin goes away its devices turn unhealthy (allocatable 0) and the capacity stays
    # for a grace period (5 minutes): capacity alone does not mean a plugin runs.
    gpu_allocatable: int = 0
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
    # A pod of the operator's device-plugin DaemonSet is on the node (running, or terminating
    # after `helm uninstall` or a workload switch): the GPUs it serves are ours.
    plugin_pod: bool = False
    # The node carries the detector's own `device-plugin=false` (ledger): a foreign plugin was
    # found and confirmed before (by this operator process or an earlier one).
    plugin_adapted: bool = False
    # Seconds since the labeller first saw the node serve GPUs with none of our plugin in sight
    # (the outcome's `unexplained`); None: not until now.
    unexplained_for: float | None = None

    @property
    def dra_node(self) -> bool:
        """The admin moved the node to DRA (`nvidia.com/dra-kubelet-plugin=true`): DRA slices
        for it are expected there."""
        return self.labels.get(keys.DRA_NODE) == "true"


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
    # The node serves GPUs with none of our plugin in sight: the labeller times how long.
    unexplained: bool = False
    # Above 0: hold the node (no label change) and look again after this many seconds.
    wait: float = 0.0


# What the driver manager writes into the deploy labels it pauses.
PAUSED = "paused-for-driver-upgrade"


def _our_plugin_deployed(labels: Mapping[str, str]) -> bool:
    # Once the operator deployed its device plugin here, the capacity is (also) ours: the
    # detector only judges a node before that. A plugin paused for a driver (re)install
    # (`paused-for-driver-upgrade`, or a value with that suffix) is still ours.
    value = labels.get(keys.DEPLOY_PREFIX + DEVICE_PLUGIN, "")
    return value == "true" or PAUSED in value


def cloud_plugin(labels: Mapping[str, str], policy: CoexistPolicy) -> str:
    """The labels that say the cloud runs its own device plugin on the node ("" if none)."""
    shown = []
    accelerator = labels.get(GKE_ACCELERATOR_LABEL)
    if accelerator and labels.get(GKE_NO_PLUGIN_LABEL) != "true":
        shown.append(f"{GKE_ACCELERATOR_LABEL}={accelerator} without {GKE_NO_PLUGIN_LABEL}=true")
    shown += [f"{r.key}={labels[r.key]}" for r in policy.foreign_plugin_labels if r.matches(labels)]
    return ", ".join(shown)


def _foreign_plugin(node: NodeFacts, policy: CoexistPolicy) -> tuple[str, bool, float]:
    """The evidence of a device plugin that is not ours ("" if none), whether the node serves
    GPUs with none of our plugin in sight, and how long to hold the node before those GPUs
    count as another plugin's (0: no hold)."""
    if node.plugin_ledgered or _our_plugin_deployed(node.labels):
        return "", False, 0.0  # the operator's plugin is deployed here: the GPUs are (also) ours
    # Capacity with nothing allocatable is left over by a plugin that went away; GPUs served
    # while a pod of our plugin is on the node are that pod's.
    unexplained = node.gpu_allocatable > 0 and not node.plugin_pod
    advertised = (
        f"the node advertises {node.gpu_capacity} {GPU_RESOURCE} ({node.gpu_allocatable} "
        "allocatable)"
    )
    labels = cloud_plugin(node.labels, policy)
    if labels:
        evidence = f"the node's labels say the cloud runs its own device plugin ({labels})"
        return (f"{evidence}; {advertised}" if node.gpu_capacity else evidence), unexplained, 0.0
    if not unexplained:
        return "", False, 0.0
    waited = node.unexplained_for
    confirm = policy.confirm_after
    if confirm > 0 and not node.plugin_adapted and (waited is None or waited < confirm):
        return "", True, max(confirm - (waited or 0.0), 0.01)
    evidence = (
        f"{advertised} while the operator's device plugin is neither deployed nor running there "
        "(another device plugin is registered with the kubelet)"
    )
    return evidence, True, 0.0


def _plugin_serving(node: NodeFacts) -> bool:
    """A device plugin advertises allocatable GPUs on the node and is not just ours winding down
    (our deploy label already `false` while our pod still stops)."""
    if node.gpu_allocatable <= 0:
        return False
    label = node.labels.get(keys.DEPLOY_PREFIX + DEVICE_PLUGIN, "")
    return label != "false" or not node.plugin_pod


def detect(node: NodeFacts, policy: CoexistPolicy) -> Outcome:
    """The findings on one GPU node and the deploy labels they impose; or, while the node
    serves GPUs with none of our plugin in sight for less than `policy.confirm_after`, only
    how long to hold it."""
    plugin, unexplained, wait = _foreign_plugin(node, policy)
    if wait > 0:
        return Outcome(unexplained=True, wait=wait)
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
    if plugin:
        found.append(Finding("foreign-device-plugin", policy.foreign_device_plugin, plugin))
    if node.dra_slices:
        shown = ", ".join(sorted(node.dra_slices)[:3])
        if not node.dra_node:
            found.append(Finding(
                "dra-driver", policy.dra_driver,
                f"ResourceSlice(s) of the DRA driver {DRA_DRIVER} name this node ({shown}): DRA "
                "and the device plugin on one node admit the same GPU twice (to serve this "
                f"node through DRA on purpose, label it {keys.DRA_NODE}=true)",
            ))  # fmt: skip
        elif _plugin_serving(node):
            # A DRA node: its slices are expected; a device plugin still handing out the same
            # GPUs is not (one that is only winding down after the node moved is left alone).
            found.append(Finding(
                "dra-driver", policy.dra_driver,
                f"the node is a DRA node ({keys.DRA_NODE}=true) with ResourceSlice(s) of "
                f"{DRA_DRIVER} ({shown}), yet a device plugin serves {node.gpu_allocatable} "
                f"allocatable {GPU_RESOURCE} there too: both would hand out the same GPU",
            ))  # fmt: skip
    out = Outcome(findings=found, unexplained=unexplained)
    for finding in found:
        if finding.action == "refuse":
            out.refused = True
        elif finding.action == "adapt":
            if finding.case in ("managed-driver", "foreign-device-plugin"):
                out.overrides[DRIVER] = keys.DRIVER_PREINSTALLED
            if finding.case in ("foreign-device-plugin", "dra-driver"):
                out.overrides[DEVICE_PLUGIN] = "false"
    return out


def adapted_preinstalled(
    labels: Mapping[str, str], outcome: Outcome, owned: Mapping[str, str] | None = None
) -> bool:
    """Whether the node's `pre-installed` driver label is the detector's doing: still warranted
    (then the ClusterPolicy status reports the finding, not a conflict), or written by the
    operator per its ledger `owned` (the operator writes that value only as the detector's
    adapt; when the evidence went, the write that takes it back is on its way)."""
    if labels.get(keys.DEPLOY_DRIVER) != keys.DRIVER_PREINSTALLED:
        return False
    if outcome.overrides.get(DRIVER) == keys.DRIVER_PREINSTALLED:
        return True
    return (owned or {}).get(keys.DEPLOY_DRIVER) == keys.DRIVER_PREINSTALLED


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
