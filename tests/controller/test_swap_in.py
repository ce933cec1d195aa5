"""Swapping our operator in for NVIDIA's on a running cluster (docs/swap-in.md), on kubesim with
real kubectl: the operand objects NVIDIA's operator left behind (tests/fixtures/upstream_operands)
run on the GPU nodes; `gpu-operator adopt --dry-run` says what will happen; then our operator takes
every object over in place, and no driver pod is deleted."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml
from kubesim_helpers import kubectl, needs_kubectl
from operator_harness import NAMESPACE, OPERATOR_ENV, Env

from gpu_operator.api import keys
from gpu_operator.kube.client import FIELD_MANAGER
from gpu_operator.operands import adoption
from kubesim.store import Event

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upstream_operands"
GPU_NODES = ("gpu-1", "gpu-2")
UPSTREAM_MANAGER = "gpu-operator"  # controller-runtime names the manager after the binary


def upstream_node_labels(node: str, env: Env) -> list[str]:
    labels = yaml.safe_load((FIXTURES / "node-labels.yaml").read_text())
    if env.node_labels(node).get(keys.MIG_CAPABLE) == "true":
        labels["nvidia.com/gpu.deploy.mig-manager"] = "true"
    return [f"{k}={v}" for k, v in labels.items()]


async def lay_down_upstream(env: Env, tmp_path: Path) -> str:
    """The cluster as NVIDIA's operator leaves it, its operator gone; returns the policy uid."""
    sim = env.sim
    await kubectl(sim, "create", "-f", str(FIXTURES / "policy.yaml"))
    uid = env.policy()["metadata"]["uid"]
    for node in GPU_NODES:
        await kubectl(sim, "label", "node", node, "--overwrite", *upstream_node_labels(node, env))
    operands = tmp_path / "operands.yaml"
    operands.write_text((FIXTURES / "operands.yaml").read_text().replace("CLUSTER_POLICY_UID", uid))
    # Upstream creates and updates (never server-side applies) under its own manager name.
    await kubectl(sim, "create", "-f", str(operands), f"--field-manager={UPSTREAM_MANAGER}")
    await kubectl(sim, "create", "-f", "-", stdin=json.dumps(nvidia_operator_scaled_to_zero()))
    return str(uid)


def nvidia_operator_scaled_to_zero() -> dict[str, Any]:
    """NVIDIA's operator Deployment after `kubectl scale --replicas=0`: its `*_IMAGE` env is what
    `adopt` renders unset images from (the same values ours is installed with)."""
    labels = {"app": "gpu-operator", "app.kubernetes.io/component": "gpu-operator"}
    env = [{"name": k, "value": v} for k, v in sorted(OPERATOR_ENV.items())]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "gpu-operator", "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": "gpu-operator",
                    "containers": [
                        {"name": "gpu-operator", "image": "nvcr.io/nvidia/gpu-operator:v25.10.0",
                         "env": env}
                    ],
                },
            },
        },
    }  # fmt: skip


def operand_pods(env: Env) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["uid"]: p for p in env.sim.store.list("pods", namespace=NAMESPACE)}


def hash_of(obj: dict[str, Any]) -> str | None:
    return (obj["metadata"].get("annotations") or {}).get(keys.LAST_APPLIED_HASH)


