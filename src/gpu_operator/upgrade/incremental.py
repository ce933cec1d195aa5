"""Incremental planning (issue 32): what the planner keeps about each node between passes.

A full pass plans every node; at 1,000 nodes that is tens of milliseconds, paid for each of a
rollout's events. An incremental pass plans only the nodes whose facts changed (their node or
pods), the nodes it must come back to (a step written, pods evicted, a timeout due) and the
nodes in progress, and reads the rest of the fleet from the `Fleet`: one `NodeSummary` per node
as its last pass left it, and counters over them per policy (in progress, unavailable, failed,
canaries). A node nobody touched since its last pass has nothing new to do, so its summary is
what a full pass would find; waiting nodes are planned only when a slot is free for them.

Everything here is pure bookkeeping (no I/O): the controller and the tests feed it the nodes
that changed and the plans that came out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from gpu_operator.upgrade import actions
from gpu_operator.upgrade.actions import NodeSummary


@dataclass
class Counts:
    """Counters over the summaries of one policy's nodes."""

    total: int = 0
    busy: int = 0
    unavailable: int = 0
    failed: int = 0
    failed_canaries: int = 0
    # pool -> [members, canaries, canaries not done]
    pools: dict[str, list[int]] = field(default_factory=dict)

    def add(self, summary: NodeSummary, sign: int) -> None:
        self.total += sign
        self.busy += sign * summary.busy
        self.unavailable += sign * summary.unavailable
        self.failed += sign * summary.failed
        self.failed_canaries += sign * summary.failed_canary
        pool = self.pools.setdefault(summary.pool, [0, 0, 0])
        pool[0] += sign
        pool[1] += sign * summary.canary
        pool[2] += sign * summary.canary_pending
        if pool == [0, 0, 0]:
            del self.pools[summary.pool]

    def copy(self) -> Counts:
        return Counts(
            self.total,
            self.busy,
            self.unavailable,
            self.failed,
            self.failed_canaries,
            {k: list(v) for k, v in self.pools.items()},
        )


class Fleet:
    """Per-node summaries and per-policy counters, kept in step with the plans."""

    def __init__(self) -> None:
        self.summaries: dict[str, NodeSummary] = {}
        self.groups: dict[str, Counts] = {}
        self.rollbacks = 0  # nodes with a rollback label (incremental passes leave them alone)
        # Waiting nodes per policy: name -> (canary first, unavailable), for the start order.
        self.waiting: dict[str, dict[str, tuple[bool, bool]]] = {}
        self.busy: set[str] = set()
        # Nodes the next pass must plan again whatever happens: a step written (its next step
        # is planned from the node as written), pods asked to go, a timeout or retry due.
        self.sticky: set[str] = set()
        self.deadlines: dict[str, float] = {}  # node -> when its own wait ends (Unix seconds)
        self.ready = False  # a full pass has filled it

    def __len__(self) -> int:
        return len(self.summaries)

    # ----- keeping it -----------------------------------------------------------------------

    def _put(self, name: str, summary: NodeSummary | None) -> None:
        old = self.summaries.pop(name, None)
        if old is not None:
            if old.owner:
                self.groups[old.owner].add(old, -1)
                if self.groups[old.owner].total == 0:
                    del self.groups[old.owner]
                waiting = self.waiting.get(old.owner)
                if waiting is not None and waiting.pop(name, None) is not None and not waiting:
                    del self.waiting[old.owner]
            self.rollbacks -= old.rollback
            self.busy.discard(name)
        if summary is None:
            return
        self.summaries[name] = summary
        if summary.owner:
            self.groups.setdefault(summary.owner, Counts()).add(summary, 1)
            if summary.waiting:
                waiting = self.waiting.setdefault(summary.owner, {})
                waiting[name] = (summary.first, summary.unavailable)
        self.rollbacks += summary.rollback
        if summary.busy:
            self.busy.add(name)

    def update(self, plan: actions.Plan, focus: Collection[str], now: float) -> None:
        """Take an incremental pass's outcome: the summaries of the nodes it planned (a focus
        node it did not summarize is gone)."""
        for name in focus:
            if name not in plan.summaries:
                self._put(name, None)
        for name, summary in plan.summaries.items():
            self._put(name, summary)
        self._follow(plan, [*focus, *plan.summaries], now)

    def reset(
        self,
        plan: actions.Plan,
        now: float,
        pending: Iterable[str] = (),
        *,
        check: bool = True,
    ) -> list[str]:
        """Take a full pass's outcome; the policies whose counters disagreed with it, over the
        nodes without `pending` changes (those the incremental passes have not seen yet) and
        those the next incremental pass would plan anyway: none, unless the full pass, the
        safety net, corrected them. `check=False`: facts of every node changed since the
        incremental passes (a DaemonSet, policy, revision, budget or claim changed), so their
        counters cannot be compared with the full pass's.

        A waiting node this pass starts is left out too: its slot was freed by a node of
        `pending` (or it was due), as the next incremental pass would have started it."""
        pending = self.focus(pending, now) | {
            action.node
            for action in plan.actions
            if isinstance(action, actions.PatchNode)
            and (summary := self.summaries.get(action.node)) is not None
            and summary.waiting
        }
        before = {k: _comparable(self.background(k, pending)) for k in self.groups}
        had = self.ready and check
        self.summaries, self.groups, self.waiting = {}, {}, {}
        self.busy, self.rollbacks = set(), 0
        for name, summary in plan.summaries.items():
            self._put(name, summary)
        self.deadlines = {}
        self._follow(plan, list(plan.summaries), now)
        self.ready = True
        if not had:
            return []
        # A policy with no node left to compare has no counters on one side: empty ones (a
        # policy whose every node has a pending change is not a drift).
        after = {k: _comparable(self.background(k, pending)) for k in self.groups}
        empty = _comparable(Counts())
        return sorted(
            key for key in {*before, *after} if before.get(key, empty) != after.get(key, empty)
        )

    def _follow(self, plan: actions.Plan, planned: Iterable[str], now: float) -> None:
        for name in planned:
            self.sticky.discard(name)
            self.deadlines.pop(name, None)
        for action in plan.actions:
            if isinstance(action, actions.PatchNode | actions.EvictPod | actions.DeletePod):
                self.sticky.add(action.node)
        for name, seconds in plan.node_wake.items():
            self.deadlines[name] = now + seconds

    # ----- asking it ------------------------------------------------------------------------

    def focus(self, changed: Iterable[str], now: float) -> set[str]:
        """The nodes an incremental pass plans: those whose facts changed, those it must come
        back to, those whose wait is over, and every node in progress."""
        due = {name for name, at in self.deadlines.items() if at <= now}
        return {*changed, *self.sticky, *due, *self.busy}

    def next_deadline(self) -> float | None:
        return min(self.deadlines.values(), default=None)

    def background(self, owner: str, planned: Iterable[str]) -> Counts:
        """The counters of a policy's nodes other than `planned` (those this pass plans)."""
        counts = self.groups.get(owner, Counts()).copy()
        for name in planned:
            summary = self.summaries.get(name)
            if summary is not None and summary.owner == owner:
                counts.add(summary, -1)
        return counts

    def waiting_nodes(self, owner: str) -> Mapping[str, tuple[bool, bool]]:
        return self.waiting.get(owner, {})


def _comparable(counts: Counts) -> tuple[int, ...]:
    pools = tuple(x for key in sorted(counts.pools) for x in counts.pools[key])
    return (
        counts.total,
        counts.busy,
        counts.unavailable,
        counts.failed,
        counts.failed_canaries,
        *pools,
    )
