"""Why a GPU node is (not) usable: walk the node readiness chain and stop at the first failing link.

Pure: a snapshot of one node's facts in (labels, the operand pods on it, Events, optionally log
tails), a verdict out. `gpu-operator explain node` feeds it everything the API has; the
ClusterPolicy reconciler feeds it its stripped caches (no capacity, no logs), so every link skips
what its snapshot does not know instead of guessing. The chain is docs/node-chain.md's.

A label is a claim, not a fact: each link checks whether the policy runs the component that acts
on its label (a MIG config label with the MIG manager disabled, a VM workload label with sandbox
workloads off) and what the node really shows (allocatable resources, GFD's labels, the pods).
A label the evidence contradicts is a warning that names both; a link fails only when pods cannot
use the node's GPUs, so a node the ClusterPolicy status counts as ready and that serves GPUs is
never "not usable".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpu_operator.api import keys
from gpu_operator.nodes import gate, ledger

Obj = dict[str, Any]
LinkStatus = Literal["ok", "warning", "failed", "skipped"]

# The operand pods the chain reads, by their `app` label (upstream's DaemonSet names).
DRIVER_APP = "nvidia-driver-daemonset"
DRIVER_COMPONENT = "nvidia-driver"
TOOLKIT_APP = "nvidia-container-toolkit-daemonset"
PLUGIN_APP = "nvidia-device-plugin-daemonset"
MIG_MANAGER_APP = "nvidia-mig-manager"
VALIDATOR_APP = "nvidia-operator-validator"
CUDA_VALIDATOR_APP = "nvidia-cuda-validator"
DRIVER_MANAGER = "k8s-driver-manager"
DRIVER_CTR = "nvidia-driver-ctr"
VALIDATIONS = ("driver-validation", "toolkit-validation", "cuda-validation", "plugin-validation")
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
# The MIG manager's states (agents/mig_manager/protocol.py) and its config that turns MIG off.
MIG_BUSY = ("pending", "rebooting")
MIG_DISABLED_CONFIG = "all-disabled"
# GFD's labels of the MIG layout: the strategy, and the product of a `single` MIG node.
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
# Who pauses operands by rewriting their deploy labels (value -> the agent and what it does).
_PAUSERS = {
    "paused-for-driver-upgrade": (
        "driver pod's k8s-driver-manager",
        "the driver is being (re)installed",
    ),
    "paused-for-mig-change": ("nvidia-mig-manager", "the MIG manager repartitions the GPUs"),
    "paused-for-vgpu-change": ("nvidia-vgpu-device-manager", "the vGPU devices are reconfigured"),
}
# Log lines worth quoting as evidence: the last few that say something went wrong.
_TELLING = re.compile(r"error|fail|unable|could not|cannot|refused|unhealthy|rejected|E:", re.I)
LOG_EVIDENCE_LINES = 5
_CONTAINER_IN_PROBLEM = re.compile(r"^(?:init container|container) (\S+)")
# Upgrade states in which the node is taken out of service on purpose.
_UPGRADE_IDLE = frozenset({"", "upgrade-done", "upgrade-required"})


@dataclass(frozen=True)
class ContainerView:
    """One container's state as the chain needs it."""

    name: str
    init: bool = False
    ready: bool = False
    state: str = "waiting"  # waiting | running | terminated
    reason: str = ""
    exit_code: int | None = None
    message: str = ""  # the termination message, current or last
    restarts: int = 0

    @property
    def succeeded(self) -> bool:
        return self.state == "terminated" and self.exit_code == 0


@dataclass(frozen=True)
class PodView:
    """An operand pod on the node: its identity, its worst problem (None: running and ready)
    and, when the snapshot has them, its containers."""

    name: str
    app: str
    problem: str | None = None
    phase: str = "Running"
    containers: tuple[ContainerView, ...] = ()
    component: str = ""
    image: str = ""

    def container(self, name: str) -> ContainerView | None:
        return next((c for c in self.containers if c.name == name), None)

    @property
    def failing_container(self) -> str | None:
        """The container its problem names (known also from a summary's text alone)."""
        found = _CONTAINER_IN_PROBLEM.match(self.problem or "")
        return found.group(1) if found else None


@dataclass(frozen=True)
class PolicyView:
    """What the chain needs from the ClusterPolicy: which operands it deploys."""

    driver: bool = True
    toolkit: bool = True
    device_plugin: bool = True
    validator: bool = True
    driver_crd: bool = False
    mig_manager: bool = True
    # sandboxWorkloads.enabled (off unless set, as upstream) and its defaultWorkload: without
    # sandbox workloads every GPU node is a container node whatever its workload label says.
    sandbox_workloads: bool = False
    default_workload: str = keys.WORKLOAD_CONTAINER


# The DRA chain (docs/dra.md): NVIDIA's DRA driver's kubelet plugin pods (its chart, our stand-in
# and the GPUCluster's DaemonSet all label them so), its driver name, and the Event the kubelet
# records when a plugin fails to prepare a pod's claims.
DRA_PLUGIN_APP = "nvidia-dra-driver-kubelet-plugin"
DRA_DRIVER = "gpu.nvidia.com"
DRA_PREPARE_FAILED = "FailedPrepareDynamicResources"
# What our plugin logs while the device plugin still serves the node, and per GPU it withholds
# (agents/dra_kubelet_plugin/handover.py).
_HANDOVER_BLOCKED = "publishing no devices"
_HANDOVER_WITHHELD = re.compile(r"withheld: held through the device plugin", re.I)


@dataclass(frozen=True)
class ClaimPod:
    """A pod a ResourceClaim is reserved for: whether it runs, and its Warning Events."""

    ref: str  # namespace/name
    phase: str = "Running"
    problem: str | None = None  # readiness.pod_problem's text; None: running and ready
    events: tuple[str, ...] = ()  # "Reason: message" of its Warning Events


@dataclass(frozen=True)
class ClaimView:
    """A ResourceClaim allocated on the node: its devices of the node's pool, its pods."""

    ref: str  # namespace/name
    devices: tuple[str, ...] = ()
    pods: tuple[ClaimPod, ...] = ()


@dataclass(frozen=True)
class DraFacts:
    """What the DRA chain reads about a node that gets its GPUs through DRA.

    `mode`: why the node is a DRA node ("label": nvidia.com/dra-kubelet-plugin=true under a
    ClusterPolicy; "gpucluster": every GPU node under a GPUCluster). `slices` and `claims` are
    None when resource.k8s.io/v1 is not served (or the snapshot did not read them)."""

    mode: Literal["label", "gpucluster"] = "label"
    # None: not known (the operator's own cache sees only its namespace's pods).
    plugin_pods: tuple[PodView, ...] | None = ()
    slices: tuple[Obj, ...] | None = None
    claims: tuple[ClaimView, ...] | None = None


@dataclass(frozen=True)
class NodeFacts:
    """One node's facts. `None` means the snapshot does not know (the status path reads no
    capacity and no logs); an empty value means there is none."""

    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)
    has_nfd: bool | None = None  # None: decided from the labels
    capacity: Mapping[str, str] | None = None
    allocatable: Mapping[str, str] | None = None
    conditions: Sequence[Obj] | None = None
    unschedulable: bool = False
    pods: Sequence[PodView] = ()
    events: Sequence[Obj] = ()
    logs: Mapping[tuple[str, str], str] | None = None  # (pod, container) -> tail
    policy: PolicyView | None = None
    # DaemonSets of the chain by app name, to tell "not scheduled here" from "not created".
    daemonsets: Mapping[str, Obj] | None = None
    # The node's taints and the readiness gate's startup taint (None: the gate is off, or the
    # snapshot does not know).
    taints: Sequence[Obj] | None = None
    startup_taint: gate.StartupTaint | None = None
    # Whole GPUs and MIG devices allocatable, as one total: for a snapshot without `allocatable`
    # (the operator's cache keeps only this count). None: not known.
    gpu_allocatable: int | None = None
    # The pods outside the operator's namespace that hold GPUs on the node: "namespace/name" ->
    # the GPU resources (whole GPUs and MIG devices) they request. None: not read.
    gpu_pods: Mapping[str, int] | None = None
    # The DRA chain's facts on a DRA node (None: not a DRA node, or not read: the chain is the
    # device plugin's). A node labelled nvidia.com/dra-kubelet-plugin=true without them still
    # has its device-plugin links skipped (the status path reads no slices).
    dra: DraFacts | None = None


@dataclass(frozen=True)
class Evidence:
    kind: str  # label | annotation | pod | container | log | event | condition | resource
    ref: str
    text: str


