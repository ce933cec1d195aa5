"""Events at scale: the garbage collector ignores them (as kube-controller-manager's does), and
the recorders' Events take a lean create path that stores exactly what the full one stores."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
from kubesim_helpers import instant
from waiting import eventually

import kubesim
from kubesim.controllers.garbage_collector import GarbageCollector
from kubesim.store import Event, Store

EVENTS = ("", "events")


def configmap(name: str, namespace: str = "default", **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, **meta},
    }


def owned_by(owner: dict[str, Any]) -> list[dict[str, Any]]:
    meta = owner["metadata"]
    return [
        {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": meta["name"],
            "uid": meta["uid"],
        }
    ]


def event_about(obj: dict[str, Any], name: str, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": obj["metadata"]["namespace"], **meta},
        "involvedObject": {
            "kind": obj["kind"],
            "name": obj["metadata"]["name"],
            "namespace": obj["metadata"]["namespace"],
            "uid": obj["metadata"]["uid"],
        },
        "reason": "Tested",
        "message": "a test event",
        "type": "Normal",
        "source": {"component": "test"},
    }


@pytest.fixture
async def gc_sim() -> Any:
    async with kubesim.Cluster(
        nodes=0, kubelet=instant(), controllers=["garbage-collector"]
    ) as sim:
        yield sim


async def test_an_event_owned_by_a_deleted_object_is_not_collected(gc_sim: Any) -> None:
    # kube-controller-manager's collector ignores Events (core and events.k8s.io): it never
    # deletes one, whatever its ownerReferences say; other dependents go as usual.
    sim = gc_sim
    owner = sim.store.create(configmap("owner"))
    sim.store.create(event_about(owner, "owned-event", ownerReferences=owned_by(owner)))
    sim.store.create(configmap("dependent", ownerReferences=owned_by(owner)))
    sim.store.delete("configmaps", "owner", "default")
    await eventually(
        lambda: sim.store.get("configmaps", "dependent", "default") is None,
        "the ConfigMap owned by the deleted owner collected",
    )
    await sim.settle()
    assert sim.store.get("events", "owned-event", "default") is not None


async def test_foreground_and_orphan_deletions_leave_events_as_they_are(gc_sim: Any) -> None:
    sim = gc_sim
    for propagation in ("Foreground", "Orphan"):
        name = f"owner-{propagation.lower()}"
        owner = sim.store.create(configmap(name))
        refs = owned_by(owner)
        refs[0]["blockOwnerDeletion"] = True
        sim.store.create(event_about(owner, f"{name}-event", ownerReferences=refs))
        sim.store.delete("configmaps", name, "default", propagation=propagation)
        await eventually(
            lambda name=name: sim.store.get("configmaps", name, "default") is None,
            f"the {propagation} deletion of {name} finished (no Event blocks it)",
        )
        await sim.settle()
        event = sim.store.get("events", f"{name}-event", "default")
        assert event is not None
        assert event["metadata"]["ownerReferences"] == refs


async def test_an_object_owned_by_an_event_stays_while_that_event_exists(gc_sim: Any) -> None:
    # The collector has no node for an Event owner: it looks the owner up, as the real one does.
    sim = gc_sim
    anchor = sim.store.create(configmap("anchor"))
    event = sim.store.create(event_about(anchor, "owner-event"))
    sim.store.create(configmap("kept", ownerReferences=owned_by(event)))
    stale = owned_by(event)
    stale[0]["uid"] = "00000000-0000-4000-8000-000000000000"
    sim.store.create(configmap("stale", ownerReferences=stale))
    await eventually(
        lambda: sim.store.get("configmaps", "stale", "default") is None,
        "the ConfigMap whose Event owner has another uid collected",
    )
    await sim.settle()
    assert sim.store.get("configmaps", "kept", "default") is not None


async def test_the_garbage_collector_is_not_told_of_events(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []
    on_event = GarbageCollector.on_event

    def spying(self: GarbageCollector, event: Event) -> None:
        seen.append(event.key)
        on_event(self, event)

    monkeypatch.setattr(GarbageCollector, "on_event", spying)
    async with kubesim.Cluster(
        nodes=0, kubelet=instant(), controllers=["garbage-collector"]
    ) as sim:
        anchor = sim.store.create(configmap("anchor"))
        for n in range(3):
            sim.events.record(anchor, "Normal", "Tested", f"event {n}", component="test")
        sim.store.create(event_about(anchor, "direct"))
        await sim.settle()
        assert len(sim.store.list("events", "default")) == 4
    assert ("", "configmaps") in seen
    assert EVENTS not in seen


def recorded(sim: Any, reason: str) -> list[dict[str, Any]]:
    return [e for e in sim.store.list("events") if e["reason"] == reason]


async def test_lean_recorder_events_store_what_the_full_create_stores() -> None:
    async with kubesim.Cluster(nodes=0, kubelet=instant(), controllers=[]) as sim:
        anchor = sim.store.create(configmap("anchor"))
        # The first Event of a shape takes the full create path, the next ones the lean one.
        sim.events.record(anchor, "Normal", "Tested", "first", component="test", host="node-1")
        sim.events.record(anchor, "Normal", "Tested", "second", component="test", host="node-1")
        first, second = sorted(recorded(sim, "Tested"), key=lambda e: e["message"])
        rt = sim.store.registry.resolve("events")
        body = copy.deepcopy(second)
        for field in ("uid", "resourceVersion", "creationTimestamp"):
            del body["metadata"][field]
        body["metadata"]["name"] = "through-insert"
        full = sim.store.insert(rt, body).obj

        def comparable(event: dict[str, Any]) -> dict[str, Any]:
            event = copy.deepcopy(event)
            for field in ("name", "uid", "resourceVersion", "creationTimestamp"):
                event["metadata"].pop(field)
            return event

        assert comparable(second) == comparable(full)
        assert set(first) == set(second)
        assert second["metadata"]["uid"] != first["metadata"]["uid"]


async def test_recorder_events_are_still_refused_in_a_terminating_namespace() -> None:
    async with kubesim.Cluster(nodes=0, kubelet=instant()) as sim:
        sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "going"}})
        held = sim.store.create(configmap("held", "going", finalizers=["example.com/hold"]))
        sim.events.record(held, "Normal", "Tested", "before", component="test")
        sim.store.delete("namespaces", "going")
        await eventually(
            lambda: bool(
                (sim.store.get("namespaces", "going") or {})
                .get("metadata", {})
                .get("deletionTimestamp")
            ),
            "the namespace terminating",
        )
        # Same shape as the admitted one: the lean path, which must refuse it like the full one.
        sim.events.record(held, "Normal", "Tested", "after", component="test")
        messages = [e["message"] for e in sim.store.list("events", "going")]
        assert "after" not in messages
        rt = sim.store.registry.resolve("events")
        event = event_about(held, "direct")
        with pytest.raises(kubesim.errors.ApiError) as refused:
            sim.store.insert_event(rt, event)
        assert refused.value.code == 403
        assert "because it is being terminated" in str(refused.value)


async def test_repeated_recorder_events_are_still_aggregated() -> None:
    async with kubesim.Cluster(nodes=0, kubelet=instant(), controllers=[]) as sim:
        anchor = sim.store.create(configmap("anchor"))
        for _ in range(3):
            sim.events.record(anchor, "Warning", "Again", "same", component="test")
        sim.events.record(anchor, "Warning", "Again", "other", component="test")
        events = sorted(recorded(sim, "Again"), key=lambda e: e["message"])
        assert [(e["message"], e["count"]) for e in events] == [("other", 1), ("same", 3)]


async def test_no_storage_admission_hook_acts_on_a_core_event() -> None:
    # The lean path skips the store's admission hooks: none may have anything to do to an Event.
    async with kubesim.Cluster(nodes=0, kubelet=instant(), authorization="rbac") as sim:
        anchor = sim.store.create(configmap("anchor"))
        rt = sim.store.registry.resolve("events")
        event = sim.store.create(event_about(anchor, "checked"))
        assert sim.store.admission
        for hook in sim.store.admission:
            for old in (None, copy.deepcopy(event)):
                body = copy.deepcopy(event)
                hook(sim.store, rt, body, old)
                assert body == event, hook


def test_listeners_of_every_kind_but_some_are_not_called_for_those() -> None:
    store = Store()
    calls: list[tuple[str, tuple[str, str]]] = []
    unsubscribe = store.subscribe(lambda e: calls.append(("all-but", e.key)), ignore=[EVENTS])
    store.subscribe(lambda e: calls.append(("all", e.key)))
    store.subscribe(lambda e: calls.append(("events", e.key)), [EVENTS])
    store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}})
    cm = store.create(configmap("cm", "ns"))
    store.create(event_about(cm, "ev"))
    namespaces, configmaps = ("", "namespaces"), ("", "configmaps")
    assert calls == [
        ("all-but", namespaces),
        ("all", namespaces),
        ("all-but", configmaps),
        ("all", configmaps),
        ("all", EVENTS),
        ("events", EVENTS),
    ]
    calls.clear()
    unsubscribe()
    store.create(configmap("cm2", "ns"))
    assert calls == [("all", configmaps)]


def test_keys_created_after_a_list_keep_lists_in_order() -> None:
    # Created keys that do not sort last are merged into a kind's order at the next read (not
    # inserted one by one into a list of hundreds of thousands): reads still see key order.
    rng = random.Random(7)
    store = Store()
    for ns in ("a", "b", "c"):
        store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    live: set[tuple[str, str]] = set()
    for round_ in range(6):
        for _ in range(200):
            key = (rng.choice("abc"), f"cm-{rng.randrange(10_000):05d}")
            if key in live:
                store.delete("configmaps", key[1], key[0])
                live.discard(key)
            else:
                store.create(configmap(key[1], key[0]))
                live.add(key)
        every = [
            (o["metadata"]["namespace"], o["metadata"]["name"]) for o in store.list("configmaps")
        ]
        assert every == sorted(live), round_
        in_b = [o["metadata"]["name"] for o in store.list("configmaps", "b")]
        assert in_b == sorted(name for ns, name in live if ns == "b")
        scanned = [
            (s.obj["metadata"]["namespace"], s.obj["metadata"]["name"])
            for s in store.scan(("", "configmaps"))
        ]
        assert scanned == sorted(live)
