"""How soon the driver upgrade's next pass follows an event (docs/upgrades.md, "Chained and
incremental passes"): a node or pod event asks for a pass within the debounce, and a pass already
pending for later (a chained pass's follow-up, a refused patch's replan) is brought forward rather
than kept; only after a failed pass does the queue's retry backoff hold."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from gpu_operator.controller import runtime, upgrade
from gpu_operator.kube.client import AsyncClient
from gpu_operator.upgrade import snapshot, states

LATER = 30.0  # a pending pass far later than any debounce


def node(name: str, state: str) -> snapshot.Node:
    return snapshot.node_from(
        {
            "metadata": {
                "name": name,
                "uid": f"uid-{name}",
                "resourceVersion": "7",
                "labels": {states.STATE_LABEL: state},
            }
        }
    )


def reconciler() -> tuple[runtime.Runtime, upgrade.UpgradeReconciler]:
    # Nothing here reaches the API server: only the caches' event mappers and the work queue.
    rt = runtime.Runtime(cast(AsyncClient, None), runtime.Settings(namespace="gpu-operator"))
    rec = upgrade.UpgradeReconciler(rt)
    rt.register(rec)
    return rt, rec


async def next_key(rt: runtime.Runtime, within: float) -> str | None:
    try:
        return await asyncio.wait_for(rt.queue.get(), within)
    except TimeoutError:
        return None


async def test_a_node_event_brings_a_pending_later_pass_forward() -> None:
    rt, _ = reconciler()
    rt.enqueue(upgrade.KEY, LATER)  # e.g. the follow-up of a chain of passes
    old = node("gpu-1", states.UPGRADE_REQUIRED)
    rt._dispatch(upgrade.CACHE_NODES, "gpu-1", old, node("gpu-1", states.CORDON_REQUIRED))
    assert await next_key(rt, 5.0) == upgrade.KEY


async def test_a_pod_event_brings_a_pending_later_pass_forward() -> None:
    rt, _ = reconciler()
    rt.enqueue(upgrade.KEY, LATER)
    pod = snapshot.pod_from(
        {
            "metadata": {
                "name": "driver-1",
                "namespace": "gpu-operator",
                "uid": "p1",
                "labels": {"app": states.DRIVER_APP},
            },
            "spec": {"nodeName": "gpu-1", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running"},
        }
    )
    rt._dispatch(upgrade.CACHE_PODS, "gpu-operator/driver-1", None, pod)
    assert await next_key(rt, 5.0) == upgrade.KEY


async def test_after_a_failed_pass_the_retry_backoff_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rt, rec = reconciler()

    async def failing(key: str) -> None:
        raise RuntimeError("the API server is down")

    async def nothing() -> None:
        return None

    monkeypatch.setattr(rec, "_watch_claims", nothing)
    monkeypatch.setattr(rec, "_passes", failing)
    with pytest.raises(RuntimeError):
        await rec.reconcile(upgrade.KEY)
    rt.enqueue(upgrade.KEY, LATER)  # the retry's backoff
    old = node("gpu-1", states.UPGRADE_REQUIRED)
    rt._dispatch(upgrade.CACHE_NODES, "gpu-1", old, node("gpu-1", states.CORDON_REQUIRED))
    assert await next_key(rt, 0.5) is None

    # A pass that succeeds ends the backoff: events bring passes forward again.
    async def fine(key: str) -> None:
        return None

    monkeypatch.setattr(rec, "_passes", fine)
    await rec.reconcile(upgrade.KEY)
    rt._dispatch(upgrade.CACHE_NODES, "gpu-1", old, node("gpu-1", states.DRAIN_REQUIRED))
    assert await next_key(rt, 5.0) == upgrade.KEY
