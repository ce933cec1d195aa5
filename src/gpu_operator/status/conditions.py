"""The Ready/Error condition pair upstream writes, with its reasons."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

READY: Final = "Ready"
ERROR: Final = "Error"

# Reasons (upstream's spellings, plus InvalidSpec for a policy the operator refuses to act on).
RECONCILED: Final = "Reconciled"
RECONCILE_FAILED: Final = "ReconcileFailed"
NFD_LABELS_MISSING: Final = "NFDLabelsMissing"
NO_GPU_NODES: Final = "NoGPUNodes"
OPERAND_NOT_READY: Final = "OperandNotReady"
DRIVER_NOT_READY: Final = "DriverNotReady"
INVALID_SPEC: Final = "InvalidSpec"
CRD_OUTDATED: Final = "CRDSchemaOutdated"
SINGLETON: Final = "MultipleClusterPolicies"
# Ours: planned work in progress (status/rollout.py), Ready=False with Error=False.
DRIVER_UPGRADE_IN_PROGRESS: Final = "DriverUpgradeInProgress"
OPERAND_ROLLOUT_IN_PROGRESS: Final = "OperandRolloutInProgress"
PROGRESS_REASONS: Final = frozenset({DRIVER_UPGRADE_IN_PROGRESS, OPERAND_ROLLOUT_IN_PROGRESS})
PLANNED_WORK: Final = "planned work in progress, nothing has failed (see the Ready condition)"


def _condition(
    type_: str, status: bool, reason: str, message: str, now: str, generation: int | None
) -> dict[str, Any]:
    condition: dict[str, Any] = {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    return condition


def pair(
    *,
    ready: bool,
    reason: str,
    message: str,
    now: str,
    generation: int | None,
    previous: Sequence[dict[str, Any]] = (),
    planned: bool = False,
) -> list[dict[str, Any]]:
    """Ready=True + Error=False(Ready) when ready, else Ready=False(Error) + Error=True(reason);
    for planned work in progress (`planned`, ours) Ready=False(reason) + Error=False(reason).

    lastTransitionTime moves only when a condition's status flips, as the API conventions ask.
    """
    if ready:
        wanted = [
            _condition(READY, True, reason, message, now, generation),
            _condition(ERROR, False, READY, "", now, generation),
        ]
    elif planned:
        wanted = [
            _condition(READY, False, reason, message, now, generation),
            _condition(ERROR, False, reason, PLANNED_WORK, now, generation),
        ]
    else:
        wanted = [
            _condition(READY, False, ERROR, message, now, generation),
            _condition(ERROR, True, reason, message, now, generation),
        ]
    before = {c.get("type"): c for c in previous}
    for condition in wanted:
        old = before.get(condition["type"])
        if old and old.get("status") == condition["status"] and old.get("lastTransitionTime"):
            condition["lastTransitionTime"] = old["lastTransitionTime"]
    others = [c for c in previous if c.get("type") not in (READY, ERROR)]
    return wanted + others
