"""The operator process's cyclic garbage collector, tuned for a process of large, long-lived caches.

The caches hold every node and pod of the cluster as small dicts and tuples: millions of objects
at 20,000 nodes that live as long as the process. CPython's collector walks every object of the
oldest generation on each full collection, and a full collection comes each time a quarter as
many objects again have survived to that generation; while a rollout grows the caches, the
operator spent a sixth of its CPU walking objects that were never garbage. Long-running Python
services do two things about it, and so does `GcTuning`:

- **Freeze** what is known to be alive: once the first lists are cached, after one full
  collection, and again at the end of every later full collection (its survivors are alive at
  that moment), every tracked object moves to the permanent generation, which no collection
  walks. Freezing is a list splice: it costs nothing however big the caches are. A full
  collection then walks only what survived since the last one.
- **Raise the young generation's threshold**, so that the short-lived objects of a watch event or
  a pass (decoded JSON, summaries replaced at once) are counted in larger batches: fewer young
  collections, and fewer objects that survive one only because it came mid-pass.

The trade-off: objects allocated after a freeze are collected as before, cycles included, and
frozen objects are still freed by reference counting (a cache entry replaced or deleted goes at
once). Only a reference *cycle* among frozen objects that becomes garbage later is not found
until the next `refresh` (every REFRESH_SECONDS: unfreeze, one full collection, freeze again),
so such leftovers are bounded by what the process allocates in that time. The caches' objects are
trees, not cycles, so little is ever left.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any

# Objects allocated (less freed) before a young collection; CPython's default is 700.
YOUNG_THRESHOLD = 50_000
# How often frozen objects are collected again (cycles among them that became garbage).
REFRESH_SECONDS = 600.0


class GcTuning:
    """The collector settings of one operator process (`install`, then `keep` as a task)."""

    def __init__(
        self,
        *,
        young: int = YOUNG_THRESHOLD,
        refresh_seconds: float = REFRESH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.young = young
        self.refresh_seconds = refresh_seconds
        self._clock = clock
        self._threshold: tuple[int, int, int] | None = None
        self._settled = False
        self._refreshed = 0.0
        self.freezes = 0

    def install(self) -> None:
        """Raise the young generation's threshold and freeze the survivors of every full
        collection from `settle` on."""
        if self._threshold is not None:
            return
        self._threshold = gc.get_threshold()
        _, middle, old = self._threshold
        gc.set_threshold(self.young, middle, old)
        gc.callbacks.append(self._collected)

    def uninstall(self) -> None:
        """The collector as it was before `install`; nothing stays frozen."""
        if self._threshold is None:
            return
        if self._collected in gc.callbacks:
            gc.callbacks.remove(self._collected)
        gc.set_threshold(*self._threshold)
        self._threshold = None
        self._settled = False
        gc.unfreeze()

    def settle(self) -> None:
        """The first lists are cached: collect once, then freeze what is left (all alive)."""
        gc.collect()
        gc.freeze()
        self.freezes += 1
        self._settled = True
        self._refreshed = self._clock()

    def refresh(self) -> bool:
        """Every `refresh_seconds`: unfreeze, collect everything once (cycles among frozen
        objects that became garbage go now), freeze again. Whether it ran."""
        if not self._settled or self._clock() - self._refreshed < self.refresh_seconds:
            return False
        gc.unfreeze()
        self.settle()
        return True

    def _collected(self, phase: str, info: dict[str, Any]) -> None:
        # The end of a full collection: what is left is alive, young generations are empty.
        if phase == "stop" and info.get("generation") == 2 and self._settled:
            gc.freeze()
            self.freezes += 1

    async def keep(self, ready: asyncio.Event, *, poll: float = 60.0) -> None:
        """Settle once `ready` is set (the caches listed), then refresh on schedule."""
        await ready.wait()
        self.settle()
        while True:
            await asyncio.sleep(poll)
            self.refresh()
