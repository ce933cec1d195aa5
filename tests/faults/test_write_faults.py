"""Rejected writes: the ClusterPolicy status says so at once, with an Event, and retries."""

from __future__ import annotations

from typing import Any

from kubesim_helpers import kubectl, needs_kubectl
from operator_harness import NAMESPACE, Env, policy

POLICIES = "clusterpolicies.nvidia.com"


def state_of(env: Env, name: str) -> dict[str, Any]:
    states = (env.policy().get("status") or {}).get("states") or []
    return next((s for s in states if s["name"] == name), {})


def events(env: Env, reason: str) -> list[dict[str, Any]]:
    # Events about the cluster-scoped ClusterPolicy go to `default`, as client-go records them.
    found = env.sim.store.list("events", namespace="default")
    return [e for e in found if e.get("reason") == reason]


async def test_rejected_daemonset_write_fails_the_state_at_the_first_refusal(env: Env) -> None:
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    faults = env.sim.faults

    def failed() -> bool:
        return state_of(env, "state-dcgm-exporter").get("state") == "failed"

    rule = faults.add(verb="patch", resource="daemonsets.apps", code=403)
    # "At once" without a clock: how many writes had been refused when the status first said
    # failed, seen synchronously as the status is committed (retries back off; the first says).
    refused_when_failed: list[int] = []

    def record(_event: Any) -> None:
        if not refused_when_failed and failed():
            refused_when_failed.append(faults.injected)

    unsubscribe = env.sim.store.subscribe(record)
    env.sim.store.patch(
        POLICIES, "cluster-policy",
        {"spec": {"dcgmExporter": {"env": [{"name": "DCGM_EXPORTER_DEBUG", "value": "1"}]}}},
    )  # fmt: skip

    await env.wait(failed, "state-dcgm-exporter failed")
    unsubscribe()
    assert refused_when_failed == [1]
    status = env.policy()["status"]
    assert status["state"] == "notReady"
    message = state_of(env, "state-dcgm-exporter")["message"]
    assert "nvidia-dcgm-exporter" in message, message
    assert "injected fault" in message, message
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"
    assert "injected fault" in ready["message"]
    await env.wait(lambda: bool(events(env, "StateFailed")), "a StateFailed Event")
    # Retried with backoff while the API server refuses: more than one attempt, not a hot loop.
    seen = faults.injected
    await env.wait(lambda: faults.injected >= seen + 2, "the write retried")
    faults.remove(rule)
    await env.wait_ready()
    exporter = env.daemonsets()["nvidia-dcgm-exporter"]
    env_vars = exporter["spec"]["template"]["spec"]["containers"][0].get("env") or []
    assert {"name": "DCGM_EXPORTER_DEBUG", "value": "1"} in env_vars


async def test_deleted_operator_namespace_is_reported_not_ready(env: Env) -> None:
    # The chart's ServiceAccount goes with the namespace: an operator running on other
    # credentials (the admin's here) is what keeps trying to write into it.
    env.kubeconfig = env.sim.kubeconfig_path
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    env.sim.store.delete("namespaces", NAMESPACE)
    env.sim.store.patch(
        POLICIES, "cluster-policy", {"spec": {"gfd": {"env": [{"name": "X", "value": "1"}]}}}
    )
    await env.wait(
        lambda: (env.policy().get("status") or {}).get("state") == "notReady",
        "policy notReady after its namespace went",
    )
    message = state_of(env, "gpu-feature-discovery").get("message", "")
    assert NAMESPACE in message or "not found" in message.lower(), message


@needs_kubectl
async def test_state_failed_event_outlives_the_deleted_operator_namespace(env: Env) -> None:
    # Events about the ClusterPolicy are recorded in `default` (client-go's rule for
    # cluster-scoped objects), so the failure stays visible once the operator's namespace is gone.
    env.kubeconfig = env.sim.kubeconfig_path
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    env.sim.store.delete("namespaces", NAMESPACE)
    env.sim.store.patch(
        POLICIES, "cluster-policy", {"spec": {"gfd": {"env": [{"name": "X", "value": "2"}]}}}
    )

    def about_the_policy() -> list[dict[str, Any]]:
        return [
            e for e in events(env, "StateFailed") if e["involvedObject"]["kind"] == "ClusterPolicy"
        ]

    await env.wait(lambda: bool(about_the_policy()), "a StateFailed Event in default")
    event = about_the_policy()[0]
    assert event["involvedObject"]["name"] == "cluster-policy"
    assert event["type"] == "Warning"
    # Which state's write fails first varies; each says the namespace is gone.
    assert f'namespaces "{NAMESPACE}" not found' in event["message"], event["message"]
    # What a user sees: the Event under the ClusterPolicy, and in `default`.
    described = await kubectl(env.sim, "describe", "clusterpolicy", "cluster-policy")
    assert "StateFailed" in described, described
    listed = await kubectl(
        env.sim, "get", "events", "-n", "default", "--field-selector", "reason=StateFailed"
    )
    assert "clusterpolicy/cluster-policy" in listed, listed
