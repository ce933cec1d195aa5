"""Turns between API requests and background work on kubesim's one event loop.

A real API server answers requests while its controllers and the kubelets run elsewhere. Here
they share one event loop, and asyncio runs every ready task once per loop iteration before it
looks at the sockets again: a thousand pod workers and controllers, each taking a short step,
made a request that arrived mid-convergence wait a whole round of them (100 ms and more).

So all background work (controllers, kubelets) shares one budget: once `SLICE_SECONDS` of it
has run since the last turn was given, background work parks at its next yield point
(`pause`, `tick`, `call_next_turn`) and the loop polls its sockets. A turn is given after the
requests read by that poll have started (`HOPS` loop iterations: aiohttp reads a request, then
starts its handler); while requests are in flight (`begin`/`end`, counted by the server for
every request but watches and streams) background work keeps waiting, at most `WAIT_CAP`
seconds from the moment the first of them began, so it never starves.

Parked tasks wait in one FIFO queue and a turn wakes them one at a time: a turn wakes the
first; a woken task that finds room left in the slice wakes the next before it runs its step,
and one that finds the slice spent parks again at the head of the queue. A turn thus wakes the
tasks that run in it plus one, however many are parked (waking them all at once, thousands of
pod workers at 5,000 nodes, cost more CPU than the work itself).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

# The most background work runs between two looks at the sockets.
SLICE_SECONDS = 0.005
# The longest background work waits while requests are in flight.
WAIT_CAP = 0.05
# Loop iterations between the socket poll and a request's handler starting (aiohttp).
HOPS = 2


class Turns:
    """The shared budget of background work and the count of requests in flight."""

    def __init__(self) -> None:
        self.pending = 0
        self._pending_since = 0.0
        self._deadline = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._callbacks: list[Callable[[], None]] = []
        self._opening = False
        self._cap_timer: asyncio.TimerHandle | None = None
        # Counters (tests, benchmarks): times a task parked, times a parked task was woken.
        self.parks = 0
        self.wakes = 0

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is not loop:  # a new loop (tests run many): nothing carries over
            self._loop = loop
            self.pending = 0
            self._waiters = deque()
            self._callbacks = []
            self._opening = False
            self._cap_timer = None

    # ----- requests ----------------------------------------------------------------------------

    def begin(self) -> None:
        """A request's handler started."""
        self._bind(asyncio.get_running_loop())
        if not self.pending:
            self._pending_since = time.perf_counter()
        self.pending += 1

    def end(self) -> None:
        """A request's handler finished."""
        if self.pending:
            self.pending -= 1
        if not self.pending and self._waiting():
            self._open()

    # ----- background work ---------------------------------------------------------------------

    def due(self) -> bool:
        """Whether background work should stop at its next yield point."""
        now = time.perf_counter()
        if now >= self._deadline + SLICE_SECONDS and not self._waiting():
            # Nothing ran in the background for a while (an idle loop, or only requests):
            # a fresh slice starts now, as it would after a turn.
            self._deadline = now + SLICE_SECONDS
        return now >= self._deadline or self._held(now)

    def _held(self, now: float) -> bool:
        return bool(self.pending) and now - self._pending_since < WAIT_CAP

    async def pause(self) -> None:
        """A yield point between background batches: always lets the loop run other tasks,
        and waits for the next turn when the shared slice is spent or requests are in flight."""
        await asyncio.sleep(0)
        if self.due():
            await self._wait_turn()

    async def tick(self) -> None:
        """A yield point between background items: waits only when `due`."""
        if self.due():
            await self._wait_turn()

    def call_next_turn(self, callback: Callable[[], None]) -> None:
        """Run a plain callback now if the slice has room, else when the next turn is given."""
        loop = asyncio.get_running_loop()
        self._bind(loop)
        if not self.due():
            loop.call_soon(callback)
            return
        self._callbacks.append(callback)
        self._request_turn(loop)

    async def _wait_turn(self) -> None:
        """Park until a turn has room for this task: at the tail of the queue, and at its head
        again when woken into a slice that is already spent."""
        loop = asyncio.get_running_loop()
        self._bind(loop)
        woken = False
        while self.due():
            self.parks += 1
            waiter: asyncio.Future[None] = loop.create_future()
            if woken:
                self._waiters.appendleft(waiter)
            else:
                self._waiters.append(waiter)
            self._request_turn(loop)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_next()  # woken, then cancelled: the turn passes on
                raise
            self.wakes += 1
            woken = True
        if woken:
            self._wake_next()  # room is left in this slice: the next waiter may run too

    def _wake_next(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():  # a cancelled waiter's task is gone
                waiter.set_result(None)
                return

    def _waiting(self) -> bool:
        return bool(self._waiters) or bool(self._callbacks)

    def _request_turn(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._opening:
            self._opening = True
            # A timer runs after the I/O callbacks of its loop iteration: the sockets go first.
            loop.call_later(0, self._hop, HOPS)

    def _hop(self, left: int) -> None:
        loop = asyncio.get_running_loop()
        if left:
            loop.call_soon(self._hop, left - 1)
            return
        self._opening = False
        now = time.perf_counter()
        if self._held(now):
            # Requests in flight go first: `end` gives the turn, or this timer at the cap.
            if self._cap_timer is None:
                delay = self._pending_since + WAIT_CAP - now
                self._cap_timer = loop.call_later(delay, self._cap_reached)
            return
        self._open()

    def _cap_reached(self) -> None:
        self._cap_timer = None
        if self._waiting():
            self._open()

    def _open(self) -> None:
        if self._cap_timer is not None:
            self._cap_timer.cancel()
            self._cap_timer = None
        self._deadline = time.perf_counter() + SLICE_SECONDS
        if self.pending:  # the cap was reached: the requests still in flight share the loop
            self._pending_since = time.perf_counter() - WAIT_CAP
        callbacks, self._callbacks = self._callbacks, []
        self._wake_next()
        loop = self._loop
        for callback in callbacks:
            if loop is not None:
                loop.call_soon(callback)


TURNS = Turns()
