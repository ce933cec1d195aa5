"""Why a GPU node is (not) usable: walk the node readiness chain and stop at the first failing link.

Pure: a snapshot of one node's facts in (labels, the operand pods on it, Events, optionally log
tails), a verdict out. `gpu-operator explain node` feeds it everything the API has; the
ClusterPolicy reconciler feeds it its stripped caches (no capacity, no logs), so every link skips
what its snapshot does not know instead of guessing. The chain is docs/node-chain.md's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpu_operator.api import keys
from gpu_operator.nodes import gate, ledger

Obj = dict[str, Any]
LinkStatus = Literal["ok", "failed", "skipped"]

# The operand pods the chain reads, by their `app` label (upstream's DaemonSet names).
DRIVER_APP = "nvidia-driver-daemonset"
DRIVER_COMPONENT = "nvidia-driver"
TOOLKIT_APP = "nvidia-container-toolkit-daemonset"
PLUGIN_APP = "nvidia-device-plugin-daemonset"
VALIDATOR_APP = "nvidia-operator-validator"
CUDA_VALIDATOR_APP = "nvidia-cuda-validator"
DRIVER_MANAGER = "k8s-driver-manager"
DRIVER_CTR = "nvidia-driver-ctr"
VALIDATIONS = ("driver-validation", "toolkit-validation", "cuda-validation", "plugin-validation")
GPU_RESOURCE = "nvidia.com/gpu"
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

    @property
    def failed(self) -> Link | None:
        return next((link for link in self.links if link.status == "failed"), None)

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
        if failed is None:
            return f"node {self.node}: every link of the chain holds"
        return f"node {self.node}: {failed.title} failed: {failed.summary}"

    def to_dict(self) -> dict[str, Any]:
        failed = self.failed
        return {
            "node": self.node,
            "usable": self.usable,
            "failedLink": failed.id if failed else None,
            "message": self.message(),
            "startupGate": self.startup_gate or None,
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
TITLES = dict(CHAIN)


class _Stop(Exception):
    """Raised by a link check to end the walk with its failing link."""

    def __init__(self, link: Link, before: Sequence[Link] = ()) -> None:
        self.link = link
        self.before = tuple(before)


def _fail(id_: str, summary: str, evidence: Iterable[Evidence] = (), fix: str = "") -> _Stop:
    return _Stop(Link(id_, TITLES[id_], "failed", summary, tuple(evidence), fix))


def _ok(id_: str, summary: str, evidence: Iterable[Evidence] = ()) -> Link:
    return Link(id_, TITLES[id_], "ok", summary, tuple(evidence))


def _skip(id_: str, summary: str) -> Link:
    return Link(id_, TITLES[id_], "skipped", summary)


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


def _deploy_labels(facts: NodeFacts) -> Link:
    labels = facts.labels
    owned = ledger.read(facts.annotations)
    workload = labels.get(keys.GPU_WORKLOAD_CONFIG, keys.WORKLOAD_CONTAINER)
    if workload != keys.WORKLOAD_CONTAINER:
        raise _fail(
            "deploy-labels",
            f"the node runs {workload} workloads: its GPUs go to VMs, not pods",
            [Evidence("label", keys.GPU_WORKLOAD_CONFIG, workload)],
            f"label the node {keys.GPU_WORKLOAD_CONFIG}=container to use its GPUs in containers",
        )
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
    evidence = []
    for operand in ("driver", "container-toolkit", "device-plugin", "operator-validator"):
        key = keys.DEPLOY_PREFIX + operand
        value = labels.get(key)
        if value is None:
            raise _fail(
                "deploy-labels",
                f"{key} is not set: the operator has not labelled the node yet",
                [Evidence("label", key, "absent")],
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
            raise _fail(
                "deploy-labels",
                f"{key}={value}: paused while the driver is being (re)installed",
                evidence,
                "wait for the driver pod's k8s-driver-manager to finish "
                "(its log says what it waits for)",
            )
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
        raise _fail(
            "allocatable",
            "allocatable has no nvidia.com/gpu: every device is unhealthy",
            [Evidence("resource", "allocatable", "nvidia.com/gpu: 0")],
            "read the device plugin's log for the devices it marked unhealthy and why",
        )
    return _ok(
        "allocatable",
        f"{count} GPU(s) allocatable",
        [Evidence("resource", "allocatable", f"{GPU_RESOURCE}: {count}")],
    )


def _validator(facts: NodeFacts) -> Link:
    if facts.policy is not None and not facts.policy.validator:
        return _skip("validator", "validator.enabled=false")
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
    return gate.plan(
        gate.GateFacts(
            taints=taints,
            gpu_allocatable=gate.allocatable_gpus(facts.allocatable),
            validator_ready=bool(validators) and validators[0].problem is None,
        ),
        taint,
    )


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


def _mig(facts: NodeFacts) -> Link:
    state = facts.labels.get(keys.MIG_CONFIG_STATE)
    config = facts.labels.get(keys.MIG_CONFIG, "")
    evidence = [Evidence("label", keys.MIG_CONFIG_STATE, state or "absent")]
    if state == "failed":
        raise _fail(
            "mig",
            f"applying MIG config {config or '?'} failed",
            evidence,
            "read the nvidia-mig-manager pod's log; fix or change nvidia.com/mig.config",
        )
    if state in ("pending", "rebooting"):
        raise _fail(
            "mig",
            f"MIG config {config or '?'} is being applied ({state}): GPUs are paused",
            evidence,
            "wait for nvidia.com/mig.config.state=success",
        )
    if state is None:
        return _skip("mig", "no MIG configuration on this node")
    return _ok("mig", f"MIG config {config} applied", evidence)


def _upgrade(facts: NodeFacts) -> Link:
    state = facts.labels.get(keys.UPGRADE_STATE, "")
    evidence = [Evidence("label", keys.UPGRADE_STATE, state or "absent")]
    if state == "upgrade-failed":
        raise _fail(
            "upgrade",
            "the driver upgrade failed on this node",
            evidence,
            "`gpu-operator upgrade status` says why; fix it and retry the upgrade",
        )
    if state not in _UPGRADE_IDLE:
        raise _fail(
            "upgrade",
            f"a driver upgrade is in progress ({state})",
            evidence,
            "wait for upgrade-done (`gpu-operator upgrade status`)",
        )
    return _ok("upgrade", state or "no upgrade in progress", evidence)


def explain(facts: NodeFacts) -> Verdict:
    """Walk the chain for one node; stop at the first failing link (later links not reached)."""
    links: list[Link] = []
    steps = (
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
    return Verdict(facts.name, tuple(links), _gate_sentence(facts, plan) if plan else "")


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
    return PolicyView(
        driver=enabled("driver"),
        toolkit=enabled("toolkit"),
        device_plugin=enabled("devicePlugin"),
        validator=True,
        driver_crd=bool(driver.get("useNvidiaDriverCRD")),
    )


def worst(verdicts: Iterable[Verdict]) -> Verdict | None:
    """The failing node furthest from usable (earliest failing link; then by name)."""
    failing = [v for v in verdicts if not v.usable]
    return min(failing, key=lambda v: (v.depth, v.node)) if failing else None
