"""Swapping our operator in for NVIDIA's on a running cluster (docs/swap-in.md), on kubesim with
real kubectl: the operand objects NVIDIA's 26.7 operator leaves behind run on the GPU nodes;
`gpu-operator adopt --dry-run` says what will happen; then our operator takes every object over in
place, no operand pod is deleted and no DaemonSet's pod template changes.

Two layouts: tests/fixtures/upstream_operands (a small description of 26.7's objects for the test
cluster), and, where it exists, ../shared/reference/upstream-objects-26.7 (the objects NVIDIA's
26.7 operator itself wrote for its chart's default ClusterPolicy, on the nodes it ran with)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubesim_helpers import kubectl, needs_kubectl
from operator_harness import NAMESPACE, OPERATOR_ENV, Env

import kubesim
from gpu_operator.api import crds, keys
from gpu_operator.kube.client import FIELD_MANAGER
from gpu_operator.operands import adoption
from kubesim.controllers.kubelet import KubeletConfig
from kubesim.store import Event

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upstream_operands"
GPU_NODES = ("gpu-1", "gpu-2")
UPSTREAM_MANAGER = "gpu-operator"  # controller-runtime names the manager after the binary


def upstream_node_labels(node: str, env: Env) -> tuple[list[str], list[str]]:
    """`key=value` labels and annotations NVIDIA's operator leaves on a GPU node."""
    found = yaml.safe_load((FIXTURES / "node-labels.yaml").read_text())
    labels = dict(found["labels"])
    if env.node_labels(node).get(keys.MIG_CAPABLE) == "true":
        labels.update(found["mig-capable-labels"])
    return (
        [f"{k}={v}" for k, v in labels.items()],
        [f"{k}={v}" for k, v in found["annotations"].items()],
    )


