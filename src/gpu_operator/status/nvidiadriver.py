"""NVIDIADriver status: `state` and the Ready/Error condition pair, as upstream writes them.

Upstream's messages say "Waiting for driver pod to be ready"; here they say which pool, which
node and what is wrong, and a driver held back by a version check says why with its source.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpu_operator.status import conditions

DISABLED = "disabled"
READY = "ready"
NOT_READY = "notReady"
NO_POLICY = "NoClusterPolicy"


@dataclass(frozen=True)
class DriverReport:
    """How one NVIDIADriver stands after a pass.

    `problems` are (reason, message) pairs, most important first; `waiting` says what keeps
    its driver pods from ready (per pool, first reason each); `planned` when all of that is
    planned work in progress (status/rollout.py: its nodes' driver upgrade, a new spec rolling
    out, the hand-over), not an error; `nodes` and `pools` count what it serves.
    """

    problems: Sequence[tuple[str, str]] = ()
    waiting: Sequence[str] = ()
    nodes: int = 0
    pools: Sequence[str] = ()
    unchecked: int = 0
    planned: bool = False


def _message(report: DriverReport) -> str:
    if not report.nodes:
        return "no GPU node is assigned to this NVIDIADriver"
    pools = ", ".join(report.pools)
    message = f"driver ready on {report.nodes} node(s) in {len(report.pools)} pool(s): {pools}"
    if report.unchecked:
        message += (
            f"; the driver version was not checked on {report.unchecked} node(s) whose GPUs "
            "GPU feature discovery has not labelled yet"
        )
    return message


def build(
    report: DriverReport,
    *,
    namespace: str,
    now: str,
    generation: int | None,
    previous: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The status of an NVIDIADriver that is in charge of its nodes."""
    before = (previous or {}).get("conditions") or []
    planned = False
    if report.problems:
        reason, _ = report.problems[0]
        text = "; ".join(message for _, message in report.problems)
        if report.waiting:
            text += "; waiting for: " + "; ".join(report.waiting)
        ready, message = False, text
    elif report.waiting and report.planned:
        ready, planned, reason = False, True, conditions.DRIVER_UPGRADE_IN_PROGRESS
        message = "planned work in progress: " + "; ".join(report.waiting)
    elif report.waiting:
        ready, reason = False, conditions.DRIVER_NOT_READY
        message = "driver not ready: " + "; ".join(report.waiting)
    else:
        ready, reason, message = True, conditions.RECONCILED, _message(report)
    return {
        "state": READY if ready else NOT_READY,
        "namespace": namespace,
        "conditions": conditions.pair(
            ready=ready,
            reason=reason,
            message=message,
            now=now,
            generation=generation,
            previous=before,
            planned=planned,
        ),
    }


def inactive(
    message: str,
    *,
    state: str,
    reason: str,
    namespace: str,
    now: str,
    generation: int | None,
    previous: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The status of an NVIDIADriver that is not in charge (disabled, or no ClusterPolicy)."""
    return {
        "state": state,
        "namespace": namespace,
        "conditions": conditions.pair(
            ready=False,
            reason=reason,
            message=message,
            now=now,
            generation=generation,
            previous=(previous or {}).get("conditions") or [],
        ),
    }
