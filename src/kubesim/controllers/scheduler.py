"""The default scheduler: filters nodes as kube-scheduler's default plugins do, scores the feasible
ones, binds the best, and explains failures with kube-scheduler's FailedScheduling message.

A per-node allocation index (requested resources, pod count, host ports) is kept from pod and node
events, so an attempt never scans all pods. Unschedulable pods wait as in kube-scheduler's queue:
each failed attempt backs the pod off (1 s, doubling to 10 s), and a waiting pod is moved back only
by an event that can make it schedulable (queueing hints: the changed node now passes the pod's
filters, or a DRA object it waits for changed), or after 5 minutes without one.
"""

from __future__ import annotations

import asyncio
import copy
import time
from dataclasses import dataclass, field
from typing import Any

from kubesim.controllers import scheduler_dra, scheduling
from kubesim.controllers.base import Controller
from kubesim.store import Event, Store, Stored, now

POD_KEY = ("", "pods")
NODE_KEY = ("", "nodes")
SCHEDULER_NAME = "default-scheduler"
TERMINAL = ("Succeeded", "Failed")

# kube-scheduler's filter reasons (1.35), in the order its default plugins run; a node reports
# only the first plugin that rejects it (NodeResourcesFit can report several resources).
UNSCHEDULABLE = "node(s) were unschedulable"
TAINT = "node(s) had untolerated taint {{{key}: {value}}}"
AFFINITY_PREFILTER = "node(s) didn't satisfy plugin(s) [NodeAffinity]"
AFFINITY = "node(s) didn't match Pod's node affinity/selector"
PORTS = "node(s) didn't have free ports for the requested pod ports"
TOO_MANY_PODS = "Too many pods"
# DefaultPreemption's per-node verdicts. kubesim never preempts, so every node where removing
# pods could help reports the verdict of a cluster whose pods all share one priority.
PREEMPTION_NOT_HELPFUL = "Preemption is not helpful for scheduling"
NO_VICTIMS = "No preemption victims found for incoming pod"
NOT_ELIGIBLE = "not eligible due to preemptionPolicy=Never."
NO_NODES = "no nodes available to schedule pods"
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
# Score weights of the default profile's plugins that kubesim implements.
WEIGHT_FIT, WEIGHT_BALANCED, WEIGHT_TAINT, WEIGHT_AFFINITY = 1, 1, 3, 2
# kube-scheduler's queue: podInitialBackoffSeconds, podMaxBackoffSeconds, and how long a pod may
# wait in unschedulablePods without an event before it is tried again
# (podMaxInUnschedulablePodsDuration).
INITIAL_BACKOFF, MAX_BACKOFF = 1.0, 10.0
MAX_UNSCHEDULABLE_SECONDS = 300.0


def backoff_seconds(attempts: int) -> float:
    """The backoff after `attempts` failed attempts (1 s, 2 s, 4 s, ... at most 10 s)."""
    if attempts <= 0:
        return 0.0
    return min(MAX_BACKOFF, INITIAL_BACKOFF * float(2 ** min(attempts - 1, 16)))


@dataclass
class Waiting:
    """A pod in unschedulablePods: what rejected it, how often, and until when it backs off."""

    fit: PodFit | None
    plugins: frozenset[str]
    attempts: int = 0
    backoff_until: float = 0.0


@dataclass
class NodeInfo:
    """What the scheduler knows about one node: the object and what bound pods use on it."""

    name: str
    node: dict[str, Any] | None = None
    allocatable: dict[str, int] = field(default_factory=dict)
    requested: dict[str, int] = field(default_factory=dict)
    non_zero: dict[str, int] = field(default_factory=dict)
    pods: int = 0
    ports: dict[tuple[str, int], dict[str, int]] = field(default_factory=dict)
    taints: list[dict[str, Any]] = field(default_factory=list)
    unschedulable: bool = False

    def set_node(self, node: dict[str, Any] | None) -> None:
        previous, self.node = self.node, node
        if not node:
            self.allocatable = {}
        elif previous is None or _allocatable_source(previous) != _allocatable_source(node):
            # Parsed again only when it changed (label writes are far more frequent).
            self.allocatable = scheduling.node_allocatable(node)
        spec = (node or {}).get("spec") or {}
        self.taints = spec.get("taints") or []
        self.unschedulable = bool(spec.get("unschedulable"))


