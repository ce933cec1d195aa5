"""The kube runtime against kubesim over HTTP: caches, writer, leader election, work queue."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from lightkube import ApiError
from waiting import DEADLINE, eventually, within

import kubesim
from gpu_operator.kube import client as kube_client
from gpu_operator.kube import resources
from gpu_operator.kube.cache import Informer
from gpu_operator.kube.leader import LeaderElector
from gpu_operator.kube.queue import WorkQueue
from gpu_operator.kube.writer import Writer, content_hash, needs_write


@pytest.fixture
async def sim() -> AsyncIterator[kubesim.Cluster]:
    async with kubesim.Cluster() as cluster:
        yield cluster


def configmap(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "t"}},
        "data": data,
    }


async def test_informer_lists_then_follows_the_watch(sim: kubesim.Cluster) -> None:
    sim.add_node("n1", labels={"a": "1"})
    client = kube_client.connect(str(sim.kubeconfig_path))
    seen: list[tuple[str, bool, bool]] = []
    informer = Informer(
        client,
        resources.NODE,
        transform=lambda o: {"metadata": o["metadata"]},
        on_change=lambda key, old, new: seen.append((key, old is None, new is None)),
    )
    task = asyncio.create_task(informer.run())
    try:
        await within(informer.synced.wait(), "the informer to sync")
        assert set(informer.objects) == {"n1"}
        sim.add_node("n2")
        await sim.wait_for(
            lambda: "n2" in informer.objects, message="n2 in cache", timeout=DEADLINE
        )
        sim.remove_node("n1")
        await sim.wait_for(
            lambda: "n1" not in informer.objects, message="n1 gone", timeout=DEADLINE
        )
        assert ("n2", True, False) in seen
        assert ("n1", False, True) in seen
        assert informer.relists == 1
        assert set(informer.objects["n2"]) == {"metadata"}
    finally:
        task.cancel()
        await client.close()


async def test_informer_relists_after_410(sim: kubesim.Cluster) -> None:
    client = kube_client.connect(str(sim.kubeconfig_path))
    informer = Informer(client, resources.NODE)
    task = asyncio.create_task(informer.run())
    try:
        await within(informer.synced.wait(), "the informer to sync")
        sim.faults.expire_next_watch()
        sim.faults.drop_watches()
        sim.add_node("late")
        await sim.wait_for(
            lambda: "late" in informer.objects, message="late node cached", timeout=DEADLINE
        )
        await sim.wait_for(
            lambda: informer.relists >= 2, message="relist after 410", timeout=DEADLINE
        )
    finally:
        task.cancel()
        await client.close()


async def test_writer_applies_only_changes(sim: kubesim.Cluster) -> None:
    client = kube_client.connect(str(sim.kubeconfig_path))
    writer = Writer(client, namespace="default")
    desired = configmap("cfg", {"k": "v"})
    try:
        await writer.apply(desired)
        live = dict(
            await client.get(resources.resource("v1", "ConfigMap"), "cfg", namespace="default")
        )
        assert live["data"] == {"k": "v"}
        assert not needs_write(desired, live)
        changed = configmap("cfg", {"k": "w"})
        assert needs_write(changed, live)
        await writer.apply(changed)
        live = dict(
            await client.get(resources.resource("v1", "ConfigMap"), "cfg", namespace="default")
        )
        assert live["data"] == {"k": "w"}
        await writer.delete(changed)
        await writer.delete(changed)  # already gone is fine
    finally:
        await client.close()


def test_hash_ignores_our_own_annotation() -> None:
    obj = configmap("c", {"a": "b"})
    stamped = {
        **obj,
        "metadata": {**obj["metadata"], "annotations": {"nvidia.com/last-applied-hash": "x"}},
    }
    assert content_hash(obj) == content_hash(stamped)
    assert content_hash(obj) != content_hash(configmap("c", {"a": "c"}))


async def test_writer_patches_node_labels_and_records_events(sim: kubesim.Cluster) -> None:
    sim.add_node("gpu-1")
    client = kube_client.connect(str(sim.kubeconfig_path))
    writer = Writer(client, namespace="default")
    try:
        await writer.patch_node("gpu-1", {"metadata": {"labels": {"x": "1"}}})
        node = sim.store.get("nodes", "gpu-1")
        assert node["metadata"]["labels"]["x"] == "1"
        await writer.event(node, reason="Test", message="hello")
        events = sim.store.list("events", namespace="default")
        # The simulated kubelet records node lifecycle Events of its own; only ours matter here.
        ours = [
            e for e in events if e["involvedObject"]["name"] == "gpu-1" and e["reason"] == "Test"
        ]
        assert [e["message"] for e in ours] == ["hello"]
    finally:
        await client.close()


async def test_writer_labels_a_node_as_a_merge_patch_of_its_field_manager(
    sim: kubesim.Cluster,
) -> None:
    """`label_node` (the node labelling reconciler's lean write) sends the same request as
    `patch_node`: a merge patch owned by the operator's field manager; a refusal is an ApiError
    with the server's code."""
    sim.add_node("gpu-1", labels={"keep": "1", "drop": "1"})
    client = kube_client.connect(str(sim.kubeconfig_path))
    writer = Writer(client, namespace="default")
    try:
        patch = {"metadata": {"labels": {"x": "1", "drop": None}, "annotations": {"a": "b"}}}
        await writer.label_node("gpu-1", patch)
        meta = sim.store.get("nodes", "gpu-1")["metadata"]
        assert meta["labels"]["x"] == "1"
        assert meta["labels"]["keep"] == "1"
        assert "drop" not in meta["labels"]
        assert meta["annotations"]["a"] == "b"
        managers = {entry["manager"] for entry in meta.get("managedFields") or []}
        assert kube_client.FIELD_MANAGER in managers
        with pytest.raises(ApiError) as refused:
            await writer.label_node("no-such-node", {"metadata": {"labels": {"x": "1"}}})
        assert refused.value.status.code == 404
    finally:
        await client.close()


async def test_one_leader_and_takeover_after_release(sim: kubesim.Cluster) -> None:
    clients = [kube_client.connect(str(sim.kubeconfig_path)) for _ in range(2)]
    # A lease far longer than any stall of a loaded machine: only the release hands it over.
    electors = [
        LeaderElector(c, namespace="default", identity=f"op-{i}", retry_period=0.05,
                      lease_duration=DEADLINE, renew_deadline=DEADLINE / 2)
        for i, c in enumerate(clients)
    ]  # fmt: skip
    tasks = [asyncio.create_task(e.run()) for e in electors]

    def leaders() -> list[int]:
        return [i for i, e in enumerate(electors) if e.is_leader.is_set()]

    try:
        # Either may win the first election (both campaign at once).
        (first,) = await eventually(leaders, "a leader")
        standby = 1 - first
        await asyncio.sleep(0.2)  # a window in which the standby must stay standby
        assert leaders() == [first]
        await electors[first].release()
        tasks[first].cancel()
        await within(electors[standby].is_leader.wait(), "the standby to take over")
        lease = sim.store.get("leases.coordination.k8s.io", "53822513.nvidia.com", "default")
        assert lease["spec"]["holderIdentity"] == f"op-{standby}"
        assert lease["spec"]["leaseTransitions"] >= 1
    finally:
        for task in tasks:
            task.cancel()
        for client in clients:
            await client.close()


async def test_expired_lease_is_taken_over(sim: kubesim.Cluster) -> None:
    client = kube_client.connect(str(sim.kubeconfig_path))
    stale = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    sim.store.create({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "53822513.nvidia.com", "namespace": "default"},
        "spec": {"holderIdentity": "dead", "leaseDurationSeconds": 15, "renewTime": stale},
    })  # fmt: skip
    elector = LeaderElector(client, namespace="default", identity="me")
    try:
        assert await elector.try_acquire_or_renew()
    finally:
        await client.close()


async def test_work_queue_coalesces_and_requeues_dirty_keys() -> None:
    queue = WorkQueue(base_delay=0.01)
    queue.add("a")
    queue.add("a")
    queue.add("b")
    assert len(queue) == 2
    key = await queue.get()
    assert key == "a"
    queue.add("a")  # while processing: processed again after done
    assert len(queue) == 1
    queue.done("a")
    assert len(queue) == 2
    assert await queue.get() == "b"
    assert await queue.get() == "a"


async def test_work_queue_backoff_grows_and_resets() -> None:
    queue = WorkQueue(base_delay=0.01, max_delay=0.04)
    delays = [queue.retry("k") for _ in range(4)]
    assert delays == [0.01, 0.02, 0.04, 0.04]
    queue.forget("k")
    assert queue.retry("k") == 0.01
    assert await within(queue.get(), "the retried key") == "k"
