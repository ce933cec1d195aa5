"""Rolling driver upgrades end to end on kubesim (issue 15): the operator as the chart's
ServiceAccount, real kubectl where a user would reach for it, and every node update recorded."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubesim_helpers import kubectl, needs_kubectl
from operator_harness import NAMESPACE, Env, gpu_node, policy
from waiting import DEADLINE

from gpu_operator.api import keys
from gpu_operator.nodes import ledger
from gpu_operator.upgrade import states
from kubesim import PodContext
from kubesim.store import Event

GPU_NODES = [f"gpu-{i}" for i in range(1, 13)]
HUMAN_CORDONED = "gpu-3"
PDB_NODE = "gpu-5"
UPGRADE_POLICY = {
    "autoUpgrade": True,
    "maxParallelUpgrades": 3,
    "maxUnavailable": "25%",
    "podDeletion": {"timeoutSeconds": 3},
}
WAIT = DEADLINE
GPU = "nvidia.com/gpu"


@dataclass
class History:
    """Every committed node update, in order: (name, unschedulable, ready, state)."""

    events: list[tuple[str, bool, bool, str]] = field(default_factory=list)
    nodes: dict[str, tuple[bool, bool, str]] = field(default_factory=dict)
    peak_unavailable: int = 0
    peak_busy: int = 0

    def record(self, event: Event) -> None:
        node = event.new.obj
        name = node["metadata"]["name"]
        if event.type == "DELETED" or name not in GPU_NODES:
            return
        conditions = (node.get("status") or {}).get("conditions") or []
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        state = (node["metadata"].get("labels") or {}).get(states.STATE_LABEL, "")
        entry = (bool((node.get("spec") or {}).get("unschedulable")), ready, state)
        self.nodes[name] = entry
        self.events.append((name, *entry))
        unavailable = sum(1 for u, r, _ in self.nodes.values() if u or not r)
        busy = sum(1 for _, _, s in self.nodes.values() if s not in states.IDLE)
        self.peak_unavailable = max(self.peak_unavailable, unavailable)
        self.peak_busy = max(self.peak_busy, busy)


async def kill_operator(env: Env) -> None:
    """Stop the running operator as a killed pod would stop: mid-work, nothing handed over."""
    operator = env.operators[-1]
    await env.stop_operator(operator)
    index = env.operators.index(operator)
    env.operators.pop(index)
    env.tasks.pop(index)


async def wait(env: Env, predicate: Any, message: str, timeout: float = WAIT) -> None:
    """Wait for a condition; on timeout, say where every node's upgrade stands."""

    def reports() -> list[str]:
        plan = env.operators[-1].upgrade.last_plan if env.operators else None
        return [f"{n}: {r.state} ({r.message})" for n, r in (plan.nodes if plan else {}).items()]

    await env.wait(predicate, message, timeout, state=reports)


def node(env: Env, name: str) -> dict[str, Any]:
    found = env.sim.store.get("nodes", name)
    assert found is not None
    return found


def state(env: Env, name: str) -> str:
    return str(env.node_labels(name).get(states.STATE_LABEL, ""))


def gpu_workload(env: Env, name: str, node_name: str, app: str) -> None:
    """A Deployment of one GPU pod pinned to a node (its replacement waits for the node)."""
    labels = {"app": app, "workload": name}
    env.sim.store.create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": node_name},
                        "containers": [
                            {
                                "name": "main",
                                "image": "nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04",
                                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                            }
                        ],
                    },
                },
            },
        }
    )


def gpu_pods_on(env: Env, node_name: str) -> list[dict[str, Any]]:
    return [
        p
        for p in env.sim.store.list("pods", namespace="ml")
        if p["spec"].get("nodeName") == node_name and p["status"].get("phase") == "Running"
    ]


