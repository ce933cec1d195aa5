"""Recorder Events stored in compact form (`CompactEvent`) serve exactly what their dict form
served: the same JSON, protobuf and Table bytes in lists, gets and watches, the same field-selector
results, the same count updates and namespace deletion."""

from __future__ import annotations

import datetime as dt
import json
import types
import uuid
from typing import Any

import aiohttp
import pytest
from kubesim_helpers import instant
from waiting import eventually

import kubesim
from kubesim import printers
from kubesim.controllers.events import COMBINED_PREFIX
from kubesim.store import CompactEvent, LazyStored, Stored, dumps

EVENTS = ("", "events")
PROTOBUF = "application/vnd.kubernetes.protobuf"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


def pod(name: str, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "resourceVersion": "41",
        },
    }


def record_mix(sim: kubesim.Cluster) -> None:
    """Events of every form the recorder writes: with and without host and field path, about a
    namespaced and a cluster-scoped object, a non-ASCII message, counted and combined ones."""
    events = sim.events
    for index in range(3):
        subject = pod(f"web-{index}")
        events.record(subject, "Normal", "Scheduled", f"assigned to n{index}", component="sched")
        for container in ("init", "app"):
            for reason, message in (("Pulled", 'Image "x:1" already present'), ("Started", "ok")):
                events.record(
                    subject,
                    "Normal",
                    reason,
                    f"{message} ({container}, größe)",
                    component="kubelet",
                    host=f"n{index}",
                    field_path=f"spec.containers{{{container}}}",
                )
        events.record(subject, "Warning", "BackOff", "Back-off", component="kubelet", host="n1")
        events.record(subject, "Warning", "BackOff", "Back-off", component="kubelet", host="n1")
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "uid": "n1"}}
    for _ in range(2):
        events.record(node, "Normal", "NodeReady", "Node n1 ready", component="kubelet", host="n1")
    for name, count in (("ds", 10), ("ds2", 12)):  # a combined Event, one counted on
        owner = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        }
        for index in range(count):
            events.record(
                owner, "Normal", "SuccessfulCreate", f"Created pod: {name}-{index}", component="c"
            )


QUERIES: list[dict[str, str]] = [
    {},
    {"fieldSelector": "involvedObject.name=web-1"},
    {"fieldSelector": "involvedObject.kind=Pod,involvedObject.namespace=default"},
    {"fieldSelector": "involvedObject.fieldPath=spec.containers{app}"},
    {"fieldSelector": "reason=Pulled,type=Normal"},
    {"fieldSelector": "type=Warning"},
    {"fieldSelector": "involvedObject.uid=uid-web-2"},
    {"fieldSelector": "source=kubelet"},
    {"fieldSelector": "metadata.namespace=default"},
]


async def served(session: aiohttp.ClientSession, names: list[tuple[str, str]]) -> list[Any]:
    """Every list query in JSON, protobuf and Table (all namespaces and one), each Event's get
    and a watch's replay, as bytes."""
    out: list[Any] = []
    for path in ("/api/v1/events", "/api/v1/namespaces/default/events"):
        for query in QUERIES:
            for accept in ("application/json", PROTOBUF, TABLE):
                async with session.get(path, params=query, headers={"Accept": accept}) as resp:
                    assert resp.status == 200, await resp.text()
                    body = await resp.read()
                out.append((path, sorted(query.items()), accept, body))
    for namespace, name in names:
        for accept in ("application/json", PROTOBUF, TABLE):
            url = f"/api/v1/namespaces/{namespace}/events/{name}"
            async with session.get(url, headers={"Accept": accept}) as resp:
                assert resp.status == 200
                out.append((url, accept, await resp.read()))
    params = {"watch": "1", "resourceVersion": "0", "timeoutSeconds": "1"}
    async with session.get("/api/v1/events", params=params) as resp:
        lines = [json.loads(line) for line in (await resp.read()).splitlines() if line]
    out.append(sorted(json.dumps(line, sort_keys=True) for line in lines))
    return out


