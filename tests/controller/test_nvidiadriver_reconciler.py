"""The NVIDIADriver reconciler on kubesim, running under the chart's RBAC: pools, ownership,
conflicts, version checks and the hand-over from the ClusterPolicy."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from operator_harness import NAMESPACE, Env, gpu_node, policy
from waiting import DEADLINE

from gpu_operator.api import keys

NVD = "nvidiadrivers.nvidia.com"
DRIVER = {"repository": "nvcr.io/nvidia", "image": "driver", "version": "580.95.05"}
CRD_MODE = {**DRIVER, "useNvidiaDriverCRD": True}
HOPPER = {"nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0"}


def nvidiadriver(name: str, **spec: Any) -> dict[str, Any]:
    # The CRD's required fields are given although they have defaults: kubesim does not apply
    # CRD schema defaults before its required check (the real API server does).
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "NVIDIADriver",
        "metadata": {"name": name},
        "spec": {"default": False, "driverType": "gpu", **copy.deepcopy(DRIVER), **spec},
    }


def status(env: Env, name: str) -> dict[str, Any]:
    found = env.sim.store.get(NVD, name)
    assert found is not None
    result: dict[str, Any] = found.get("status") or {}
    return result


def condition(env: Env, name: str, type_: str) -> dict[str, Any]:
    return next((c for c in status(env, name).get("conditions") or [] if c["type"] == type_), {})


def pool_daemonsets(env: Env) -> dict[str, dict[str, Any]]:
    return {n: d for n, d in env.daemonsets().items() if n.startswith("nvidia-gpu-driver-")}


def driver_pods(env: Env) -> list[dict[str, Any]]:
    return [
        p
        for p in env.sim.store.list("pods", namespace=NAMESPACE)
        if (p["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "nvidia-driver"
        and not p["metadata"].get("deletionTimestamp")
    ]


def events(env: Env, reason: str) -> list[dict[str, Any]]:
    found = env.sim.store.list("events", namespace="default")  # NVIDIADrivers are cluster-scoped
    return [e for e in found if e.get("reason") == reason]


async def wait_state(env: Env, name: str, state: str, timeout: float = DEADLINE) -> None:
    await env.wait(lambda: status(env, name).get("state") == state, f"{name} {state}", timeout)


async def test_pools_per_os_and_selector_with_owner_labels_and_ready_status(env: Env) -> None:
    gpu_node(env.sim, "a100-1", **{keys.GPU_PRODUCT: "A100-SXM4-80GB"})
    rhel = {keys.NFD_OS_ID: "rhel", keys.NFD_OS_VERSION_ID: "9.4", keys.NFD_OS_VERSION_MAJOR: "9"}
    gpu_node(env.sim, "rhel-1", **rhel)
    env.sim.store.create(policy(driver=CRD_MODE))
    env.sim.store.create(nvidiadriver("default", default=True))
    env.sim.store.create(
        nvidiadriver(
            "a100", version="570.195.03", nodeSelector={keys.GPU_PRODUCT: "A100-SXM4-80GB"}
        )
    )
    env.start_operator()
    await wait_state(env, "default", "ready")
    await wait_state(env, "a100", "ready")
    await env.wait_ready()
    owners = {n: env.node_labels(n).get(keys.DRIVER_OWNER) for n in ("gpu-1", "gpu-2", "a100-1",
                                                                    "rhel-1", "cpu-1")}  # fmt: skip
    assert owners == {"gpu-1": "default", "gpu-2": "default", "a100-1": "a100",
                      "rhel-1": "default", "cpu-1": None}  # fmt: skip
    pools = pool_daemonsets(env)
    assert len(pools) == 3  # default: ubuntu22.04 and rhel9; a100: ubuntu22.04
    images = sorted(d["spec"]["template"]["spec"]["containers"][0]["image"] for d in pools.values())
    assert images == [
        "nvcr.io/nvidia/driver:570.195.03-ubuntu22.04",
        "nvcr.io/nvidia/driver:580.95.05-rhel9",
        "nvcr.io/nvidia/driver:580.95.05-ubuntu22.04",
    ]
    pods_by_node = {p["spec"]["nodeName"]: p for p in driver_pods(env)}
    assert set(pods_by_node) == {"gpu-1", "gpu-2", "a100-1", "rhel-1"}
    assert "nvidia-driver-daemonset" not in env.daemonsets()  # the policy handed it over
    ready = condition(env, "default", "Ready")
    assert ready["reason"] == "Reconciled"
    assert "3 node(s) in 2 pool(s)" in ready["message"]
    policy_states = {s["name"]: s["state"] for s in env.policy()["status"]["states"]}
    assert policy_states["state-driver"] == "disabled"


async def test_a_conflict_shows_in_both_drivers_and_the_node_gets_no_driver(env: Env) -> None:
    env.sim.store.create(policy(driver=CRD_MODE))
    env.sim.store.create(nvidiadriver("one", nodeSelector={"pool": "shared"}))
    env.sim.store.create(nvidiadriver("two", nodeSelector={"pool": "shared"}))
    env.start_operator()
    env.sim.store.patch("nodes", "gpu-1", {"metadata": {"labels": {"pool": "shared"}}})
    for name in ("one", "two"):
        await env.wait(
            lambda name=name: (
                condition(env, name, "Error").get("reason") == "ConflictingNodeSelector"
            ),
            f"{name} reports the conflict",
        )
        assert "gpu-1" in condition(env, name, "Error")["message"]
        assert status(env, name)["state"] == "notReady"
    assert keys.DRIVER_OWNER not in env.node_labels("gpu-1")
    await env.sim.settle(timeout=DEADLINE)
    assert not [p for p in driver_pods(env) if p["spec"]["nodeName"] == "gpu-1"]
    await env.wait(lambda: len(events(env, "ConflictingNodeSelector")) == 2, "both warned")
    # Removing the second driver's claim resolves it.
    env.sim.store.patch(NVD, "two", {"spec": {"nodeSelector": {"pool": "other"}}})
    await wait_state(env, "one", "ready")
    assert env.node_labels("gpu-1")[keys.DRIVER_OWNER] == "one"


async def test_a_version_that_cannot_drive_the_pools_gpus_is_not_rolled_out(env: Env) -> None:
    env.sim.store.patch("nodes", "gpu-1", {"metadata": {"labels": HOPPER}})
    env.sim.store.create(policy(driver=CRD_MODE))
    env.sim.store.create(nvidiadriver("default", default=True, version="515.65.01"))
    env.start_operator()
    await env.wait(
        lambda: condition(env, "default", "Error").get("reason") == "DriverVersionUnsupported",
        "version error",
    )
    message = condition(env, "default", "Error")["message"]
    assert "515.65.01 is older than 520.61.05" in message
    assert "Hopper" in message
    assert "gpu-1" in message
    assert not pool_daemonsets(env)
    await env.wait(lambda: bool(events(env, "DriverVersionUnsupported")), "a Warning event")
    env.sim.store.patch(NVD, "default", {"spec": {"version": "580.95.05"}})
    await wait_state(env, "default", "ready")
    assert len(pool_daemonsets(env)) == 1


async def test_the_cluster_policy_hands_over_without_restarting_identical_driver_pods(
    env: Env,
) -> None:
    env.sim.store.create(policy(driver=DRIVER))
    env.start_operator()
    await env.wait_ready()
    before = {p["spec"]["nodeName"]: p for p in driver_pods(env)}
    assert set(before) == {"gpu-1", "gpu-2"}
    # kubesim's DaemonSet controller keeps the oldest of two pods on a node by creation time,
    # which has whole seconds: let the clock pass the driver pods' second.
    created = max(p["metadata"]["creationTimestamp"] for p in before.values())
    await env.wait(
        lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") > created, "a second passed"
    )
    cordoned: set[str] = set()

    def record(event: Any) -> None:
        # A restart-free hand-over never cordons a node (no GPU pod is evicted for it).
        if event.key == ("", "nodes") and (event.new.obj.get("spec") or {}).get("unschedulable"):
            cordoned.add(event.new.obj["metadata"]["name"])

    unsubscribe = env.sim.store.subscribe(record)
    env.sim.store.create(nvidiadriver("default", default=True))
    env.sim.store.patch(
        "clusterpolicies.nvidia.com",
        "cluster-policy",
        {"spec": {"driver": {"useNvidiaDriverCRD": True}}},
    )

    def adopted() -> bool:
        pools = pool_daemonsets(env)
        uids = {d["metadata"]["uid"] for d in pools.values()}
        pods = driver_pods(env)
        return len(pods) == 2 and all(
            [r.get("uid") for r in p["metadata"].get("ownerReferences") or []][:1]
            and p["metadata"]["ownerReferences"][0]["uid"] in uids
            for p in pods
        )

    await env.wait(adopted, "driver pods adopted by the pool DaemonSet")
    await wait_state(env, "default", "ready")
    after = {p["spec"]["nodeName"]: p for p in driver_pods(env)}
    for node, pod in before.items():
        assert after[node]["metadata"]["uid"] == pod["metadata"]["uid"], node
        statuses = after[node]["status"].get("containerStatuses") or []
        assert all(s.get("restartCount", 0) == 0 for s in statuses)
    (pool,) = pool_daemonsets(env).values()
    assert after["gpu-1"]["metadata"]["labels"]["app"] == pool["metadata"]["name"]
    assert "nvidia-driver-daemonset" not in env.daemonsets()
    await env.wait(lambda: bool(events(env, "DriverPodsAdopted")), "an adoption event")
    for node in ("gpu-1", "gpu-2"):
        # In sync with its pool: the upgrade flow has nothing left to do, and the node is
        # schedulable.
        await env.wait(
            lambda node=node: (
                env.node_labels(node).get(keys.UPGRADE_STATE) in (None, "upgrade-done")
                and not (env.sim.store.get("nodes", node) or {})
                .get("spec", {})
                .get("unschedulable")
            ),
            f"{node} settled",
        )
    unsubscribe()
    assert not cordoned
    await env.wait_ready()


async def test_a_changed_driver_is_left_to_the_upgrade_flow_at_hand_over(env: Env) -> None:
    env.sim.store.create(policy(driver=DRIVER))
    env.start_operator()
    await env.wait_ready()
    before = {p["metadata"]["uid"] for p in driver_pods(env)}
    states: set[tuple[str, str]] = set()

    def record(event: Any) -> None:
        if event.key == ("", "nodes"):
            meta = event.new.obj["metadata"]
            state = (meta.get("labels") or {}).get(keys.UPGRADE_STATE)
            if state:
                states.add((meta["name"], state))

    unsubscribe = env.sim.store.subscribe(record)
    try:
        env.sim.store.create(nvidiadriver("default", default=True, version="570.195.03"))
        env.sim.store.patch(
            "clusterpolicies.nvidia.com", "cluster-policy",
            {"spec": {"driver": {"useNvidiaDriverCRD": True}}},
        )  # fmt: skip
        for node in ("gpu-1", "gpu-2"):
            await env.wait(
                lambda node=node: (node, "upgrade-required") in states,
                f"{node} marked for upgrade",
            )
    finally:
        unsubscribe()
    # Never adopted: each old pod is still an orphan (or already replaced by the upgrade flow).
    for pod in driver_pods(env):
        if pod["metadata"]["uid"] in before:
            assert not pod["metadata"].get("ownerReferences")
    assert not events(env, "DriverPodsAdopted")


async def test_nvidiadrivers_are_disabled_while_the_policy_keeps_the_driver(env: Env) -> None:
    env.sim.store.create(policy(driver=DRIVER))
    env.sim.store.create(nvidiadriver("default", default=True))
    env.start_operator()
    await wait_state(env, "default", "disabled")
    assert condition(env, "default", "Error")["message"] == (
        "useNvidiaDriverCRD is not enabled in ClusterPolicy"
    )
    await env.wait_ready()
    assert not pool_daemonsets(env)
    assert keys.DRIVER_OWNER not in env.node_labels("gpu-1")


async def test_switching_back_retires_the_pools_then_the_owner_labels(env: Env) -> None:
    env.sim.store.create(policy(driver=CRD_MODE))
    env.sim.store.create(nvidiadriver("default", default=True))
    env.start_operator()
    await wait_state(env, "default", "ready")
    pool_pods = {p["metadata"]["uid"] for p in driver_pods(env)}
    env.sim.store.patch(
        "clusterpolicies.nvidia.com",
        "cluster-policy",
        {"spec": {"driver": {"useNvidiaDriverCRD": False}}},
    )
    await wait_state(env, "default", "disabled")
    await env.wait(lambda: not pool_daemonsets(env), "pool DaemonSets retired")
    # Retired with orphan propagation: the pool's pods were not deleted with their DaemonSet.
    remaining = {p["metadata"]["uid"] for p in env.sim.store.list("pods", namespace=NAMESPACE)}
    assert pool_pods <= remaining
    await env.wait(
        lambda: all(keys.DRIVER_OWNER not in env.node_labels(n) for n in ("gpu-1", "gpu-2")),
        "owner labels removed",
    )
    await env.wait(lambda: "nvidia-driver-daemonset" in env.daemonsets(), "policy driver back")


async def test_without_a_cluster_policy_nvidiadrivers_say_what_is_missing(env: Env) -> None:
    env.sim.store.create(nvidiadriver("default", default=True))
    env.start_operator()
    await env.wait(
        lambda: condition(env, "default", "Error").get("reason") == "NoClusterPolicy",
        "no-policy status",
    )
    assert "useNvidiaDriverCRD: true" in condition(env, "default", "Error")["message"]
