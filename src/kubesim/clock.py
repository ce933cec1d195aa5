"""The simulated cluster's clock: wall time plus an offset that tests move forward.

Time-driven controllers (CronJob schedules, Job deadlines and TTLs, Deployment progress deadlines)
read this clock instead of the wall clock, so a test can jump an hour ahead with
`sim.clock.advance(3600)` instead of waiting. Listeners hear every jump and requeue their work.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

Listener = Callable[[], None]


class Clock:
    """Wall-clock time shifted by `offset` seconds; `advance` moves it forward and notifies."""

    def __init__(self) -> None:
        self.offset = 0.0
        self._listeners: list[Listener] = []

    def time(self) -> float:
        """Seconds since the epoch on the simulated clock."""
        return time.time() + self.offset

    def now(self) -> dt.datetime:
        """The simulated time as an aware UTC datetime."""
        return dt.datetime.fromtimestamp(self.time(), dt.UTC)

    def stamp(self, moment: dt.datetime | None = None) -> str:
        """An RFC 3339 timestamp (seconds precision) of `moment`, default now."""
        return (moment or self.now()).astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def advance(self, seconds: float) -> None:
        """Move the clock forward and tell every listener (they requeue time-driven work)."""
        if seconds < 0:
            raise ValueError("the simulated clock only moves forward")
        self.offset += seconds
        for listener in tuple(self._listeners):
            listener()

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` after every `advance`; returns an unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def seconds_until(self, stamp: str) -> float:
        """Seconds from now until an RFC 3339 timestamp (negative when it is past)."""
        moment = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        return moment.timestamp() - self.time()