def dict_form(version: CompactEvent) -> dict[str, Any]:
    """The dict the recorder stored before the compact form (from the version's fields, not
    from its `obj`): keys in the order the recorder, `insert_event` and the commit set them."""
    namespace, kind, api_version, obj_namespace, field_path, reason, event_type, component, \
        reporting = version._shape  # fmt: skip
    involved: dict[str, Any] = {
        "kind": kind,
        "name": version._obj_name,
        "uid": version._obj_uid,
        "apiVersion": api_version,
        "resourceVersion": version._obj_rv,
    }
    if obj_namespace:
        involved["namespace"] = obj_namespace
    if field_path:
        involved["fieldPath"] = field_path
    source = {"component": component}
    if version._host:
        source["host"] = version._host
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": version._name,
            "namespace": namespace,
            "uid": str(uuid.UUID(int=version._uid)),
            "creationTimestamp": version._created,
            "resourceVersion": str(version._rv),
        },
        "involvedObject": involved,
        "reason": reason,
        "message": version._message,
        "type": event_type,
        "source": source,
        "firstTimestamp": version._first,
        "lastTimestamp": version._last,
        "count": version._count,
        "reportingComponent": reporting,
        "reportingInstance": version._host if reporting else "",
    }


def freeze_printer_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Table rows show ages ("Last Seen"): one fixed now for every row of the test."""
    frozen = dt.datetime.now(dt.UTC)

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> Frozen:
            return cls.fromtimestamp(frozen.timestamp(), tz)

    clock = types.ModuleType("datetime")
    clock.__dict__.update(dt.__dict__)
    clock.datetime = Frozen  # type: ignore[attr-defined]
    monkeypatch.setattr(printers, "dt", clock)


async def test_compact_events_serve_the_bytes_of_their_dict_form(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    freeze_printer_clock(monkeypatch)
    async with kubesim.Cluster(nodes=0, kubelet=instant(), controllers=[]) as sim:
        record_mix(sim)
        bucket = sim.store.bucket(EVENTS)
        compact = {key: s for key, s in bucket.items() if isinstance(s, CompactEvent)}
        assert len(compact) >= 15
        assert any(s.obj["message"].startswith(COMBINED_PREFIX) for s in compact.values())
        assert any(s.obj["metadata"]["namespace"] == "default" and s.obj["involvedObject"]["kind"]
                   == "Node" for s in bucket.values())  # fmt: skip
        names = sorted(bucket)
        async with aiohttp.ClientSession(base_url=sim.url) as session:
            # Twice: the second time protobuf items and Table rows come from the versions' caches.
            compact_form = await served(session, names)
            assert await served(session, names) == compact_form
            # Today's form of the very same versions: the dict the recorder built, its bytes
            # encoded when first read.
            for key, version in compact.items():
                obj = dict_form(version)
                assert version.obj == obj
                assert version.obj is not version.obj  # built afresh on each read
                assert version.raw == dumps(obj) == Stored(obj).raw
                assert version.rv == int(obj["metadata"]["resourceVersion"])
                bucket[key] = LazyStored(obj)
            assert await served(session, names) == compact_form


async def test_counts_selectors_and_namespace_deletion_work_on_compact_events() -> None:
    async with kubesim.Cluster(nodes=0, kubelet=instant()) as sim:
        sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
        for index in range(4):
            sim.events.record(pod(f"p{index}", "team"), "Normal", "Pulled", "m", component="k")
        before = sim.store.list("events", "team")
        assert sum(isinstance(s, CompactEvent) for s in sim.store.bucket(EVENTS).values()) == 3
        # A repeat counts on the compact version: count, lastTimestamp, the rest unchanged.
        sim.events.record(pod("p3", "team"), "Normal", "Pulled", "m", component="k")
        after = {e["metadata"]["name"]: e for e in sim.store.list("events", "team")}
        (old,) = [e for e in before if e["involvedObject"]["name"] == "p3"]
        new = after[old["metadata"]["name"]]
        assert new["count"] == 2
        assert int(new["metadata"]["resourceVersion"]) > int(old["metadata"]["resourceVersion"])
        for field in ("involvedObject", "reason", "message", "source", "firstTimestamp"):
            assert new[field] == old[field]
        assert new["metadata"]["uid"] == old["metadata"]["uid"]
        selected = sim.store.list(
            "events", "team", field_selector="involvedObject.name=p2,involvedObject.kind=Pod"
        )
        assert [e["involvedObject"]["name"] for e in selected] == ["p2"]
        # The namespace controller empties a terminating namespace of them.
        sim.store.delete("namespaces", "team")
        # A terminating namespace refuses new ones (the recorder drops them, as the real ones).
        assert sim.store.get("namespaces", "team")["metadata"].get("deletionTimestamp")
        sim.events.record(pod("late", "team"), "Normal", "Pulled", "m", component="k")
        assert sim.store.list("events", "team", field_selector="involvedObject.name=late") == []

        await eventually(
            lambda: sim.store.peek(("", "namespaces"), "", "team") is None,
            "the namespace team emptied and gone",
        )
        assert sim.store.list("events", "team") == []