@dataclass(frozen=True)
class Link:
    id: str
    title: str
    status: LinkStatus
    summary: str
    evidence: tuple[Evidence, ...] = ()
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "title": self.title,
            "status": self.status,
            "summary": self.summary,
        }
        if self.evidence:
            out["evidence"] = [vars(e) for e in self.evidence]
        if self.fix:
            out["fix"] = self.fix
        return out


@dataclass(frozen=True)
class Verdict:
    node: str
    links: tuple[Link, ...]
    # While the startup taint is on the node: what it waits for ("" when not at the gate).
    startup_gate: str = ""
    # The chain walked: the device plugin's (CHAIN) or the DRA driver's (DRA_CHAIN).
    dra: bool = False

    @property
    def chain(self) -> tuple[tuple[str, str], ...]:
        return DRA_CHAIN if self.dra else CHAIN

    @property
    def failed(self) -> Link | None:
        return next((link for link in self.links if link.status == "failed"), None)

    @property
    def warnings(self) -> tuple[Link, ...]:
        """Links that hold but whose labels disagree with what the node shows."""
        return tuple(link for link in self.links if link.status == "warning")

    @property
    def usable(self) -> bool:
        return self.failed is None

    @property
    def depth(self) -> int:
        """How far along the chain the node got (the index of its failing link)."""
        return next((i for i, link in enumerate(self.links) if link.status == "failed"), 99)

    def message(self) -> str:
        """One line: the first failing link and why, or that the node is usable."""
        failed = self.failed
        if failed is not None:
            return f"node {self.node}: {failed.title} failed: {failed.summary}"
        warnings = self.warnings
        if not warnings:
            return f"node {self.node}: every link of the chain holds"
        said = "; ".join(f"{link.title}: {link.summary}" for link in warnings)
        count = "a warning" if len(warnings) == 1 else f"{len(warnings)} warnings"
        return f"node {self.node}: usable, with {count}: {said}"

    def to_dict(self) -> dict[str, Any]:
        failed = self.failed
        return {
            "node": self.node,
            "usable": self.usable,
            "failedLink": failed.id if failed else None,
            "warnings": [link.id for link in self.warnings],
            "message": self.message(),
            "startupGate": self.startup_gate or None,
            "chain": "dra" if self.dra else "device-plugin",
            "links": [link.to_dict() for link in self.links],
        }


# The chain, in order: (id, title).
CHAIN = (
    ("nfd", "NFD labels"),
    ("gpu-detected", "GPU detected"),
    ("deploy-labels", "deploy labels"),
    ("driver-manager", "driver manager"),
    ("driver", "driver loaded"),
    ("toolkit", "container toolkit"),
    ("device-plugin", "device plugin"),
    ("allocatable", "allocatable"),
    ("validator", "validator"),
    ("gate", "startup gate"),
    ("mig", "MIG"),
    ("upgrade", "driver upgrade"),
)
# On a DRA node the device plugin's links give way to the DRA driver's.
_DRA_LINKS = (
    ("dra-plugin", "DRA kubelet plugin"),
    ("dra-handover", "hand-over"),
    ("dra-slices", "ResourceSlices"),
    ("schedulable", "schedulable"),
    ("dra-claims", "claims"),
)
_SPLIT = next(i for i, (id_, _) in enumerate(CHAIN) if id_ == "device-plugin")
DRA_CHAIN = (*CHAIN[:_SPLIT], *_DRA_LINKS, *CHAIN[_SPLIT + 2 :])
TITLES = dict((*CHAIN, *_DRA_LINKS))


class _Stop(Exception):
    """Raised by a link check to end the walk with its failing link."""

    def __init__(self, link: Link, before: Sequence[Link] = ()) -> None:
        self.link = link
        self.before = tuple(before)


def _fail(id_: str, summary: str, evidence: Iterable[Evidence] = (), fix: str = "") -> _Stop:
    return _Stop(Link(id_, TITLES[id_], "failed", summary, tuple(evidence), fix))


def _ok(id_: str, summary: str, evidence: Iterable[Evidence] = ()) -> Link:
    return Link(id_, TITLES[id_], "ok", summary, tuple(evidence))


def _skip(id_: str, summary: str, evidence: Iterable[Evidence] = ()) -> Link:
    return Link(id_, TITLES[id_], "skipped", summary, tuple(evidence))


def _warn(id_: str, summary: str, evidence: Iterable[Evidence] = (), fix: str = "") -> Link:
    return Link(id_, TITLES[id_], "warning", summary, tuple(evidence), fix)


# ----- helpers ------------------------------------------------------------------------------


