"""What the upgrade planner sees: nodes, driver DaemonSets (pools), pods, PDBs and policies.

Each `*_from` function turns one API object (a dict) into the small frozen record the planner
reads. The controller uses them as cache transforms and `upgrade plan` on listed objects, so both
plan from the same facts.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpu_operator import api
from gpu_operator.api import enablement, keys
from gpu_operator.nodes import ledger
from gpu_operator.operands.readiness import PodSummary
from gpu_operator.upgrade import policy as policy_mod
from gpu_operator.upgrade import selectors, states

Obj = Mapping[str, Any]
_GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
# Node annotations the planner reads (everything else is dropped from the cache).
_NODE_ANNOTATIONS = frozenset(
    {
        ledger.ANNOTATION,
        *states.PROGRESS_ANNOTATIONS,
        states.REQUESTED,
        states.SAFE_LOAD,
        states.CANARY,
    }
)
_NODE_LABEL_PREFIXES = (keys.PREFIX, "feature.node.kubernetes.io/", "kubernetes.io/hostname")


def timestamp(value: Any) -> float:
    """Seconds since the epoch of an RFC 3339 time ("" or junk: 0)."""
    if not isinstance(value, str) or not value:
        return 0.0
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _interned(mapping: Mapping[str, Any]) -> dict[str, str]:
    return {sys.intern(str(k)): sys.intern(str(v)) for k, v in mapping.items()}


# Pods of one DaemonSet carry the same labels: one dict for all of them (read-only: the planner
# and the simulator copy before they change labels). Bounded, as pod labels may be anything.
_POD_LABELS: dict[tuple[tuple[Any, Any], ...], dict[str, str]] = {}
_POD_LABELS_LIMIT = 10_000


def _pod_labels(mapping: Mapping[str, Any]) -> Mapping[str, str]:
    key = tuple(mapping.items())
    found = _POD_LABELS.get(key)
    if found is None:
        if len(_POD_LABELS) >= _POD_LABELS_LIMIT:
            _POD_LABELS.clear()
        found = _POD_LABELS[key] = _interned(mapping)
    return found


# Nodes and pods are kept per cached object (140,000 pods at 20,000 nodes): slots, no __dict__.
@dataclass(frozen=True, slots=True)
class Node:
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    unschedulable: bool
    ready: bool
    resource_version: str = ""
    uid: str = ""

    @property
    def state(self) -> str:
        return self.labels.get(states.STATE_LABEL, states.UNKNOWN)

    @property
    def cordoned_by_us(self) -> bool:
        return ledger.CORDON in ledger.read(self.annotations)

    @property
    def kernel(self) -> str:
        return self.labels.get(keys.NFD_KERNEL_FULL, "")


def node_from(obj: Obj) -> Node:
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    conditions = (obj.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return Node(
        name=str(meta.get("name")),
        labels=_interned({k: v for k, v in labels.items() if k.startswith(_NODE_LABEL_PREFIXES)}),
        annotations={k: v for k, v in annotations.items() if k in _NODE_ANNOTATIONS},
        unschedulable=bool((obj.get("spec") or {}).get("unschedulable")),
        ready=ready,
        resource_version=str(meta.get("resourceVersion") or ""),
        uid=str(meta.get("uid") or ""),
    )


@dataclass(frozen=True, slots=True)
class Pod:
    namespace: str
    name: str
    node: str
    phase: str
    ready: bool
    deleting: bool
    created: float
    labels: Mapping[str, str]
    controller_kind: str | None
    controller_uid: str | None
    gpu: bool
    empty_dir: bool
    restarts: int
    grace_seconds: int
    config_digest: str | None = None
    image: str = ""
    # The ResourceClaims the pod holds (names in its namespace); `Snapshot.build` marks the pod
    # a GPU pod when one of them is allocated by NVIDIA's GPU DRA driver.
    claims: tuple[str, ...] = ()
    # For the operator namespace's pods in the operator's one pod cache: the readiness summary
    # the status side reads (controller/strip.pod_record); no part of the planner's facts.
    summary: PodSummary | None = field(default=None, compare=False, repr=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def active(self) -> bool:
        """Running or about to run, and not on its way out."""
        return self.phase in ("Running", "Pending") and not self.deleting

    @property
    def revision(self) -> str | None:
        return self.labels.get(states.REVISION_HASH_LABEL)


def _uses_gpu(spec: Obj) -> bool:
    for ctr in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        resources = ctr.get("resources") or {}
        for section in ("limits", "requests"):
            for name in resources.get(section) or {}:
                if str(name).startswith(_GPU_RESOURCE_PREFIXES):
                    return True
    return False


def _claims(spec: Obj, status: Obj) -> tuple[str, ...]:
    """The names of the pod's ResourceClaims: named in the spec, or (made from a template) as the
    pod's status reports them; an entry whose claim is not made yet holds nothing."""
    made = {
        str(s.get("name")): str(s["resourceClaimName"])
        for s in status.get("resourceClaimStatuses") or []
        if s.get("resourceClaimName")
    }
    names = []
    for entry in spec.get("resourceClaims") or []:
        name = entry.get("resourceClaimName") or made.get(str(entry.get("name")))
        if name:
            names.append(sys.intern(str(name)))
    return tuple(names)


