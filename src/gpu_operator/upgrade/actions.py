"""What a planning pass asks the executor to do, and what it found, per node and per policy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PatchNode:
    """One merge patch of a node (labels, annotations, cordon), guarded by its resourceVersion so
    that a decision made on a stale view fails with a conflict instead of overwriting."""

    node: str
    labels: Mapping[str, str | None]
    annotations: Mapping[str, str | None]
    unschedulable: bool | None
    resource_version: str
    # A node can take several steps in one pass, one patch per state (each state label is
    # written, in order): `step` is this patch's place in the node's chain. A later step is
    # planned from the node as the earlier ones leave it, so the executor applies a chain in
    # order, each patch guarded by the resourceVersion the previous one returned, and stops at
    # the first refusal.
    step: int = 0
    # The patch starts the node's upgrade (takes a maxParallelUpgrades slot and, for a
    # schedulable node, a maxUnavailable one). Slots are counted after the other nodes' steps
    # of the same pass, so these are applied only once every other patch of the pass was.
    takes_slot: bool = False

    def merge_patch(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {}
        if self.resource_version:
            metadata["resourceVersion"] = self.resource_version
        if self.labels:
            metadata["labels"] = dict(self.labels)
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        patch: dict[str, Any] = {"metadata": metadata}
        if self.unschedulable is not None:
            # null removes the field, as `kubectl uncordon` leaves it.
            patch["spec"] = {"unschedulable": True if self.unschedulable else None}
        return patch


@dataclass(frozen=True)
class EvictPod:
    """Evict through the Eviction API, so PodDisruptionBudgets are honoured (429 = not now)."""

    namespace: str
    name: str
    node: str


@dataclass(frozen=True)
class DeletePod:
    """Delete a pod outright: a stale driver pod (OnDelete DaemonSet) or an old validator pod."""

    namespace: str
    name: str
    node: str
    why: str


@dataclass(frozen=True)
class EnsureRollbackSet:
    """Create (or keep) the DaemonSet that runs a previous driver revision on rolled-back nodes."""

    namespace: str
    name: str
    pool: str
    revision: str
    revision_hash: str


@dataclass(frozen=True)
class DeleteRollbackSet:
    """Remove a rollback DaemonSet no node selects any more."""

    namespace: str
    name: str


@dataclass(frozen=True)
class Event:
    """A core/v1 Event on a node (reason GPUDriverUpgrade, as upstream)."""

    node: str
    message: str
    warning: bool = False
    # The step (PatchNode.step) of the node's chain this Event tells about: recorded only once
    # that patch was applied.
    step: int = 0


Action = PatchNode | EvictPod | DeletePod | EnsureRollbackSet | DeleteRollbackSet | Event


@dataclass(frozen=True)
class NodeReport:
    """One node after this pass: its pool, state, and what it is doing or waiting for."""

    node: str
    pool: str
    owner: str
    state: str
    previous: str
    message: str
    blocked_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class GroupReport:
    """One upgrade policy (a ClusterPolicy or NVIDIADriver) and its limits this pass."""

    owner: str
    total: int
    in_progress: int
    unavailable: int
    max_unavailable: int
    max_parallel: int
    started: int
    failed: int
    available: int = 0
    stopped: str | None = None
    error: str | None = None


def write_order(todo: list[Action]) -> tuple[list[list[PatchNode]], list[list[PatchNode]]]:
    """The node patches of a plan as chains (one per node, in step order), in the two waves
    they must be applied in: first every node that does not start its upgrade (this frees the
    slots of nodes that finish), then, only if all of those were applied, the nodes that start.
    Within a wave the nodes are independent; within a chain the steps are sequential."""
    chains: dict[str, list[PatchNode]] = {}
    for action in todo:
        if isinstance(action, PatchNode):
            chains.setdefault(action.node, []).append(action)
    first: list[list[PatchNode]] = []
    starts: list[list[PatchNode]] = []
    for chain in chains.values():
        chain.sort(key=lambda a: a.step)
        (starts if chain[0].takes_slot else first).append(chain)
    return first, starts


@dataclass(frozen=True, slots=True)
class NodeSummary:
    """One node as its last pass leaves it (its patches applied), for the counters."""

    owner: str  # the policy (group) key; "" for nodes outside every policy
    pool: str
    busy: bool  # in progress: takes a maxParallelUpgrades slot
    unavailable: bool  # counts against maxUnavailable
    failed: bool
    failed_canary: bool  # a failed canary of its pool's newest revision (stops the rollout)
    canary: bool  # a canary of its pool's newest revision
    canary_pending: bool  # ... that is not done yet
    waiting: bool  # upgrade-required: competes for a slot
    rollback: bool  # carries (or gets) the rollback label
    first: bool  # its canary annotation names its pool's target (it starts before the others)


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    nodes: dict[str, NodeReport] = field(default_factory=dict)
    groups: dict[str, GroupReport] = field(default_factory=dict)
    # Seconds until a timeout or retry is due; None when only events can change anything.
    requeue_after: float | None = None
    # Incremental planning (upgrade/incremental.py): each planned node as this pass leaves it,
    # when each node's own wait ends (seconds from now), and whether an incremental pass found
    # something only a full pass may decide (a stopped rollout, a rollback).
    summaries: dict[str, NodeSummary] = field(default_factory=dict)
    node_wake: dict[str, float] = field(default_factory=dict)
    needs_full: str | None = None

    def wake_in(self, seconds: float, node: str | None = None) -> None:
        seconds = max(seconds, 0.0)
        if self.requeue_after is None or seconds < self.requeue_after:
            self.requeue_after = seconds
        if node is not None:
            held = self.node_wake.get(node)
            if held is None or seconds < held:
                self.node_wake[node] = seconds