def telling_lines(text: str, limit: int = LOG_EVIDENCE_LINES) -> list[str]:
    """The last lines of a log tail that say something went wrong (else its last lines)."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    telling = [line for line in lines if _TELLING.search(line)]
    return (telling or lines)[-limit:]


def _pods(facts: NodeFacts, app: str) -> list[PodView]:
    return [p for p in facts.pods if p.app == app]


def _driver_pods(facts: NodeFacts) -> list[PodView]:
    return [
        p for p in facts.pods if p.app.startswith(DRIVER_APP) or p.component == DRIVER_COMPONENT
    ]


def _events_about(facts: NodeFacts, name: str) -> list[Evidence]:
    found = []
    for event in facts.events:
        involved = event.get("involvedObject") or {}
        if involved.get("name") != name or event.get("type") != "Warning":
            continue
        text = f"{event.get('reason', '')}: {event.get('message', '')}".strip()
        found.append(Evidence("event", f"{involved.get('kind', '')}/{name}", text))
    return found[-3:]


def _pod_evidence(facts: NodeFacts, pod: PodView, container: str | None = None) -> list[Evidence]:
    """The pod's problem, the failing container's message and log lines, its Warning Events."""
    out = [Evidence("pod", pod.name, pod.problem or f"phase {pod.phase}")]
    name = container or pod.failing_container
    ctr = pod.container(name) if name else None
    if ctr is not None and ctr.message:
        last = ctr.message.strip().splitlines()[-1]
        if last not in (pod.problem or ""):
            out.append(Evidence("container", f"{pod.name}/{ctr.name}", last))
    if name and facts.logs is not None:
        tail = facts.logs.get((pod.name, name), "")
        out.extend(Evidence("log", f"{pod.name}/{name}", line) for line in telling_lines(tail))
    out.extend(_events_about(facts, pod.name))
    return out


def _not_scheduled(facts: NodeFacts, app: str, what: str) -> str:
    """Why a DaemonSet has no pod on the node, as far as the snapshot tells."""
    if facts.daemonsets is None:
        return f"no {what} pod on the node"
    ds = facts.daemonsets.get(app)
    if ds is None:
        return f"no {what} pod on the node: the DaemonSet {app} does not exist (yet)"
    selector = ((ds.get("spec") or {}).get("template") or {}).get("spec", {}).get(
        "nodeSelector"
    ) or {}
    missing = [f"{k}={v}" for k, v in selector.items() if facts.labels.get(k) != v]
    if missing:
        wanted = ", ".join(missing)
        return f"no {what} pod on the node: it lacks the DaemonSet {app}'s nodeSelector {wanted}"
    return f"no {what} pod on the node yet (the DaemonSet {app} selects it)"


def _quantity(values: Mapping[str, str] | None, prefix: str) -> int:
    """The summed count of every GPU resource (nvidia.com/gpu, nvidia.com/mig-*)."""
    total = 0
    for key, value in (values or {}).items():
        if key == prefix or key.startswith(("nvidia.com/mig-", prefix + ".")):
            try:
                total += int(str(value))
            except ValueError:
                continue
    return total


def _gpu_resources(values: Mapping[str, str] | None) -> dict[str, int]:
    """The GPU resources of a resource list (whole GPUs, shared GPUs, MIG devices) by name."""
    found: dict[str, int] = {}
    for key, value in (values or {}).items():
        if key == GPU_RESOURCE or key.startswith((MIG_RESOURCE_PREFIX, GPU_RESOURCE + ".")):
            try:
                found[key] = int(str(value))
            except ValueError:
                continue
    return found


def _gpu_total(facts: NodeFacts) -> int | None:
    """Whole GPUs and MIG devices allocatable; None when the snapshot does not know."""
    if facts.allocatable is not None:
        return _quantity(facts.allocatable, GPU_RESOURCE)
    return facts.gpu_allocatable


def _serving(facts: NodeFacts) -> str:
    """What the node serves pods, in words ("" when the snapshot does not know)."""
    if facts.allocatable is not None:
        found = {k: n for k, n in sorted(_gpu_resources(facts.allocatable).items()) if n > 0}
        said = ", ".join(f"{k}: {n}" for k, n in found.items())
        text = f"allocatable {said}" if said else "no GPU resource allocatable"
    elif facts.gpu_allocatable is not None:
        text = f"{facts.gpu_allocatable} GPU resource(s) allocatable"
    else:
        return ""
    if facts.gpu_pods:
        text += f", {sum(facts.gpu_pods.values())} in use by {len(facts.gpu_pods)} pod(s)"
    return text


def _serving_evidence(facts: NodeFacts, shown: int = 3) -> list[Evidence]:
    """The allocatable GPU resources and the pods that hold GPUs on the node."""
    out = []
    if facts.allocatable is not None:
        found = sorted(_gpu_resources(facts.allocatable).items())
        said = ", ".join(f"{k}: {n}" for k, n in found) or "no nvidia.com/gpu or nvidia.com/mig-*"
        out.append(Evidence("resource", "allocatable", said))
    elif facts.gpu_allocatable is not None:
        out.append(Evidence("resource", "allocatable", f"{facts.gpu_allocatable} GPU resource(s)"))
    pods = sorted((facts.gpu_pods or {}).items())
    out.extend(Evidence("pod", name, f"holds {n} GPU resource(s)") for name, n in pods[:shown])
    if len(pods) > shown:
        more = sum(n for _, n in pods[shown:])
        out.append(Evidence("pod", "...", f"{len(pods) - shown} more pod(s) hold {more}"))
    return out


@dataclass(frozen=True)
class MigLayout:
    """The MIG devices a node shows (resource -> count; empty: whole GPUs) and where from."""

    devices: Mapping[str, int]
    evidence: tuple[Evidence, ...]
    # GFD's single strategy cannot export the MIG devices (mixed profiles, an empty GPU).
    invalid: str = ""

    @property
    def mig_on(self) -> bool:
        return bool(self.devices) or bool(self.invalid)

    def describe(self) -> str:
        if self.invalid:
            return (
                f"MIG devices the single strategy cannot export ({keys.GPU_PRODUCT}={self.invalid})"
            )
        if not self.devices:
            return "whole GPUs, no MIG devices"
        return ", ".join(f"{n} x {name}" for name, n in sorted(self.devices.items()))


def _int(value: str | None) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def mig_layout(facts: NodeFacts) -> MigLayout | None:
    """The MIG layout the node really shows: its allocatable MIG resources when the snapshot has
    them, else GFD's labels (`nvidia.com/mig-<profile>.count`; with the single strategy a
    `...-MIG-<profile>` product). None when neither tells: no MIG device seen and no MIG strategy
    labelled (with strategy `none` MIG devices are not exported, so their absence says nothing)."""
    labels = facts.labels
    product = labels.get(keys.GPU_PRODUCT, "")
    single = "-MIG-" in product
    invalid = product if product.endswith("-MIG-INVALID") else ""
    devices: dict[str, int] = {}
    evidence: list[Evidence] = []
    if facts.allocatable is not None:
        found = _gpu_resources(facts.allocatable)
        devices = {k: n for k, n in found.items() if k.startswith(MIG_RESOURCE_PREFIX) and n > 0}
        if single and not invalid and found.get(GPU_RESOURCE, 0) > 0:
            devices[f"{GPU_RESOURCE} ({product})"] = found[GPU_RESOURCE]
        said = ", ".join(f"{k}: {n}" for k, n in sorted(found.items()))
        evidence.append(Evidence("resource", "allocatable", said or "no nvidia.com/gpu"))
    else:
        for key, value in sorted(labels.items()):
            if key.startswith(MIG_RESOURCE_PREFIX) and key.endswith(".count") and _int(value):
                devices[key.removesuffix(".count")] = _int(value)
                evidence.append(Evidence("label", key, value))
        if single and not invalid and _int(labels.get(GPU_COUNT_LABEL)):
            devices[f"{GPU_RESOURCE} ({product})"] = _int(labels.get(GPU_COUNT_LABEL))
        if GPU_COUNT_LABEL in labels:
            evidence.append(Evidence("label", GPU_COUNT_LABEL, labels[GPU_COUNT_LABEL]))
        if facts.gpu_allocatable is not None:
            total = f"{facts.gpu_allocatable} GPU resource(s)"
            evidence.append(Evidence("resource", "allocatable", total))
    strategy = labels.get(MIG_STRATEGY_LABEL)
    if product:
        evidence.append(Evidence("label", keys.GPU_PRODUCT, product))
    if strategy:
        evidence.append(Evidence("label", MIG_STRATEGY_LABEL, strategy))
    capable = labels.get(keys.MIG_CAPABLE)
    if capable == "false":
        evidence.append(Evidence("label", keys.MIG_CAPABLE, capable))
    if devices or invalid or strategy in ("single", "mixed") or capable == "false":
        return MigLayout(devices, tuple(evidence), invalid)
    return None


def gpu_requests(pod: Obj) -> int:
    """The GPU resources (whole GPUs and MIG devices) a pod holds while it runs: its containers'
    limits summed, or its largest init container's when that is more (as the scheduler counts)."""
    spec = pod.get("spec") or {}

    def of(container: Obj) -> int:
        limits = (container.get("resources") or {}).get("limits") or {}
        return sum(_gpu_resources({k: str(v) for k, v in limits.items()}).values())

    running = sum(of(c) for c in spec.get("containers") or [])
    init = max((of(c) for c in spec.get("initContainers") or []), default=0)
    return max(running, init)


# ----- the links ----------------------------------------------------------------------------


def _nfd(facts: NodeFacts) -> Link:
    has = facts.has_nfd
    if has is None:
        has = any(k.startswith(keys.NFD_LABEL_PREFIX) for k in facts.labels)
    if not has:
        raise _fail(
            "nfd",
            "the node carries no feature.node.kubernetes.io/ labels",
            [Evidence("label", "feature.node.kubernetes.io/*", "none")],
            "run Node Feature Discovery (nfd.enabled=true in the chart) and check the nfd-worker "
            "pod on this node",
        )
    return _ok("nfd", "NFD labelled the node")


def _gpu_detected(facts: NodeFacts) -> Link:
    labels = facts.labels
    pci = [k for k in keys.NFD_GPU_LABELS if labels.get(k) == "true"]
    if not pci:
        raise _fail(
            "gpu-detected",
            "NFD found no NVIDIA PCI device (vendor 10de) on this node",
            [
                Evidence(
                    "label", keys.NFD_GPU_LABELS[0], labels.get(keys.NFD_GPU_LABELS[0], "absent")
                )
            ],
            "not a GPU node; if it has a GPU, check `lspci -nn | grep 10de` on the host and "
            "NFD's pci source (deviceClassWhitelist)",
        )
    present = labels.get(keys.GPU_PRESENT)
    if present != "true":
        raise _fail(
            "gpu-detected",
            f"{pci[0]}=true but {keys.GPU_PRESENT} is {present or 'absent'}",
            [Evidence("label", keys.GPU_PRESENT, present or "absent")],
            "the operator labels GPU nodes: check that it runs and that a ClusterPolicy exists "
            "(`gpu-operator explain policy`)",
        )
    product = labels.get(keys.GPU_PRODUCT)
    what = f"{labels.get('nvidia.com/gpu.count', '?')} x {product}" if product else "GPU present"
    return _ok("gpu-detected", what, [Evidence("label", keys.GPU_PRESENT, "true")])