async def install(env: Env) -> None:
    """Twelve GPU nodes with a GPU each, one GPU workload per node, the policy installed."""
    for name in GPU_NODES[2:]:
        gpu_node(env.sim, name)
    env.sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    for name in GPU_NODES:
        gpu_workload(env, f"train-{name}", name, "train")
    body = policy()
    body["spec"]["driver"]["upgradePolicy"] = UPGRADE_POLICY
    env.sim.store.create(body)
    env.start_operator()
    # The GPUs appear once the operator's device plugin is deployed (capacity before that would
    # be another device plugin's: the coexistence detector would keep ours off the node).
    plugin_label = keys.DEPLOY_PREFIX + "device-plugin"
    await env.wait(
        lambda: all(
            node(env, n)["metadata"]["labels"].get(plugin_label) == "true" for n in GPU_NODES
        ),
        "device plugins deployed",
    )
    for name in GPU_NODES:
        env.sim.store.patch(
            "nodes",
            name,
            {"status": {"capacity": {GPU: "2"}, "allocatable": {GPU: "2"}}},
            status=True,
        )
    await env.wait_ready(timeout=WAIT)
    await env.wait(lambda: all(gpu_pods_on(env, n) for n in GPU_NODES), "GPU workloads run")


def change_driver_version(env: Env, version: str) -> None:
    env.sim.store.patch(
        "clusterpolicies.nvidia.com", "cluster-policy", {"spec": {"driver": {"version": version}}}
    )


def driver_image(env: Env, name: str) -> str:
    pods = env.sim.store.list(
        "pods",
        namespace=NAMESPACE,
        label_selector="app=nvidia-driver-daemonset",
        field_selector=f"spec.nodeName={name}",
    )
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    assert len(live) == 1, [p["metadata"]["name"] for p in pods]
    containers = live[0]["spec"]["containers"]
    return str(next(c["image"] for c in containers if c["name"] == "nvidia-driver-ctr"))


@needs_kubectl
async def test_a_driver_change_rolls_through_twelve_nodes_within_the_limits_and_survives_a_restart(
    env: Env,
) -> None:
    await install(env)
    # A node whose only GPU pod is protected by a PDB that allows no disruption.
    gpu_workload(env, "critical", PDB_NODE, "critical")
    env.sim.store.create(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "critical", "namespace": "ml"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "critical"}}},
        }
    )
    await env.wait(lambda: len(gpu_pods_on(env, PDB_NODE)) == 2, "critical pod runs")
    await env.wait(
        lambda: all(state(env, n) == states.UPGRADE_DONE for n in GPU_NODES),
        "every node starts upgrade-done",
        WAIT,
    )
    assert state(env, "cpu-1") == ""
    await kubectl(env.sim, "cordon", HUMAN_CORDONED)

    history = History()
    unsubscribe = env.sim.store.subscribe(history.record, keys=[("", "nodes")])
    try:
        change_driver_version(env, "580.105.08")
        # Kill the operator in the middle of the rollout; a new one resumes from the nodes.
        await env.wait(
            lambda: (
                sum(state(env, n) == states.UPGRADE_DONE for n in GPU_NODES) >= 4
                and any(state(env, n) not in states.IDLE for n in GPU_NODES)
            ),
            "rollout under way",
            WAIT,
        )
        await kill_operator(env)
        interrupted = {n: state(env, n) for n in GPU_NODES}
        env.start_operator()

        def settled() -> bool:
            return all(
                state(env, n) == (states.UPGRADE_FAILED if n == PDB_NODE else states.UPGRADE_DONE)
                for n in GPU_NODES
            )

        await env.wait(settled, "every node done, the PDB node failed", WAIT)
    finally:
        unsubscribe()

    # The limits held at every recorded update: maxUnavailable 25% of 12 is 3 (the human's
    # cordon counts), and no more than maxParallelUpgrades 3 nodes were ever mid-upgrade.
    assert history.peak_unavailable <= 3, history.events
    assert history.peak_busy <= 3, history.events
    assert any(s not in states.IDLE for s in interrupted.values())
    # Every node but the blocked one runs the new driver; the blocked one kept the old one.
    for name in GPU_NODES:
        image = driver_image(env, name)
        assert image.endswith("580.105.08-ubuntu22.04") == (name != PDB_NODE), (name, image)
    # The human's cordon outlived the upgrade; ours were all undone and left no ledger entry.
    assert node(env, HUMAN_CORDONED)["spec"].get("unschedulable") is True
    for name in GPU_NODES:
        if name != HUMAN_CORDONED:
            assert not node(env, name)["spec"].get("unschedulable"), name
        owned = json.loads(
            node(env, name)["metadata"].get("annotations", {}).get(ledger.ANNOTATION, "{}")
        )
        assert ledger.CORDON not in owned, name
    # The failed node says why and how to retry; its workload was never forced off.
    failure = node(env, PDB_NODE)["metadata"]["annotations"][states.FAILURE]
    assert "PodDisruptionBudget ml/critical" in failure
    assert f"kubectl label node {PDB_NODE} {states.STATE_LABEL}-" in failure
    assert any(p["metadata"]["name"].startswith("critical") for p in gpu_pods_on(env, PDB_NODE))
    # Evicted workloads came back once their node was uncordoned.
    await env.wait(
        lambda: all(gpu_pods_on(env, n) for n in GPU_NODES if n != HUMAN_CORDONED),
        "workloads back",
        WAIT,
    )
    # What a user sees.
    table = await kubectl(env.sim, "get", "nodes", "-L", states.STATE_LABEL)
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:]}
    assert rows[PDB_NODE][-1] == states.UPGRADE_FAILED
    assert rows[HUMAN_CORDONED][1] == "Ready,SchedulingDisabled"
    assert rows["gpu-1"][-1] == states.UPGRADE_DONE
    events = await kubectl(
        env.sim,
        "get",
        "events",
        "-n",
        "default",  # Events about Nodes go to `default`, as client-go records them
        "--field-selector",
        f"reason={states.EVENT_REASON},involvedObject.name={PDB_NODE}",
        "-o",
        "json",
    )
    messages = [e["message"] for e in json.loads(events)["items"]]
    assert any("driver upgrade failed" in m for m in messages), messages


