"""Event-driven passes are spaced by what a pass costs (issue 32): at thousands of nodes a
ClusterPolicy status pass or a driver-upgrade plan reads every node and pod, and a rollout's
events asked for them back to back, keeping a core busy. A cheap pass keeps the configured
debounce; an expensive one waits a few times its own duration (bounded) before the next."""

from __future__ import annotations

import time
from typing import Any

import pytest
from operator_harness import NAMESPACE, Env, policy

from gpu_operator.controller import clusterpolicy, upgrade
from gpu_operator.controller.runtime import Request
from gpu_operator.upgrade import planner


async def test_status_passes_wait_three_times_as_long_as_the_last_pass_took(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.sim.store.create(policy())
    operator = env.start_operator(status_debounce=0.2, status_write_interval=1.0)
    await env.wait_ready()
    reconciler = operator.policy
    longest = max(clusterpolicy.MAX_STATUS_SPACING, 1.0)

    def spacing_after(took: float) -> float:
        return max(0.2, min(clusterpolicy.STATUS_PASS_SPACING * took, longest))

    # A real pass (asked for by a pod event) leaves a debounce of three times its own cost, at
    # least the configured one: stated as that relation, so it holds on any machine, however
    # long the pass took under load.
    took: list[float] = []
    space = reconciler._space_passes

    def measured(seconds: float) -> None:
        took.append(seconds)
        space(seconds)

    monkeypatch.setattr(reconciler, "_space_passes", measured)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": NAMESPACE},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip
    env.sim.store.create(pod)
    await env.wait(lambda: bool(took), "a status pass after the pod event")
    assert reconciler._on_status("pod", {"a": 1}, {"a": 2}) == (
        Request("policy", spacing_after(took[-1])),
    )
    # A pass of a millisecond (a three-node cluster on an idle machine) keeps the debounce.
    reconciler._space_passes(0.001)
    assert reconciler._on_status("pod", {"a": 1}, {"a": 2}) == (Request("policy", 0.2),)
    # A pass of 0.25 s waits three times that: a pass's cost stays at most a quarter of a core.
    reconciler._space_passes(0.25)
    assert reconciler._on_status("pod", {"a": 1}, {"a": 2}) == (Request("policy", 0.75),)
    # Never longer than the longest spacing: the status lags a change by at most that.
    reconciler._space_passes(70.0)
    assert reconciler._on_status("pod", {"a": 1}, {"a": 2}) == (Request("policy", longest),)
    # A ClusterPolicy edit is still reconciled at once.
    old = env.policy()
    new = {**old, "spec": {**old["spec"], "gfd": {"enabled": False}}}
    assert reconciler._on_policy("cluster-policy", old, new) == [Request("policy")]
    reconciler._space_passes(0.001)
    assert reconciler._on_status("pod", {"a": 1}, {"a": 2}) == (Request("policy", 0.2),)


async def test_upgrade_plans_are_spaced_by_their_cost(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.sim.store.create(policy())
    operator = env.start_operator()
    await env.wait_ready()
    reconciler = operator.upgrade
    real = planner.plan

    def slow(snap: Any, **options: Any) -> Any:
        time.sleep(0.2)  # a plan over a large fleet
        return real(snap, **options)

    monkeypatch.setattr(planner, "plan", slow)
    # Events ask the queue for a pass within a delay (a pending later pass is brought forward):
    # record the delays asked for.
    asked: list[float] = []
    enqueue_within = reconciler.rt.enqueue_within

    def record(key: str, delay: float) -> None:
        asked.append(delay)
        enqueue_within(key, delay)

    monkeypatch.setattr(reconciler.rt, "enqueue_within", record)

    def requested_delay() -> float:
        asked.clear()
        assert reconciler._always("x", 1, 2) == []
        assert len(asked) == 1
        return asked[0]

    # A DaemonSet (or policy, revision, budget) event asks for a full pass over the fleet; its
    # cost spaces the next full pass.
    requested_delay()
    await reconciler.reconcile(upgrade.KEY)
    after = requested_delay()
    assert upgrade.PASS_SPACING * 0.2 <= after <= upgrade.MAX_SPACING_SECONDS
    monkeypatch.setattr(planner, "plan", real)
    await reconciler.reconcile(upgrade.KEY)
    # A plan of three nodes is cheap again: the spacing comes back down.
    assert requested_delay() < upgrade.PASS_SPACING * 0.2
