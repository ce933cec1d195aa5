"""Recorder Events keep their bytes unencoded until something reads them (most are never read
while a fleet rolls out); what a read gets is exactly the eager encoding, and the size limit
still refuses an Event whose message could reach it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kubesim import errors
from kubesim.controllers.events import EventRecorder
from kubesim.request_limits import MAX_OBJECT_BYTES
from kubesim.store import CompactEvent, Store, Stored, dumps

EVENTS = ("", "events")


def pod(store: Store) -> dict[str, Any]:
    return store.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }
    )


def fresh_store() -> Store:
    store = Store()
    store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})
    return store


def test_lean_recorder_events_encode_on_first_read_with_the_eager_bytes() -> None:
    store = fresh_store()
    recorder = EventRecorder(store)
    obj = pod(store)
    for reason, message in [("Created", "Container created"), ("Started", "Container stårted")]:
        # The first of a shape takes the whole create path; the second the lean one.
        for container in ("a", "b"):
            recorder.record(
                obj,
                "Normal",
                reason,
                message,
                component="kubelet",
                host="node-1",
                field_path=f"spec.containers{{{container}}}",
            )
    stored = sorted(store.bucket(EVENTS).values(), key=lambda s: s.rv)
    assert len(stored) == 4
    lean = [s for s in stored if isinstance(s, CompactEvent)]
    assert len(lean) == 2  # the second of each shape
    for version in lean:
        assert version._raw is None  # nothing has read it yet
        eager = Stored(version.obj).raw
        assert version.raw == eager == dumps(version.obj)
        assert json.loads(version.raw) == version.obj
        assert version.copy() == version.obj
    # Lists and gets serve the same objects from either kind of version.
    listed = store.list("events", "default")
    assert [item["reason"] for item in listed] == [
        "Created",
        "Created",
        "Started",
        "Started",
    ]


def test_lean_event_with_a_huge_message_is_still_refused_as_too_large() -> None:
    store = fresh_store()
    rt = store.registry.resolve("events")
    message = "x" * (MAX_OBJECT_BYTES + 1)
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "web.1", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "web", "namespace": "default"},
        "reason": "Failed",
        "message": message,
        "type": "Warning",
        "source": {"component": "kubelet"},
        "count": 1,
    }
    with pytest.raises(errors.ApiError) as raised:
        store.insert_event(rt, event)
    assert raised.value.code == 413
    assert store.peek(EVENTS, "default", "web.1") is None
