"""State loss seen from the watch streams, and Lease renewal by PUT alone (issue 32).

The operator's steady state sends nothing but Lease renewals: the API server going back in time
(an etcd restore) is noticed from watch bookmarks and from relists, not from a list a second."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from waiting import eventually

import kubesim
from gpu_operator.kube import client as kube_client
from gpu_operator.kube import resources
from gpu_operator.kube.cache import Informer
from gpu_operator.kube.leader import LEASE_NAME, LeaderElector

LEASES = "leases.coordination.k8s.io"


def configmap(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default"},
        "data": {"k": name},
    }


@contextlib.asynccontextmanager
async def run_informer(sim: kubesim.Cluster, losses: list[str]) -> AsyncIterator[Informer]:
    client = kube_client.connect(str(sim.kubeconfig_path))
    informer = Informer(
        client,
        resources.resource("v1", "ConfigMap"),
        namespace="default",
        on_state_lost=lambda _informer, how: losses.append(how),
    )
    task = asyncio.create_task(informer.run())
    try:
        yield informer
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()


async def test_a_bookmark_older_than_what_the_cache_saw_is_state_loss() -> None:
    # A restore ends every watch; the informer resumes from a version the server no longer
    # has, where no event ever comes: only the bookmark's older resourceVersion tells.
    async with kubesim.Cluster(bookmark_interval=0.2) as sim:
        sim.store.create(configmap("kept"))
        backup = sim.faults.snapshot()
        losses: list[str] = []
        async with run_informer(sim, losses) as informer:
            await informer.synced.wait()
            sim.store.create(configmap("after-backup"))
            await eventually(lambda: informer.get("after-backup", "default") is not None, "event")
            await eventually(lambda: informer.bookmarks > 0, "a bookmark")
            sim.faults.restore_snapshot(backup)
            await eventually(lambda: losses, "the state loss noticed")
            assert "bookmark" in losses[0]
            await eventually(
                lambda: informer.get("after-backup", "default") is None, "the cache relisted"
            )
            assert informer.get("kept", "default") is not None


async def test_a_relist_after_a_failed_watch_compares_resource_versions() -> None:
    # No bookmarks within the test: the failed watch's relist is what must notice.
    async with kubesim.Cluster(bookmark_interval=3600) as sim:
        sim.store.create(configmap("kept"))
        backup = sim.faults.snapshot()
        losses: list[str] = []
        async with run_informer(sim, losses) as informer:
            await informer.synced.wait()
            sim.store.create(configmap("after-backup"))
            await eventually(lambda: informer.get("after-backup", "default") is not None, "event")
            sim.faults.add(verb="watch", resource="configmaps", code=500, count=1)
            sim.faults.restore_snapshot(backup)
            await eventually(lambda: losses, "the state loss noticed")
            assert "relist" in losses[0]
            await eventually(
                lambda: informer.get("after-backup", "default") is None, "the cache relisted"
            )


async def test_an_ordinary_relist_is_not_state_loss() -> None:
    async with kubesim.Cluster(bookmark_interval=0.2) as sim:
        losses: list[str] = []
        async with run_informer(sim, losses) as informer:
            await informer.synced.wait()
            for index in range(5):
                sim.store.create(configmap(f"cm-{index}"))
            sim.faults.add(verb="watch", resource="configmaps", code=500, count=1)
            sim.store.close_watches()
            await eventually(lambda: informer.relists >= 2, "a relist")
            await eventually(lambda: informer.bookmarks >= 2, "bookmarks after it")
            assert informer.get("cm-4", "default") is not None
            assert losses == []


@pytest.fixture
async def sim() -> AsyncIterator[kubesim.Cluster]:
    async with kubesim.Cluster() as cluster:
        yield cluster


async def test_a_leader_renews_with_one_put_and_no_get(sim: kubesim.Cluster) -> None:
    client = kube_client.connect(str(sim.kubeconfig_path))
    elector = LeaderElector(client, namespace="default", identity="me")
    try:
        assert await elector.try_acquire_or_renew()  # GET (404) + create
        acquired = sim.store.get(LEASES, LEASE_NAME, "default")["spec"]
        before = sim.stats.snapshot()
        for _ in range(5):
            assert await elector.try_acquire_or_renew()
        assert sim.stats.since(before) == {("update", LEASES): 5}
        lease = sim.store.get(LEASES, LEASE_NAME, "default")
        assert lease["spec"]["holderIdentity"] == "me"
        assert lease["spec"]["leaseTransitions"] == acquired["leaseTransitions"]
        assert lease["spec"]["acquireTime"] == acquired["acquireTime"]
        assert lease["spec"]["renewTime"] > acquired["renewTime"]
    finally:
        await client.close()


async def test_a_conflicting_renewal_falls_back_to_get_and_put(sim: kubesim.Cluster) -> None:
    client = kube_client.connect(str(sim.kubeconfig_path))
    elector = LeaderElector(client, namespace="default", identity="me")
    try:
        assert await elector.try_acquire_or_renew()
        # Someone else touched the Lease (still ours): the cached copy is stale.
        sim.store.patch(LEASES, LEASE_NAME, {"metadata": {"labels": {"x": "y"}}}, "default")
        before = sim.stats.snapshot()
        assert await elector.try_acquire_or_renew()
        assert sim.stats.since(before) == {("update", LEASES): 2, ("get", LEASES): 1}
        before = sim.stats.snapshot()
        assert await elector.try_acquire_or_renew()
        assert sim.stats.since(before) == {("update", LEASES): 1}
    finally:
        await client.close()


async def test_a_lease_taken_by_another_holder_is_not_renewed(sim: kubesim.Cluster) -> None:
    client = kube_client.connect(str(sim.kubeconfig_path))
    elector = LeaderElector(client, namespace="default", identity="me")
    try:
        assert await elector.try_acquire_or_renew()
        lease = sim.store.get(LEASES, LEASE_NAME, "default")
        spec = {**lease["spec"], "holderIdentity": "other"}
        sim.store.patch(LEASES, LEASE_NAME, {"spec": spec}, "default")
        assert not await elector.try_acquire_or_renew()
        assert not elector.holds_fresh_lease()
        assert sim.store.get(LEASES, LEASE_NAME, "default")["spec"]["holderIdentity"] == "other"
    finally:
        await client.close()
