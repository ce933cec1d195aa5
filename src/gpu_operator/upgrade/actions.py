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


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    nodes: dict[str, NodeReport] = field(default_factory=dict)
    groups: dict[str, GroupReport] = field(default_factory=dict)
    # Seconds until a timeout or retry is due; None when only events can change anything.
    requeue_after: float | None = None

    def wake_in(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        if self.requeue_after is None or seconds < self.requeue_after:
            self.requeue_after = seconds