@needs_kubectl
async def test_retrying_a_failed_node_after_its_pdb_is_relaxed_finishes_it(
    env: Env,
) -> None:
    await install(env)
    gpu_workload(env, "critical", PDB_NODE, "critical")
    env.sim.store.create(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "critical", "namespace": "ml"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "critical"}}},
        }
    )
    await env.wait(lambda: len(gpu_pods_on(env, PDB_NODE)) == 2, "critical pod runs")
    await env.wait(lambda: state(env, PDB_NODE) == states.UPGRADE_DONE, "initial state", WAIT)
    change_driver_version(env, "580.105.08")
    await env.wait(lambda: state(env, PDB_NODE) == states.UPGRADE_FAILED, "PDB node fails", WAIT)
    # The runbook: relax the budget, then clear the label as the failure annotation says.
    await kubectl(env.sim, "delete", "pdb", "critical", "-n", "ml")
    await kubectl(env.sim, "label", "node", PDB_NODE, f"{states.STATE_LABEL}-")
    await env.wait(lambda: state(env, PDB_NODE) == states.UPGRADE_DONE, "retried node done", WAIT)
    assert driver_image(env, PDB_NODE).endswith("580.105.08-ubuntu22.04")
    assert states.FAILURE not in node(env, PDB_NODE)["metadata"].get("annotations", {})


async def test_upgrade_plan_against_the_cluster_shows_the_rollout_before_anything_changes(
    env: Env, tmp_path: Path
) -> None:
    await install(env)
    gpu_workload(env, "critical", PDB_NODE, "critical")
    env.sim.store.create(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "critical", "namespace": "ml"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "critical"}}},
        }
    )
    await env.wait(
        lambda: all(state(env, n) == states.UPGRADE_DONE for n in GPU_NODES), "settled", WAIT
    )
    await env.sim.settle(timeout=DEADLINE)
    new = env.policy()
    new["spec"]["driver"]["version"] = "580.105.08"
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({k: new[k] for k in ("apiVersion", "kind", "metadata", "spec")}))
    before = {d["metadata"]["name"]: d["metadata"]["generation"] for d in env.daemonsets().values()}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpu_operator",
        "upgrade",
        "plan",
        "--kubeconfig",
        str(env.sim.kubeconfig_path),
        "-f",
        str(path),
        "-o",
        "json",
        "--driver-start-seconds",
        "100",
        "--eviction-seconds",
        "10",
        "--validation-seconds",
        "20",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, errors = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode == 0, errors.decode()
    data = json.loads(out)
    assert data["notes"] == [
        "ClusterPolicy/cluster-policy: the driver changes; its nodes get a new revision"
    ]
    nodes = {n["name"]: n for n in data["nodes"]}
    assert set(nodes) == set(GPU_NODES)
    assert [len(b["nodes"]) for b in data["batches"]][:1] == [3]
    assert nodes[PDB_NODE]["blockedBy"] == ["ml/critical"]
    assert nodes[PDB_NODE]["state"] == states.UPGRADE_FAILED
    assert any(p.startswith("ml/train-gpu-1-") for p in nodes["gpu-1"]["evicts"])
    assert nodes["gpu-1"]["precompiled"]["verdict"] == "n/a"
    assert data["estimate"]["peakUnavailable"] <= 3
    # A dry run: nothing in the cluster moved.
    after = {d["metadata"]["name"]: d["metadata"]["generation"] for d in env.daemonsets().values()}
    assert after == before
    assert all(state(env, n) == states.UPGRADE_DONE for n in GPU_NODES)
    assert all(not node(env, n)["spec"].get("unschedulable") for n in GPU_NODES)