# The DRA driver of NVIDIA's GPUs: a pod holding a claim it allocated uses GPUs as one that
# requests nvidia.com/gpu does (upstream 26.7 counts both).
GPU_DRA_DRIVER = "gpu.nvidia.com"


@dataclass(frozen=True, slots=True)
class Claim:
    """A ResourceClaim as the upgrade planner needs it: does it hold GPUs of `gpu.nvidia.com`?"""

    namespace: str
    name: str
    gpu: bool

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def claim_from(obj: Obj) -> Claim:
    """Allocated by `gpu.nvidia.com` without admin access: admin-access results (monitoring and
    validation pods) give a management view of the devices without consuming them, so, as
    upstream, they neither hold a driver restart back nor get the pod evicted."""
    meta = obj.get("metadata") or {}
    allocation = (obj.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    gpu = any(r.get("driver") == GPU_DRA_DRIVER and not r.get("adminAccess") for r in results)
    return Claim(str(meta.get("namespace") or ""), str(meta.get("name")), gpu)


def _env(ctr: Obj, name: str) -> str | None:
    for env in ctr.get("env") or []:
        if env.get("name") == name and "value" in env:
            return str(env["value"])
    return None


def _digest(spec: Obj) -> str | None:
    """The pod's DRIVER_CONFIG_DIGEST: the first non-empty one, init containers first (the
    driver manager's), as upstream reads it."""
    for ctr in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        value = _env(ctr, "DRIVER_CONFIG_DIGEST")
        if value:
            return value
    return None


def _driver_image(containers: list[Obj]) -> str:
    """The driver container's image (else the first container's): what a pool installs."""
    chosen = next((c for c in containers if c.get("name") == "nvidia-driver-ctr"), None)
    if chosen is None and containers:
        chosen = containers[0]
    return str((chosen or {}).get("image") or "")


def pod_from(obj: Obj, summary: PodSummary | None = None) -> Pod:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    controller = None
    for owner in meta.get("ownerReferences") or ():
        if owner.get("controller"):
            controller = owner
            break
    ready = False
    for condition in status.get("conditions") or ():
        if condition.get("type") == "Ready" and condition.get("status") == "True":
            ready = True
            break
    restarts = 0
    for statuses in (status.get("containerStatuses"), status.get("initContainerStatuses")):
        for one in statuses or ():
            restarts = max(restarts, int(one.get("restartCount") or 0))
    containers = spec.get("containers") or []
    return Pod(
        namespace=sys.intern(str(meta.get("namespace") or "")),
        name=str(meta.get("name")),
        node=sys.intern(str(spec.get("nodeName") or "")),
        phase=sys.intern(str(status.get("phase") or "Pending")),
        ready=ready,
        deleting=bool(meta.get("deletionTimestamp")),
        created=timestamp(meta.get("creationTimestamp")),
        labels=_pod_labels(meta.get("labels") or {}),
        # Shared by every pod of a DaemonSet: one string each, not one per pod.
        controller_kind=sys.intern(str(controller.get("kind"))) if controller else None,
        controller_uid=sys.intern(str(controller.get("uid"))) if controller else None,
        gpu=_uses_gpu(spec),
        empty_dir=any("emptyDir" in v for v in spec.get("volumes") or []),
        restarts=restarts,
        grace_seconds=int(spec.get("terminationGracePeriodSeconds") or 30),
        config_digest=_shared(_digest(spec)),
        image=sys.intern(_driver_image(containers)),
        claims=_claims(spec, status),
        summary=summary,
    )


def _shared(value: str | None) -> str | None:
    return sys.intern(value) if value is not None else None


@dataclass(frozen=True)
class Budget:
    """A PodDisruptionBudget: which pods it covers and how many may go now."""

    namespace: str
    name: str
    selector: selectors.Selector
    disruptions_allowed: int

    def covers(self, pod: Pod) -> bool:
        return pod.namespace == self.namespace and self.selector.matches(pod.labels)


def budget_from(obj: Obj) -> Budget:
    meta = obj.get("metadata") or {}
    return Budget(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name")),
        selector=selectors.from_object((obj.get("spec") or {}).get("selector")),
        disruptions_allowed=int((obj.get("status") or {}).get("disruptionsAllowed") or 0),
    )


@dataclass(frozen=True)
class Revision:
    """A ControllerRevision of a DaemonSet: its hash, number and owner."""

    name: str
    hash: str
    number: int
    owner_uid: str
    template: Mapping[str, Any] | None = None


def revision_from(obj: Obj) -> Revision:
    meta = obj.get("metadata") or {}
    owner: Mapping[str, Any] = next(
        (r for r in meta.get("ownerReferences") or [] if r.get("controller")), {}
    )
    labels = meta.get("labels") or {}
    name = str(meta.get("name"))
    owner_name = str(owner.get("name") or "")
    digest = labels.get(states.REVISION_HASH_LABEL) or name.removeprefix(f"{owner_name}-")
    data = obj.get("data") or {}
    template = ((data.get("spec") or {}).get("template")) if _is_driver(labels) else None
    return Revision(
        name=name,
        hash=str(digest),
        number=int(obj.get("revision") or 0),
        owner_uid=str(owner.get("uid") or ""),
        template=template,
    )


def _is_driver(labels: Mapping[str, str]) -> bool:
    return (
        labels.get("app") == states.DRIVER_APP
        or labels.get("app.kubernetes.io/component") == states.DRIVER_COMPONENT
    )


@dataclass(frozen=True)
class DaemonSet:
    """A driver DaemonSet (a pool), a rollback DaemonSet, or the validator's."""

    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str]
    owner_kind: str | None
    owner_name: str | None
    owner_uid: str | None
    node_selector: Mapping[str, str]
    on_delete: bool
    config_digest: str | None
    image: str
    precompiled: bool

    @property
    def driver(self) -> bool:
        return _is_driver(self.labels) and states.ROLLBACK_LABEL not in self.labels

    @property
    def rollback(self) -> bool:
        return states.ROLLBACK_LABEL in self.labels

    @property
    def validator(self) -> bool:
        return self.labels.get("app") == states.VALIDATOR_APP or self.name == states.VALIDATOR_APP