@dataclass
class PodUsage:
    """What one bound, non-terminal pod takes from its node."""

    uid: str
    node: str
    requests: dict[str, int]
    non_zero: dict[str, int]
    ports: list[tuple[str, int, str]]


# Which plugin rejected a node, by its reason; a waiting pod is retried only for changes that
# could undo a rejection it got (kube-scheduler's queueing hints, coarsely).
EVERYTHING = "*"
FREED = frozenset({"NodeResourcesFit", "NodePorts"})


def plugin_of(reason: str) -> str:
    """The default plugin that reports a filter reason."""
    if reason in (AFFINITY, AFFINITY_PREFILTER):
        return "NodeAffinity"
    if reason == UNSCHEDULABLE:
        return "NodeUnschedulable"
    if reason == PORTS:
        return "NodePorts"
    if reason in (scheduler_dra.CANNOT_ALLOCATE, scheduler_dra.NOT_ON_NODE) or reason.startswith(
        ("claim ", "request ")
    ):
        return scheduler_dra.PLUGIN
    if reason.startswith("node(s) had untolerated taint"):
        return "TaintToleration"
    return "NodeResourcesFit"


def node_changes(old: dict[str, Any] | None, new: dict[str, Any]) -> frozenset[str]:
    """The plugins whose verdict a node change can turn (not heartbeats, conditions or
    annotations); everything for a new node."""
    if old is None:
        return frozenset({EVERYTHING})
    changed = set()
    if old["metadata"].get("labels") != new["metadata"].get("labels"):
        changed.add("NodeAffinity")
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    if old_spec.get("taints") != new_spec.get("taints"):
        changed.add("TaintToleration")
    if bool(old_spec.get("unschedulable")) != bool(new_spec.get("unschedulable")):
        changed.add("NodeUnschedulable")
    if _allocatable_source(old) != _allocatable_source(new) and (
        scheduling.node_allocatable(old) != scheduling.node_allocatable(new)
    ):
        changed.add("NodeResourcesFit")
    return frozenset(changed)


def _allocatable_source(node: dict[str, Any]) -> Any:
    """What scheduling.node_allocatable reads from a node."""
    status = node.get("status") or {}
    return status.get("allocatable") or status.get("capacity")