@needs_kubectl
async def test_a_failed_canary_stops_the_rollout_and_is_rolled_back_then_retried(
    env: Env,
) -> None:
    """The new driver fails validation on the canary: nothing else is touched, the canary goes
    back to the old driver and into service; once fixed, a retry upgrades everything."""
    broken = {"gpu-1"}

    async def driver_validation(ctx: PodContext) -> int:
        # The validator's driver check (WITH_WAIT, as upstream): it waits for a ready driver pod
        # on its node, then fails on a broken node when that driver is the new one.
        def driver_images() -> list[str]:
            pods = env.sim.store.list(
                "pods", namespace=NAMESPACE, field_selector=f"spec.nodeName={ctx.node_name}"
            )
            return [
                c["image"]
                for p in pods
                for c in p["spec"]["containers"]
                if c["name"] == "nvidia-driver-ctr"
                and not p["metadata"].get("deletionTimestamp")
                and any(
                    cond["type"] == "Ready" and cond["status"] == "True"
                    for cond in p["status"].get("conditions") or []
                )
            ]

        await env.sim.wait_for(lambda: bool(driver_images()), timeout=WAIT, message="driver")
        new_driver = any("580.105.08" in image for image in driver_images())
        return 1 if new_driver and ctx.node_name in broken else 0

    env.sim.register_pod_runner(
        driver_validation,
        label_selector="app=nvidia-operator-validator",
        container="driver-validation",
    )
    for name in ("gpu-3", "gpu-4"):
        gpu_node(env.sim, name)
    body = policy()
    body["metadata"]["annotations"] = {
        states.CANARY_NODES: "1",
        states.ROLLBACK: "true",
        states.VALIDATION_TIMEOUT: "2",
    }
    body["spec"]["driver"]["upgradePolicy"] = {
        "autoUpgrade": True,
        "maxParallelUpgrades": 2,
        "maxUnavailable": "50%",
    }
    env.sim.store.create(body)
    env.start_operator()
    nodes = ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    await env.wait(lambda: all(state(env, n) == states.UPGRADE_DONE for n in nodes), "done", WAIT)
    old_image = driver_image(env, "gpu-1")
    change_driver_version(env, "580.105.08")

    def rolled_back() -> bool:
        annotations = node(env, "gpu-1")["metadata"].get("annotations") or {}
        return annotations.get(states.FAILURE, "").startswith("Rolled back")

    await wait(env, rolled_back, "the canary rolled back")
    assert state(env, "gpu-1") == states.UPGRADE_FAILED
    assert not node(env, "gpu-1")["spec"].get("unschedulable")
    assert driver_image(env, "gpu-1") == old_image
    rollback_sets = [n for n in env.daemonsets() if "-rollback-" in n]
    assert len(rollback_sets) == 1
    # The rollout stopped at the canary: the other nodes never left their old driver.
    for name in ("gpu-2", "gpu-3", "gpu-4"):
        assert state(env, name) == states.UPGRADE_REQUIRED
        assert driver_image(env, name) == old_image
        assert not node(env, name)["spec"].get("unschedulable")
    failure = node(env, "gpu-1")["metadata"]["annotations"][states.FAILURE]
    assert "validation failed" in failure
    # Fixed (say, a firmware update); the runbook's retry hands the node back and resumes. The
    # 2 s validation deadline made the canary fail fast; the healthy nodes get a realistic one,
    # or a loaded machine would fail them for being slow to start a validator pod.
    broken.clear()
    await kubectl(
        env.sim, "annotate", "clusterpolicy", "cluster-policy",
        f"{states.VALIDATION_TIMEOUT}=600", "--overwrite",
    )  # fmt: skip
    await kubectl(env.sim, "label", "node", "gpu-1", f"{states.STATE_LABEL}-")
    await wait(env, lambda: all(state(env, n) == states.UPGRADE_DONE for n in nodes), "all")
    for name in nodes:
        assert driver_image(env, name).endswith("580.105.08-ubuntu22.04")
        assert not node(env, name)["spec"].get("unschedulable")
    await env.wait(lambda: not any("-rollback-" in n for n in env.daemonsets()), "cleaned up")
    labels = env.node_labels("gpu-1")
    assert labels[states.DRIVER_DEPLOY_LABEL] == "true"
    assert states.ROLLBACK_LABEL not in labels


