"""A dry run of a whole rollout: the real planner against a modelled cluster and clock.

`upgrade plan` uses it to say which nodes go in which batch, what each batch evicts, and how long
the rollout should take; tests use it to check the limits at every step. The model is simple and
says so: evicted pods leave after `Timing.eviction`, a replaced driver pod is ready after
`Timing.driver_start`, a validator after `Timing.validation`; a PDB with no disruptions allowed
blocks for ever, one that allows any never does (budgets are not recounted as pods move).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpu_operator.upgrade import actions, planner, states
from gpu_operator.upgrade.snapshot import Node, Pod, Snapshot


@dataclass(frozen=True)
class Timing:
    """Seconds each step is assumed to take (our estimates; override them with what you see)."""

    eviction: float = 30.0  # Kubernetes' default terminationGracePeriodSeconds
    driver_start: float = 300.0  # build and load a driver from source on the node
    driver_start_precompiled: float = 60.0  # pull and load a precompiled driver
    validation: float = 60.0  # the validator pod's checks on the new driver

    def start_for(self, precompiled: bool) -> float:
        return self.driver_start_precompiled if precompiled else self.driver_start

    def per_node(self, *, precompiled: bool, evicts: bool, validates: bool) -> float:
        """One node's upgrade, start to finish, as this model sees it."""
        return (
            (self.eviction if evicts else 0.0)
            + self.start_for(precompiled)
            + (self.validation if validates else 0.0)
        )


@dataclass
class NodeRun:
    """One node's rollout in the dry run."""

    node: str
    pool: str
    batch: int | None = None
    started: float | None = None
    finished: float | None = None
    state: str = ""
    evicted: list[str] = field(default_factory=list)
    blocked_by: set[str] = field(default_factory=set)
    message: str = ""
    canary: bool = False


@dataclass
class Outcome:
    """What the dry run saw: per node, per batch, peak limits, and the end time."""

    nodes: dict[str, NodeRun]
    batches: list[list[str]]
    duration: float
    peak_unavailable: int
    peak_in_progress: int
    finished: bool
    steps: int


Check = Callable[[Snapshot, actions.Plan], None]
# Called with every node after each single node write (the limits must hold between the writes
# of one pass too, not only between passes).
WriteCheck = Callable[[Mapping[str, Node]], None]


class _Model:
    def __init__(self, snap: Snapshot, timing: Timing) -> None:
        self.now = snap.now
        self.start = snap.now
        self.timing = timing
        self.base = snap
        self.nodes: dict[str, Node] = dict(snap.nodes)
        self.pods: dict[str, Pod] = {p.key: p for p in snap.pods}
        self.queue: list[tuple[float, int, str, str]] = []  # (time, seq, what, pod key)
        self.seq = 0
        self.waiting: dict[str, list[str]] = {}  # node -> validator pods waiting for its driver
        self.rv = 1000
        self.precompiled = {d.uid: d.precompiled for d in snap.daemonsets}
        self.targets = planner.pool_targets(
            [d for d in snap.daemonsets if d.driver], snap.revisions
        )
        self.pools = {d.uid: d for d in snap.daemonsets}

    def snapshot(self) -> Snapshot:
        return Snapshot.build(
            now=self.now,
            nodes=self.nodes.values(),
            daemonsets=self.base.daemonsets,
            revisions=self.base.revisions,
            pods=self.pods.values(),
            budgets=self.base.budgets,
            owners=self.base.owners,
            namespace=self.base.namespace,
        )

    def later(self, delay: float, what: str, key: str) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (self.now + delay, self.seq, what, key))

    def patch(self, action: actions.PatchNode) -> None:
        node = self.nodes[action.node]
        labels = dict(node.labels)
        annotations = dict(node.annotations)
        for key, value in action.labels.items():
            if value is None:
                labels.pop(key, None)
            else:
                labels[key] = value
        for key, value in action.annotations.items():
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value
        self.rv += 1
        self.nodes[action.node] = dataclasses.replace(
            node,
            labels=labels,
            annotations=annotations,
            unschedulable=node.unschedulable
            if action.unschedulable is None
            else action.unschedulable,
            resource_version=str(self.rv),
        )

    def evict(self, action: actions.EvictPod) -> bool:
        key = f"{action.namespace}/{action.name}"
        pod = self.pods.get(key)
        if pod is None or pod.deleting:
            return False
        if any(b.covers(pod) and b.disruptions_allowed <= 0 for b in self.base.budgets):
            return False
        self.pods[key] = dataclasses.replace(pod, deleting=True)
        self.later(self.timing.eviction, "gone", key)
        return True

    def delete(self, action: actions.DeletePod) -> bool:
        key = f"{action.namespace}/{action.name}"
        pod = self.pods.get(key)
        if pod is None or pod.deleting:
            return False
        self.pods[key] = dataclasses.replace(pod, deleting=True)
        self.later(0.0, "replace", key)
        return True

    def replace(self, key: str) -> None:
        """A deleted DaemonSet pod comes back at the pool's newest revision."""
        old = self.pods.pop(key, None)
        if old is None or old.controller_uid is None:
            return
        revision = old.revision
        if old.labels.get("app") != states.VALIDATOR_APP:
            revision = self.targets.get(old.controller_uid, revision)
        self.seq += 1
        labels = dict(old.labels)
        if revision:
            labels[states.REVISION_HASH_LABEL] = revision
        new = dataclasses.replace(
            old,
            name=f"{old.name.split('~')[0]}~{self.seq}",
            deleting=False,
            ready=False,
            phase="Running",
            created=self.now,
            labels=labels,
            restarts=0,
        )
        self.pods[new.key] = new
        if old.labels.get("app") == states.VALIDATOR_APP:
            if not self._driver_ready_on(new.node):
                # The validator's checks start once the node's driver is ready (its init
                # container waits for it).
                self.waiting.setdefault(new.node, []).append(new.key)
                return
            delay = self.timing.validation
        else:
            delay = self.timing.start_for(self.precompiled.get(old.controller_uid, False))
        self.later(delay, "ready", new.key)

    def _driver_ready_on(self, node: str) -> bool:
        return any(
            p.node == node and p.labels.get("app") == states.DRIVER_APP and p.ready
            and not p.deleting
            for p in self.pods.values()
        )  # fmt: skip

    def fire(self, what: str, key: str) -> None:
        if what == "gone":
            self.pods.pop(key, None)
        elif what == "replace":
            self.replace(key)
        elif what == "ready" and key in self.pods:
            pod = self.pods[key]
            self.pods[key] = dataclasses.replace(pod, ready=True)
            if pod.labels.get("app") == states.DRIVER_APP:
                for waiting in self.waiting.pop(pod.node, []):
                    self.later(self.timing.validation, "ready", waiting)


