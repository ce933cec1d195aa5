"""When to write an object's status: at most once per window, the newest always, failures at once.

During a rollout every pod event changes a status message a little ("3 of 1000 pods updated"), and
writing each one cost about four writes a second per object (issue 19: 970 status patches for 20
quick ClusterPolicy edits at 1,000 nodes). The reconcilers ask `StatusWrites.decide` before each
write: an unchanged status is dropped, a status inside the window is deferred until the window
ends (the reconciler queues itself for then, so the newest status is written even if no event
comes), and news (a failure, or a driver upgrade starting) is written at once, since users wait
on it. State in, decision out: the clock is passed in, the writes stay in the reconcilers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from gpu_operator.status import conditions

# Error-condition reasons that only say "still converging": a change between them can wait.
WAITING_REASONS = frozenset(
    {
        conditions.READY,
        conditions.OPERAND_NOT_READY,
        conditions.DRIVER_NOT_READY,
        *conditions.PROGRESS_REASONS,
    }
)

Action = Literal["write", "defer", "drop"]


class Decision(NamedTuple):
    """What to do with a status: write it now, defer it by `delay` seconds, or drop it."""

    action: Action
    delay: float = 0.0


WRITE = Decision("write")
DROP = Decision("drop")


def without_times(status: Mapping[str, Any]) -> dict[str, Any]:
    """A status without its conditions' lastTransitionTime: two passes agree on everything else."""
    out = dict(status)
    out["conditions"] = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"}
        for c in status.get("conditions") or []
    ]
    return out


def _failed_states(status: Mapping[str, Any]) -> set[tuple[Any, Any]]:
    return {
        (s.get("name"), s.get("message"))
        for s in status.get("states") or []
        if isinstance(s, Mapping) and s.get("state") == "failed"
    }


def _error(status: Mapping[str, Any]) -> tuple[Any, Any]:
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == conditions.ERROR:
            return c.get("status"), c.get("reason")
    return None, None


def _ready(status: Mapping[str, Any]) -> tuple[Any, Any]:
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == conditions.READY:
            return c.get("status"), c.get("reason")
    return None, None


def is_news(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Whether `after` reports a failure `before` did not: a state newly failed (or failed for
    another reason), an Error condition newly true for a reason other than converging, or a
    driver upgrade starting (Ready True -> False for DriverUpgradeInProgress: once per upgrade,
    and it must show even when a small fleet's upgrade ends inside the window; other rollouts
    inside the window stay unwritten)."""
    if _failed_states(after) - _failed_states(before):
        return True
    if _ready(before)[0] == "True" and _ready(after) == (
        "False",
        conditions.DRIVER_UPGRADE_IN_PROGRESS,
    ):
        return True
    status, reason = _error(after)
    return status == "True" and reason not in WAITING_REASONS and _error(before) != (status, reason)


class StatusWrites:
    """Per-object memory of the last status written and when; `window` seconds between writes."""

    def __init__(self, window: float) -> None:
        if not (math.isfinite(window) and window >= 0):
            raise ValueError(f"the status write interval must be 0 or more seconds, not {window}")
        self.window = window
        self._last: dict[str, tuple[float, dict[str, Any]]] = {}

    def decide(
        self, key: str, live: Mapping[str, Any] | None, new: Mapping[str, Any], now: float
    ) -> Decision:
        """Whether to write `new` over the object's `live` status at monotonic time `now`."""
        wanted = without_times(new)
        if without_times(live or {}) == wanted:
            return DROP
        last = self._last.get(key)
        if last is None:
            return WRITE
        when, written = last
        elapsed = now - when
        if elapsed >= self.window:
            return WRITE
        # Equal to our last write means the cache has not caught up yet: deferred, not dropped,
        # so it is compared again when the window ends in case someone else wrote the status.
        if written != wanted and is_news(written, wanted):
            return WRITE
        return Decision("defer", self.window - elapsed)

    def wrote(self, key: str, status: Mapping[str, Any], now: float) -> None:
        """Record a successful write (a failed one is not recorded: its retry goes out at once)."""
        self._last[key] = (now, without_times(status))

    def forget(self, key: str) -> None:
        """The object is gone."""
        self._last.pop(key, None)
