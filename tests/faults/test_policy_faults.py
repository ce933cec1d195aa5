"""Faults around the ClusterPolicy itself: several at once, invalid and hostile ones."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from operator_harness import Env, policy


async def test_three_policies_created_at_once_log_no_exception(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    faults = env.sim.faults
    before = faults.before

    def named(name: str) -> dict[str, Any]:
        body = policy()
        body["metadata"]["name"] = name
        return body

    async def third_arrives_mid_pass(verb: str, resource: str) -> None:
        # The third policy appears while the operator writes another one's status: exactly
        # when it walks its cache of policies.
        if (
            resource == "clusterpolicies.nvidia.com/status"
            and env.sim.store.get("clusterpolicies.nvidia.com", "policy-c") is None
        ):
            env.sim.store.create(named("policy-c"))
            policies = env.operator.runtime.caches["clusterpolicies"].objects
            await env.wait(lambda: "policy-c" in policies, "the operator saw policy-c")
        await before(verb, resource)

    faults.before = third_arrives_mid_pass  # type: ignore[method-assign]
    env.sim.store.create(named("policy-a"))
    env.sim.store.create(named("policy-b"))
    env.start_operator()

    names = ("policy-a", "policy-b", "policy-c")

    def settled() -> bool:
        found = (env.sim.store.get("clusterpolicies.nvidia.com", n) for n in names)
        states = [((p or {}).get("status") or {}).get("state") for p in found]
        return states.count("ignored") == 2 and "ready" in states

    await env.wait(settled, "one policy ready, two ignored")
    failures = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert not failures, failures


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": "x"}
    for _ in range(depth):
        value = {"n": value}
    return value


# 1,000 levels is what the report found; the real server stores up to 10,000 (kubesim too).
@pytest.mark.parametrize("depth", [1_000, 5_000])
async def test_deeply_nested_policy_is_invalid_and_the_watch_lives_on(env: Env, depth: int) -> None:
    hostile = policy(kataManager={"enabled": False, "config": nested(depth)})
    hostile["metadata"]["name"] = "hostile"
    env.sim.store.create(hostile)
    env.start_operator()

    def invalid() -> bool:
        status = env.sim.store.get("clusterpolicies.nvidia.com", "hostile") or {}
        conditions = (status.get("status") or {}).get("conditions") or []
        return any(c.get("reason") == "InvalidSpec" for c in conditions)

    await env.wait(invalid, "the nested policy reported InvalidSpec")
    status = env.sim.store.get("clusterpolicies.nvidia.com", "hostile")
    assert status is not None
    ready = next(c for c in status["status"]["conditions"] if c["type"] == "Ready")
    assert "kataManager.config" in ready["message"], ready
    assert "nest" in ready["message"], ready
    # The watch still works: replacing the hostile policy with a sane one converges.
    env.sim.store.delete("clusterpolicies.nvidia.com", "hostile")
    env.sim.store.create(policy())
    await env.wait_ready()


async def test_invalid_policy_says_its_states_were_not_evaluated(env: Env) -> None:
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    names = {s["name"] for s in env.policy()["status"]["states"]}
    env.sim.store.patch(
        "clusterpolicies.nvidia.com", "cluster-policy",
        {"spec": {"driver": {"upgradePolicy": {"maxUnavailable": "lots"}}}},
    )  # fmt: skip

    def not_evaluated() -> bool:
        states = (env.policy().get("status") or {}).get("states") or []
        return bool(states) and all("not evaluated" in s.get("message", "") for s in states)

    await env.wait(not_evaluated, "every state marked not evaluated")
    states = env.policy()["status"]["states"]
    assert {s["name"] for s in states} == names
    assert {s["state"] for s in states} == {"notReady"}
    assert "InvalidSpec" in states[0]["message"]
