"""The recorder's one-pass Event path stores exactly the Events the earlier, plainer recorder
stored: same fields, names, timestamps, counts and aggregation, for a pod's whole kubelet
sequence, a node's Events and repeats."""

from __future__ import annotations

import contextlib
import copy
import itertools
import time
from typing import Any

import pytest
from kubesim_helpers import instant

import kubesim
from kubesim import errors
from kubesim.controllers.events import AGGREGATION_WINDOW, EVENT_KEY
from kubesim.store import Store, now

BASE_NS = 1_790_000_000_000_000_000


class ReferenceRecorder:
    """The recorder as it was before its one-pass rewrite (kept here as the reference): a
    `now()` per Event, the involved object and source built step by step."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._recent: dict[tuple[str, ...], tuple[str, float]] = {}
        self._admitted: set[tuple[str, str, str]] = set()

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
        with contextlib.suppress(errors.ApiError):
            self._record(obj, event_type, reason, message, component, host, field_path)

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
        rt = self.store.registry.resolve("events")
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
            "reportingComponent": component,
            "reportingInstance": host,
        }
        shape = (component, reason, involved["kind"])
        if shape in self._admitted:
            self.store.insert_event(rt, event)
        else:
            self.store.insert(rt, event)
            self._admitted.add(shape)
        self._recent[key] = (name, moment)


def pod(name: str, uid: str, rv: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": uid, "resourceVersion": rv},
    }


def record_sequence(recorder: Any) -> None:
    """A pod's kubelet Events (init and app containers), a crash-looping container's repeats,
    the scheduler's Event and a node's Events (cluster-scoped: the `default` namespace)."""
    for index in range(3):
        subject = pod(f"driver-{index}", f"uid-{index}", str(100 + index))
        recorder.record(
            subject,
            "Normal",
            "Scheduled",
            f"assigned to node-{index}",
            component="default-scheduler",
        )
        for field_path, image in (
            ("spec.initContainers{toolkit-validation}", "nvcr.io/nvidia/validator:v25"),
            ("spec.containers{driver}", "nvcr.io/nvidia/driver:580"),
        ):
            recorder.record(
                subject,
                "Normal",
                "Pulling",
                f'Pulling image "{image}"',
                component="kubelet",
                host=f"node-{index}",
                field_path=field_path,
            )
            recorder.record(
                subject,
                "Normal",
                "Pulled",
                f'Pulled image "{image}"',
                component="kubelet",
                host=f"node-{index}",
                field_path=field_path,
            )
            for reason, message in (
                ("Created", "Container created"),
                ("Started", "Container started"),
            ):
                recorder.record(
                    subject,
                    "Normal",
                    reason,
                    message,
                    component="kubelet",
                    host=f"node-{index}",
                    field_path=field_path,
                )
        subject["metadata"]["resourceVersion"] = str(200 + index)
        for _ in range(3):
            recorder.record(
                subject,
                "Warning",
                "BackOff",
                "Back-off restarting failed container",
                component="kubelet",
                host=f"node-{index}",
                field_path="spec.containers{driver}",
            )
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": f"node-{index}", "uid": f"node-{index}"},
        }
        for _ in range(2):
            recorder.record(
                node,
                "Normal",
                "NodeReady",
                f"Node node-{index} status is now: NodeReady",
                component="kubelet",
                host=f"node-{index}",
            )


def stored_events(sim: Any) -> list[dict[str, Any]]:
    events = []
    for event in sim.store.list("events"):
        event = copy.deepcopy(event)
        for field in ("uid", "resourceVersion", "creationTimestamp"):
            event["metadata"].pop(field)
        # The name's suffix is the clock in nanoseconds, read once per recorded Event (repeats
        # included) rather than once per created one: only the object's name part is compared.
        object_name, _, suffix = event["metadata"]["name"].rpartition(".")
        assert int(suffix, 16) >= 1_790_000_000_000_000_000
        event["metadata"]["name"] = object_name
        events.append(event)
    return sorted(
        events,
        key=lambda e: (
            e["metadata"]["name"],
            e["reason"],
            e["message"],
            e["involvedObject"].get("fieldPath", ""),
        ),
    )


async def test_one_pass_recorder_stores_the_reference_recorders_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    results = []
    for make in (ReferenceRecorder, None):
        # The same clock for both runs: names (from time_ns) and timestamps line up.
        ticks = itertools.count()
        monkeypatch.setattr(time, "time_ns", lambda ticks=ticks: BASE_NS + next(ticks) * 1_000_003)
        monkeypatch.setattr(time, "time", lambda: BASE_NS / 1e9)
        async with kubesim.Cluster(nodes=0, kubelet=instant(), controllers=[]) as sim:
            recorder = sim.events if make is None else make(sim.store)
            record_sequence(recorder)
            results.append(stored_events(sim))
        monkeypatch.undo()
    reference, one_pass = results
    assert len(reference) == 3 * (1 + 8 + 1 + 1)
    assert one_pass == reference
    counts = sorted({(e["reason"], e["count"]) for e in one_pass})
    assert ("BackOff", 3) in counts
    assert ("NodeReady", 2) in counts
    backoff = next(e for e in one_pass if e["reason"] == "BackOff")
    assert backoff["involvedObject"]["resourceVersion"] == "200"
    node_ready = next(e for e in one_pass if e["reason"] == "NodeReady")
    assert node_ready["metadata"]["namespace"] == "default"
    assert "namespace" not in node_ready["involvedObject"]
    assert node_ready["source"] == {"component": "kubelet", "host": "node-0"}


async def test_the_timestamps_follow_the_clock_second_by_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1_790_000_000_000_000_000]
    monkeypatch.setattr(time, "time_ns", lambda: clock[0])
    async with kubesim.Cluster(nodes=0, kubelet=instant(), controllers=[]) as sim:
        subject = pod("ticking", "uid-t", "1")
        sim.events.record(subject, "Normal", "Tick", "one", component="test")
        clock[0] += 999_999_999
        sim.events.record(subject, "Normal", "Tick", "one", component="test")
        first = sim.store.list("events")[0]
        assert first["count"] == 2
        assert first["firstTimestamp"] == first["lastTimestamp"] == "2026-09-21T14:13:20Z"
        clock[0] += 1
        sim.events.record(subject, "Normal", "Tick", "one", component="test")
        again = sim.store.list("events")[0]
        assert (again["count"], again["lastTimestamp"]) == (3, "2026-09-21T14:13:21Z")
        assert again["firstTimestamp"] == "2026-09-21T14:13:20Z"