async def test_a_pod_only_change_restarts_driver_pods_in_place_without_evicting_workloads(
    env: Env,
) -> None:
    """Upstream's restart-only route: the driver pod template changes (here its resources) but
    not DRIVER_CONFIG_DIGEST, so each node is cordoned and its driver pod replaced while its GPU
    workload keeps running; no node goes through pod deletion or drain."""
    names = ["gpu-1", "gpu-2"]
    env.sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    for name in names:
        gpu_workload(env, f"train-{name}", name, "train")
    body = policy()
    body["spec"]["driver"]["upgradePolicy"] = UPGRADE_POLICY
    env.sim.store.create(body)
    env.start_operator()
    plugin_label = keys.DEPLOY_PREFIX + "device-plugin"
    await env.wait(
        lambda: all(node(env, n)["metadata"]["labels"].get(plugin_label) == "true" for n in names),
        "device plugins deployed",
    )
    for name in names:
        env.sim.store.patch(
            "nodes", name, {"status": {"capacity": {GPU: "1"}, "allocatable": {GPU: "1"}}},
            status=True,
        )  # fmt: skip
    await env.wait_ready(timeout=WAIT)
    await env.wait(lambda: all(gpu_pods_on(env, n) for n in names), "GPU workloads run")
    await env.wait(
        lambda: all(state(env, n) == states.UPGRADE_DONE for n in names), "settled", WAIT
    )

    def live_driver_pod(name: str) -> dict[str, Any] | None:
        pods = env.sim.store.list(
            "pods",
            namespace=NAMESPACE,
            label_selector="app=nvidia-driver-daemonset",
            field_selector=f"spec.nodeName={name}",
        )
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        return live[0] if len(live) == 1 else None  # none while the old one is replaced

    def driver_pod(name: str) -> dict[str, Any]:
        found = live_driver_pod(name)
        assert found is not None, name
        return found

    def replaced(name: str) -> bool:
        pod = live_driver_pod(name)
        return pod is not None and pod["metadata"]["uid"] != before[name]["metadata"]["uid"]

    def digest(pod: dict[str, Any]) -> str:
        ctr = next(c for c in pod["spec"]["containers"] if c["name"] == "nvidia-driver-ctr")
        return str(next(e["value"] for e in ctr["env"] if e["name"] == "DRIVER_CONFIG_DIGEST"))

    before = {n: driver_pod(n) for n in names}
    workloads = {n: {p["metadata"]["uid"] for p in gpu_pods_on(env, n)} for n in names}
    history = History()
    unsubscribe = env.sim.store.subscribe(history.record, keys=[("", "nodes")])
    try:
        env.sim.store.patch(
            "clusterpolicies.nvidia.com",
            "cluster-policy",
            {"spec": {"driver": {"resources": {"limits": {"memory": "2Gi"}}}}},
        )
        await env.wait(
            lambda: all(replaced(n) and state(env, n) == states.UPGRADE_DONE for n in names),
            "driver pods replaced in place",
            WAIT,
        )
    finally:
        unsubscribe()
    seen = {s for name, _, _, s in history.events if name in names}
    assert states.POD_RESTART_REQUIRED in seen
    assert not seen & {states.CORDON_REQUIRED, states.POD_DELETION_REQUIRED,
                       states.DRAIN_REQUIRED}, history.events  # fmt: skip
    for name in names:
        after = driver_pod(name)
        assert digest(after) == digest(before[name])
        ctr = next(c for c in after["spec"]["containers"] if c["name"] == "nvidia-driver-ctr")
        assert ctr["resources"]["limits"]["memory"] == "2Gi"
        # The same GPU pods run: nothing was evicted; the cordon was ours and is undone.
        assert {p["metadata"]["uid"] for p in gpu_pods_on(env, name)} == workloads[name]
        assert not node(env, name)["spec"].get("unschedulable")