def _workload(facts: NodeFacts) -> tuple[list[Evidence], str, str]:
    """The node's workload config as the policy reads it: (evidence, a warning, its fix).

    Without sandbox workloads every GPU node is a container node (the operator deploys the
    container operands whatever the label says): a VM label then has no effect and is only
    worth a warning. With them, a VM workload (the node's label, else the policy's default)
    gives the GPUs to VMs: no pod gets one (a failure)."""
    policy = facts.policy or PolicyView()
    label = facts.labels.get(keys.GPU_WORKLOAD_CONFIG)
    if not policy.sandbox_workloads:
        if label is None or label == keys.WORKLOAD_CONTAINER:
            return [], "", ""
        serving = _serving(facts)
        return (
            [
                Evidence("label", keys.GPU_WORKLOAD_CONFIG,
                         f"{label} (no effect: sandboxWorkloads.enabled=false)"),
                *_serving_evidence(facts),
            ],
            f"label says {keys.GPU_WORKLOAD_CONFIG}={label} but sandboxWorkloads.enabled=false: "
            "the label has no effect and the node is a container node"
            + (f" ({serving})" if serving else ""),
            f"kubectl label node {facts.name} {keys.GPU_WORKLOAD_CONFIG}- (or enable "
            "sandboxWorkloads to give this node's GPUs to VMs)",
        )  # fmt: skip
    evidence = []
    warning = fix = ""
    if label in keys.WORKLOADS:
        workload, why = str(label), f"{keys.GPU_WORKLOAD_CONFIG}={label}"
        evidence.append(Evidence("label", keys.GPU_WORKLOAD_CONFIG, str(label)))
    else:
        workload = policy.default_workload
        why = f"sandboxWorkloads.defaultWorkload={workload}"
        evidence.append(Evidence("label", keys.GPU_WORKLOAD_CONFIG, label or "absent"))
        if label is not None:
            warning = (
                f"{keys.GPU_WORKLOAD_CONFIG}={label} is not a workload config "
                f"({', '.join(keys.WORKLOADS)}): the operator uses {why}"
            )
            fix = (
                f"kubectl label node {facts.name} {keys.GPU_WORKLOAD_CONFIG}={workload} --overwrite"
            )
    if workload != keys.WORKLOAD_CONTAINER:
        left = _gpu_resources(facts.allocatable).get(GPU_RESOURCE, 0)
        if left:
            removed = "the container operands that advertised it are being removed"
            evidence.append(
                Evidence("resource", "allocatable", f"{GPU_RESOURCE}: {left} ({removed})")
            )
        raise _fail(
            "deploy-labels",
            f"the node runs {workload} workloads ({why}, sandboxWorkloads.enabled=true): its GPUs "
            "go to VMs, not pods",
            evidence,
            f"label the node {keys.GPU_WORKLOAD_CONFIG}=container to use its GPUs in containers",
        )
    return (evidence if warning else []), warning, fix


def _paused(facts: NodeFacts, key: str, value: str, evidence: list[Evidence]) -> _Stop:
    """A deploy label an agent paused: who paused it, and whether anything will restore it."""
    policy = facts.policy or PolicyView()
    pauser = next((p for v, p in _PAUSERS.items() if value.endswith(v)), None)
    if value.endswith("paused-for-mig-change") and not policy.mig_manager:
        return _fail(
            "deploy-labels",
            f"{key}={value}, but the MIG manager is disabled (migManager.enabled=false): "
            "nothing restores it",
            evidence,
            f"kubectl label node {facts.name} {key}=true --overwrite",
        )
    if pauser is None:
        return _fail(
            "deploy-labels",
            f"{key}={value}: paused",
            evidence,
            f"the agent that paused it restores it; if none runs: kubectl label node {facts.name} "
            f"{key}=true --overwrite",
        )
    agent, doing = pauser
    return _fail(
        "deploy-labels",
        f"{key}={value}: paused while {doing}",
        evidence,
        f"wait for the {agent} to finish (its log says what it waits for)",
    )


def _deploy_labels(facts: NodeFacts) -> Link:
    labels = facts.labels
    owned = ledger.read(facts.annotations)
    evidence, warning, warning_fix = _workload(facts)
    if labels.get(keys.DEPLOY_OPERANDS) == "false":
        raise _fail(
            "deploy-labels",
            f"{keys.DEPLOY_OPERANDS}=false: no operand runs here",
            [
                Evidence(
                    "label",
                    keys.DEPLOY_OPERANDS,
                    f"false (set by {_who(owned, keys.DEPLOY_OPERANDS)})",
                )
            ],
            f"kubectl label node {facts.name} {keys.DEPLOY_OPERANDS}-",
        )
    mode = dra_mode(facts)
    operands: tuple[str, ...] = ("driver", "container-toolkit", "device-plugin",
                                 "operator-validator")  # fmt: skip
    if mode == "gpucluster":
        operands = ("dra-driver", "dra-validator")
    for operand in operands:
        key = keys.DEPLOY_PREFIX + operand
        value = labels.get(key)
        if mode == "label" and operand == "device-plugin" and value != "true":
            # The operator turns its device plugin off on a DRA node (nodes/labelling.py).
            said = f"{value} (set by {_who(owned, key)})" if value else "absent"
            evidence.append(Evidence("label", key, f"{said}: {keys.DRA_NODE}=true, DRA serves"))
            continue
        if value is None:
            raise _fail(
                "deploy-labels",
                f"{key} is not set: the operator has not labelled the node yet",
                [*evidence, Evidence("label", key, "absent")],
                "the operator labels GPU nodes; check its log (`gpu-operator explain policy`)",
            )
        who = _who(owned, key)
        evidence.append(Evidence("label", key, f"{value} (set by {who})"))
        if value == "false":
            raise _fail(
                "deploy-labels",
                f"{key}=false (set by {who})",
                evidence,
                f"kubectl label node {facts.name} {key}=true --overwrite",
            )
        if value.startswith(ledger.PAUSE_PREFIX) or value.endswith("paused-for-driver-upgrade"):
            raise _paused(facts, key, value, evidence)
    if warning:
        return _warn("deploy-labels", warning, evidence, warning_fix)
    return _ok("deploy-labels", "operands deployed here", evidence)


# The Event reason controller/nodelabels.py records a coexistence finding under.
COEXIST_EVENT = "CoexistenceConflict:"


def _who(owned: Mapping[str, str], key: str) -> str:
    if key == keys.DEPLOY_DRIVER:
        return "k8s-driver-manager" if key not in owned else "the operator"
    return "the operator" if key in owned else "someone else"


def _driver(facts: NodeFacts) -> list[Link]:
    labels = facts.labels
    policy = facts.policy or PolicyView()
    version = _driver_version(labels)
    if labels.get(keys.DEPLOY_DRIVER) == keys.DRIVER_PREINSTALLED:
        if ledger.read(facts.annotations).get(keys.DEPLOY_DRIVER) == keys.DRIVER_PREINSTALLED:
            # The coexistence detector's adapt (NFD saw the module, or a cloud driver label):
            # the chain runs on the host's driver by design; its Event says what was seen.
            found = [
                e for e in _events_about(facts, facts.name) if e.text.startswith(COEXIST_EVENT)
            ]
            return [
                _skip("driver-manager", "preinstalled driver found before any driver pod"),
                _ok("driver", f"preinstalled driver{version}", [
                    Evidence("label", keys.DEPLOY_DRIVER,
                             "pre-installed (set by the operator's coexistence detector)"),
                    *found,
                ]),
            ]  # fmt: skip
        evidence = [
            Evidence("label", keys.DEPLOY_DRIVER, "pre-installed (set by k8s-driver-manager)")
        ]
        if policy.driver:
            raise _fail(
                "driver",
                "the host runs a preinstalled NVIDIA driver while driver.enabled=true: "
                "the operator's driver does not run here",
                evidence,
                "create the node pool without a driver (AKS: --gpu-driver none), or set "
                "driver.enabled=false",
            )
        return [
            _skip("driver-manager", "preinstalled driver"),
            _ok("driver", f"preinstalled driver{version}", evidence),
        ]
    if not policy.driver:
        return [
            _skip("driver-manager", "driver.enabled=false"),
            _ok("driver", f"the host's driver (driver.enabled=false){version}"),
        ]
    pods = _driver_pods(facts)
    if not pods:
        raise _fail(
            "driver-manager",
            _not_scheduled(facts, DRIVER_APP, "driver"),
            [],
            "check the driver DaemonSet (`gpu-operator explain policy`) and the node's labels",
        )
    pod = pods[0]
    manager = pod.container(DRIVER_MANAGER)
    failing = pod.failing_container
    if failing == DRIVER_MANAGER or (manager is not None and not manager.succeeded and pod.problem):
        raise _fail(
            "driver-manager",
            f"{DRIVER_MANAGER} has not finished: {pod.problem or manager}",
            _pod_evidence(facts, pod, DRIVER_MANAGER),
            f"kubectl logs -n <ns> {pod.name} -c {DRIVER_MANAGER} says what it waits for",
        )
    manager_link = _ok(
        "driver-manager", f"{DRIVER_MANAGER} done", [Evidence("pod", pod.name, "init done")]
    )
    ctr = pod.container(DRIVER_CTR)
    loaded = pod.problem is None and (ctr is None or ctr.ready)
    if not loaded:
        summary = pod.problem or f"{DRIVER_CTR} is not ready yet"
        evidence = _pod_evidence(facts, pod, DRIVER_CTR)
        fix = _driver_fix(" ".join([summary, *(e.text for e in evidence)]))
        stop = _fail("driver", summary, evidence, fix)
        raise _Stop(stop.link, [manager_link])
    image_version = pod.image.rsplit(":", 1)[-1] if ":" in pod.image else ""
    what = version or (f" (image {image_version})" if image_version else "")
    return [
        manager_link,
        _ok("driver", f"driver loaded{what}", [Evidence("pod", pod.name, "ready")]),
    ]


