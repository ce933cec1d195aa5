"""What /healthz and /readyz answer: liveness is a work loop that is not stuck; readiness is
synced caches with working watches, a reachable API server and a leadership state that lets
this replica do its job (leader, or a standby waiting to take over)."""

from __future__ import annotations

import time

from gpu_operator.controller.runtime import Runtime

# A watch may be down this long (a reconnect, a relist) before the replica stops being ready.
WATCH_GRACE = 10.0


def liveness(rt: Runtime, *, now: float | None = None) -> tuple[bool, str]:
    """(alive, why): dead when one reconcile has run longer than `settings.stuck_after`."""
    at = time.monotonic() if now is None else now
    limit = rt.settings.stuck_after
    stuck = sorted(key for key, started in list(rt.busy.items()) if at - started > limit)
    if stuck:
        return False, f"work loop stuck: {', '.join(stuck)} running for more than {limit:.0f}s"
    return True, "ok"


def readiness(rt: Runtime, *, now: float | None = None) -> tuple[bool, str]:
    """(ready, why): caches synced, every watch open (or down less than WATCH_GRACE), the API
    server answering the consistency check, and the leader lease not lost."""
    if not rt.ready.is_set():
        return False, "caches not synced yet"
    at = time.monotonic() if now is None else now
    down = sorted(
        name
        for name, informer in list(rt.caches.informers.items())
        if informer.down_since is not None and at - informer.down_since > WATCH_GRACE
    )
    if down:
        return False, f"watch not working for {WATCH_GRACE:.0f}s: {', '.join(down)}"
    if rt.consistency_error is not None:
        return False, f"API server check failing: {rt.consistency_error}"
    elector = rt.elector
    if elector is not None:
        if elector.lost.is_set():
            return False, "lost the leader lease"
        return True, "ok (leader)" if elector.is_leader.is_set() else "ok (standby)"
    return True, "ok"
