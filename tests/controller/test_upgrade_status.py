"""What a driver upgrade shows while it runs (issue 30, items 5 and 6): a planned upgrade is
progress, not an error (Ready=False DriverUpgradeInProgress, Error=False), a failure during it is
an error naming the node; each node's upgrade start is one Event, and a state's StateReady Event
is recorded once per transition, however many nodes the upgrade flaps it on. Counted as a user
sees them: `kubectl get events`, each Event's `count` included."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from kubesim_helpers import kubectl, needs_kubectl
from operator_harness import Env, gpu_node, policy
from waiting import DEADLINE

from gpu_operator.status import conditions
from gpu_operator.upgrade import states
from kubesim import PodContext
from kubesim.store import Event

NODES = ["gpu-1", "gpu-2", "gpu-3"]
POLICY = "clusterpolicies.nvidia.com"
VALIDATION = "state-operator-validation"


def state(env: Env, name: str) -> str:
    return str(env.node_labels(name).get(states.STATE_LABEL, ""))


def conditions_of(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type"): c for c in status.get("conditions") or []}


def state_outcome(env: Env, name: str) -> str | None:
    states_ = (env.policy().get("status") or {}).get("states") or []
    return next((s.get("state") for s in states_ if s.get("name") == name), None)


class StatusLog:
    """Every ClusterPolicy status the API server stored, as (Ready, Error) condition pairs."""

    def __init__(self) -> None:
        self.seen: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def record(self, event: Event) -> None:
        found = conditions_of(event.new.obj.get("status") or {})
        if "Ready" in found and "Error" in found:
            self.seen.append((found["Ready"], found["Error"]))

    def errors(self) -> list[dict[str, Any]]:
        return [error for _, error in self.seen if error.get("status") == "True"]


async def event_counts(env: Env, *selector: str) -> Counter[tuple[str, str]]:
    """(object, message) -> how often it happened, as `kubectl get events` reports it: the sum of
    the matching Events' counts (a recorder that aggregates repeats bumps `count`)."""
    out = await kubectl(
        env.sim, "get", "events", "-n", "default", "--field-selector", ",".join(selector),
        "-o", "json",
    )  # fmt: skip
    counts: Counter[tuple[str, str]] = Counter()
    for item in json.loads(out)["items"]:
        key = (item["involvedObject"]["name"], item["message"])
        counts[key] += int(item.get("count") or 1)
    return counts


async def install(env: Env, upgrade_policy: dict[str, Any]) -> None:
    gpu_node(env.sim, "gpu-3")
    body = policy()
    body["spec"]["driver"]["upgradePolicy"] = upgrade_policy
    env.sim.store.create(body)
    env.start_operator()
    await env.wait(
        lambda: all(state(env, n) == states.UPGRADE_DONE for n in NODES), "upgrade-done", DEADLINE
    )
    await env.wait_ready()


def change_driver_version(env: Env) -> None:
    env.sim.store.patch(POLICY, "cluster-policy", {"spec": {"driver": {"version": "580.105.08"}}})


@needs_kubectl
async def test_a_planned_driver_upgrade_is_progress_with_one_event_per_node_and_transition(
    env: Env,
) -> None:
    await install(env, {"autoUpgrade": True, "maxParallelUpgrades": 1, "maxUnavailable": 1})
    before = await event_counts(env, "involvedObject.name=cluster-policy", "reason=StateReady")

    # Each node's new validator waits (its driver check) until the test lets it pass, and only
    # after the operator has reported the validation state not ready: every node the upgrade
    # reaches flaps that state, visibly.
    gated: set[str] = set()
    released: set[str] = set()

    async def driver_validation(ctx: PodContext) -> int:
        gated.add(ctx.node_name)
        await env.sim.wait_for(
            lambda: ctx.node_name in released, timeout=DEADLINE, message=f"{ctx.node_name} freed"
        )
        return 0

    env.sim.register_pod_runner(
        driver_validation,
        label_selector="app=nvidia-operator-validator",
        container="driver-validation",
    )

    # The first node patch after every node is queued is refused once with a conflict, as the
    # API server refuses a patch guarded by a resourceVersion someone else's write made stale.
    conflict: list[bool] = []
    queued: dict[str, str] = {}

    def refuse_once(event: Event) -> None:
        node = event.new.obj["metadata"]
        queued[node["name"]] = (node.get("labels") or {}).get(states.STATE_LABEL, "")
        if not conflict and all(queued.get(n) == states.UPGRADE_REQUIRED for n in NODES):
            conflict.append(True)
            env.sim.faults.add(verb="patch", resource="nodes", code=409, count=1)

    statuses = StatusLog()
    unsubscribe = [
        env.sim.store.subscribe(statuses.record, keys=[("nvidia.com", "clusterpolicies")]),
        env.sim.store.subscribe(refuse_once, keys=[("", "nodes")]),
    ]
    try:
        change_driver_version(env)

        def step() -> bool:
            for name in gated - released:
                if state_outcome(env, VALIDATION) == "notReady":
                    released.add(name)
            done = released == set(NODES) and all(
                state(env, n) == states.UPGRADE_DONE for n in NODES
            )
            return done and (env.policy().get("status") or {}).get("state") == "ready"

        await env.wait(step, "every node upgraded and the policy ready again", DEADLINE)
    finally:
        for stop in unsubscribe:
            stop()

    assert conflict, "the rollout never queued every node"
    assert env.sim.faults.injected >= 1
    # Planned work all along: not ready with a progress reason, never an error.
    assert statuses.errors() == [], statuses.errors()[:3]
    progress = [r for r, _ in statuses.seen if r.get("status") == "False"]
    assert progress, statuses.seen
    assert {r["reason"] for r in progress} == {conditions.DRIVER_UPGRADE_IN_PROGRESS}, progress
    assert any("upgrading the driver on 1/3 node(s)" in r["message"] for r in progress), progress
    # One start Event per node, the conflicted start included.
    upgrades = await event_counts(env, f"reason={states.EVENT_REASON}")
    for name in NODES:
        started = {m: c for (n, m), c in upgrades.items() if n == name and "upgrade started" in m}
        assert sum(started.values()) == 1, (name, upgrades)
    # One StateReady per state and transition: the driver and the validation state were each
    # not ready during the upgrade (on every node, for the validation) and ready after it.
    after = await event_counts(env, "involvedObject.name=cluster-policy", "reason=StateReady")
    recorded = after - before
    for name in ("state-driver", VALIDATION):
        assert recorded[("cluster-policy", f"{name} is ready")] == 1, recorded