def run(
    snap: Snapshot,
    timing: Timing | None = None,
    *,
    check: Check | None = None,
    check_writes: WriteCheck | None = None,
    max_steps: int = 100_000,
    horizon: float = 30 * 24 * 3600.0,
) -> Outcome:
    """Plan, apply, advance the clock; until nothing is left to do (or `horizon` seconds)."""
    model = _Model(snap, timing or Timing())
    runs: dict[str, NodeRun] = {}
    batches: list[list[str]] = []
    peak_unavailable = peak_in_progress = 0
    steps = 0
    finished = False
    while steps < max_steps:
        steps += 1
        current = model.snapshot()
        plan = planner.plan(current, chain=True)
        if check is not None:
            check(current, plan)
        for group in plan.groups.values():
            peak_unavailable = max(peak_unavailable, group.unavailable)
            peak_in_progress = max(peak_in_progress, group.in_progress)
        batch: list[str] = []
        # A node's report tells its last step; the Event of its start says whether a canary.
        canaries = {
            a.node
            for a in plan.actions
            if isinstance(a, actions.Event) and a.message.startswith("canary ")
        }
        for report in plan.nodes.values():
            entry = runs.setdefault(report.node, NodeRun(report.node, report.pool))
            entry.state = report.state
            entry.message = report.message
            entry.blocked_by.update(report.blocked_by)
            leaves_idle = report.previous in (states.UPGRADE_REQUIRED, "", states.UPGRADE_DONE)
            if leaves_idle and report.state not in states.IDLE and entry.started is None:
                entry.started = model.now
                entry.batch = len(batches)
                entry.canary = report.node in canaries or "canary" in report.message
                batch.append(report.node)
            if report.state in (states.UPGRADE_DONE, states.UPGRADE_FAILED) and (
                entry.started is not None and entry.finished is None
            ):
                entry.finished = model.now
        if batch:
            batches.append(sorted(batch))
        changed = _apply(model, plan.actions, runs, check_writes)
        if changed:
            continue
        wake = [model.queue[0][0]] if model.queue else []
        if plan.requeue_after is not None:
            wake.append(model.now + max(plan.requeue_after, 1.0))
        if not wake:
            finished = True
            break
        model.now = min(wake)
        if model.now - model.start > horizon:
            break
        while model.queue and model.queue[0][0] <= model.now:
            _, _, what, key = heapq.heappop(model.queue)
            model.fire(what, key)
    return Outcome(
        nodes=runs,
        batches=batches,
        duration=model.now - model.start,
        peak_unavailable=peak_unavailable,
        peak_in_progress=peak_in_progress,
        finished=finished,
        steps=steps,
    )


def _apply(
    model: _Model,
    todo: list[actions.Action],
    runs: dict[str, NodeRun],
    check_writes: WriteCheck | None = None,
) -> bool:
    """Apply a plan as the controller does: node patches in their write order (the nodes that
    start only after every other node's steps), then the pod work."""
    changed = False
    first, starts = actions.write_order(todo)
    for chain in [*first, *starts]:
        for patch in chain:
            model.patch(patch)
            changed = True
            if check_writes is not None:
                check_writes(model.nodes)
    for action in todo:
        if isinstance(action, actions.EvictPod):
            if model.evict(action):
                changed = True
                runs[action.node].evicted.append(f"{action.namespace}/{action.name}")
        elif isinstance(action, actions.DeletePod):
            changed = model.delete(action) or changed
    return changed
