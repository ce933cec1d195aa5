"""Planned work or a failure: what a not-ready operand state means while the operator rolls out.

Upstream reports every not-ready state as `Error=True` (`DriverNotReady`, `OperandNotReady`), so a
planned driver upgrade pages whoever alerts on Error for as long as it runs. Here a state whose
only problems are explained by work the operator is doing on schedule is *progress*: the driver
upgrade state machine has the node (queued or under way), or a DaemonSet is rolling a new spec out
to its pods. A problem no rollout explains stays an error, and so does a real failure during a
rollout: a node in `upgrade-failed`, an image that cannot be pulled or a pod whose configuration is
wrong, a pod that cannot be scheduled, a pod that keeps crashing past its restart budget.

Facts in (per DaemonSet: whether a new spec is rolling out and which pods have which problem; per
driver owner: where its nodes stand in the upgrade state machine), a verdict out.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from gpu_operator.upgrade import states

# Nodes the upgrade state machine holds: queued for a slot, or under way.
QUEUED = frozenset({states.UPGRADE_REQUIRED})
UNDER_WAY = frozenset(
    {
        states.CORDON_REQUIRED,
        states.WAIT_FOR_JOBS_REQUIRED,
        states.POD_DELETION_REQUIRED,
        states.DRAIN_REQUIRED,
        states.POD_RESTART_REQUIRED,
        states.VALIDATION_REQUIRED,
        states.UNCORDON_REQUIRED,
    }
)
# Restarts a pod may take during planned work before it counts as failing: a driver pod gets
# upstream's budget (past it the upgrade fails the node), and so do the other operands on a node
# whose driver is being replaced (they restart while it is down); anything else rolling out a new
# spec gets a few.
DRIVER_RESTART_BUDGET = states.MAX_DRIVER_RESTARTS
OPERAND_RESTART_BUDGET = 3
# Kubernetes reasons no rollout explains: the image or the pod's configuration is wrong, or the
# pod cannot be placed. (Container creation errors are not here: while a node's driver is being
# replaced, a container that needs the NVIDIA runtime fails to start until the driver is back.)
BROKEN_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "Unschedulable",
    }
)

Kind = Literal["ready", "progress", "fault", "waiting"]


@dataclass(frozen=True)
class Issue:
    """One pod's problem (or a node's pending work), where it is and what Kubernetes says."""

    node: str
    text: str
    # The Kubernetes reasons behind it: container waiting reasons, `Unschedulable`.
    reasons: tuple[str, ...] = ()
    restarts: int = 0
    # The pod runs an older revision than its DaemonSet's newest (an OnDelete pod waiting to be
    # replaced).
    outdated: bool = False


@dataclass(frozen=True)
class Workload:
    """One DaemonSet of a state (or the node labelling), as its readiness left it."""

    name: str
    # Why it is not ready, "" when it is.
    problem: str = ""
    # A new spec of an existing DaemonSet is rolling out: written in this pass, not yet seen by
    # its controller, or pods of an older template are still being replaced on schedule.
    updating: bool = False
    issues: tuple[Issue, ...] = ()
    # Driver pods: upstream's restart budget; other operands' pods get a few restarts.
    driver: bool = False
    # The node labelling's pending nodes: re-checking a node the driver upgrade changes (any
    # node with an upgrade state) is part of that upgrade.
    labelling: bool = False


@dataclass(frozen=True)
class Upgrade:
    """Where one owner's driver nodes stand in the upgrade state machine (their state label).

    `states` maps each of its nodes to its state; nodes labelled
    `nvidia.com/gpu-driver-upgrade.skip=true` are left out of it and listed in `skipped` (they
    wait for ever; upstream's status leaves them out too). `failures` says why failed nodes
    failed. `enabled`: the owner's upgrades run (autoUpgrade on, its upgrade policy usable), so a
    driver pod of an older revision is replaced on schedule.
    """

    states: Mapping[str, str] = field(default_factory=dict)
    failures: Mapping[str, str] = field(default_factory=dict)
    enabled: bool = False
    skipped: frozenset[str] = frozenset()

    # Worked out once per view (a status pass asks for each once per pod issue: thousands while
    # a rollout goes on); the view is immutable, its `states` never edited after it is made.
    @cached_property
    def under_way(self) -> tuple[str, ...]:
        return tuple(sorted(n for n, s in self.states.items() if s in UNDER_WAY))

    @cached_property
    def queued(self) -> tuple[str, ...]:
        return tuple(sorted(n for n, s in self.states.items() if s in QUEUED))

    @cached_property
    def failed(self) -> tuple[str, ...]:
        return tuple(sorted(n for n, s in self.states.items() if s == states.UPGRADE_FAILED))

    @cached_property
    def moving(self) -> frozenset[str]:
        """`under_way` as a set (membership tests per pod issue)."""
        return frozenset(self.under_way)

    @cached_property
    def waiting(self) -> frozenset[str]:
        """`queued` as a set."""
        return frozenset(self.queued)

    @property
    def active(self) -> bool:
        """Whether a rollout is queued or under way."""
        return bool(self.under_way or self.queued)

    def summary(self, shown: int = 3) -> str:
        """`upgrading the driver on 2/10 node(s): gpu-3 (drain-required), ...; 5 waiting for a
        slot`, or "" when nothing is queued or under way."""
        if not self.active:
            return ""
        moving = self.under_way
        text = f"upgrading the driver on {len(moving)}/{len(self.states)} node(s)"
        if moving:
            names = ", ".join(f"{n} ({self.states[n]})" for n in moving[:shown])
            more = f" and {len(moving) - shown} more" if len(moving) > shown else ""
            text += f": {names}{more}"
        if self.queued:
            text += f"; {len(self.queued)} waiting for a slot"
        return text

    def failure_message(self) -> str:
        """What failed, node by node (the first one's reason in full), or ""."""
        failed = self.failed
        if not failed:
            return ""
        first = failed[0]
        why = self.failures.get(first) or "no reason recorded"
        text = f"driver upgrade failed on {first}: {why}"
        if len(failed) > 1:
            text += f" (and on {len(failed) - 1} more: {', '.join(failed[1:4])}"
            text += ", ...)" if len(failed) > 4 else ")"
        return text


@dataclass(frozen=True)
class Verdict:
    """How a state stands: ready, planned work in progress, a failure, or not ready for a reason
    no rollout explains (upstream's not-ready, an error); with what to say about it."""

    kind: Kind
    message: str = ""
    # The driver upgrade accounts for (some of) it: the driver's nodes are in the upgrade, or
    # its pods are on nodes whose driver is being replaced.
    upgrade: bool = False

    @property
    def planned(self) -> bool:
        return self.kind == "progress"


def _budget(issue: Issue, workload: Workload, under_way: Collection[str]) -> int:
    if workload.driver or issue.node in under_way:
        return DRIVER_RESTART_BUDGET
    return OPERAND_RESTART_BUDGET


def broken(issue: Issue, budget: int) -> bool:
    """Whether a problem is a failure whatever is rolling out."""
    return bool(BROKEN_REASONS.intersection(issue.reasons)) or issue.restarts > budget


def _explained(issue: Issue, workload: Workload, upgrade: Upgrade) -> bool:
    """Whether planned work accounts for a (non-broken) problem."""
    if workload.updating or issue.node in upgrade.moving:
        return True
    if workload.labelling and issue.node in upgrade.states:
        return True
    if not (workload.driver and issue.outdated):
        return False
    # A driver pod of an older revision waits for its node's turn: queued already, or about to
    # be (upgrades run and the node is neither skipped nor failed).
    return issue.node in upgrade.waiting or (
        upgrade.enabled
        and issue.node not in upgrade.skipped
        and upgrade.states.get(issue.node) != states.UPGRADE_FAILED
    )


def _fault_text(workload: Workload, issue: Issue, budget: int) -> str:
    """The workload's problem, naming the failing pod (when its problem does not already) and
    the budget it went past."""
    text = workload.problem
    if issue.text not in text:
        text += f"; {issue.node}: {issue.text}" if issue.node else f"; {issue.text}"
    if issue.restarts > budget and not BROKEN_REASONS.intersection(issue.reasons):
        text += f" (more than {budget} restarts)"
    return text


def judge(
    workloads: Sequence[Workload], upgrade: Upgrade | None = None, *, driver: bool = False
) -> Verdict:
    """The verdict for one state from its workloads; `upgrade` is where the driver nodes stand
    (for the driver state its failed nodes fail it, and nodes held by the upgrade make it not
    ready even when every pod is); `driver` marks the driver state."""
    upgrade = upgrade or Upgrade()
    faults: list[str] = []
    unexplained: list[str] = []
    planned: list[str] = []
    by_upgrade = driver
    if driver and upgrade.failed:
        faults.append(upgrade.failure_message())
    for workload in workloads:
        if not workload.problem:
            continue
        broken_here = []
        for issue in workload.issues:
            budget = _budget(issue, workload, upgrade.moving)
            if broken(issue, budget):
                broken_here.append(_fault_text(workload, issue, budget))
        if broken_here:
            faults.extend(broken_here[:1])
            continue
        if workload.issues:
            explained = all(_explained(i, workload, upgrade) for i in workload.issues)
            by_upgrade = by_upgrade or any(
                i.node in upgrade.moving
                or i.node in upgrade.waiting
                or (workload.labelling and i.node in upgrade.states)
                for i in workload.issues
            )
        else:
            # Counts that lag (no pod to blame): planned while the spec rolls out or the
            # driver's nodes are in the upgrade.
            explained = workload.updating or (driver and upgrade.active)
        (planned if explained else unexplained).append(workload.problem)
    progress = upgrade.summary() if driver else ""
    message = "; ".join(p for p in (*faults, *unexplained, progress, *planned) if p)
    if faults:
        return Verdict("fault", message, by_upgrade)
    if unexplained:
        return Verdict("waiting", message, by_upgrade)
    if message:
        return Verdict("progress", message, by_upgrade)
    return Verdict("ready")