def running(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


async def adopt_dry_run(env: Env, output: str = "json") -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpu_operator", "adopt", "--dry-run", "-o", output,
        "--kubeconfig", str(env.sim.kubeconfig_path), "--namespace", NAMESPACE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    out, errors = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    assert out, errors.decode()
    return proc.returncode, out.decode()


@needs_kubectl
async def test_our_operator_adopts_nvidias_operands_without_restarting_a_driver(
    env: Env, tmp_path: Path
) -> None:
    uid = await lay_down_upstream(env, tmp_path)
    daemonsets = env.daemonsets()
    await env.wait(
        lambda: (
            all(
                (ds.get("status") or {}).get("numberReady")
                == (ds.get("status") or {}).get("desiredNumberScheduled")
                for ds in env.daemonsets().values()
            )
            and len(operand_pods(env)) > 0
            and all(running(p) for p in operand_pods(env).values())
        ),
        "NVIDIA's operand pods running",
    )
    before = operand_pods(env)
    drivers = {u for u, p in before.items() if p["metadata"]["name"].startswith("nvidia-driver")}
    assert len(drivers) == len(GPU_NODES)

    # What the user runs first: everything is adopted in place, nothing rolls.
    code, text = await adopt_dry_run(env)
    plan = json.loads(text)
    verdicts = {f"{o['kind']}/{o['name']}": o for o in plan["objects"]}
    assert code == adoption.EXIT_OK, plan
    for name in daemonsets:
        assert verdicts[f"DaemonSet/{name}"]["verdict"] == "adopt", verdicts[f"DaemonSet/{name}"]
    assert not [o for o in plan["objects"] if o["rolls"]]
    assert plan["counts"]["adopt"] == len(plan["objects"])
    code, table = await adopt_dry_run(env, "table")
    assert code == adoption.EXIT_OK
    assert "DaemonSet/nvidia-driver-daemonset" in table
    assert f"{len(plan['objects'])} adopt, 0 patch, 0 replace, 0 create, 0 delete" in table

    # Every pod deletion from here on, as a watch sees it (graceful: deletionTimestamp first).
    deleted: list[str] = []

    def record(event: Event) -> None:
        meta = event.new.obj["metadata"]
        if event.type == "DELETED" or meta.get("deletionTimestamp"):
            deleted.append(meta["name"])

    unsubscribe = env.sim.store.subscribe(record, keys=[("", "pods")])
    try:
        env.start_operator()
        await env.wait_ready()
        await env.wait(
            lambda: all(
                hash_of(d) != hash_of(daemonsets[name])
                and keys.OPERATOR_STATE_LABEL in (d["metadata"].get("labels") or {})
                for name, d in env.daemonsets().items()
            ),
            "every DaemonSet carries our bookkeeping",
        )
    finally:
        unsubscribe()
    assert deleted == []
    after = env.daemonsets()
    assert set(after) == set(daemonsets)
    for name, ds in after.items():
        meta = ds["metadata"]
        # Adopted in place: the same object (uid), owned by the same ClusterPolicy, and now
        # also managed by our server-side apply.
        assert meta["uid"] == daemonsets[name]["metadata"]["uid"], name
        assert meta["ownerReferences"][0]["uid"] == uid
        managers = {(m["manager"], m["operation"]) for m in meta.get("managedFields") or []}
        assert (FIELD_MANAGER, "Apply") in managers, (name, managers)
        assert ds["metadata"]["generation"] == daemonsets[name]["metadata"]["generation"], name
    assert set(operand_pods(env)) >= drivers  # the same driver pods still run
    # The annotation ours does not render stays: nothing of upstream's is removed.
    driver = after["nvidia-driver-daemonset"]["metadata"]["annotations"]
    assert driver["openshift.io/scc"] == "nvidia-driver"
    # What a user sees.
    listing = await kubectl(env.sim, "-n", NAMESPACE, "get", "ds")
    assert "nvidia-driver-daemonset" in listing

    # Swap back: ours stopped, NVIDIA's operator writes its objects again with an Update (its
    # hash differs from ours). The pod templates are the same: nothing restarts.
    await env.stop_operator(env.operator)
    unsubscribe = env.sim.store.subscribe(record, keys=[("", "pods")])
    try:
        operands = tmp_path / "operands.yaml"
        await kubectl(
            env.sim, "replace", "-f", str(operands), f"--field-manager={UPSTREAM_MANAGER}"
        )
        await env.wait(
            lambda: all(
                hash_of(d) == hash_of(daemonsets[name]) for name, d in env.daemonsets().items()
            ),
            "NVIDIA's hash annotations back",
        )
    finally:
        unsubscribe()
    assert deleted == []
    for name, ds in env.daemonsets().items():
        assert ds["metadata"]["uid"] == daemonsets[name]["metadata"]["uid"], name
        assert ds["metadata"]["generation"] == daemonsets[name]["metadata"]["generation"], name