def feasible_nodes_to_find(total: int) -> int:
    """How many feasible nodes an attempt looks for before scoring (the real adaptive default:
    all below 100 nodes, else 50% minus 1% per 125 nodes, at least 5% and at least 100)."""
    if total < 100:
        return total
    percentage = max(5, 50 - total // 125)
    return max(100, total * percentage // 100)


class PodFit:
    """One scheduling attempt's view of a pod: its requests, ports and placement rules."""

    def __init__(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        self.spec: dict[str, Any] = pod.get("spec") or {}
        self.requests, self.non_zero = scheduling.pod_requests_and_non_zero(self.spec)
        self.ports = scheduling.host_ports(self.spec)
        self.tolerations: list[dict[str, Any]] = self.spec.get("tolerations") or []
        self.tolerates_unschedulable = any(
            scheduling.tolerates(t, UNSCHEDULABLE_TAINT) for t in self.tolerations
        )
        node_affinity = (self.spec.get("affinity") or {}).get("nodeAffinity") or {}
        self.preferred: list[dict[str, Any]] = (
            node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []
        )
        self.allowed_names = _prefilter_names(
            node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        )
        self.has_selector = bool(self.spec.get("nodeSelector")) or bool(
            node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        )
        # Resources in the order NodeResourcesFit reports them.
        self.resource_order = [
            n for n in ("cpu", "memory", "ephemeral-storage") if n in self.requests
        ] + sorted(n for n in self.requests if scheduling.is_scalar_resource(n))
        self.prefer_tolerations = [
            t
            for t in self.tolerations
            if not t.get("effect") or t.get("effect") == "PreferNoSchedule"
        ]
        # Each preferred term as a pod spec requiring just that term (to reuse node_selected).
        self.preferences = [
            (
                int(term.get("weight") or 0),
                {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [term.get("preference") or {}]
                            }
                        }
                    }
                },
            )
            for term in self.preferred
        ]

    def filter(self, info: NodeInfo) -> tuple[list[str], bool]:
        """(reasons, unresolvable) for one node; no reasons means the pod fits."""
        assert info.node is not None
        if self.allowed_names is not None and info.name not in self.allowed_names:
            return [AFFINITY_PREFILTER], True
        if info.unschedulable and not self.tolerates_unschedulable:
            return [UNSCHEDULABLE], True
        taint = scheduling.untolerated_taint(
            info.taints, self.tolerations, ("NoSchedule", "NoExecute")
        )
        if taint is not None:
            return [TAINT.format(key=taint.get("key", ""), value=taint.get("value", ""))], True
        if self.has_selector and not scheduling.node_selected(info.node, self.spec):
            return [AFFINITY], True
        if self.ports and _ports_conflict(info.ports, self.ports):
            return [PORTS], False
        return self._fit(info)

    def _fit(self, info: NodeInfo) -> tuple[list[str], bool]:
        reasons: list[str] = []
        unresolvable = False
        if info.pods + 1 > info.allocatable.get("pods", 0):
            reasons.append(TOO_MANY_PODS)
        if not self.requests:
            return reasons, False
        for name in self.resource_order:
            want = self.requests[name]
            have = info.allocatable.get(name, 0)
            if want > have - info.requested.get(name, 0):
                reasons.append(f"Insufficient {name}")
                # More than the whole node: removing other pods could never make room.
                unresolvable = unresolvable or want > have
        return reasons, unresolvable

    def score(self, info: NodeInfo) -> tuple[int, int, int, int]:
        """Raw (least-allocated, balanced, untolerated PreferNoSchedule taints, affinity)."""
        fractions = []
        least = 0
        for name in ("cpu", "memory"):
            capacity = info.allocatable.get(name, 0)
            used = info.non_zero.get(name, 0) + self.non_zero.get(name, 0)
            if capacity <= 0 or used > capacity:
                fractions.append(1.0)
                continue
            least += (capacity - used) * 100 // capacity
            fractions.append(used / capacity)
        balanced = int((1 - abs(fractions[0] - fractions[1]) / 2) * 100)
        taints = sum(
            1
            for taint in info.taints
            if taint.get("effect") == "PreferNoSchedule"
            and not any(scheduling.tolerates(t, taint) for t in self.prefer_tolerations)
        )
        affinity = 0
        assert info.node is not None
        for weight, preference in self.preferences:
            if scheduling.node_selected(info.node, preference):
                affinity += weight
        return least // 2, balanced, taints, affinity


def fit_fails(fit: PodFit, info: NodeInfo, rejected: frozenset[str]) -> bool:
    """Whether the plugins that rejected the pod (`rejected`) still reject it on this one node
    (a queueing hint's check). As in kube-scheduler, a hint looks only at its own plugin: a pod
    kept out by a cordon is moved back when the node is uncordoned even if it now lacks the
    resources (that attempt then records NodeResourcesFit, whose hint waits for allocatable)."""
    why, _ = fit.filter(info)
    return any(plugin_of(reason) in rejected for reason in why) if rejected else bool(why)