def _driver_version(labels: Mapping[str, str]) -> str:
    parts = [labels.get(f"nvidia.com/cuda.driver.{p}") for p in ("major", "minor", "rev")]
    if not parts[0]:
        return ""
    return " " + ".".join(p for p in parts if p)


def _driver_fix(text: str) -> str:
    if "Key was rejected" in text:
        return (
            "the node has UEFI Secure Boot: use signed modules (driver.usePrecompiled=true) "
            "or disable Secure Boot"
        )
    if "Unable to locate package" in text:
        return (
            "no precompiled driver for the node's kernel: wait for NFD to relabel the kernel, "
            "or use driver.usePrecompiled=false"
        )
    if "driver is in use" in text:
        return (
            "stop what holds the host's driver (nvidia-persistenced, GPU processes) "
            "or set driver.enabled=false"
        )
    if "ImagePull" in text or "ErrImage" in text:
        return "check driver.repository/image/version and the pull secrets"
    return "read the driver container's log (kubectl logs -c nvidia-driver-ctr --previous)"


def _operand(facts: NodeFacts, id_: str, app: str, what: str, fix: str) -> Link:
    pods = _pods(facts, app)
    if not pods:
        raise _fail(id_, _not_scheduled(facts, app, what), [], fix)
    pod = pods[0]
    if pod.problem is not None:
        raise _fail(id_, f"{pod.name}: {pod.problem}", _pod_evidence(facts, pod), fix)
    return _ok(id_, f"{pod.name} ready", [Evidence("pod", pod.name, "ready")])


def _toolkit(facts: NodeFacts) -> Link:
    if facts.policy is not None and not facts.policy.toolkit:
        return _skip("toolkit", "toolkit.enabled=false: the node's runtime is configured by hand")
    return _operand(
        facts,
        "toolkit",
        TOOLKIT_APP,
        "container toolkit",
        "read the toolkit's log (kubectl logs -c nvidia-container-toolkit-ctr); a "
        "driver-validation failure there means the driver link is at fault",
    )


def _device_plugin(facts: NodeFacts) -> Link:
    if facts.policy is not None and not facts.policy.device_plugin:
        return _skip("device-plugin", "devicePlugin.enabled=false")
    link = _operand(
        facts,
        "device-plugin",
        PLUGIN_APP,
        "device plugin",
        "read the device plugin's log (kubectl logs -c nvidia-device-plugin)",
    )
    if facts.capacity is None:
        return link
    capacity = _quantity(facts.capacity, GPU_RESOURCE)
    if capacity == 0:
        raise _fail(
            "device-plugin",
            "the device plugin runs but the node advertises no nvidia.com/gpu",
            [*link.evidence, Evidence("resource", "capacity", "no nvidia.com/gpu")],
            "the plugin did not register with the kubelet: read its log",
        )
    allocatable = _quantity(facts.allocatable, GPU_RESOURCE)
    evidence = [*link.evidence, Evidence("resource", "capacity", f"{GPU_RESOURCE}: {capacity}")]
    summary = f"{capacity} device(s) registered"
    if allocatable < capacity:
        # The plugin marks a device unhealthy (an XID, an ECC error): it stays in capacity and
        # leaves allocatable. Fewer GPUs is not an unusable node; the summary says so.
        summary += f", {capacity - allocatable} unhealthy"
        plugin = _pods(facts, PLUGIN_APP)[0]
        for (pod, _), tail in (facts.logs or {}).items():
            if pod == plugin.name:
                evidence.extend(
                    Evidence("log", pod, line)
                    for line in telling_lines(tail)
                    if "unhealthy" in line.lower()
                )
    return Link("device-plugin", TITLES["device-plugin"], "ok", summary, tuple(evidence))


def _allocatable(facts: NodeFacts) -> Link:
    ready = next((c for c in facts.conditions or [] if c.get("type") == "Ready"), None)
    if ready is not None and ready.get("status") != "True":
        raise _fail(
            "allocatable",
            f"the node is NotReady: {ready.get('reason', '')} {ready.get('message', '')}".strip(),
            [Evidence("condition", "Ready", str(ready.get("message") or ready.get("status")))],
            "the kubelet or the container runtime is down: check the runtime's config and log",
        )
    if facts.unschedulable:
        state = facts.labels.get(keys.UPGRADE_STATE, "")
        who = f"the driver upgrade ({state})" if state and state not in _UPGRADE_IDLE else "someone"
        raise _fail(
            "allocatable",
            f"the node is cordoned (by {who}): no new pod lands here",
            [Evidence("resource", "spec.unschedulable", "true")],
            f"kubectl uncordon {facts.name} once the work on it is done",
        )
    if facts.allocatable is None:
        return _skip("allocatable", "not in this snapshot")
    count = _quantity(facts.allocatable, GPU_RESOURCE)
    if count == 0 and (facts.policy is None or facts.policy.device_plugin):
        policy = facts.policy or PolicyView()
        mig_state = facts.labels.get(keys.MIG_CONFIG_STATE, "")
        if policy.mig_manager and mig_state in (*MIG_BUSY, "failed"):
            # The MIG manager took the GPUs away (a change under way, or one that failed half
            # done): its labels say more than the device plugin's log.
            config = facts.labels.get(keys.MIG_CONFIG) or "?"
            raise _fail(
                "allocatable",
                f"allocatable has no nvidia.com/gpu or nvidia.com/mig-*: the MIG manager's "
                f"change to {config} is {mig_state}",
                [
                    Evidence("resource", "allocatable", "no nvidia.com/gpu or nvidia.com/mig-*"),
                    Evidence("label", keys.MIG_CONFIG_STATE, mig_state),
                    *_mig_message(facts),
                ],
                _MIG_FAILED_FIX if mig_state == "failed" else _MIG_BUSY_FIX,
            )
        raise _fail(
            "allocatable",
            "allocatable has no nvidia.com/gpu: every device is unhealthy",
            [Evidence("resource", "allocatable", "nvidia.com/gpu: 0")],
            "read the device plugin's log for the devices it marked unhealthy and why",
        )
    summary = f"{count} GPU(s) allocatable"
    if facts.gpu_pods:
        summary += f", {sum(facts.gpu_pods.values())} in use by {len(facts.gpu_pods)} pod(s)"
    return _ok("allocatable", summary, _serving_evidence(facts))


def _validator(facts: NodeFacts) -> Link:
    if facts.policy is not None and not facts.policy.validator:
        return _skip("validator", "validator.enabled=false")
    if dra_mode(facts) == "gpucluster":
        return _skip("validator", "the GPUCluster validates DRA: `gpu-operator explain policy`")
    pods = _pods(facts, VALIDATOR_APP)
    fix = "read the failing init container's log (kubectl logs -c <container> --previous)"
    if not pods:
        raise _fail("validator", _not_scheduled(facts, VALIDATOR_APP, "validator"), [], fix)
    pod = pods[0]
    if pod.problem is None:
        return _ok("validator", "all validations passed", [Evidence("pod", pod.name, "ready")])
    failing = pod.failing_container or next(
        (c.name for c in pod.containers if c.init and not c.succeeded), None
    )
    evidence = _pod_evidence(facts, pod, failing)
    if failing == "cuda-validation":
        for workload in _pods(facts, CUDA_VALIDATOR_APP):
            if workload.problem:
                evidence.extend(_pod_evidence(facts, workload, "cuda-validation"))
        fix = (
            "the CUDA workload failed on this node's GPUs: check them (nvidia-smi -q, XID/ECC "
            "errors), reset the GPU (nvidia-smi -r) or drain the node"
        )
    step = f"{failing}: " if failing else ""
    return Link(
        "validator", TITLES["validator"], "failed", f"{step}{pod.problem}", tuple(evidence), fix
    )


