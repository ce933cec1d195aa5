"""Event-driven passes are spaced by what a pass costs (issue 32): at thousands of nodes a
ClusterPolicy status pass or a driver-upgrade plan reads every node and pod, and a rollout's
events asked for them back to back, keeping a core busy. A cheap pass keeps the configured
debounce; an expensive one waits about its own duration (bounded) before the next."""

from __future__ import annotations

import time
from typing import Any

import pytest
from operator_harness import Env, policy

from gpu_operator.controller import upgrade
from gpu_operator.controller.runtime import Request
from gpu_operator.upgrade import planner


async def test_status_passes_wait_about_as_long_as_the_last_pass_took(env: Env) -> None:
    env.sim.store.create(policy())
    operator = env.start_operator(status_debounce=0.2, status_write_interval=1.0)
    await env.wait_ready()
    reconciler = operator.policy
    # On a three-node cluster a pass takes milliseconds: the configured debounce.
    assert reconciler._on_status("pod", {"a": 1}, {"a": 2}) == (Request("policy", 0.2),)
    reconciler._space_passes(0.6)
    assert reconciler._on_status("pod", {"a": 1}, {"a": 2}) == (Request("policy", 0.6),)
    # Never longer than the status write window: the status stays as fresh as it is written.
    reconciler._space_passes(7.0)
    assert reconciler._on_status("pod", {"a": 1}, {"a": 2}) == (Request("policy", 1.0),)
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

    def slow(snap: Any) -> Any:
        time.sleep(0.2)  # a plan over a large fleet
        return real(snap)

    monkeypatch.setattr(planner, "plan", slow)
    await reconciler.reconcile(upgrade.KEY)
    after = reconciler._always("x", 1, 2)[0].after
    assert upgrade.PASS_SPACING * 0.2 <= after <= upgrade.MAX_SPACING_SECONDS
    monkeypatch.setattr(planner, "plan", real)
    await reconciler.reconcile(upgrade.KEY)
    # A plan of three nodes is cheap again: the spacing comes back down.
    assert reconciler._always("x", 1, 2)[0].after < upgrade.PASS_SPACING * 0.2