async def test_a_node_failing_its_upgrade_is_an_error_naming_the_node(env: Env) -> None:
    """The rollout is progress until a node fails; then Error=True says which node and why."""
    env.sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    labels = {"app": "critical"}
    env.sim.store.create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "critical", "namespace": "ml"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": "gpu-2"},
                        "containers": [{
                            "name": "main", "image": "nvcr.io/nvidia/cuda:13.0.0-base-ubuntu22.04",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }],
                    },
                },
            },
        }
    )  # fmt: skip
    env.sim.store.create(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "critical", "namespace": "ml"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}},
        }
    )
    await install(
        env,
        {
            "autoUpgrade": True,
            "maxParallelUpgrades": 3,
            "maxUnavailable": "100%",
            "podDeletion": {"timeoutSeconds": 2},
        },
    )
    for name in NODES:
        env.sim.store.patch(
            "nodes", name, {"status": {"capacity": {"nvidia.com/gpu": "1"},
                                       "allocatable": {"nvidia.com/gpu": "1"}}}, status=True,
        )  # fmt: skip

    def critical_runs() -> bool:
        pods = env.sim.store.list("pods", namespace="ml")
        return any(p["status"].get("phase") == "Running" for p in pods)

    await env.wait(critical_runs, "the PDB-protected pod runs on gpu-2")
    change_driver_version(env)
    await env.wait(lambda: state(env, "gpu-2") == states.UPGRADE_FAILED, "gpu-2 fails", DEADLINE)

    def error() -> dict[str, Any]:
        return conditions_of(env.policy().get("status") or {}).get("Error") or {}

    await env.wait(lambda: error().get("status") == "True", "Error=True")
    found = error()
    assert found["reason"] == conditions.DRIVER_NOT_READY, found
    assert "driver upgrade failed on gpu-2" in found["message"], found
    assert "PodDisruptionBudget ml/critical" in found["message"], found
    ready = conditions_of(env.policy()["status"])["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "Error")


async def test_an_nvidiadriver_upgrade_is_progress_on_the_nvidiadriver_too(env: Env) -> None:
    """Same for an NVIDIADriver: its nodes' upgrade is progress in its own status, and the
    ClusterPolicy's operands restarting on those nodes are no error either."""
    gpu_node(env.sim, "gpu-3")
    driver = {"repository": "nvcr.io/nvidia", "image": "driver", "version": "580.95.05"}
    env.sim.store.create(policy(driver={**driver, "useNvidiaDriverCRD": True}))
    env.sim.store.create(
        {
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "NVIDIADriver",
            "metadata": {"name": "default"},
            "spec": {
                "default": True, "driverType": "gpu", **driver,
                "upgradePolicy": {"autoUpgrade": True, "maxParallelUpgrades": 1},
            },
        }
    )  # fmt: skip
    env.start_operator()

    def nvd_status() -> dict[str, Any]:
        found = env.sim.store.get("nvidiadrivers.nvidia.com", "default")
        return (found or {}).get("status") or {}

    await env.wait(
        lambda: all(state(env, n) == states.UPGRADE_DONE for n in NODES), "upgrade-done", DEADLINE
    )
    await env.wait(lambda: nvd_status().get("state") == "ready", "the NVIDIADriver ready")
    await env.wait_ready()
    statuses, policy_statuses = StatusLog(), StatusLog()
    stops = [
        env.sim.store.subscribe(statuses.record, keys=[("nvidia.com", "nvidiadrivers")]),
        # The ClusterPolicy's operands restart on the nodes too (the validator re-runs there).
        env.sim.store.subscribe(policy_statuses.record, keys=[("nvidia.com", "clusterpolicies")]),
    ]
    try:
        env.sim.store.patch(
            "nvidiadrivers.nvidia.com", "default", {"spec": {"version": "580.105.08"}}
        )
        await env.wait(
            lambda: any(r.get("status") == "False" for r, _ in statuses.seen), "not ready"
        )

        def upgraded() -> bool:
            done = all(state(env, n) == states.UPGRADE_DONE for n in NODES)
            policy_ready = (env.policy().get("status") or {}).get("state") == "ready"
            return done and policy_ready and nvd_status().get("state") == "ready"

        await env.wait(upgraded, "every node upgraded, both objects ready", DEADLINE)
    finally:
        for stop in stops:
            stop()
    assert statuses.errors() == [], statuses.errors()[:3]
    assert policy_statuses.errors() == [], policy_statuses.errors()[:3]
    reasons = {r["reason"] for r, _ in statuses.seen if r.get("status") == "False"}
    assert reasons == {conditions.DRIVER_UPGRADE_IN_PROGRESS}, statuses.seen