def _gate_plan(facts: NodeFacts) -> gate.GatePlan | None:
    """The readiness gate's plan for the node, None when the startup taint is not on it."""
    taint = facts.startup_taint
    taints = facts.taints or ()
    if taint is None or not any(taint.matches(t) for t in taints):
        return None
    validators = _pods(facts, VALIDATOR_APP)
    dra = dra_mode(facts) is not None
    capacity = _int((facts.capacity or {}).get(GPU_RESOURCE)) if dra else 0
    return gate.plan(
        gate.GateFacts(
            taints=taints,
            gpu_allocatable=gate.allocatable_gpus(facts.allocatable),
            validator_ready=bool(validators) and validators[0].problem is None,
            dra=dra,
            dra_devices=_dra_devices(facts),
            gpus=gate.node_gpus(facts.labels, capacity) if dra else 0,
        ),
        taint,
    )


def _dra_devices(facts: NodeFacts) -> int | None:
    """The devices the node's gpu.nvidia.com ResourceSlices publish (None: not read)."""
    if facts.dra is None or facts.dra.slices is None:
        return None
    return gate.slice_devices(facts.dra.slices)


def _gate_sentence(facts: NodeFacts, plan: gate.GatePlan) -> str:
    if plan.remove:
        return (
            f"the startup taint {facts.startup_taint} is still on the node although it validated:"
            " the operator removes it on its next pass"
        )
    return (
        f"the startup taint {facts.startup_taint} is still on the node: GPU pods without a "
        f"toleration stay Pending until it has {plan.waiting_for}"
    )


def _gate(facts: NodeFacts) -> Link:
    if facts.startup_taint is None or facts.taints is None:
        return _skip("gate", "no startup taint configured (operator.startupTaint)")
    plan = _gate_plan(facts)
    if plan is None:
        return _ok("gate", f"the startup taint {facts.startup_taint} is not on the node")
    if facts.policy is not None and not facts.policy.validator:
        fix = "the gate opens on a Ready validator pod: enable the validator, or remove the taint"
    elif plan.remove:
        fix = (
            "if it stays: read the operator's log (it patches spec.taints of the node; RBAC "
            "`patch nodes`), or remove it by hand: kubectl taint node "
            f"{facts.name} {facts.startup_taint.key}:{facts.startup_taint.effect}-"
        )
    else:
        fix = "the links above say why the node is not validated yet"
    evidence = [Evidence("taint", facts.startup_taint.key, str(facts.startup_taint))]
    raise _fail("gate", _gate_sentence(facts, plan), evidence, fix)


_MIG_FAILED_FIX = (
    "read nvidia.com/mig.config.state.message (a node annotation) and the nvidia-mig-manager "
    "pod's log; a message that says it is still retrying (the driver missing, a GPU busy) ends "
    "by itself once its cause does; otherwise fix the config, then label another config and the "
    "one you want (a config that failed is tried again on a label change or a driver restart)"
)
_MIG_BUSY_FIX = "wait for nvidia.com/mig.config.state=success (the nvidia-mig-manager pod's log)"


def _mig_message(facts: NodeFacts) -> list[Evidence]:
    """Why the MIG manager's last change failed, as it wrote it beside the state label."""
    text = facts.annotations.get(keys.MIG_CONFIG_STATE_MESSAGE)
    return [Evidence("annotation", keys.MIG_CONFIG_STATE_MESSAGE, text)] if text else []


def _mig_unmanaged(
    facts: NodeFacts, idle: str, layout: MigLayout | None, claims: list[Evidence], fix: str
) -> Link:
    """MIG labels on a node where no MIG manager acts on them: the GPUs keep the layout they
    have, so the labels are judged against that layout."""
    labels = facts.labels
    config = labels.get(keys.MIG_CONFIG, "")
    state = labels.get(keys.MIG_CONFIG_STATE)
    said = f"{keys.MIG_CONFIG}={config}" if config else f"{keys.MIG_CONFIG_STATE}={state}"
    if layout is None:
        return _warn(
            "mig",
            f"label says {said} but {idle}: nothing applies it, and this snapshot does not show "
            "the GPUs' MIG layout",
            claims,
            fix,
        )
    evidence = [*claims, *layout.evidence]
    shows = layout.describe()
    if config and config != MIG_DISABLED_CONFIG and not layout.mig_on:
        return _warn(
            "mig",
            f"label says {keys.MIG_CONFIG}={config} but {idle} and the GPUs show no MIG "
            f"devices ({shows}): the label is stale",
            evidence,
            fix,
        )
    if config == MIG_DISABLED_CONFIG and layout.mig_on:
        return _warn(
            "mig",
            f"label says {keys.MIG_CONFIG}={config} but the GPUs show {shows} and {idle}: "
            "nothing turns MIG off",
            evidence,
            fix,
        )
    if state in (*MIG_BUSY, "failed"):
        return _warn(
            "mig",
            f"label says {keys.MIG_CONFIG_STATE}={state} but {idle}: no MIG change runs; the "
            f"GPUs show {shows}",
            evidence,
            fix,
        )
    return _skip("mig", f"{said} is not acted on ({idle}); the GPUs show {shows}", evidence)


def _mig(facts: NodeFacts) -> Link:
    """The MIG layout: what the MIG manager's labels claim, checked against whether the policy
    runs the MIG manager and what the GPUs really show (allocatable MIG resources, GFD)."""
    policy = facts.policy or PolicyView()
    labels = facts.labels
    state = labels.get(keys.MIG_CONFIG_STATE)
    config = labels.get(keys.MIG_CONFIG, "")
    layout = mig_layout(facts)
    shown = list(layout.evidence) if layout is not None else []
    if not config and state is None:
        if layout is not None and layout.mig_on:
            return _skip(
                "mig", f"no MIG configuration label; the GPUs show {layout.describe()}", shown
            )
        return _skip("mig", "no MIG configuration on this node")
    claims = [
        Evidence("label", keys.MIG_CONFIG, config or "absent"),
        Evidence("label", keys.MIG_CONFIG_STATE, state or "absent"),
    ]
    remove = f"kubectl label node {facts.name} {keys.MIG_CONFIG}- {keys.MIG_CONFIG_STATE}-"
    if not policy.mig_manager:
        return _mig_unmanaged(
            facts,
            "the MIG manager is disabled (migManager.enabled=false)",
            layout,
            claims,
            f"remove the stale labels ({remove}), or enable the MIG manager "
            "(migManager.enabled=true)",
        )
    if labels.get(keys.MIG_CAPABLE) == "false":
        return _mig_unmanaged(
            facts,
            f"the GPUs are not MIG-capable ({keys.MIG_CAPABLE}=false)",
            layout,
            claims,
            f"remove the stale labels ({remove})",
        )
    managers = _pods(facts, MIG_MANAGER_APP)
    busy = [e for pod in managers if pod.problem for e in _pod_evidence(facts, pod)]
    if state is None:
        where = "" if managers or not facts.pods else f"; no {MIG_MANAGER_APP} pod on the node"
        return _skip("mig", f"{keys.MIG_CONFIG}={config} is not applied yet{where}", claims)
    total = _gpu_total(facts)
    evidence = [*claims, *_mig_message(facts), *shown, *busy]
    shows = f" ({layout.describe()})" if layout is not None else ""
    if state == "failed":
        if total == 0 and policy.device_plugin:
            raise _fail(
                "mig",
                f"applying MIG config {config or '?'} failed and the node has no GPU allocatable",
                evidence,
                _MIG_FAILED_FIX,
            )
        serves = f", {total} GPU resource(s) allocatable" if total else ""
        return _warn(
            "mig",
            f"applying MIG config {config or '?'} failed: the GPUs keep their previous layout"
            f"{shows}{serves}; pods can use them, but the MIG layout is not the one asked for",
            evidence,
            _MIG_FAILED_FIX,
        )
    if state in MIG_BUSY:
        if total:
            return _warn(
                "mig",
                f"MIG config {config or '?'} is being applied ({state}): {total} GPU resource(s) "
                "allocatable until the MIG manager pauses the GPU clients to repartition",
                evidence,
                _MIG_BUSY_FIX,
            )
        raise _fail(
            "mig",
            f"MIG config {config or '?'} is being applied ({state}): GPUs are paused",
            evidence,
            _MIG_BUSY_FIX,
        )
    if layout is not None and config == MIG_DISABLED_CONFIG and layout.mig_on:
        return _warn(
            "mig",
            f"label says {keys.MIG_CONFIG}={config} ({state}) but the GPUs show "
            f"{layout.describe()}",
            evidence,
            "the MIG manager acts on label changes (and when the driver comes back): label "
            f"another config, then {MIG_DISABLED_CONFIG}; its log says what it did",
        )
    wants_devices = config not in (MIG_DISABLED_CONFIG, "all-enabled")
    if layout is not None and wants_devices and not layout.mig_on:
        # A config whose entries cover none of these GPUs changes nothing and still succeeds.
        return _warn(
            "mig",
            f"label says {keys.MIG_CONFIG}={config} ({state}) but the GPUs show no MIG devices "
            f"({layout.describe()}): the config does not cover these GPUs",
            evidence,
            "check the config's device filters against the node's GPUs (the nvidia-mig-manager "
            "pod's log)",
        )
    if state != "success":
        return _ok("mig", f"MIG config {config or '?'}: state {state}{shows}", evidence)
    return _ok("mig", f"MIG config {config} applied{shows}", evidence)


