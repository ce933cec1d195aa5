"""Store writes call only the listeners that read them, and the cheaper write paths keep what the
long ones gave: deletions-only listeners, the namespace controller off creates and updates, the
owner index across updates, generated names, a DaemonSet's totals kept from per-node records."""

from __future__ import annotations

import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubesim_helpers import TEST_IMAGES, configmap, instant
from waiting import DEADLINE

import kubesim
from kubesim.controllers import deployment as deployment_mod
from kubesim.controllers import namespace as namespace_mod
from kubesim.controllers.daemonset import EMPTY, DaemonState, NodeRecord
from kubesim.store import Event, Store, random_suffix


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


SECRET = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "default"}}


def owned(name: str, *uids: str) -> dict[str, Any]:
    cm = configmap(name)
    cm["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": f"owner-{uid}", "uid": uid}
        for uid in uids
    ]
    return cm


# ----- deletions-only listeners -------------------------------------------------------------


def test_a_deletions_only_listener_hears_the_deletions_of_every_kind_it_does_not_ignore() -> None:
    store = Store()
    store.create(namespace("default"))
    heard: list[tuple[str, str, str]] = []
    unsubscribe = store.subscribe(
        lambda e: heard.append((e.type, e.key[1], e.new.obj["metadata"]["name"])),
        ignore=[("", "secrets")],
        deletions_only=True,
    )
    store.create(configmap("c"))
    store.patch("configmaps", "c", {"data": {"k": "w"}}, "default")
    store.create(SECRET)
    store.delete("secrets", "s", "default")
    store.delete("configmaps", "c", "default")
    assert heard == [("DELETED", "configmaps", "c")]
    unsubscribe()
    store.create(configmap("d"))
    store.delete("configmaps", "d", "default")
    assert heard == [("DELETED", "configmaps", "c")]


def test_deletions_and_other_changes_call_the_same_listeners_in_the_same_order() -> None:
    store = Store()
    store.create(namespace("default"))
    calls: list[str] = []
    store.subscribe(lambda e: calls.append(f"all {e.type}"))
    store.subscribe(lambda e: calls.append(f"deletions {e.type}"), deletions_only=True)
    store.subscribe(lambda e: calls.append(f"keyed {e.type}"), [("", "configmaps")])
    store.create(configmap("c"))
    store.delete("configmaps", "c", "default")
    assert calls == [
        "all ADDED", "keyed ADDED", "all DELETED", "deletions DELETED", "keyed DELETED",
    ]  # fmt: skip


def test_a_keyed_deletions_only_listener_hears_the_deletions_of_its_kinds() -> None:
    store = Store()
    store.create(namespace("default"))
    heard: list[tuple[str, str]] = []
    unsubscribe = store.subscribe(
        lambda e: heard.append((e.type, e.new.obj["metadata"]["name"])),
        [("", "configmaps")],
        deletions_only=True,
    )
    store.create(configmap("c"))
    store.patch("configmaps", "c", {"data": {"k": "w"}}, "default")
    store.create(SECRET)
    store.delete("secrets", "s", "default")
    store.delete("configmaps", "c", "default")
    assert heard == [("DELETED", "c")]
    unsubscribe()
    store.create(configmap("d"))
    store.delete("configmaps", "d", "default")
    assert heard == [("DELETED", "c")]


async def test_the_deployment_controller_hears_pods_only_when_they_are_deleted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    heard: list[tuple[str, str]] = []
    on_event = deployment_mod.DeploymentController.on_event

    def spying(self: Any, event: Event) -> None:
        heard.append((event.type, event.key[1]))
        on_event(self, event)

    monkeypatch.setattr(deployment_mod.DeploymentController, "on_event", spying)
    async with kubesim.Cluster(nodes=1, kubelet=instant(), images=TEST_IMAGES) as sim:
        sim.store.create(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {
                    "replicas": 1,
                    "strategy": {"type": "Recreate"},
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "c", "image": "example/web:1"}]},
                    },
                },
            }
        )

        def available(image: str) -> bool:
            pods = sim.store.list("pods", "default")
            return len(pods) == 1 and all(
                p["spec"]["containers"][0]["image"] == image
                and (p.get("status") or {}).get("phase") == "Running"
                for p in pods
            )

        await sim.wait_for(lambda: available("example/web:1"), DEADLINE, "the first pod")
        assert not [kind for _, kind in heard if kind == "pods"]
        # A Recreate rollout waits for the old pod's deletion, which it still hears of.
        sim.store.patch(
            "deployments.apps",
            "web",
            {"spec": {"template": {"spec": {"containers": [{"name": "c",
                                                            "image": "example/web:2"}]}}}},
            "default",
        )  # fmt: skip
        await sim.wait_for(lambda: available("example/web:2"), DEADLINE, "the new pod")
        assert ("DELETED", "pods") in heard
        assert {t for t, kind in heard if kind == "pods"} == {"DELETED"}


