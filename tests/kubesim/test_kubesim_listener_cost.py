"""The cheaper paths of what a store commit's listeners do per pod: each must see what the long
way saw (the scheduler's requests accounting, a namespace's objects in a scan)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kubesim.controllers import scheduling
from kubesim.controllers.disruption import DisruptionController
from kubesim.store import Store

SPECS: list[dict[str, Any]] = [
    {"containers": [{"name": "a", "image": "a"}]},
    {"containers": [{"name": "a", "image": "a", "resources": {"limits": {"cpu": "1"}}}]},
    {
        "initContainers": [
            {
                "name": "proxy",
                "image": "p",
                "restartPolicy": "Always",
                "resources": {"requests": {"memory": "1Gi"}},
            },
            {"name": "setup", "image": "s", "resources": {"requests": {"cpu": "3"}}},
            {"name": "bare", "image": "b"},
        ],
        "containers": [
            {"name": "a", "image": "a", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
            {"name": "b", "image": "b", "resources": {"requests": {"cpu": "500m"}}},
        ],
        "overhead": {"cpu": "250m", "memory": "10Mi"},
    },
    {
        "containers": [{"name": "a", "image": "a", "resources": {"requests": {"cpu": "2"}}}],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
    },
    {"containers": []},
]


@pytest.mark.parametrize("spec", SPECS)
def test_requests_and_scoring_requests_in_one_pass_equal_each_alone(spec: dict[str, Any]) -> None:
    assert scheduling.pod_requests_and_non_zero(spec) == (
        scheduling.pod_requests(spec),
        scheduling.pod_requests(spec, non_zero=True),
    )


def test_requests_kept_per_shape_tell_apart_every_field_they_read() -> None:
    """Specs that differ in one field the requests read each get their own (the memo's key
    holds them all), and a caller changing what it got changes nothing for the next."""
    base = {
        "initContainers": [
            {"name": "i", "image": "i", "resources": {"requests": {"memory": "3Gi"}}}
        ],
        "containers": [{"name": "a", "image": "a", "resources": {"requests": {"cpu": "1"}}}],
    }
    variants = [base]
    for change in (
        lambda s: s["initContainers"][0].update(restartPolicy="Always"),
        lambda s: s["containers"][0]["resources"].update(limits={"cpu": "3"}),
        lambda s: s["containers"][0]["resources"].update(requests={"cpu": "2"}),
        lambda s: s["containers"][0].pop("resources"),
        lambda s: s["containers"].append({"name": "b", "image": "b"}),
        lambda s: s.update(overhead={"cpu": "100m"}),
        lambda s: s.update(resources={"requests": {"memory": "5Gi"}}),
    ):
        variant = json.loads(json.dumps(base))
        change(variant)
        variants.append(variant)
    for _ in range(2):
        for spec in variants:
            assert scheduling.pod_requests_and_non_zero(spec) == (
                scheduling.pod_requests(spec),
                scheduling.pod_requests(spec, non_zero=True),
            ), spec
    requests, non_zero = scheduling.pod_requests_and_non_zero(base)
    requests["cpu"] = non_zero["cpu"] = 0
    assert scheduling.pod_requests_and_non_zero(base)[0]["cpu"] == 1000


def _cm(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
    }


def test_a_namespace_scan_yields_exactly_that_namespaces_objects_in_order() -> None:
    store = Store()
    names = ["", "a", "ab", "a-b", "b", "default", "default-x", "z"]
    for namespace in names[1:]:
        store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for namespace in names[1:]:
        for name in ("m", "a", "z"):
            store.create(_cm(namespace, name))
    key = store.registry.resolve("configmaps").key
    everything = [s.obj["metadata"] for s in store.scan(key)]
    for namespace in [*names, "aa", "zz"]:
        expected = [(m["namespace"], m["name"]) for m in everything if m["namespace"] == namespace]
        got = [
            (s.obj["metadata"]["namespace"], s.obj["metadata"]["name"])
            for s in store.scan(key, namespace)
        ]
        assert got == expected, namespace
    # Created after the kind was first read (kept in a side set until the next read).
    store.create(_cm("ab", "b"))
    assert [s.obj["metadata"]["name"] for s in store.scan(key, "ab")] == ["a", "b", "m", "z"]


def test_a_removal_during_a_namespace_scan_acts_as_on_the_list() -> None:
    store = Store()
    store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}})
    for name in "abcd":
        store.create(_cm("x", name))
    rt = store.registry.resolve("configmaps")
    seen = []
    for stored in store.scan(rt.key, "x"):
        seen.append(stored.obj["metadata"]["name"])
        store.remove(rt, "x", stored.obj["metadata"]["name"])
    # Removing the current key shifts the next one under it, as iterating the list does.
    assert seen == ["a", "c"]


def test_a_pod_change_wakes_the_budgets_of_its_own_namespace_only() -> None:
    store = Store()
    for namespace in ("de", "default", "default-x"):
        store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        store.create(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": f"pdb-{namespace}", "namespace": namespace},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "a"}}},
            }
        )
    controller = DisruptionController(store)
    store.subscribe(controller.on_event, controller.resources)
    store.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "labels": {"app": "a"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }
    )
    assert list(controller._pending) == [("default", "pdb-default")]
