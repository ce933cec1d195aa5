"""From per-state outcomes to the ClusterPolicy status: state, conditions and a readable summary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpu_operator.status import conditions

StateOutcome = Literal["ready", "notReady", "disabled", "failed"]


@dataclass(frozen=True)
class StateReport:
    """How one operand state stands after a pass: its outcome and the first concrete reason."""

    name: str
    outcome: StateOutcome
    message: str = ""
    # A notReady state whose problems are all planned work in progress (status/rollout.py): a
    # driver upgrade, a new spec rolling out. Not an error.
    planned: bool = False
    # A notReady state that concerns the driver (the driver state, or nodes the driver upgrade
    # holds).
    driver: bool = False


@dataclass(frozen=True)
class ClusterView:
    """Cluster-wide facts that change what "ready" means."""

    has_nfd: bool = True
    gpu_nodes: int = 1
    label_conflicts: int = 0
    # GPU nodes whose host runs its own driver while the policy installs drivers (sorted).
    preinstalled_drivers: tuple[str, ...] = ()
    # The coexistence detector's sentence (nodes/coexist.py summary), "" when nothing was found.
    coexistence: str = ""
    # The node chain's verdict for the worst GPU node (status/explain.py), "" when all hold.
    worst_node: str = ""
    # The nodes still behind the readiness gate's startup taint (nodes/gate.py waiting_summary),
    # "" when none: information, never a reason to be not ready (autoscaled nodes keep coming).
    startup_gate: str = ""
    # What the policy asks for that has no effect, said without holding anything back (a
    # device-plugin ConfigMap no node uses, a ServiceMonitor without its CRD).
    notes: tuple[str, ...] = ()


def preinstalled_message(nodes: Sequence[str], shown: int = 5) -> str:
    """What to say about GPU nodes with a preinstalled driver while `driver.enabled=true` ("" for
    none): which nodes, that the operator leaves them alone, and the two ways out (seed
    documents 000/001: on AKS the two drivers are mutually exclusive)."""
    if not nodes:
        return ""
    names = ", ".join(nodes[:shown])
    if len(nodes) > shown:
        names += f" and {len(nodes) - shown} more"
    return (
        f"{len(nodes)} GPU node(s) already run a preinstalled NVIDIA driver ({names}): the "
        "operator's driver does not run there while driver.enabled=true; create the node pool "
        "with --gpu-driver none, or set driver.enabled=false"
    )


def _listed(reports: Sequence[StateReport]) -> str:
    return "; ".join(f"{r.name} ({r.message})" if r.message else r.name for r in reports)


def _not_ready_message(reports: Sequence[StateReport]) -> str:
    errors = [r for r in reports if not r.planned]
    planned = [r for r in reports if r.planned]
    message = "states not ready: " + _listed(errors)
    if planned:
        message += "; planned work in progress: " + _listed(planned)
    return message


def in_progress(reports: Sequence[StateReport]) -> bool:
    """Whether the policy is not ready only because of planned work (no state failed, every
    notReady state is planned): Ready=False with a progress reason, Error=False."""
    waiting = [r for r in reports if r.outcome == "notReady"]
    return (
        bool(waiting)
        and all(r.planned for r in waiting)
        and not any(r.outcome == "failed" for r in reports)
    )


def build(
    reports: Sequence[StateReport],
    cluster: ClusterView,
    *,
    namespace: str,
    now: str,
    generation: int | None,
    previous: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The status subresource for a reconciled ClusterPolicy."""
    previous_conditions = (previous or {}).get("conditions") or []
    failed = [r for r in reports if r.outcome == "failed"]
    waiting = [r for r in reports if r.outcome == "notReady"]
    planned = in_progress(reports)
    if failed:
        first = failed[0]
        ready, reason = False, conditions.RECONCILE_FAILED
        message = f"failed to reconcile {first.name}: {first.message}"
        if len(failed) > 1:
            message += f" (and {len(failed) - 1} more: {', '.join(r.name for r in failed[1:])})"
    elif planned:
        ready = False
        driver = any(r.driver for r in waiting)
        reason = (
            conditions.DRIVER_UPGRADE_IN_PROGRESS
            if driver
            else conditions.OPERAND_ROLLOUT_IN_PROGRESS
        )
        message = "planned work in progress: " + _listed(waiting)
    elif waiting:
        errors = [r for r in waiting if not r.planned]
        driver_only = all(r.name == "state-driver" for r in errors)
        ready = False
        reason = conditions.DRIVER_NOT_READY if driver_only else conditions.OPERAND_NOT_READY
        message = _not_ready_message(waiting)
    elif not cluster.has_nfd:
        ready, reason = True, conditions.NFD_LABELS_MISSING
        message = "no node carries NFD labels: GPU nodes cannot be detected; is NFD running?"
    elif cluster.gpu_nodes == 0:
        ready, reason = True, conditions.NO_GPU_NODES
        message = "no GPU nodes found; operands will be deployed when one joins"
    else:
        ready, reason = True, conditions.RECONCILED
        message = f"all operand states ready on {cluster.gpu_nodes} GPU node(s)"
    if ready and cluster.label_conflicts:
        message += (
            f"; {cluster.label_conflicts} node label(s) set by someone else were left as they are"
            " (see events)"
        )
    if cluster.preinstalled_drivers:
        message += "; " + preinstalled_message(cluster.preinstalled_drivers)
    if cluster.coexistence:
        message += "; " + cluster.coexistence
    if cluster.worst_node and not ready and not planned:
        message += "; first failing link: " + cluster.worst_node
    if cluster.startup_gate:
        message += "; " + cluster.startup_gate
    for note in cluster.notes:
        message += "; " + note
    return {
        "state": "ready" if ready else "notReady",
        "namespace": namespace,
        "conditions": conditions.pair(
            ready=ready,
            reason=reason,
            message=message,
            now=now,
            generation=generation,
            previous=previous_conditions,
            planned=planned,
        ),
        "states": [
            {"name": r.name, "state": r.outcome, **({"message": r.message} if r.message else {})}
            for r in reports
        ],
    }


