"""The counters check of the driver upgrade (docs/upgrades.md, "Chained and incremental
passes"): every full pass compares the per-policy counters the incremental passes kept with its
own and warns `driver upgrade counts of ... were off; corrected` where they differ. That warning
means a bookkeeping bug, so an ordinary rollout must never log it: not at start-up, not after the
policy change that starts the rollout, not on a full pass that starts a waiting node, and not on
the periodic safety-net passes (here asked for again and again while the runtime's own passes run).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

import pytest
from operator_harness import NAMESPACE, Env, gpu_node, policy
from waiting import DEADLINE

from gpu_operator.controller import upgrade
from gpu_operator.upgrade import actions, states

NODES = ["gpu-1", "gpu-2", "gpu-3"]
VERSION = "580.105.08"


def state(env: Env, name: str) -> str:
    return str(env.node_labels(name).get(states.STATE_LABEL, ""))


def upgraded(env: Env) -> bool:
    pods = env.sim.store.list(
        "pods", namespace=NAMESPACE, label_selector="app=nvidia-driver-daemonset"
    )
    images = {
        p["spec"]["nodeName"]: c["image"]
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        for c in p["spec"]["containers"]
        if c["name"] == "nvidia-driver-ctr"
    }
    return all(VERSION in images.get(n, "") for n in NODES) and all(
        state(env, n) == states.UPGRADE_DONE for n in NODES
    )


async def test_a_small_rollout_never_finds_the_upgrade_counts_off(
    env: Env, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.WARNING, logger=upgrade.__name__)
    gpu_node(env.sim, "gpu-3")
    body = policy()
    body["spec"]["driver"]["upgradePolicy"] = {
        "autoUpgrade": True,
        "maxParallelUpgrades": 1,
        "maxUnavailable": 1,
    }
    env.sim.store.create(body)
    operator = env.start_operator()
    reconciler = operator.upgrade
    # Every full pass's check: (compared at all, the policies it found off).
    checks: list[tuple[bool, list[str]]] = []
    reset = reconciler.fleet.reset

    def recorded(
        plan: actions.Plan, now: float, pending: Iterable[str] = (), *, check: bool = True
    ) -> list[str]:
        compared = reconciler.fleet.ready and check
        drift = reset(plan, now, pending, check=check)
        checks.append((compared, drift))
        return drift

    monkeypatch.setattr(reconciler.fleet, "reset", recorded)
    await env.wait(
        lambda: all(state(env, n) == states.UPGRADE_DONE for n in NODES), "upgrade-done", DEADLINE
    )
    await env.wait_ready()

    # The rollout, one node at a time, with safety-net passes asked for throughout.
    env.sim.store.patch(
        "clusterpolicies.nvidia.com", "cluster-policy", {"spec": {"driver": {"version": VERSION}}}
    )
    busy: list[Any] = []

    async def resync() -> None:
        while True:
            busy.extend(n for n in NODES if state(env, n) not in states.IDLE)
            await reconciler.reconcile(upgrade.RESYNC_KEY)
            await asyncio.sleep(0.02)

    task = asyncio.create_task(resync())
    try:
        await env.wait(lambda: upgraded(env), "every node upgraded", DEADLINE)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    assert busy, "the rollout was seen under way"
    assert sum(compared for compared, _ in checks) >= 3, checks  # the check did run
    assert [drift for _, drift in checks if drift] == []
    assert reconciler.drifts == 0
    assert [r.getMessage() for r in caplog.records if "were off" in r.getMessage()] == []
