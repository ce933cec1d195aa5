"""Objects nested as deep as the real server stores them (its JSON decoder takes 10,000 levels)
are stored, and served by get, list and watch; only HTTP write bodies stay bounded
(request_limits.MAX_DEPTH)."""

from __future__ import annotations

import json
import sys
from typing import Any

import aiohttp
import pytest
from kubesim_helpers import kubectl, needs_kubectl
from waiting import DEADLINE, within

import kubesim
from kubesim import store

WIDGETS = "/apis/example.com/v1/namespaces/default/widgets"
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {
        "group": "example.com",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                        },
                    }
                },
            }
        ],
    },
}


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": "x"}
    for _ in range(depth):
        value = {"n": value}
    return value


def depth_of(value: Any) -> int:
    depth = 0
    while isinstance(value, dict) and "n" in value:
        value, depth = value["n"], depth + 1
    return depth


def decoded(raw: bytes) -> Any:
    # The test's own decoder needs the deeper limit too (the object is deeper than Python's 1,000).
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(store.DEEP_RECURSION_LIMIT)
    try:
        return json.loads(raw)
    finally:
        sys.setrecursionlimit(before)


async def widget_crd(sim: kubesim.Cluster) -> None:
    sim.store.create(CRD)

    def served() -> bool:
        try:
            sim.store.registry.resolve("widgets.example.com")
        except kubesim.errors.ApiError:
            return False
        return True

    await sim.wait_for(served, timeout=DEADLINE)


@pytest.mark.parametrize("depth", [1_000, 9_990])
async def test_objects_nested_as_deep_as_the_real_server_allows_are_served(
    sim: kubesim.Cluster, depth: int
) -> None:
    await widget_crd(sim)
    start = sim.store.list("widgets", "default")
    assert start == []
    async with aiohttp.ClientSession(base_url=sim.url) as http:
        listed = await (await http.get(WIDGETS)).json()
        watch = await http.get(
            WIDGETS, params={"watch": "1", "resourceVersion": listed["metadata"]["resourceVersion"]}
        )
        sim.store.create({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "deep", "namespace": "default"},
            "spec": {"config": nested(depth)},
        })  # fmt: skip
        line = await within(watch.content.readline(), "the ADDED event")
        event = decoded(line)
        assert event["type"] == "ADDED"
        assert depth_of(event["object"]["spec"]["config"]) == depth
        watch.close()
        got = await http.get(f"{WIDGETS}/deep")
        assert got.status == 200
        assert depth_of(decoded(await got.read())["spec"]["config"]) == depth
        items = decoded(await (await http.get(WIDGETS)).read())["items"]
        assert [depth_of(i["spec"]["config"]) for i in items] == [depth]
    kept = sim.store.get("widgets", "deep", "default")
    assert kept is not None
    assert depth_of(kept["spec"]["config"]) == depth
    # The raised limit was only for those calls.
    assert sys.getrecursionlimit() < store.DEEP_RECURSION_LIMIT


@needs_kubectl
async def test_kubectl_reads_a_thousand_level_object(sim: kubesim.Cluster) -> None:
    await widget_crd(sim)
    sim.store.create({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "deep", "namespace": "default"},
        "spec": {"config": nested(1_000)},
    })  # fmt: skip
    name = await kubectl(sim, "get", "widget", "deep", "-o", "jsonpath={.metadata.name}")
    assert name.strip() == "deep"