def refused(
    reason: str,
    message: str,
    *,
    namespace: str,
    now: str,
    generation: int | None,
    previous: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Status for a policy the operator will not act on; existing operands are left running.

    Every state it listed before is marked as not evaluated: a status patch merges, so states
    left out would keep saying `ready` from an earlier, valid spec."""
    earlier = [s for s in (previous or {}).get("states") or [] if isinstance(s, dict)]
    not_evaluated = f"not evaluated: {reason} (see the Ready condition)"
    return {
        "state": "notReady",
        "namespace": namespace,
        "conditions": conditions.pair(
            ready=False,
            reason=reason,
            message=message,
            now=now,
            generation=generation,
            previous=(previous or {}).get("conditions") or [],
        ),
        "states": [
            {"name": str(s.get("name")), "state": "notReady", "message": not_evaluated}
            for s in earlier
            if s.get("name")
        ],
    }


def invalid(
    problems: Sequence[str],
    *,
    namespace: str,
    now: str,
    generation: int | None,
    previous: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Status for an invalid policy: the message names the fields at fault."""
    more = f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
    message = f"invalid ClusterPolicy, nothing was changed: {'; '.join(problems[:5])}{more}"
    return refused(
        conditions.INVALID_SPEC, message, namespace=namespace, now=now, generation=generation,
        previous=previous,
    )  # fmt: skip


def ignored(*, active: str, namespace: str, now: str, generation: int | None) -> dict[str, Any]:
    """Status for every ClusterPolicy but the oldest: only one can be in charge."""
    return {
        "state": "ignored",
        "namespace": namespace,
        "conditions": conditions.pair(
            ready=False,
            reason=conditions.SINGLETON,
            message=f"ClusterPolicy {active} is older and in charge; this one is ignored",
            now=now,
            generation=generation,
        ),
    }
