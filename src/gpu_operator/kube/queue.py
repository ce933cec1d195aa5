"""A coalescing work queue with per-key exponential backoff and delayed requeue.

A key added while it waits is queued once; a key added while it is being processed is processed
again after `done` — so no event is lost and no key is worked on twice at the same time.
"""

from __future__ import annotations

import asyncio
from collections import deque


class WorkQueue:
    """Keys to reconcile, processed one at a time each."""

    def __init__(self, *, base_delay: float = 0.1, max_delay: float = 3.0) -> None:
        self._queue: deque[str] = deque()
        self._queued: set[str] = set()
        self._processing: set[str] = set()
        self._dirty: set[str] = set()
        self._failures: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._ready = asyncio.Event()
        self._base_delay = base_delay
        self._max_delay = max_delay
        # Keys served ahead of every other queued key (Reconciler.first_keys): a cluster-wide pass
        # asked for while thousands of per-node keys wait must not wait behind all of them.
        self.first: set[str] = set()
        self.shutting_down = False

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def idle(self) -> bool:
        """Nothing queued, being processed or waiting for its delay."""
        return not (self._queue or self._processing or self._timers)

    def add(self, key: str) -> None:
        """Queue a key now (a pending delayed add of the same key is superseded)."""
        timer = self._timers.pop(key, None)
        if timer:
            timer.cancel()
        if key in self._processing:
            self._dirty.add(key)
            return
        if key not in self._queued:
            self._queued.add(key)
            if key in self.first:
                self._queue.appendleft(key)
            else:
                self._queue.append(key)
            self._ready.set()

    def add_after(self, key: str, delay: float) -> None:
        """Queue a key after `delay` seconds; an earlier pending time for it wins."""
        if delay <= 0:
            self.add(key)
            return
        if key in self._queued or key in self._timers:
            return
        loop = asyncio.get_running_loop()
        self._timers[key] = loop.call_later(delay, self._fire, key)

    def add_within(self, key: str, delay: float) -> None:
        """Queue a key no later than `delay` seconds from now: a later pending time (a retry's
        backoff) is brought forward, an earlier one kept."""
        if delay <= 0:
            self.add(key)
            return
        if key in self._queued:
            return
        loop = asyncio.get_running_loop()
        timer = self._timers.get(key)
        if timer is not None:
            if timer.when() <= loop.time() + delay:
                return
            timer.cancel()
        self._timers[key] = loop.call_later(delay, self._fire, key)

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def retry(self, key: str) -> float:
        """Requeue a failed key with exponential backoff; returns the delay used."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay: float = min(self._base_delay * (2**failures), self._max_delay)
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        """The key succeeded: reset its backoff."""
        self._failures.pop(key, None)

    async def get(self) -> str:
        """The next key to process (marks it as being processed)."""
        while not self._queue:
            self._ready.clear()
            await self._ready.wait()
        key = self._queue.popleft()
        self._queued.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: str) -> None:
        """Processing of `key` finished; it is requeued if it was added meanwhile."""
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def shutdown(self) -> None:
        self.shutting_down = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