def owned_by(objects: list[dict[str, Any]], policy: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects, with the controller reference to the ClusterPolicy NVIDIA's operator sets."""
    for obj in objects:
        obj["metadata"]["ownerReferences"] = [adoption.owner_reference(policy)]
    return objects


async def create_as_upstream(env: Env, objects: list[dict[str, Any]], path: Path) -> None:
    # Upstream creates and updates (never server-side applies) under its own manager name.
    path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    await kubectl(env.sim, "create", "-f", str(path), f"--field-manager={UPSTREAM_MANAGER}")


async def lay_down_upstream(env: Env, tmp_path: Path) -> str:
    """The cluster as NVIDIA's operator leaves it, its operator gone; returns the policy uid."""
    sim = env.sim
    await kubectl(sim, "create", "-f", str(FIXTURES / "policy.yaml"))
    for node in GPU_NODES:
        labels, annotations = upstream_node_labels(node, env)
        await kubectl(sim, "label", "node", node, "--overwrite", *labels)
        await kubectl(sim, "annotate", "node", node, "--overwrite", *annotations)
    documents = yaml.safe_load_all((FIXTURES / "operands.yaml").read_text())
    operands = owned_by([d for d in documents if d], env.policy())
    await create_as_upstream(env, operands, tmp_path / "operands.yaml")
    await kubectl(sim, "create", "-f", "-", stdin=json.dumps(nvidia_operator_scaled_to_zero()))
    return str(env.policy()["metadata"]["uid"])


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
                        {"name": "gpu-operator", "image": "nvcr.io/nvidia/gpu-operator:v26.7.0",
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


async def wait_running(env: Env) -> dict[str, dict[str, Any]]:
    """Wait until every DaemonSet's pods run; return the pods by uid."""
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
    return operand_pods(env)


async def check_the_plan(env: Env, daemonsets: dict[str, dict[str, Any]]) -> None:
    """What the user runs first: every DaemonSet is adopted as is, nothing rolls or goes.

    Other objects may be patched in place (our RBAC and ConfigMap contents differ on purpose,
    docs/operands.md) or created (our own objects): no pod restarts for that."""
    code, text = await adopt_dry_run(env)
    plan = json.loads(text)
    verdicts = {f"{o['kind']}/{o['name']}": o for o in plan["objects"]}
    assert code == adoption.EXIT_OK, plan
    for name in daemonsets:
        assert verdicts[f"DaemonSet/{name}"]["verdict"] == "adopt", verdicts[f"DaemonSet/{name}"]
    assert not [o for o in plan["objects"] if o["rolls"]]
    assert {o["verdict"] for o in plan["objects"]} <= {"adopt", "patch", "create"}, plan
    code, table = await adopt_dry_run(env, "table")
    assert code == adoption.EXIT_OK
    assert "DaemonSet/nvidia-driver-daemonset" in table
    assert "0 replace, " in table
    assert "0 delete, 0 blocked; 0 roll" in table


def deletions(env: Env) -> tuple[list[str], Callable[[], None]]:
    """Every pod deletion from now on, as a watch sees it (graceful: deletionTimestamp first),
    and the unsubscribe function."""
    deleted: list[str] = []

    def record(event: Event) -> None:
        meta = event.new.obj["metadata"]
        if event.type == "DELETED" or meta.get("deletionTimestamp"):
            deleted.append(meta["name"])

    return deleted, env.sim.store.subscribe(record, keys=[("", "pods")])


async def take_over(env: Env, daemonsets: dict[str, dict[str, Any]], uid: str) -> None:
    """Start our operator; it adopts every DaemonSet in place and restarts no pod."""
    pods = operand_pods(env)
    deleted, unsubscribe = deletions(env)
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
    assert set(operand_pods(env)) >= set(pods)  # the same pods still run
    after = env.daemonsets()
    assert set(after) == set(daemonsets)
    for name, ds in after.items():
        meta = ds["metadata"]
        # Adopted in place: the same object (uid), owned by the same ClusterPolicy, and now
        # also managed by our server-side apply, with the very pod template NVIDIA's wrote (a
        # changed template would roll its pods, or, for the driver, hand them to the upgrade
        # flow).
        assert meta["uid"] == daemonsets[name]["metadata"]["uid"], name
        assert meta["ownerReferences"][0]["uid"] == uid
        managers = {(m["manager"], m["operation"]) for m in meta.get("managedFields") or []}
        assert (FIELD_MANAGER, "Apply") in managers, (name, managers)
        assert meta["generation"] == daemonsets[name]["metadata"]["generation"], name
        assert ds["spec"]["template"] == daemonsets[name]["spec"]["template"], name
    # The annotation ours does not render stays: nothing of upstream's is removed.
    driver = after["nvidia-driver-daemonset"]["metadata"]["annotations"]
    assert driver["openshift.io/scc"] == "nvidia-driver"


@needs_kubectl
async def test_our_operator_adopts_nvidias_operands_without_restarting_a_driver(
    env: Env, tmp_path: Path
) -> None:
    uid = await lay_down_upstream(env, tmp_path)
    daemonsets = env.daemonsets()
    before = await wait_running(env)
    drivers = {u for u, p in before.items() if p["metadata"]["name"].startswith("nvidia-driver")}
    assert len(drivers) == len(GPU_NODES)
    await check_the_plan(env, daemonsets)
    await take_over(env, daemonsets, uid)
    assert set(operand_pods(env)) >= drivers  # the same driver pods still run
    # What a user sees.
    listing = await kubectl(env.sim, "-n", NAMESPACE, "get", "ds")
    assert "nvidia-driver-daemonset" in listing

    # Swap back: ours stopped, NVIDIA's operator writes its objects again with an Update (its
    # hash differs from ours). The pod templates are the same: nothing restarts.
    await env.stop_operator(env.operator)
    deleted, unsubscribe = deletions(env)
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


# ----- the objects NVIDIA's 26.7 operator itself wrote ------------------------------------------

REFERENCE = Path(__file__).resolve().parents[3] / "shared/reference/upstream-objects-26.7"
needs_reference = pytest.mark.skipif(
    not REFERENCE.is_dir(), reason=f"no upstream reference objects at {REFERENCE}"
)
# The reference's files that hold no objects NVIDIA's operator wrote.
NOT_OBJECTS = ("clusterpolicy.yaml", "nodes.yaml", "sample-pods.yaml", "pods-summary.yaml")
# Written by the API server, not by NVIDIA's operator: the server writes them again on create.
SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")


def reference(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((REFERENCE / name).read_text()) if d]


def as_written(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as NVIDIA's operator sent it: no status, no server-written metadata."""
    obj = {k: v for k, v in obj.items() if k != "status"}
    obj["metadata"] = {k: v for k, v in obj["metadata"].items() if k not in SERVER_FIELDS}
    if obj["kind"] == "Service":
        # Allocated by the server; the test cluster allocates its own.
        obj["spec"] = {k: v for k, v in obj["spec"].items() if k not in ("clusterIP", "clusterIPs")}
    return obj


def written_by_nvidia() -> list[dict[str, Any]]:
    """Every object the reference ClusterPolicy controls, in an order that creates cleanly
    (ServiceMonitors left out: the test cluster has no prometheus-operator CRDs, so neither
    operator renders them)."""
    order = ("RuntimeClass", "ServiceAccount", "Role", "ClusterRole", "RoleBinding",
             "ClusterRoleBinding", "ConfigMap", "Service", "DaemonSet")  # fmt: skip
    found = []
    for path in sorted(REFERENCE.glob("*.yaml")):
        if path.name in NOT_OBJECTS:
            continue
        for obj in reference(path.name):
            owners = obj.get("metadata", {}).get("ownerReferences") or []
            if obj.get("kind") in order and any(o["kind"] == "ClusterPolicy" for o in owners):
                found.append(as_written(obj))
    return sorted(found, key=lambda o: order.index(o["kind"]))


@pytest.fixture
async def reference_env(chart_rbac: Callable[..., Path] | None) -> AsyncIterator[Env]:
    """A cluster with the reference's nodes (labels and annotations as NVIDIA's operator left
    them), our CRDs, and the chart's RBAC for our operator."""
    mode = "rbac" if chart_rbac is not None else "open"
    async with kubesim.Cluster(kubelet=KubeletConfig(instant=True), authorization=mode) as sim:
        sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for crd in crds.all_crds().values():
            sim.store.create(crd)
        nodes = yaml.safe_load((REFERENCE / "nodes.yaml").read_text())
        for name, node in nodes.items():
            sim.add_node(name, labels=node.get("labels") or {})
            stored = sim.store.get("nodes", name)
            assert stored is not None
            stored["metadata"]["annotations"] = {
                **(stored["metadata"].get("annotations") or {}),
                **(node.get("annotations") or {}),
            }
            sim.store.update(stored)
        kubeconfig = chart_rbac(sim) if chart_rbac is not None else sim.kubeconfig_path
        environment = Env(sim, [], [], kubeconfig)
        yield environment
        for operator in list(environment.operators):
            await environment.stop_operator(operator)
        refused = [
            f"{u.name}: {a.verb} {a.combined_resource} {a.name}" for u, a in sim.auth.denials
        ]
        assert not refused, refused


@needs_kubectl
@needs_reference
async def test_our_operator_adopts_the_objects_nvidias_26_7_operator_wrote(
    reference_env: Env, tmp_path: Path
) -> None:
    env = reference_env
    policy = as_written(reference("clusterpolicy.yaml")[0])
    await kubectl(env.sim, "create", "-f", "-", stdin=json.dumps(policy))
    uid = str(env.policy()["metadata"]["uid"])
    # The reference operator ran with the chart's images in its Deployment's env; the policy
    # names every image itself, so the env only has to be there for `adopt` to read.
    await kubectl(env.sim, "create", "-f", "-", stdin=json.dumps(nvidia_operator_scaled_to_zero()))
    await create_as_upstream(env, owned_by(written_by_nvidia(), env.policy()), tmp_path / "o.yaml")
    daemonsets = env.daemonsets()
    assert len(daemonsets) == 8
    before = await wait_running(env)
    assert len(before) > 0
    await check_the_plan(env, daemonsets)
    await take_over(env, daemonsets, uid)
