"""The caches list in pages of LIST_PAGE_SIZE (limit/continue), as client-go's reflector does
(issue 32): a 20,000-node list answered whole made the operator hold every raw node at once, and
its peak memory passed 400 MB before any work began."""

from __future__ import annotations

import asyncio
from typing import Any

from waiting import eventually

import kubesim
from gpu_operator.kube import client as kube_client
from gpu_operator.kube import resources
from gpu_operator.kube.cache import LIST_PAGE_SIZE, Informer


def configmap(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default"},
        "data": {"k": name},
    }


async def test_a_big_list_comes_in_pages_and_the_watch_follows_it() -> None:
    async with kubesim.Cluster() as sim:
        count = 2 * LIST_PAGE_SIZE + 1
        for index in range(count):
            sim.store.create(configmap(f"cm-{index:05d}"))
        client = kube_client.connect(str(sim.kubeconfig_path))
        informer = Informer(client, resources.resource("v1", "ConfigMap"), namespace="default")
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 60)
            # Every object exactly once, from three requests (two full pages and the rest).
            assert sorted(informer.objects) == [f"default/cm-{i:05d}" for i in range(count)]
            assert sim.stats.count("list", "configmaps") == 3
            # The watch starts from the list's resourceVersion: a later change arrives.
            sim.store.create(configmap("after"))
            await eventually(
                lambda: informer.get("after", "default") is not None, "the new ConfigMap cached"
            )
            sim.store.delete("configmaps", "cm-00000", "default")
            await eventually(
                lambda: informer.get("cm-00000", "default") is None, "the deletion seen"
            )
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()