def _upgrade(facts: NodeFacts) -> Link:
    """A driver upgrade on the node: failing only while it keeps pods off the node's GPUs."""
    policy = facts.policy or PolicyView()
    state = facts.labels.get(keys.UPGRADE_STATE, "")
    evidence = [Evidence("label", keys.UPGRADE_STATE, state or "absent")]
    if state in _UPGRADE_IDLE:
        return _ok("upgrade", state or "no upgrade in progress", evidence)
    if not policy.driver:
        return _warn(
            "upgrade",
            f"label says {keys.UPGRADE_STATE}={state} but driver.enabled=false: no driver "
            "upgrade runs here; the label is stale",
            evidence,
            f"kubectl label node {facts.name} {keys.UPGRADE_STATE}-",
        )
    # Cordoned or NotReady nodes failed the allocatable (DRA: schedulable) link already: a full
    # snapshot that gets here shows a schedulable node serving GPUs on the driver that runs now.
    # A DRA node serves them as the devices of its ResourceSlices, not as allocatable resources.
    if dra_mode(facts) is not None:
        serving = _dra_devices(facts)
        what = "DRA device(s)"
        shown = _dra_slices_evidence(facts)
    else:
        serving = _gpu_total(facts) if facts.allocatable is not None else None
        what = "GPU resource(s)"
        shown = _serving_evidence(facts)
    if state == "upgrade-failed":
        fix = "`gpu-operator upgrade status` says why; fix it and retry the upgrade"
        if serving:
            return _warn(
                "upgrade",
                f"the driver upgrade failed on this node; it is not cordoned and serves {serving}"
                f" {what} on the driver that runs now",
                [*evidence, *shown],
                fix,
            )
        raise _fail("upgrade", "the driver upgrade failed on this node", evidence, fix)
    if serving:
        return _warn(
            "upgrade",
            f"a driver upgrade is in progress ({state}); the node serves {serving} {what} "
            "until it is cordoned",
            [*evidence, *shown],
            "wait for upgrade-done (`gpu-operator upgrade status`)",
        )
    raise _fail(
        "upgrade",
        f"a driver upgrade is in progress ({state})",
        evidence,
        "wait for upgrade-done (`gpu-operator upgrade status`)",
    )


# ----- the DRA chain (docs/dra.md) -----------------------------------------------------------


def dra_mode(facts: NodeFacts) -> Literal["label", "gpucluster"] | None:
    """Whether the node gets its GPUs through DRA, and why (None: through the device plugin)."""
    if facts.dra is not None:
        return facts.dra.mode
    return "label" if facts.labels.get(keys.DRA_NODE) == "true" else None


def _dra_host(facts: NodeFacts) -> list[Link]:
    """Under a GPUCluster the host's driver and runtime serve: no operand pod to check."""
    version = _driver_version(facts.labels)
    return [
        _skip("driver-manager", "a GPUCluster deploys no driver"),
        _skip("driver", f"the host's driver (a GPUCluster deploys none){version}"),
        _skip("toolkit", "a GPUCluster deploys no toolkit: the runtime must have CDI enabled"),
    ]


def _dra_plugin_fix(facts: NodeFacts) -> str:
    if dra_mode(facts) == "gpucluster":
        return (
            f"check the GPUCluster (`gpu-operator explain policy`) and the node's label "
            f"{keys.DEPLOY_PREFIX}dra-driver=true"
        )
    return (
        "install NVIDIA's DRA driver chart with kubeletPlugin.nodeSelector "
        f"{keys.DRA_NODE}=true (or apply examples/dra-migration/kubelet-plugin-standin.yaml); "
        f"to move the node back to the device plugin: kubectl label node {facts.name} "
        f"{keys.DRA_NODE}-"
    )


def _dra_plugin(facts: NodeFacts) -> Link:
    """The DRA kubelet plugin's pod on the node: running and ready (registered with the
    kubelet; its readiness says so)."""
    dra = facts.dra
    if dra is None or dra.plugin_pods is None:
        return _skip("dra-plugin", f"{keys.DRA_NODE}=true: DRA serves (not in this snapshot)")
    if not dra.plugin_pods:
        raise _fail(
            "dra-plugin",
            f"no DRA kubelet plugin pod (app={DRA_PLUGIN_APP}) on the node",
            [Evidence("label", keys.DRA_NODE, facts.labels.get(keys.DRA_NODE, "absent"))],
            _dra_plugin_fix(facts),
        )
    pod = dra.plugin_pods[0]
    if pod.problem is not None:
        raise _fail(
            "dra-plugin",
            f"{pod.name}: {pod.problem}",
            _pod_evidence(facts, pod),
            "read the plugin's log (kubectl logs -n <ns> " + pod.name + "); it is ready once it "
            "has registered with the kubelet",
        )
    return _ok(
        "dra-plugin",
        f"{pod.name} ready (registered with the kubelet)",
        [Evidence("pod", pod.name, "ready")],
    )


def _dra_log_lines(facts: NodeFacts, pattern: re.Pattern[str] | str) -> list[Evidence]:
    """The DRA plugin's log lines that match (the last few)."""
    dra = facts.dra
    if dra is None or facts.logs is None:
        return []
    names = {p.name for p in dra.plugin_pods or ()}
    found = []
    for (pod, ctr), tail in sorted(facts.logs.items()):
        if pod not in names:
            continue
        for line in tail.splitlines():
            hit = pattern.search(line) if isinstance(pattern, re.Pattern) else pattern in line
            if hit:
                found.append(Evidence("log", f"{pod}/{ctr}", line.strip()))
    return found[-LOG_EVIDENCE_LINES:]


def _dra_handover(facts: NodeFacts) -> Link:
    """The hand-over from the device plugin: while the kubelet still offers nvidia.com/*
    resources from a device plugin the DRA plugin publishes nothing (the same GPUs would be
    handed out twice); GPUs a device-plugin pod still holds are withheld until it ends."""
    if facts.allocatable is not None:
        serving = {k: n for k, n in sorted(_gpu_resources(facts.allocatable).items()) if n > 0}
    elif facts.gpu_allocatable is not None:  # the operator's cache: one total
        serving = {f"{GPU_RESOURCE} and {gate.MIG_PREFIX}*": facts.gpu_allocatable}
        serving = {k: n for k, n in serving.items() if n > 0}
    else:
        return _skip("dra-handover", "allocatable not in this snapshot")
    if serving:
        said = ", ".join(f"{k}: {n}" for k, n in serving.items())
        evidence = [Evidence("resource", "allocatable", said)]
        evidence += [Evidence("pod", p.name, "still on the node") for p in _pods(facts, PLUGIN_APP)]
        key = keys.DEPLOY_PREFIX + "device-plugin"
        evidence.append(Evidence("label", key, facts.labels.get(key, "absent")))
        evidence += _dra_log_lines(facts, _HANDOVER_BLOCKED)
        if facts.labels.get(key) == "true":
            fix = (
                f"someone set {key}=true on a DRA node: kubectl label node {facts.name} "
                f"{key}=false --overwrite (or remove {keys.DRA_NODE} to stay on the device plugin)"
            )
        else:
            fix = (
                "wait for the device plugin's pod to leave the node and the kubelet to drop its "
                "resources; a device plugin the operator does not run (another chart) must be "
                "taken off the node by hand"
            )
        raise _fail(
            "dra-handover",
            f"the device plugin still serves the node ({said}): the DRA plugin publishes no "
            "devices until it is gone",
            evidence,
            fix,
        )
    withheld = _dra_log_lines(facts, _HANDOVER_WITHHELD)
    if withheld:
        return _warn(
            "dra-handover",
            "GPUs still held by pods that got them through the device plugin are withheld from "
            "DRA until those pods end",
            withheld,
            "let those pods finish (or delete them); the plugin then publishes their GPUs",
        )
    return _ok("dra-handover", "no device plugin resource left on the node")


