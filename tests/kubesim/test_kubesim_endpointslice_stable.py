"""The EndpointSlice controller keeps slices stable, as upstream's reconciler does: a sync writes
only the slices whose endpoints changed, whatever the address order of new pods."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubesim_helpers import instant, kubectl, needs_kubectl
from waiting import DEADLINE

import kubesim
from kubesim.controllers.endpoints import batch_delay
from kubesim.controllers.endpointslice import (
    _Entry,
    _Slice,
    _State,
    plan_slices,
)

SELECTOR = "kubernetes.io/service-name=web"


@pytest.fixture
async def endpoint_sim() -> AsyncIterator[kubesim.Cluster]:
    """Only the endpoint controllers: pod status is written by the test, not a kubelet."""
    async with kubesim.Cluster(
        nodes=0, kubelet=instant(), controllers=["endpoint", "endpointslice", "garbage-collector"]
    ) as cluster:
        yield cluster


def web_service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }


def ip_of(index: int) -> str:
    # Even last octets: an odd one lands between two existing addresses.
    return f"10.1.{index // 100}.{(index % 100) * 2 + 2}"


def add_pod(sim: kubesim.Cluster, name: str, ip: str, *, ready: bool = True) -> None:
    created = sim.store.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
            "spec": {"nodeName": "node-1", "containers": [{"name": "main", "image": "x:1"}]},
        }
    )
    created["status"] = {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    sim.store.update(created, status=True)


def set_ready(sim: kubesim.Cluster, name: str, ready: bool) -> None:
    pod = sim.store.get("pods", name, "default")
    assert pod is not None
    pod["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    sim.store.update(pod, status=True)


def slices(sim: kubesim.Cluster) -> list[dict[str, Any]]:
    return sim.store.list("endpointslices", "default", SELECTOR)


def listed(sim: kubesim.Cluster) -> dict[str, bool]:
    """Pod name -> ready, over all slices (a duplicate fails)."""
    found: dict[str, bool] = {}
    for slice_ in slices(sim):
        for endpoint in slice_.get("endpoints") or []:
            name = endpoint["targetRef"]["name"]
            assert name not in found, f"{name} listed twice"
            found[name] = endpoint["conditions"]["ready"]
    return found


def versions(sim: kubesim.Cluster) -> dict[str, str]:
    return {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in slices(sim)}


def written(before: dict[str, str], after: dict[str, str]) -> set[str]:
    """Slices created, rewritten or deleted between two `versions`."""
    return {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}


async def converge(sim: kubesim.Cluster, desired: dict[str, bool]) -> None:
    await sim.wait_for(lambda: listed(sim) == desired, DEADLINE, "the slices list every pod")
    # Nothing more is written after the batch delay.
    await asyncio.sleep(3 * batch_delay(len(desired)))
    await sim.settle(timeout=DEADLINE)


async def web_with(sim: kubesim.Cluster, count: int) -> dict[str, bool]:
    sim.store.create(web_service())
    for index in range(count):
        add_pod(sim, f"p{index:03d}", ip_of(index))
    desired = {f"p{index:03d}": True for index in range(count)}
    await converge(sim, desired)
    return desired


async def test_a_pod_added_mid_order_rewrites_only_the_slice_with_room(
    endpoint_sim: kubesim.Cluster,
) -> None:
    sim = endpoint_sim
    desired = await web_with(sim, 299)
    assert sorted(len(s["endpoints"]) for s in slices(sim)) == [99, 100, 100]
    before = versions(sim)
    # Between the first two addresses: a re-chunking by address would shift every slice.
    add_pod(sim, "mid", "10.1.0.3")
    desired["mid"] = True
    await converge(sim, desired)
    after = versions(sim)
    assert len(written(before, after)) == 1
    assert after.keys() == before.keys()
    assert sorted(len(s["endpoints"]) for s in slices(sim)) == [100, 100, 100]


async def test_a_removed_or_changed_pod_rewrites_its_slice_alone(
    endpoint_sim: kubesim.Cluster,
) -> None:
    sim = endpoint_sim
    desired = await web_with(sim, 300)
    holder = {
        e["targetRef"]["name"]: s["metadata"]["name"] for s in slices(sim) for e in s["endpoints"]
    }
    before = versions(sim)
    assert sim.store.delete("pods", "p001", "default", grace=0)
    del desired["p001"]
    await converge(sim, desired)
    after = versions(sim)
    assert written(before, after) == {holder["p001"]}

    set_ready(sim, "p150", False)
    desired["p150"] = False
    await converge(sim, desired)
    assert written(after, versions(sim)) == {holder["p150"]}
    # Endpoints that did not change stay in their slices.
    assert all(
        holder[e["targetRef"]["name"]] == s["metadata"]["name"]
        for s in slices(sim)
        for e in s["endpoints"]
    )


async def test_slices_edited_or_deleted_by_someone_else_are_repaired_from_the_store(
    endpoint_sim: kubesim.Cluster,
) -> None:
    sim = endpoint_sim
    desired = await web_with(sim, 250)
    by_size = sorted(slices(sim), key=lambda s: len(s["endpoints"]))
    half, edited, untouched = by_size[0], by_size[1], by_size[2]
    # Someone drops an endpoint from one slice and deletes another.
    edited["endpoints"] = edited["endpoints"][1:]
    sim.store.update(edited)
    assert sim.store.delete("endpointslices", half["metadata"]["name"], "default")
    await converge(sim, desired)
    after = versions(sim)
    assert after[untouched["metadata"]["name"]] == untouched["metadata"]["resourceVersion"]
    assert all(len(s["endpoints"]) <= 100 for s in slices(sim))


async def test_random_pod_changes_keep_every_endpoint_listed_once_in_slices_of_at_most_100(
    endpoint_sim: kubesim.Cluster,
) -> None:
    sim = endpoint_sim
    rng = random.Random(32)
    desired = await web_with(sim, 120)
    next_index = 120
    for _ in range(12):
        for _ in range(rng.randint(1, 40)):
            roll = rng.random()
            if roll < 0.4 or not desired:
                name = f"p{next_index:03d}"
                ready = rng.random() < 0.8
                add_pod(sim, name, ip_of(rng.randrange(400)) if rng.random() < 0.3 else
                        ip_of(next_index), ready=ready)  # fmt: skip
                desired[name] = ready
                next_index += 1
            elif roll < 0.7:
                name = rng.choice(sorted(desired))
                assert sim.store.delete("pods", name, "default", grace=0)
                del desired[name]
            else:
                name = rng.choice(sorted(desired))
                desired[name] = not desired[name]
                set_ready(sim, name, desired[name])
        await converge(sim, desired)
        found = slices(sim)
        assert all(len(s.get("endpoints") or []) <= 100 for s in found)
        if desired:
            assert all(s.get("endpoints") for s in found), "no empty slice beside endpoints"
        else:
            assert len(found) == 1


def entry(pod: str, ready: bool, key: str = "p") -> _Entry:
    number = int(pod[1:])
    endpoint = {"addresses": [f"10.0.{number // 250}.{number % 250}"], "ready": ready}
    return (key, [{"port": 80}], endpoint, (10, 0, number // 250, number % 250))


def test_plan_slices_keeps_unchanged_endpoints_in_place_under_random_changes() -> None:
    rng = random.Random(7)
    state = _State({})
    desired: dict[str, tuple[bool, str]] = {}
    names = iter(range(10**6))
    for _ in range(300):
        changes: dict[str, _Entry | None] = {}
        for _ in range(rng.choice([1, 2, 5, 30, 150])):
            pod = f"p{rng.randrange(600)}"
            if pod in desired and rng.random() < 0.4:
                changes[pod] = None
            else:
                ready, key = rng.random() < 0.7, rng.choice("pppq")
                changes[pod] = entry(pod, ready, key)
        held = {pod: state.where[pod] for pod in state.where if pod not in changes}
        counts = {name: len(s.endpoints) for name, s in state.slices.items()}
        plan = plan_slices(state, changes, set())
        for pod, change in changes.items():
            if change is None:
                desired.pop(pod, None)
            else:
                desired[pod] = (change[2]["ready"], change[0])
        # What the controller does with the plan: creates reuse the names of deletions.
        deletes = list(plan.delete)
        for new in plan.create:
            new.name = deletes.pop(0) if deletes else f"s{next(names)}"
            state.slices[new.name] = new
            state.where.update(dict.fromkeys(new.endpoints, new.name))
        for name in deletes:
            del state.slices[name]
        # Unchanged endpoints stay in their slice; slices not planned keep their endpoints.
        assert all(state.where[pod] == name for pod, name in held.items())
        planned = set(plan.update) | set(plan.delete)
        for name, count in counts.items():
            if name not in planned:
                assert len(state.slices[name].endpoints) == count
        found: dict[str, tuple[bool, str]] = {}
        for name, slice_ in state.slices.items():
            assert len(slice_.endpoints) <= 100
            for pod, endpoint in slice_.endpoints.items():
                assert pod not in found
                assert state.where[pod] == name
                found[pod] = (endpoint["ready"], slice_.key)
        assert found == desired
        if desired:
            assert all(s.endpoints for s in state.slices.values())
        else:
            assert len(state.slices) == 1


def test_plan_slices_fills_rewritten_slices_before_an_unchanged_one_with_room() -> None:
    state = _State({})
    for name, pods in (("a", range(100)), ("b", range(100, 150)), ("c", range(150, 240))):
        state.slices[name] = _Slice(name, "p", [{"port": 80}])
        for number in pods:
            pod = f"p{number}"
            state.slices[name].endpoints[pod] = entry(pod, True)[2]
            state.where[pod] = name
    # p5 leaves slice a (rewritten anyway): the first new endpoint fills it.
    plan = plan_slices(state, {"p5": None, "p900": entry("p900", True)}, set())
    assert plan == (["a"], [], [])
    assert state.where["p900"] == "a"
    # Three new ones: the unchanged slice they fill closest to full is c (90 -> 93).
    plan = plan_slices(state, {f"p{n}": entry(f"p{n}", True) for n in (901, 902, 903)}, set())
    assert plan == (["c"], [], [])
    # A slice left without endpoints is deleted; none left at all keeps one placeholder.
    plan = plan_slices(state, dict.fromkeys(state.where), set())
    assert plan.update == []
    assert len(plan.create) == 1
    assert not plan.create[0].endpoints
    assert sorted(plan.delete) == ["a", "b", "c"]


@needs_kubectl
async def test_kubectl_lists_stable_endpointslices_of_a_service(
    endpoint_sim: kubesim.Cluster,
) -> None:
    sim = endpoint_sim
    desired = await web_with(sim, 150)
    out = await kubectl(sim, "get", "endpointslices", "-l", SELECTOR)
    rows = out.strip().splitlines()
    assert rows[0].split() == ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"]
    assert len(rows) == 3
    assert all(row.startswith("web-") and " IPv4 " in row and " 8080 " in row for row in rows[1:])
    assert any("+ 97 more..." in row for row in rows[1:])
    before = json.loads(await kubectl(sim, "get", "endpointslices", "-l", SELECTOR, "-o", "json"))
    # A readiness change and a pod whose address sorts first: the full slice keeps its version.
    set_ready(sim, "p120", False)
    desired["p120"] = False
    add_pod(sim, "mid", "10.1.0.1")
    desired["mid"] = True
    await converge(sim, desired)
    after = json.loads(await kubectl(sim, "get", "endpointslices", "-l", SELECTOR, "-o", "json"))
    versions_before = {
        s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in before["items"]
    }
    versions_after = {
        s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in after["items"]
    }
    assert len(written(versions_before, versions_after)) == 1
    assert versions_after.keys() == versions_before.keys()