def daemonset_from(obj: Obj) -> DaemonSet:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    template = (spec.get("template") or {}).get("spec") or {}
    owner = next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), None)
    labels = meta.get("labels") or {}
    containers = template.get("containers") or []
    return DaemonSet(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name")),
        uid=str(meta.get("uid") or ""),
        labels=dict(labels),
        owner_kind=str(owner.get("kind")) if owner else None,
        owner_name=str(owner.get("name")) if owner else None,
        owner_uid=str(owner.get("uid")) if owner else None,
        node_selector=dict(template.get("nodeSelector") or {}),
        on_delete=(spec.get("updateStrategy") or {}).get("type") == "OnDelete",
        config_digest=_digest(template),
        image=_driver_image(containers),
        precompiled=labels.get(keys.PRECOMPILED) == "true",
    )


@dataclass(frozen=True)
class Owner:
    """A ClusterPolicy or NVIDIADriver: whose upgradePolicy applies to its driver DaemonSets."""

    kind: str
    name: str
    uid: str
    policy: policy_mod.Policy
    version: str = ""

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.name}"


def owner_from(obj: Obj) -> Owner:
    """The upgrade policy of a ClusterPolicy or NVIDIADriver (an invalid one plans nothing)."""
    meta = obj.get("metadata") or {}
    kind = str(obj.get("kind"))
    annotations = meta.get("annotations") or {}
    checked = api.check_document(dict(obj))
    version = ""
    if not checked.ok or checked.obj is None:
        problems = "; ".join(str(p) for p in checked.errors) or "invalid"
        policy = policy_mod.Policy(auto_upgrade=False, error=f"{kind} is invalid: {problems}")
    elif isinstance(checked.obj, api.ClusterPolicy):
        driver = checked.obj.spec.driver
        policy = policy_mod.effective(driver.upgradePolicy, annotations, auto_upgrade_default=False)
        if not enablement.is_enabled(checked.obj.spec, "driver") or (
            enablement.sandbox_enabled(checked.obj.spec)
        ):
            # Upstream: no driver, or sandbox workloads, means no upgrade controller at work.
            policy = policy_mod.Policy(auto_upgrade=False, error=policy.error)
        version = driver.version or ""
    else:
        spec = getattr(checked.obj, "spec", None)
        policy = policy_mod.effective(getattr(spec, "upgradePolicy", None), annotations)
        version = str(getattr(spec, "version", "") or "")
    return Owner(
        kind=kind,
        name=str(meta.get("name")),
        uid=str(meta.get("uid") or ""),
        policy=policy,
        version=version,
    )