def _prefilter_names(required: dict[str, Any] | None) -> set[str] | None:
    """Node names a required affinity pins the pod to through `matchFields metadata.name In`
    in every term (NodeAffinity's PreFilter), or None when it does not."""
    if not required:
        return None
    names: set[str] = set()
    for term in required.get("nodeSelectorTerms") or []:
        pinned = [
            set(f.get("values") or [])
            for f in term.get("matchFields") or []
            if f.get("key") == "metadata.name" and f.get("operator") == "In"
        ]
        if not pinned:
            return None
        names |= set.intersection(*pinned)
    return names


def _ports_conflict(
    used: dict[tuple[str, int], dict[str, int]], wanted: list[tuple[str, int, str]]
) -> bool:
    for protocol, port, ip in wanted:
        ips = used.get((protocol, port))
        if not ips:
            continue
        if ip == "0.0.0.0" or "0.0.0.0" in ips or ip in ips:
            return True
    return False


def failure_message(
    total: int, reasons: dict[str, int], resolvable: int, unresolvable: int, spec: dict[str, Any]
) -> str:
    """kube-scheduler's FitError text: reason counts sorted as strings, then the preemption
    verdict (`0/3 nodes are available: 3 Insufficient cpu. preemption: ...`)."""
    if total == 0:
        return NO_NODES
    parts = sorted(f"{count} {reason}" for reason, count in reasons.items())
    message = f"0/{total} nodes are available: {', '.join(parts)}."
    if spec.get("preemptionPolicy") == "Never":
        return f"{message} preemption: {NOT_ELIGIBLE}"
    verdicts = []
    if unresolvable:
        verdicts.append(f"{unresolvable} {PREEMPTION_NOT_HELPFUL}")
    if resolvable:
        verdicts.append(f"{resolvable} {NO_VICTIMS}")
    return f"{message} preemption: 0/{total} nodes are available: {', '.join(sorted(verdicts))}."


