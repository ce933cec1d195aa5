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
from kubesim.store import Store, now

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
        """Record that `reason` happened to `obj`; never raises (events are best effort)."""
        if not self.enabled:
            return
        try:
            self._record(obj, event_type, reason, message, component, host, field_path)
        except errors.ApiError as exc:
            # A terminating namespace refuses new Events; the real recorders drop them too.
            log.debug("event %s for %s dropped: %s", reason, obj["metadata"].get("name"), exc)

    def _record(
        self,
        obj: dict[str, Any],
        event_type: str,
        reason: str,
        message: str,
        component: str,
        host: str,
        field_path: str,
    ) -> None:
        meta = obj["metadata"]
        namespace = meta.get("namespace") or "default"
        key = (namespace, meta.get("uid", ""), event_type, reason, message, component, field_path)
        stamp = now()
        registry = self.store.registry
        if self._rt is None or self._rt[0] != registry.generation:
            self._rt = (registry.generation, registry.resolve("events"))
        rt = self._rt[1]
        moment = time.monotonic()
        recent = self._recent.get(key)
        if recent is not None and moment - recent[1] < AGGREGATION_WINDOW:
            stored = self.store.peek(EVENT_KEY, namespace, recent[0])
            if stored is not None:
                event = stored.copy()
                event["count"] = int(event.get("count") or 1) + 1
                event["lastTimestamp"] = stamp
                self.store.replace(rt, event, namespace=namespace, name=recent[0])
                return
        name = f"{meta.get('name', '')}.{time.time_ns():x}"
        involved: dict[str, Any] = {
            "kind": obj.get("kind", ""),
            "name": meta.get("name", ""),
            "uid": meta.get("uid", ""),
            "apiVersion": obj.get("apiVersion", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
        }
        if meta.get("namespace"):
            involved["namespace"] = meta["namespace"]
        if field_path:
            involved["fieldPath"] = field_path
        source: dict[str, str] = {"component": component}
        if host:
            source["host"] = host
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": event_type,
            "source": source,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            # eventTime stays unset (decoding drops the null the old recorders send).
            "reportingComponent": component,
            "reportingInstance": host,
        }
        shape = (component, reason, involved["kind"])
        if shape in self._admitted:
            self.store.insert_event(rt, event)
        else:
            self.store.insert(rt, event)
            self._admitted.add(shape)
        if len(self._recent) >= _CACHE_LIMIT:
            self._recent.clear()
        self._recent[key] = (name, moment)