async def test_the_namespace_controller_hears_namespaces_and_deletions_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    heard: list[tuple[str, str]] = []
    on_event = namespace_mod.NamespaceController.on_event

    def spying(self: Any, event: Event) -> None:
        heard.append((event.type, event.key[1]))
        on_event(self, event)

    monkeypatch.setattr(namespace_mod.NamespaceController, "on_event", spying)
    async with kubesim.Cluster(nodes=0, kubelet=instant()) as sim:
        await sim.wait_for(
            lambda: sim.store.get("serviceaccounts", "default", "default") is not None
        )
        heard.clear()
        sim.store.create(namespace("team"))
        cm = configmap("held", "team")
        cm["metadata"]["finalizers"] = ["example.com/hold"]
        sim.store.create(cm)
        sim.store.patch("configmaps", "held", {"data": {"k": "w"}}, "team")
        assert heard == [("ADDED", "namespaces")]  # not the ConfigMap's create and update
        sim.store.delete("namespaces", "team")
        await sim.wait_for(
            lambda: (
                (sim.store.get("configmaps", "held", "team") or {})
                .get("metadata", {})
                .get("deletionTimestamp")
                is not None
            ),
            DEADLINE,
            "the held ConfigMap marked for deletion",
        )
        assert sim.store.get("namespaces", "team") is not None  # held by the finalizer
        # Its finalizer gone, the ConfigMap's deletion is what finishes the namespace.
        sim.store.patch("configmaps", "held", {"metadata": {"finalizers": None}}, "team")
        await sim.wait_for(
            lambda: sim.store.get("namespaces", "team") is None, DEADLINE, "namespace gone"
        )
        assert ("DELETED", "configmaps") in heard
        assert all(kind == "namespaces" or kind_type == "DELETED" for kind_type, kind in heard)


# ----- the owner index ------------------------------------------------------------------------


def test_updates_keep_or_move_dependents_as_their_owner_references_say() -> None:
    store = Store()
    store.create(namespace("default"))
    store.create(owned("c", "u1"))
    key = ("", "configmaps")
    assert store.dependents("u1") == [(key, "default", "c")]
    store.patch("configmaps", "c", {"data": {"k": "w"}}, "default")  # equal references
    assert store.dependents("u1") == [(key, "default", "c")]
    refs = owned("c", "u2", "u1")["metadata"]["ownerReferences"]
    store.patch("configmaps", "c", {"metadata": {"ownerReferences": refs}}, "default")
    assert store.dependents("u1") == store.dependents("u2") == [(key, "default", "c")]
    store.patch("configmaps", "c", {"metadata": {"ownerReferences": refs[:1]}}, "default")
    assert (store.dependents("u1"), store.dependents("u2")) == ([], [(key, "default", "c")])
    store.patch("configmaps", "c", {"metadata": {"ownerReferences": None}}, "default")
    assert store.dependents("u2") == []
    store.patch("configmaps", "c", {"metadata": {"ownerReferences": refs}}, "default")
    store.delete("configmaps", "c", "default")
    assert store.dependents("u1") == store.dependents("u2") == []


# ----- generated names ------------------------------------------------------------------------


def test_generated_name_suffixes_draw_every_character_of_the_alphabet_at_every_position() -> None:
    alphabet = set("bcdfghjklmnpqrstvwxz2456789")
    made = [random_suffix() for _ in range(3000)]
    assert {len(s) for s in made} == {5}
    assert random_suffix(8).strip(string.ascii_lowercase + string.digits) == ""
    assert len(random_suffix(8)) == 8
    for position in range(5):
        assert {s[position] for s in made} == alphabet


# ----- a DaemonSet's totals -------------------------------------------------------------------

RECORDS = st.builds(
    NodeRecord,
    desired=st.integers(0, 1),
    current=st.integers(0, 1),
    misscheduled=st.integers(0, 1),
    ready=st.integers(0, 1),
    available=st.integers(0, 1),
    updated=st.integers(0, 1),
    unavailable=st.integers(0, 1),
    surging=st.integers(0, 1),
    replace=st.sampled_from(["", "old-pod"]),
    candidate=st.sampled_from(["", "old-pod"]),
    allowed_new=st.booleans(),
    candidate_new=st.booleans(),
    retire=st.sampled_from(["", "old-pod"]),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["n1", "n2", "n3"]), RECORDS | st.just(EMPTY))))
def test_a_daemonsets_totals_and_rollout_sets_are_those_of_its_node_records(
    steps: list[tuple[str, NodeRecord]],
) -> None:
    state = DaemonState("uid")
    for node, record in steps:
        state.record(node, record)
    records = state.records.values()
    assert state.totals == {
        field: sum(getattr(r, field) for r in records) for field in state.totals
    }
    assert set(state.totals) == {
        "desired", "current", "misscheduled", "ready", "available", "updated", "unavailable",
        "surging",
    }  # fmt: skip
    assert EMPTY not in records
    assert state.replace == {n: r.replace for n, r in state.records.items() if r.replace}
    assert state.candidates == {n: r.candidate for n, r in state.records.items() if r.candidate}
    assert state.retire == {n: r.retire for n, r in state.records.items() if r.retire}
    assert state.allowed_new == {n for n, r in state.records.items() if r.allowed_new}
    assert state.candidate_new == {n for n, r in state.records.items() if r.candidate_new}
