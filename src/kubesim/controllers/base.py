"""A tiny controller runtime: a coalescing key queue drained by one task, with delayed requeues."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Hashable
from typing import Any

from kubesim import errors
from kubesim.clock import Clock
from kubesim.controllers.events import EventRecorder
from kubesim.controllers.scheduling import is_controlled_by
from kubesim.resources import ResourceType
from kubesim.store import Event, Key, Store, Stored
from kubesim.turns import TURNS

log = logging.getLogger("kubesim.controllers")

ItemKey = Hashable
# How long a controller works before it lets the event loop (and so the API server) run: every
# controller runs in the server's loop, and a request waits for whatever runs ahead of it.
SLICE_SECONDS = 0.005


def controlled(store: Store, uid: str, key: Key) -> list[Stored]:
    """The objects under a resource key whose controller ownerReference is `uid`."""
    result = []
    for dep_key, ns, name in store.dependents(uid):
        if dep_key != key:
            continue
        found = store.peek(dep_key, ns, name)
        if found is not None and is_controlled_by(found.obj, uid):
            result.append(found)
    return result


class Controller:
    """Subclasses map store events to keys (`on_event`) and converge one key (`reconcile`)."""

    name = "controller"
    # The resource keys `on_event` looks at; None: every kind (the store then calls it for all).
    resources: tuple[Key, ...] | None = None
    # With `resources` None: the kinds it never looks at (the garbage collector's Events).
    ignored_resources: tuple[Key, ...] = ()
    # Kinds whose deletions only it looks at (their creates and updates do not call it); None:
    # the deletions of every kind but `resources` (which must then be given).
    deleted_resources: tuple[Key, ...] | None = ()

    def __init__(self, store: Store) -> None:
        self.store = store
        # The cluster replaces this with its shared recorder (one aggregation cache, one switch).
        self.events = EventRecorder(store)
        self._pending: dict[ItemKey, None] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._unsubscribe_deletions: Callable[[], None] | None = None
        self._timers: dict[ItemKey, asyncio.TimerHandle] = {}
        self.idle = asyncio.Event()
        self.idle.set()

    def rt(self, resource: str) -> ResourceType:
        """A built-in resource type by plural name (`pods`, `daemonsets.apps`)."""
        return self.store.registry.resolve(resource)

    def start(self) -> None:
        """Subscribe to the store, queue an initial resync, and start draining."""
        # `on_event` itself, not a method calling it: a call per listener and commit is most of
        # what a commit costs, with a dozen controllers reading pods.
        self._unsubscribe = self.store.subscribe(
            self.on_event, self.resources, ignore=self.ignored_resources
        )
        deleted = self.deleted_resources
        if deleted or (deleted is None and self.resources is not None):
            self._unsubscribe_deletions = self.store.subscribe(
                self.on_event, deleted, ignore=self.resources or (), deletions_only=True
            )
        for key in self.initial_keys():
            self.enqueue(key)
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        """Stop draining and unsubscribe."""
        if self._unsubscribe:
            self._unsubscribe()
        if self._unsubscribe_deletions:
            self._unsubscribe_deletions()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def keys_of(self, key: Key) -> list[ItemKey]:
        """(namespace, name) of every stored object under a resource key."""
        return [
            (s.obj["metadata"].get("namespace", ""), s.obj["metadata"]["name"])
            for s in self.store.scan(key)
        ]

    def delete_pod(
        self, owner: dict[str, Any], pod: dict[str, Any], message: str | None = None
    ) -> bool:
        """Delete a pod this controller owns and record `SuccessfulDelete` on the owner (the
        message defaults to "Deleted pod: NAME"); False when it was already going or gone."""
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            return False
        try:
            self.store.remove(self.rt("pods"), meta["namespace"], meta["name"])
        except errors.ApiError as exc:
            if exc.code != 404:
                raise
            return False
        text = message if message is not None else f"Deleted pod: {meta['name']}"
        self.events.record(owner, "Normal", "SuccessfulDelete", text, component=self.name)
        return True

    def initial_keys(self) -> list[ItemKey]:
        """Keys to reconcile at start-up."""
        return []

    def on_event(self, event: Event) -> None:
        """Map a store event to keys via `enqueue`."""

    def reconcile(self, key: Any) -> None:
        """Converge one key; raise to retry later."""

    def enqueue(self, key: ItemKey) -> None:
        """Queue a key (coalesced with any pending instance)."""
        self._pending[key] = None
        self.idle.clear()
        self._wake.set()

    def enqueue_after(self, key: ItemKey, delay: float) -> None:
        """Queue a key after a delay (whichever pending timer for it fires sooner wins)."""
        if delay <= 0:
            self.enqueue(key)
            return
        loop = asyncio.get_running_loop()
        pending = self._timers.get(key)
        if pending is not None:
            if pending.when() <= loop.time() + delay:
                return
            pending.cancel()

        def fire() -> None:
            self._timers.pop(key, None)
            self.enqueue(key)

        self._timers[key] = loop.call_later(delay, fire)

    async def _run(self) -> None:
        while True:
            if not self._pending:
                self.idle.set()
                self._wake.clear()
                await self._wake.wait()
            batch = list(self._pending)
            self._pending.clear()
            for key in batch:
                # A key queued again while we yielded is served now, by this one reconcile.
                self._pending.pop(key, None)
                try:
                    self.reconcile(key)
                except errors.ApiError as exc:
                    if exc.code not in (404, 409):
                        log.warning("%s: reconciling %s failed: %s", self.name, key, exc.message)
                    self.enqueue_after(key, 0.05)
                except Exception:
                    log.exception("%s: reconciling %s crashed", self.name, key)
                    self.enqueue_after(key, 1.0)
                if TURNS.due():
                    # The API server shares this event loop: requests go first (kubesim.turns).
                    await TURNS.tick()
            await TURNS.pause()


class ClockedController(Controller):
    """A controller whose decisions read the cluster clock (deadlines, schedules, TTLs): moving
    the clock requeues `clock_keys()`, by default every initial key."""

    def __init__(self, store: Store, clock: Clock | None = None) -> None:
        super().__init__(store)
        self.clock = clock or Clock()
        self._unclock: Callable[[], None] | None = None

    def start(self) -> None:
        super().start()
        self._unclock = self.clock.subscribe(self._on_clock)

    async def stop(self) -> None:
        if self._unclock:
            self._unclock()
            self._unclock = None
        await super().stop()

    def clock_keys(self) -> list[ItemKey]:
        """Keys to requeue when the clock moves."""
        return self.initial_keys()

    def _on_clock(self) -> None:
        for key in self.clock_keys():
            self.enqueue(key)