class Scheduler(Controller):
    """Binds pods without `spec.nodeName` whose schedulerName is `default-scheduler`."""

    name = SCHEDULER_NAME
    resources = (NODE_KEY, POD_KEY, *scheduler_dra.KEYS)

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.nodes: dict[str, NodeInfo] = {}
        self.usage: dict[tuple[str, str], PodUsage] = {}
        # Waiting pods (unschedulablePods) -> what rejected them (no plugins: there were no
        # nodes); failed attempts per pod, kept until it is bound or gone (its backoff).
        self.unschedulable: dict[tuple[str, str], Waiting] = {}
        self.attempts: dict[tuple[str, str], int] = {}
        # Nodes run through the filters, all attempts together (what the queue saves).
        self.filter_passes = 0
        self._order: list[str] | None = None
        self._next_start = 0
        self.dra = scheduler_dra.DraPlugin(store)

    # ----- the allocation index --------------------------------------------------------------

    def initial_keys(self) -> list[Any]:
        self.dra.start()
        for stored in self.store.scan(NODE_KEY):
            self._node_changed(stored.obj)
        pending = []
        for stored in self.store.scan(POD_KEY):
            self._pod_changed(stored.obj)
            if self._wants_scheduling(stored.obj):
                meta = stored.obj["metadata"]
                pending.append((meta["namespace"], meta["name"]))
        return pending

    def node_order(self) -> list[str]:
        """Names of the nodes that exist, in a stable order."""
        if self._order is None:
            self._order = sorted(n for n, info in self.nodes.items() if info.node is not None)
        return self._order

    def _info(self, name: str) -> NodeInfo:
        info = self.nodes.get(name)
        if info is None:
            info = self.nodes[name] = NodeInfo(name)
        return info

    def _node_changed(self, node: dict[str, Any] | None, name: str = "") -> frozenset[str]:
        """Update a node's entry; returns the plugins whose verdicts the change may turn."""
        name = name or (node or {}).get("metadata", {}).get("name", "")
        info = self.nodes.get(name)
        if node is None:
            if info is not None:
                info.set_node(None)
                if not info.pods:
                    del self.nodes[name]
                self._order = None
            return frozenset()
        info = self._info(name)
        before = info.node
        if before is None:
            self._order = None
        info.set_node(node)
        return node_changes(before, node)

    def _pod_changed(self, pod: dict[str, Any], deleted: bool = False) -> bool:
        """Account a pod on its node (or stop); True when it freed resources on a node."""
        meta = pod["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        spec = pod.get("spec") or {}
        node: str = spec.get("nodeName") or ""
        occupying = (
            not deleted and bool(node) and (pod.get("status") or {}).get("phase") not in TERMINAL
        )
        current = self.usage.get(key)
        if occupying and current is not None and current.uid == meta.get("uid"):
            return False  # already accounted; requests of a bound pod are fixed here
        freed = False
        if current is not None:
            self._release(key, current)
            freed = True
        if occupying:
            requests, non_zero = scheduling.pod_requests_and_non_zero(spec)
            usage = PodUsage(
                meta.get("uid", ""), node, requests, non_zero, scheduling.host_ports(spec)
            )
            self.usage[key] = usage
            info = self._info(node)
            info.pods += 1
            for name, value in usage.requests.items():
                info.requested[name] = info.requested.get(name, 0) + value
            for name in ("cpu", "memory"):
                info.non_zero[name] = info.non_zero.get(name, 0) + usage.non_zero.get(name, 0)
            for protocol, port, ip in usage.ports:
                ips = info.ports.setdefault((protocol, port), {})
                ips[ip] = ips.get(ip, 0) + 1
        return freed

    def _release(self, key: tuple[str, str], usage: PodUsage) -> None:
        del self.usage[key]
        info = self.nodes.get(usage.node)
        if info is None:
            return
        info.pods -= 1
        for name, value in usage.requests.items():
            info.requested[name] = info.requested.get(name, 0) - value
        for name in ("cpu", "memory"):
            info.non_zero[name] = info.non_zero.get(name, 0) - usage.non_zero.get(name, 0)
        for protocol, port, ip in usage.ports:
            ips = info.ports.get((protocol, port)) or {}
            ips[ip] = ips.get(ip, 1) - 1
            if ips.get(ip) == 0:
                del ips[ip]
            if not ips:
                info.ports.pop((protocol, port), None)
        if info.node is None and not info.pods:
            del self.nodes[usage.node]

    def _wants_scheduling(self, pod: dict[str, Any]) -> bool:
        spec = pod.get("spec") or {}
        return (
            not spec.get("nodeName")
            and not pod["metadata"].get("deletionTimestamp")
            and (pod.get("status") or {}).get("phase") not in TERMINAL
            and spec.get("schedulerName", SCHEDULER_NAME) == SCHEDULER_NAME
            and not spec.get("schedulingGates")
        )

    def _retry_unschedulable(self, changes: frozenset[str], node: str = "") -> None:
        """Move back the waiting pods that a rejection by one of `changes` kept out and that the
        change can help: with `node`, only those that now pass the filters on that node (the
        queueing hints of NodeResourcesFit, NodePorts, NodeUnschedulable, TaintToleration and
        NodeAffinity each look at the one node that changed)."""
        if not changes:
            return
        info = self.nodes.get(node) if node else None
        for key, waiting in list(self.unschedulable.items()):
            rejected = waiting.plugins
            if not (EVERYTHING in changes or not rejected or rejected & changes):
                continue
            if (
                info is not None
                and info.node is not None
                and waiting.fit is not None
                and fit_fails(waiting.fit, info, rejected)
            ):
                continue
            self._requeue(key, waiting)

    def _requeue(self, key: tuple[str, str], waiting: Waiting) -> None:
        """unschedulablePods -> activeQ, or backoffQ while the pod backs off. As with
        SchedulerPopFromBackoffQ, a backing-off pod is tried at once when nothing else waits."""
        left = waiting.backoff_until - time.monotonic()
        if left <= 0 or not self._pending:
            self.enqueue(key)
        else:
            self._later(key, left)

    def _later(self, key: tuple[str, str], delay: float) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self.enqueue(key)  # no event loop (a synchronous caller): no timers either
            return
        self.enqueue_after(key, delay)

    def on_event(self, event: Event) -> None:
        if event.key in scheduler_dra.KEYS:
            if self.dra.on_event(event):
                self._retry_unschedulable(frozenset({scheduler_dra.PLUGIN}))
            return
        if event.key == NODE_KEY:
            obj = event.new.obj
            name = obj["metadata"]["name"]
            if event.type == "DELETED":
                self._node_changed(None, name)
            else:
                self._retry_unschedulable(self._node_changed(obj), name)
            return
        if event.key != POD_KEY:
            return
        pod = event.new.obj
        meta = pod["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        previous = self.usage.get(key)
        if self._pod_changed(pod, deleted=event.type == "DELETED"):
            assert previous is not None
            self._retry_unschedulable(FREED, previous.node)
        if event.type == "DELETED" or not self._wants_scheduling(pod):
            self.unschedulable.pop(key, None)
            self.attempts.pop(key, None)
            return
        if (
            key in self.unschedulable
            and event.old is not None
            and event.old.obj.get("spec") == pod.get("spec")
            and (event.old.obj.get("status") or {}).get("resourceClaimStatuses")
            == (pod.get("status") or {}).get("resourceClaimStatuses")
        ):
            return  # a status or metadata write (often our own): nothing new to try
        self.enqueue(key)

    # ----- one attempt -----------------------------------------------------------------------

    def reconcile(self, key: Any) -> None:
        stored = self.store.peek(POD_KEY, *key)
        if stored is None or not self._wants_scheduling(stored.obj):
            self.unschedulable.pop(key, None)
            self.attempts.pop(key, None)
            return
        fit = PodFit(stored.obj)
        claims: scheduler_dra.PodClaims | None = None
        classes: dict[str, Any] = {}
        allocations: dict[str, scheduler_dra.Plan] = {}
        if fit.spec.get("resourceClaims"):
            claims = self.dra.pod_claims(stored.obj)
            if claims.waiting:
                # PreEnqueue: the pod waits (no attempt, no event) until its claims exist.
                self.unschedulable[key] = Waiting(None, frozenset({scheduler_dra.PLUGIN}))
                return
            classes = self.dra.classes()
        order = self.node_order()
        total = len(order)
        wanted = feasible_nodes_to_find(total)
        feasible: list[NodeInfo] = []
        reasons: dict[str, int] = {}
        resolvable = unresolvable = 0
        start = self._next_start % total if total else 0
        processed = 0
        for offset in range(total):
            info = self.nodes[order[(start + offset) % total]]
            processed += 1
            self.filter_passes += 1
            why, final = fit.filter(info)
            if not why and claims is not None:
                assert info.node is not None
                reason, found = self.dra.filter(claims, info.node, classes)
                if reason:
                    why, final = [reason], reason != scheduler_dra.CANNOT_ALLOCATE
                else:
                    allocations[info.name] = found or scheduler_dra.NOTHING
            if not why:
                feasible.append(info)
                if len(feasible) >= wanted:
                    break
                continue
            for reason in why:
                reasons[reason] = reasons.get(reason, 0) + 1
            if final:
                unresolvable += 1
            else:
                resolvable += 1
        if total:
            self._next_start = (start + processed) % total
        if not feasible:
            message = failure_message(total, reasons, resolvable, unresolvable, fit.spec)
            attempts = self.attempts[key] = self.attempts.get(key, 0) + 1
            plugins = frozenset(plugin_of(r) for r in reasons)
            self.unschedulable[key] = Waiting(
                # A pod that needs DRA devices is moved back on any node change its filters
                # pass (the allocator's verdict on that node is not re-checked in a hint).
                fit,
                plugins,
                attempts,
                time.monotonic() + backoff_seconds(attempts),
            )
            self._later(key, MAX_UNSCHEDULABLE_SECONDS)
            self._unschedulable(key, stored, message)
            return
        self.unschedulable.pop(key, None)
        self.attempts.pop(key, None)
        best = self._best(fit, feasible)
        if claims is not None:
            self.dra.reserve(stored.obj, claims, allocations[best], self._write_claim)
        self._bind(key, stored, best)

    def _write_claim(self, obj: dict[str, Any], allocated: bool) -> None:
        """Write a claim's finalizer (when newly allocated), then its status."""
        rt = self.rt("resourceclaims.resource.k8s.io")
        meta = obj["metadata"]
        namespace, name = meta.get("namespace", ""), meta["name"]
        if allocated:
            written = self.store.replace(rt, copy.deepcopy(obj), namespace=namespace, name=name)
            meta["resourceVersion"] = written.obj["metadata"]["resourceVersion"]
        self.store.replace(rt, obj, namespace=namespace, name=name, subresource="status")

    def _best(self, fit: PodFit, feasible: list[NodeInfo]) -> str:
        raw = [(info, fit.score(info)) for info in feasible]
        max_taints = max(score[2] for _, score in raw)
        max_affinity = max(score[3] for _, score in raw)
        ranked = []
        for info, (least, balanced, taints, affinity) in raw:
            total = (
                WEIGHT_FIT * least
                + WEIGHT_BALANCED * balanced
                + WEIGHT_TAINT * (100 - taints * 100 // max_taints if max_taints else 100)
                + WEIGHT_AFFINITY * (affinity * 100 // max_affinity if max_affinity else 0)
            )
            # The real scheduler picks one of the best at random; kubesim takes the one with
            # the fewest pods, then the first name, so ties still spread pods deterministically.
            ranked.append((-total, info.pods, info.name))
        return min(ranked)[2]

    def _bind(self, key: tuple[str, str], stored: Stored, node: str) -> None:
        rt = self.rt("pods")
        obj = stored.copy()
        obj["spec"]["nodeName"] = node
        bound = self.store.replace(rt, obj, namespace=key[0], name=key[1])
        conditions = (bound.obj.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "PodScheduled" and c.get("status") != "True" for c in conditions):
            # The binding subresource marks the pod scheduled; clear our earlier verdict.
            updated = bound.copy()
            updated["status"]["conditions"] = [
                c for c in conditions if c.get("type") != "PodScheduled"
            ] + [
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": now(),
                }
            ]
            bound = self.store.replace(
                rt, updated, namespace=key[0], name=key[1], subresource="status"
            )
        self.events.record(
            bound.obj,
            "Normal",
            "Scheduled",
            f"Successfully assigned {key[0]}/{key[1]} to {node}",
            component=SCHEDULER_NAME,
        )

    def _unschedulable(self, key: tuple[str, str], stored: Stored, message: str) -> None:
        pod = stored.obj
        conditions = (pod.get("status") or {}).get("conditions") or []
        previous = next((c for c in conditions if c.get("type") == "PodScheduled"), None)
        if not (
            previous is not None
            and previous.get("status") == "False"
            and previous.get("reason") == "Unschedulable"
            and previous.get("message") == message
        ):
            obj = stored.copy()
            status = obj.setdefault("status", {})
            status["conditions"] = [c for c in conditions if c.get("type") != "PodScheduled"] + [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                    "lastProbeTime": None,
                    "lastTransitionTime": previous.get("lastTransitionTime", now())
                    if previous is not None and previous.get("status") == "False"
                    else now(),
                }
            ]
            self.store.replace(
                self.rt("pods"), obj, namespace=key[0], name=key[1], subresource="status"
            )
        self.events.record(pod, "Warning", "FailedScheduling", message, component=SCHEDULER_NAME)
