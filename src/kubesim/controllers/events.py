"""Events as the built-in components record them: core/v1 Events, with repeats aggregated.

A repeat of the same (object, type, reason, message, component) within the aggregation window bumps
`count` and `lastTimestamp` of the existing Event instead of creating another, as client-go's event
correlator does. Events about cluster-scoped objects (nodes) go to the `default` namespace.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kubesim import errors
from kubesim.resources import ResourceType
from kubesim.store import Store

log = logging.getLogger("kubesim.events")
EVENT_KEY = ("", "events")
# client-go keeps similar events together for ten minutes.
AGGREGATION_WINDOW = 600.0
_CACHE_LIMIT = 20_000


class EventRecorder:
    """Writes Events for one store; `enabled=False` turns every call into a no-op (scale runs)."""

    def __init__(self, store: Store, *, enabled: bool = True) -> None:
        self.store = store
        self.enabled = enabled
        # (namespace, uid, type, reason, message, component) -> (event name, first seen)
        self._recent: dict[tuple[str, ...], tuple[str, float]] = {}
        # (component, reason, involved kind) whose Events have passed the API server's whole
        # create path once: later ones are built the same way and take the store's lean path
        # (`Store.insert_event`: a rollout of thousands of pods records ten Events per pod).
        self._admitted: set[tuple[str, str, str]] = set()
        # (registry generation, the events resource type): resolved once, not per Event.
        self._rt: tuple[int, ResourceType] | None = None
        # The second of the last Event and its RFC 3339 form (as `store.now()` spells it).
        self._second = -1
        self._stamp = ""

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
        obj_namespace = meta.get("namespace")
        namespace = obj_namespace or "default"
        uid = meta.get("uid", "")
        key = (uid, reason, message, field_path, namespace, event_type, component)
        clock = time.time_ns()
        second = clock // 1_000_000_000
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))
        stamp = self._stamp
        cached = self._rt
        store = self.store
        if cached is None or cached[0] != store.registry.generation:
            cached = self._rt = (store.registry.generation, store.registry.resolve("events"))
        rt = cached[1]
        moment = time.monotonic()
        recent = self._recent.get(key)
        try:
            if recent is not None and moment - recent[1] < AGGREGATION_WINDOW:
                stored = store.peek(EVENT_KEY, namespace, recent[0])
                if stored is not None:
                    event = stored.copy()
                    event["count"] = int(event.get("count") or 1) + 1
                    event["lastTimestamp"] = stamp
                    store.replace(rt, event, namespace=namespace, name=recent[0])
                    return
            obj_name = meta.get("name", "")
            kind = obj.get("kind", "")
            name = f"{obj_name}.{clock:x}"
            involved: dict[str, Any] = {
                "kind": kind,
                "name": obj_name,
                "uid": uid,
                "apiVersion": obj.get("apiVersion", ""),
                "resourceVersion": meta.get("resourceVersion", ""),
            }
            if obj_namespace:
                involved["namespace"] = obj_namespace
            if field_path:
                involved["fieldPath"] = field_path
            event = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": namespace},
                "involvedObject": involved,
                "reason": reason,
                "message": message,
                "type": event_type,
                "source": {"component": component, "host": host}
                if host
                else {"component": component},
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
                # eventTime stays unset (decoding drops the null the old recorders send).
                "reportingComponent": component,
                "reportingInstance": host,
            }
            shape = (component, reason, kind)
            if shape in self._admitted:
                store.insert_event(rt, event)
            else:
                store.insert(rt, event)
                self._admitted.add(shape)
        except errors.ApiError as exc:
            # A terminating namespace refuses new Events; the real recorders drop them too.
            log.debug("event %s for %s dropped: %s", reason, meta.get("name"), exc)
            return
        recent_events = self._recent
        if len(recent_events) >= _CACHE_LIMIT:
            recent_events.clear()
        recent_events[key] = (name, moment)
