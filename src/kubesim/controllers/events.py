"""Events as the built-in components record them: core/v1 Events, through client-go's correlator.

Each recording source (a component on a host: every kubelet, each controller, the scheduler) has
its own correlator, as each real component has its own broadcaster, with client-go's three steps
in client-go's order: similar Events (same source, object, type and reason, another message),
from the tenth different message on while they come within ten minutes of each other, become one
"(combined from similar events): ..." Event; an exact repeat bumps `count` and `lastTimestamp` of
the Event it repeats; then a token bucket per source, object and type (25 Events, one more every
300 s) drops the rest. Events about cluster-scoped
objects (nodes) go to the `default` namespace.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from kubesim import errors
from kubesim.resources import ResourceType
from kubesim.store import CompactEvent, Store

log = logging.getLogger("kubesim.events")
EVENT_KEY = ("", "events")
# client-go's correlator defaults (tools/record/events_cache.go): each of its three caches is an
# LRU of 4096 entries; the tenth different message among similar Events (each within ten
# minutes of the last) is combined; the spam filter's token bucket holds 25 Events and refills
# one per 300 seconds.
LRU_ENTRIES = 4096
AGGREGATE_MAX_EVENTS = 10
AGGREGATION_WINDOW = 600.0
SPAM_BURST = 25
SPAM_REFILL_SECONDS = 300.0
COMBINED_PREFIX = "(combined from similar events): "
# More distinct Event shapes than any cluster records (the cache starts over past it).
_SHAPES_LIMIT = 10_000


class Correlator:
    """One source's correlator (a component on a host: a real component's own broadcaster).

    Its caches hold at most LRU_ENTRIES each, least recently used dropped first: plain dicts in
    use order (a hit moves its entry to the end) until one first fills up, then an OrderedDict
    (dropping a dict's first entry again and again is slow; most sources never fill one).
    A key starts with the involved object (kind, namespace, name, uid, apiVersion); the source
    is the correlator's own, so no key repeats it.
    """

    __slots__ = ("aggregates", "observed", "spam")

    def __init__(self) -> None:
        # (object, type, reason) -> (last time, message, ...): the similar Events' messages.
        self.aggregates: dict[tuple[str, ...], tuple[Any, ...]] = {}
        # (object, type, reason, fieldPath, message), or the aggregate key for the combined
        # Event -> the Event a repeat updates: its name (first seen: the name's suffix is the
        # clock that stamped its firstTimestamp), or (count, firstTimestamp, name).
        self.observed: dict[tuple[str, ...], str | tuple[int, str, str]] = {}
        # (object, type) -> the token bucket as the time it would have been empty (the tokens
        # are the seconds since, over SPAM_REFILL_SECONDS, at most SPAM_BURST): one float.
        self.spam: dict[tuple[str, ...], float] = {}


def _first_stamp(name: str) -> str:
    """The firstTimestamp of an Event seen once: its name ends in the clock (hexadecimal
    nanoseconds) that stamped it."""
    second = int(name.rpartition(".")[2], 16) // 1_000_000_000
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))


class EventRecorder:
    """Writes Events for one store; `enabled=False` turns every call into a no-op (scale runs).

    `clock` (seconds, monotonic) drives the correlator's windows and token buckets; tests inject
    one. Names and timestamps follow the wall clock, as the real recorders' do.
    """

    def __init__(
        self,
        store: Store,
        *,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.enabled = enabled
        self.clock = clock
        # (component, host) -> that source's correlator.
        self._correlators: dict[tuple[str, str], Correlator] = {}
        # (component, reason, involved kind) whose Events have passed the API server's whole
        # create path once: later ones are built the same way and take the store's lean path
        # (`Store.insert_compact_event`: a rollout of thousands of pods records ten per pod).
        self._admitted: set[tuple[str, str, str]] = set()
        # The shapes of stored Events (CompactEvent.SHAPE), one tuple each, shared.
        self._shapes: dict[tuple[str, ...], tuple[str, ...]] = {}
        # (registry generation, the events resource type): resolved once, not per Event.
        self._rt: tuple[int, ResourceType] | None = None
        # The second of the last Event and its RFC 3339 form (as `store.now()` spells it).
        self._second = -1
        self._stamp = ""

    def correlator(self, component: str, host: str = "") -> Correlator:
        """The correlator of one source (created on its first Event)."""
        found = self._correlators.get((component, host))
        if found is None:
            found = self._correlators[(component, host)] = Correlator()
        return found

    def record(
        self,
        obj: dict[str, Any],
        event_type: str,
        reason: str,
        message: str,
        *,
        component: str,
        host: str = "",
        field_path: str = "",
    ) -> None:
        """Record that `reason` happened to `obj`; never raises (events are best effort).

        One body, one clock read for the name and the timestamps (a rollout records about ten
        Events per pod, so each Python call and lookup here counts).
        """
        if not self.enabled:
            return
        meta = obj["metadata"]
        obj_namespace = meta.get("namespace") or ""
        uid = meta.get("uid", "")
        obj_name = meta.get("name", "")
        kind = obj.get("kind", "")
        api_version = obj.get("apiVersion", "")
        correlator = self._correlators.get((component, host))
        if correlator is None:
            correlator = self._correlators[(component, host)] = Correlator()
        moment = self.clock()
        clock = time.time_ns()
        # One string per distinct message, however many Events and cache keys hold it (a
        # fleet's pods repeat their kubelet messages: same images, same containers).
        if type(message) is str:  # (sys.intern refuses subclasses)
            message = sys.intern(message)
        # 1. Aggregation: the tenth different message among similar Events, and each after it
        # while they keep coming within the window, becomes the one combined Event.
        aggregate_key = (kind, obj_namespace, obj_name, uid, api_version, event_type, reason)
        # Each cache: one lookup that also inserts what a first sighting stores; a sighting
        # seen before is taken out and put back last (its use refreshed).
        aggregates = correlator.aggregates
        fresh: tuple[Any, ...] = (moment, message)
        similar = aggregates.setdefault(aggregate_key, fresh)
        reporting = component
        event_key: tuple[str, ...]
        if similar is fresh:
            event_key = (kind, obj_namespace, obj_name, uid, api_version, event_type, reason,
                         field_path, message)  # fmt: skip
        else:
            del aggregates[aggregate_key]
            if moment - similar[0] > AGGREGATION_WINDOW:
                similar = fresh
            elif message in similar:
                similar = (moment, *similar[1:])
            else:
                similar = (moment, *similar[1:], message)
            if len(similar) - 1 < AGGREGATE_MAX_EVENTS:
                event_key = (kind, obj_namespace, obj_name, uid, api_version, event_type, reason,
                             field_path, message)  # fmt: skip
            else:
                similar = (moment, *similar[2:])  # the set keeps nine: client-go drops one
                event_key = aggregate_key
                message = COMBINED_PREFIX + message
                reporting = ""  # client-go's combined Event leaves the reporting fields empty
            aggregates[aggregate_key] = similar
        if len(aggregates) > LRU_ENTRIES:
            if type(aggregates) is dict:
                correlator.aggregates = aggregates = OrderedDict(aggregates)
            aggregates.popitem(last=False)  # type: ignore[call-arg]
        # 2. Deduplication: a repeat of an observed Event (or of the combined one) updates it.
        second = clock // 1_000_000_000
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))
        stamp = self._stamp
        observed = correlator.observed
        name = f"{obj_name}.{clock:x}"
        seen = observed.setdefault(event_key, name)
        if seen is name:
            count, first = 1, stamp
        else:
            del observed[event_key]
            if isinstance(seen, str):
                count, first, name = 2, _first_stamp(seen), seen
            else:
                count, first, name = seen[0] + 1, seen[1], seen[2]
            observed[event_key] = (count, first, name)
        if len(observed) > LRU_ENTRIES:
            if type(observed) is dict:
                correlator.observed = observed = OrderedDict(observed)
            observed.popitem(last=False)  # type: ignore[call-arg]
        # 3. The spam filter, on what the first two made of the Event.
        spam_key = (kind, obj_namespace, obj_name, uid, api_version, event_type)
        spam = correlator.spam
        full_since = moment - SPAM_BURST * SPAM_REFILL_SECONDS
        first_token = full_since + SPAM_REFILL_SECONDS  # a new bucket, one token taken
        empty_at = spam.setdefault(spam_key, first_token)
        allowed = True
        if empty_at is not first_token:
            del spam[spam_key]
            if empty_at < full_since:
                empty_at = full_since
            allowed = moment - empty_at >= SPAM_REFILL_SECONDS  # at least one token
            if allowed:
                empty_at += SPAM_REFILL_SECONDS
            spam[spam_key] = empty_at
        if len(spam) > LRU_ENTRIES:
            if type(spam) is dict:
                correlator.spam = spam = OrderedDict(spam)
            spam.popitem(last=False)  # type: ignore[call-arg]
        if not allowed:
            return
        # 4. The write: a create, or (a repeat) client-go's patch of count, lastTimestamp and
        # message, or a create again, count and all, when that Event is gone.
        namespace = obj_namespace or "default"
        cached = self._rt
        store = self.store
        if cached is None or cached[0] != store.registry.generation:
            cached = self._rt = (store.registry.generation, store.registry.resolve("events"))
        rt = cached[1]
        try:
            if count > 1:
                stored = store.peek(EVENT_KEY, namespace, name)
                if stored is not None:
                    event = stored.copy()
                    event["count"] = count
                    event["lastTimestamp"] = stamp
                    event["message"] = message
                    store.replace(rt, event, namespace=namespace, name=name)
                    return
            shape_key = (namespace, kind, api_version, obj_namespace, field_path, reason,
                         event_type, component, reporting)  # fmt: skip
            shapes = self._shapes
            shape = shapes.get(shape_key)
            if shape is None:
                if len(shapes) >= _SHAPES_LIMIT:
                    shapes.clear()
                shape = shapes[shape_key] = shape_key
            obj_rv = meta.get("resourceVersion", "")
            compact = CompactEvent(
                shape, host, name, obj_name, uid, obj_rv, message, first, stamp, count
            )
            admitted = (component, reason, kind)
            if admitted in self._admitted:
                store.insert_compact_event(rt, compact)
            else:
                store.insert(rt, compact.obj)
                self._admitted.add(admitted)
        except errors.ApiError as exc:
            # A terminating namespace refuses new Events; the real recorders drop them too.
            log.debug("event %s for %s dropped: %s", reason, obj_name, exc)