def _dra_slices_evidence(facts: NodeFacts, shown: int = 3) -> list[Evidence]:
    """The node's first gpu.nvidia.com ResourceSlices: devices and pool."""
    slices = (
        [s for s in (facts.dra.slices or ()) if (s.get("spec") or {}).get("driver") == DRA_DRIVER]
        if facts.dra
        else []
    )
    return [
        Evidence(
            "resourceslice",
            str((s.get("metadata") or {}).get("name")),
            f"{len((s.get('spec') or {}).get('devices') or [])} device(s), pool "
            f"{((s.get('spec') or {}).get('pool') or {}).get('name')}",
        )
        for s in slices[:shown]
    ]


def _dra_slices(facts: NodeFacts) -> Link:
    """The node's ResourceSlices of the gpu.nvidia.com driver: published, with devices."""
    dra = facts.dra
    if dra is None or dra.slices is None:
        return _skip("dra-slices", "resource.k8s.io/v1 not served or not read")
    slices = [s for s in dra.slices if (s.get("spec") or {}).get("driver") == DRA_DRIVER]
    devices = gate.slice_devices(slices)
    evidence = _dra_slices_evidence(facts)
    if not devices:
        logs = [e for e in _dra_log_lines(facts, _TELLING) if not _HANDOVER_WITHHELD.search(e.text)]
        what = "no ResourceSlice" if not slices else "ResourceSlices with no device"
        raise _fail(
            "dra-slices",
            f"{what} of driver {DRA_DRIVER} for the node: no claim can get its GPUs",
            [*evidence, *logs],
            f"read the DRA plugin's log; `kubectl get resourceslices --field-selector "
            f"spec.nodeName={facts.name}` lists what it published",
        )
    return _ok(
        "dra-slices",
        f"{devices} device(s) published in {len(slices)} ResourceSlice(s)",
        evidence,
    )


def _schedulable(facts: NodeFacts) -> Link:
    """The node takes new pods: Ready and not cordoned."""
    ready = next((c for c in facts.conditions or [] if c.get("type") == "Ready"), None)
    if ready is not None and ready.get("status") != "True":
        raise _fail(
            "schedulable",
            f"the node is NotReady: {ready.get('reason', '')} {ready.get('message', '')}".strip(),
            [Evidence("condition", "Ready", str(ready.get("message") or ready.get("status")))],
            "the kubelet or the container runtime is down: check the runtime's config and log",
        )
    if facts.unschedulable:
        raise _fail(
            "schedulable",
            "the node is cordoned: no new pod lands here",
            [Evidence("resource", "spec.unschedulable", "true")],
            f"kubectl uncordon {facts.name} once the work on it is done",
        )
    if facts.conditions is None:
        return _skip("schedulable", "node conditions not in this snapshot")
    return _ok("schedulable", "Ready and not cordoned")


def _dra_claims(facts: NodeFacts) -> Link:
    """The claims allocated on the node and their pods: a pod whose claims the plugin failed to
    prepare (FailedPrepareDynamicResources) cannot start."""
    dra = facts.dra
    if dra is None or dra.claims is None:
        return _skip("dra-claims", "resource.k8s.io/v1 not served or not read")
    for claim in dra.claims:
        for pod in claim.pods:
            failed = [e for e in pod.events if e.startswith(DRA_PREPARE_FAILED)]
            if failed and pod.problem is not None:
                raise _fail(
                    "dra-claims",
                    f"pod {pod.ref} cannot start: the DRA plugin failed to prepare claim "
                    f"{claim.ref}",
                    [
                        Evidence("claim", claim.ref, ", ".join(claim.devices) or "no device"),
                        Evidence("pod", pod.ref, pod.problem),
                        *(Evidence("event", f"Pod/{pod.ref}", e) for e in failed[-3:]),
                        *_dra_log_lines(facts, _TELLING)[-3:],
                    ],
                    "read the DRA plugin's log for the claim (prepare errors: CDI spec, a device "
                    "gone, an opaque config it refuses); the kubelet retries on its own",
                )
    devices = sum(len(c.devices) for c in dra.claims)
    pods = sorted({p.ref for c in dra.claims for p in c.pods})
    evidence = [
        Evidence("claim", c.ref, f"{', '.join(c.devices)} for {', '.join(p.ref for p in c.pods)}")
        for c in dra.claims[:3]
    ]
    if not dra.claims:
        return _ok("dra-claims", "no claim allocated on the node")
    return _ok(
        "dra-claims",
        f"{len(dra.claims)} claim(s) allocated, {devices} device(s), reserved for "
        f"{len(pods)} pod(s)",
        evidence,
    )


def explain(facts: NodeFacts) -> Verdict:
    """Walk the chain for one node; stop at the first failing link (later links not reached)."""
    links: list[Link] = []
    mode = dra_mode(facts)
    steps: tuple[Callable[[NodeFacts], Link | list[Link]], ...] = (
        _nfd,
        _gpu_detected,
        _deploy_labels,
        _driver,
        _toolkit,
        _device_plugin,
        _allocatable,
        _validator,
        _gate,
        _mig,
        _upgrade,
    )
    if mode is not None:
        dra_steps = (_dra_plugin, _dra_handover, _dra_slices, _schedulable, _dra_claims)
        steps = (*steps[:5], *dra_steps, *steps[7:])
        if mode == "gpucluster":  # no driver, toolkit or ClusterPolicy validator pods there
            steps = tuple(s for s in steps if s not in (_driver, _toolkit))
            steps = (*steps[:3], _dra_host, *steps[3:])
    try:
        for step in steps:
            result = step(facts)
            links.extend(result if isinstance(result, list) else [result])
            if links and links[-1].status == "failed":
                break
    except _Stop as stop:
        links.extend([*stop.before, stop.link])
    # Said whichever link failed first: the taint is why GPU pods stay Pending on the node.
    plan = _gate_plan(facts)
    gate_said = _gate_sentence(facts, plan) if plan else ""
    return Verdict(facts.name, tuple(links), gate_said, dra=mode is not None)


# ----- snapshots from API objects -----------------------------------------------------------


def container_views(pod: Obj) -> tuple[ContainerView, ...]:
    status = pod.get("status") or {}
    out = []
    for init, key in ((True, "initContainerStatuses"), (False, "containerStatuses")):
        for cs in status.get(key) or []:
            state = cs.get("state") or {}
            kind = next((k for k in ("terminated", "running", "waiting") if k in state), "waiting")
            detail = state.get(kind) or {}
            last = (cs.get("lastState") or {}).get("terminated") or {}
            out.append(
                ContainerView(
                    name=str(cs.get("name")),
                    init=init,
                    ready=bool(cs.get("ready")),
                    state=kind,
                    reason=str(detail.get("reason") or ""),
                    exit_code=detail.get("exitCode") if kind == "terminated" else None,
                    message=str(detail.get("message") or last.get("message") or ""),
                    restarts=int(cs.get("restartCount") or 0),
                )
            )
    return tuple(out)


def pod_view(pod: Obj, problem: str | None) -> PodView:
    """A pod object as the chain reads it; `problem` is readiness.pod_problem's text."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return PodView(
        name=str(meta.get("name")),
        app=str(labels.get("app") or ""),
        problem=problem,
        phase=str((pod.get("status") or {}).get("phase") or "Pending"),
        containers=container_views(pod),
        component=str(labels.get("app.kubernetes.io/component") or ""),
        image=str(containers[0].get("image") or ""),
    )


def policy_view(spec: Mapping[str, Any] | None) -> PolicyView:
    """Which operands a ClusterPolicy spec deploys (an absent `enabled` means enabled)."""
    spec = spec or {}

    def enabled(name: str) -> bool:
        section = spec.get(name) or {}
        return section.get("enabled", True) is not False

    driver = spec.get("driver") or {}
    sandbox = spec.get("sandboxWorkloads") or {}
    return PolicyView(
        driver=enabled("driver"),
        toolkit=enabled("toolkit"),
        device_plugin=enabled("devicePlugin"),
        validator=True,
        driver_crd=bool(driver.get("useNvidiaDriverCRD")),
        mig_manager=enabled("migManager"),
        # Off unless set (upstream's default for this section, api/enablement.py).
        sandbox_workloads=sandbox.get("enabled") is True,
        default_workload=str(sandbox.get("defaultWorkload") or keys.WORKLOAD_CONTAINER),
    )


def worst(verdicts: Iterable[Verdict]) -> Verdict | None:
    """The failing node furthest from usable (earliest failing link; then by name)."""
    failing = [v for v in verdicts if not v.usable]
    return min(failing, key=lambda v: (v.depth, v.node)) if failing else None