@dataclass(frozen=True)
class Snapshot:
    """Everything one planning pass reads; `now` is Unix seconds."""

    now: float
    nodes: Mapping[str, Node]
    daemonsets: tuple[DaemonSet, ...]
    revisions: tuple[Revision, ...]
    pods: tuple[Pod, ...]
    budgets: tuple[Budget, ...] = ()
    owners: tuple[Owner, ...] = ()
    namespace: str = ""
    pods_by_node: Mapping[str, tuple[Pod, ...]] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        *,
        now: float,
        nodes: Iterable[Node],
        daemonsets: Iterable[DaemonSet],
        revisions: Iterable[Revision],
        pods: Iterable[Pod],
        budgets: Iterable[Budget] = (),
        owners: Iterable[Owner] = (),
        namespace: str = "",
        claims: Iterable[Claim] | None = None,
    ) -> Snapshot:
        """`claims`: the cluster's ResourceClaims, None where the DRA API is not served. A pod
        holding a `gpu.nvidia.com` claim is a GPU pod; so is one holding a claim not (yet) seen,
        as upstream counts a claim it cannot read (draining one pod too many can be undone,
        restarting a driver under a running GPU pod cannot)."""
        pod_list = tuple(p for p in pods if p.node)
        if claims is not None:
            held = {c.key: c.gpu for c in claims}
            pod_list = tuple(
                dataclasses.replace(p, gpu=True)
                if not p.gpu and any(held.get(f"{p.namespace}/{name}", True) for name in p.claims)
                else p
                for p in pod_list
            )
        by_node: dict[str, list[Pod]] = {}
        for pod in pod_list:
            by_node.setdefault(pod.node, []).append(pod)
        return cls(
            now=now,
            nodes={n.name: n for n in nodes},
            daemonsets=tuple(daemonsets),
            revisions=tuple(revisions),
            pods=pod_list,
            budgets=tuple(budgets),
            owners=tuple(owners),
            namespace=namespace,
            pods_by_node={k: tuple(v) for k, v in by_node.items()},
        )
