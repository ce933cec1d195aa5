"""Swapping our operator in for NVIDIA's on a running cluster and back (docs/swap-in.md), on kubesim
with real kubectl: the operand objects NVIDIA's 26.7 operator leaves behind run on the GPU nodes,
under NVIDIA's CRDs (no schema marker of ours); `gpu-operator adopt --dry-run` says the CRDs come
first and that no pod restarts; our operator refuses with the command to run; `adopt --dry-run
--apply-crds` replaces the CRDs; then our operator takes every object over in place (ours owns
what it renders, NVIDIA's field manager nothing), no operand pod is deleted, no DaemonSet changes
generation or revision, the driver upgrade flow moves no node, and the ClusterPolicy is ready.
Back: with ours stopped, NVIDIA's rules (its hash annotation comparison, then its Update; its
upgrade controller's revision check) change nothing and restart nothing.

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
from kubesim_helpers import TEST_IMAGES, kubectl, needs_kubectl
from operator_harness import NAMESPACE, OPERATOR_ENV, Env

import kubesim
from gpu_operator.api import crds, keys
from gpu_operator.cli import adopt
from gpu_operator.kube.client import FIELD_MANAGER
from gpu_operator.operands import adoption, driver_digest, takeover
from gpu_operator.status import conditions
from gpu_operator.upgrade import states
from kubesim.controllers.kubelet import KubeletConfig
from kubesim.store import Event

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upstream_operands"
GPU_NODES = ("gpu-1", "gpu-2")
UPSTREAM_MANAGER = "gpu-operator"  # controller-runtime names the manager after the binary
Obj = dict[str, Any]


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
    await lay_down(env, tmp_path, upstream_documents())
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


async def adopt_dry_run(env: Env, output: str = "json", *extra: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpu_operator", "adopt", "--dry-run", "-o", output, *extra,
        "--kubeconfig", str(env.sim.kubeconfig_path), "--namespace", NAMESPACE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "400"},
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


async def plan_of(env: Env, *extra: str) -> tuple[int, dict[str, Any]]:
    code, text = await adopt_dry_run(env, "json", *extra)
    return code, json.loads(text)


def verdicts_of(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{o['kind']}/{o['name']}": o for o in plan["objects"]}


def as_nvidias_crds(env: Env) -> None:
    """Our CRDs as NVIDIA's chart leaves them: the same API, without our schema marker."""
    for name in (str(c["metadata"]["name"]) for c in crds.all_crds().values()):
        crd = env.sim.store.get("customresourcedefinitions", name)
        assert crd is not None
        crd["metadata"]["annotations"] = {"controller-gen.kubebuilder.io/version": "v0.21.0"}
        env.sim.store.update(crd)


async def check_the_plan(env: Env, daemonsets: dict[str, dict[str, Any]]) -> None:
    """What the user runs first: the CRDs must be ours first; every DaemonSet is adopted as is,
    no pod restarts, nothing is replaced, deleted or blocked.

    Other objects may be patched in place (our RBAC and ConfigMap contents differ on purpose,
    docs/operands.md) or created (our own objects): no pod restarts for that."""
    code, plan = await plan_of(env)
    verdicts = verdicts_of(plan)
    assert code == adopt.EXIT_CRDS, plan
    assert len(plan["crds"]) == len(crds.all_crds()), plan["crds"]
    assert all("has no nvidia.com/gpu-operator-crd-version marker" in p for p in plan["crds"])
    for name in daemonsets:
        assert verdicts[f"DaemonSet/{name}"]["verdict"] == "adopt", verdicts[f"DaemonSet/{name}"]
    assert not [o for o in plan["objects"] if o["rolls"]]
    assert plan["restarts"] == []
    assert {o["verdict"] for o in plan["objects"]} <= {"adopt", "patch", "create"}, plan
    code, table = await adopt_dry_run(env, "table")
    assert code == adopt.EXIT_CRDS, table
    assert "DaemonSet/nvidia-driver-daemonset" in table
    assert "0 replace, " in table
    assert "0 delete, 0 blocked; 0 roll" in table
    assert "pods that would restart: none" in table
    assert "gpu-operator adopt --dry-run --apply-crds" in table


def deletions(env: Env) -> tuple[list[str], Callable[[], None]]:
    """Every pod deletion from now on, as a watch sees it (graceful: deletionTimestamp first),
    and the unsubscribe function."""
    deleted: list[str] = []

    def record(event: Event) -> None:
        meta = event.new.obj["metadata"]
        if event.type == "DELETED" or meta.get("deletionTimestamp"):
            deleted.append(meta["name"])

    return deleted, env.sim.store.subscribe(record, keys=[("", "pods")])


def revisions(env: Env) -> dict[str, tuple[str, int]]:
    """ControllerRevisions by name: their owner and number."""
    return {
        r["metadata"]["name"]: (r["metadata"]["ownerReferences"][0]["name"], int(r["revision"]))
        for r in env.sim.store.list("controllerrevisions", namespace=NAMESPACE)
    }


def env_value(ds: dict[str, Any], container: str, name: str) -> str | None:
    for c in ds["spec"]["template"]["spec"].get("containers") or []:
        if c["name"] == container:
            for e in c.get("env") or []:
                if e["name"] == name:
                    return str(e.get("value"))
    return None


def previous_writers(ds: dict[str, Any]) -> list[str]:
    """The managedFields entries of NVIDIA's field manager (updates as `gpu-operator`) left."""
    return [f"{e['manager']}/{e['operation']}" for e in takeover.previous_entries(ds)]


def gpu_nodes(env: Env) -> list[dict[str, Any]]:
    return [
        n
        for n in env.sim.store.list("nodes")
        if (n["metadata"].get("labels") or {}).get(keys.GPU_PRESENT) == "true"
    ]


async def refuse_then_apply_crds(env: Env, daemonsets: dict[str, dict[str, Any]]) -> None:
    """Our operator refuses NVIDIA's CRDs and names the command; the command lets it go on."""
    env.start_operator()

    def refusal() -> str | None:
        for c in (env.policy().get("status") or {}).get("conditions") or []:
            if c.get("reason") == conditions.CRD_OUTDATED:
                return str(c.get("message"))
        return None

    await env.wait(lambda: refusal() is not None, "the CRDSchemaOutdated refusal")
    message = refusal()
    assert message is not None
    assert "`gpu-operator crds --apply`" in message, message
    assert "gpu-operator adopt --dry-run --apply-crds" in message, message
    for name, ds in env.daemonsets().items():  # nothing written while it refuses
        assert hash_of(ds) == hash_of(daemonsets[name]), name
    code, plan = await plan_of(env, "--apply-crds")
    assert code == adoption.EXIT_OK, plan
    assert plan["crds"] == []
    assert len(plan["appliedCrds"]) == len(crds.all_crds())
    assert plan["restarts"] == []


async def take_over(
    env: Env, daemonsets: dict[str, dict[str, Any]], uid: str, upstream_objects: Path
) -> None:
    """Swap in and back: NVIDIA's CRDs replaced by ours, every DaemonSet adopted in place with
    ours the owner of what it renders; no pod deleted, no generation or revision changed, no node
    moved by the driver upgrade flow; then NVIDIA's rules on what ours left change nothing."""
    pods = operand_pods(env)
    before = revisions(env)
    digest = env_value(
        daemonsets["nvidia-driver-daemonset"], driver_digest.DRIVER_CTR, driver_digest.ENV_NAME
    )
    assert digest, "NVIDIA's driver DaemonSet carries DRIVER_CONFIG_DIGEST"
    deleted, unsubscribe = deletions(env)
    try:
        await refuse_then_apply_crds(env, daemonsets)
        await env.wait_ready()  # within a minute (the deadline), the CRDs applied
        await env.wait(
            lambda: all(
                hash_of(d) != hash_of(daemonsets[name])
                and keys.OPERATOR_STATE_LABEL in (d["metadata"].get("labels") or {})
                and not previous_writers(d)
                for name, d in env.daemonsets().items()
            ),
            "every DaemonSet carries our bookkeeping and no field of NVIDIA's manager",
        )
    finally:
        unsubscribe()
    assert deleted == []
    assert set(operand_pods(env)) >= set(pods)  # the same pods still run
    after = env.daemonsets()
    assert set(after) == set(daemonsets)
    for name, ds in after.items():
        meta = ds["metadata"]
        # Adopted in place: the same object (uid), owned by the same ClusterPolicy, managed by
        # our server-side apply only, with the very pod template NVIDIA's wrote (a changed
        # template would roll its pods, or, for the driver, hand them to the upgrade flow).
        assert meta["uid"] == daemonsets[name]["metadata"]["uid"], name
        assert meta["ownerReferences"][0]["uid"] == uid
        managers = {(m["manager"], m["operation"]) for m in meta.get("managedFields") or []}
        assert (FIELD_MANAGER, "Apply") in managers, (name, managers)
        assert (FIELD_MANAGER, "Update") not in managers, (name, managers)
        assert meta["generation"] == daemonsets[name]["metadata"]["generation"], name
        assert ds["spec"]["template"] == daemonsets[name]["spec"]["template"], name
    assert revisions(env) == before  # no new ControllerRevision, none renumbered
    driver = after["nvidia-driver-daemonset"]
    assert env_value(driver, driver_digest.DRIVER_CTR, driver_digest.ENV_NAME) == digest
    # The annotation ours does not render stays: nothing of upstream's metadata is removed.
    assert driver["metadata"]["annotations"]["openshift.io/scc"] == "nvidia-driver"
    for node in gpu_nodes(env):  # the driver upgrade flow had nothing to do
        assert node["metadata"]["labels"].get(states.STATE_LABEL) == states.UPGRADE_DONE
        assert not node["spec"].get("unschedulable"), node["metadata"]["name"]

    # Swap back: ours stopped, NVIDIA's operator starts on our CRDs and does what its rules say.
    await env.stop_operator(env.operator)
    served = {
        c["metadata"]["name"]: [v["name"] for v in c["spec"]["versions"] if v.get("served")]
        for c in env.sim.store.list("customresourcedefinitions")
    }
    # Every CRD NVIDIA's 26.7 operator watches (it does not start without GPUCluster's).
    assert served.get("clusterpolicies.nvidia.com") == ["v1"]
    assert served.get("nvidiadrivers.nvidia.com") == ["v1alpha1"]
    assert served.get("gpuclusters.nvidia.com") == ["v1alpha1"]
    assert nvidia_upgrade_controller_in_sync(env) == []
    await nvidia_updates_what_its_hash_says(env, daemonsets, upstream_objects)
    assert revisions(env) == before
    assert nvidia_upgrade_controller_in_sync(env) == []


def nvidia_upgrade_controller_in_sync(env: Env) -> list[str]:
    """Driver pods NVIDIA's upgrade controller would find out of sync (k8s-operator-libs'
    podInSyncWithDS and isDriverPodInSync): the pod's controller-revision-hash must be the name
    suffix of the highest-numbered ControllerRevision that the DaemonSet's selector matches and
    whose name starts with the DaemonSet's, and the pod running with every container ready. A
    pod out of sync would move its node to upgrade-required."""
    problems: list[str] = []
    all_revisions = env.sim.store.list("controllerrevisions", namespace=NAMESPACE)
    for name, ds in env.daemonsets().items():
        if not name.startswith("nvidia-driver-daemonset"):
            continue
        selector = ds["spec"]["selector"]["matchLabels"]
        candidates = [
            r
            for r in all_revisions
            if r["metadata"]["name"].startswith(name)
            and all((r["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())
        ]
        if not candidates:
            problems.append(f"{name}: no revision")
            continue
        current = max(candidates, key=lambda r: int(r["revision"]))
        want = current["metadata"]["name"].removeprefix(f"{name}-")
        for pod in operand_pods(env).values():
            owners = pod["metadata"].get("ownerReferences") or []
            if not any(o.get("uid") == ds["metadata"]["uid"] for o in owners):
                continue
            have = (pod["metadata"].get("labels") or {}).get("controller-revision-hash")
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            ready = running(pod) and statuses and all(c.get("ready") for c in statuses)
            if have != want or not ready:
                problems.append(f"{pod['metadata']['name']}: revision {have} (current {want})")
    return problems


async def nvidia_updates_what_its_hash_says(
    env: Env, daemonsets: dict[str, dict[str, Any]], upstream_objects: Path
) -> None:
    """NVIDIA's ClusterPolicy controller updates (a whole-object Update) each DaemonSet whose
    `nvidia.com/last-applied-hash` is not the hash of its own rendering (ours wrote another), and
    leaves the others. Its update must change no pod template: no generation, no pod deleted."""
    live = env.daemonsets()
    stale = {name for name, ds in live.items() if hash_of(ds) != hash_of(daemonsets[name])}
    assert stale == set(live)  # ours stamped every one: NVIDIA's updates every one once
    deleted, unsubscribe = deletions(env)
    try:
        await kubectl(
            env.sim, "replace", "-f", str(upstream_objects),
            f"--field-manager={UPSTREAM_MANAGER}",
        )  # fmt: skip
        await env.wait(
            lambda: all(
                hash_of(d) == hash_of(daemonsets[name]) for name, d in env.daemonsets().items()
            ),
            "NVIDIA's hash annotations back",
        )
        await wait_running(env)
    finally:
        unsubscribe()
    assert deleted == []
    for name, ds in env.daemonsets().items():
        assert ds["metadata"]["uid"] == daemonsets[name]["metadata"]["uid"], name
        assert ds["metadata"]["generation"] == daemonsets[name]["metadata"]["generation"], name
        assert ds["spec"]["template"] == daemonsets[name]["spec"]["template"], name


@needs_kubectl
async def test_our_operator_adopts_nvidias_operands_without_restarting_a_driver(
    env: Env, tmp_path: Path
) -> None:
    uid = await lay_down_upstream(env, tmp_path)
    as_nvidias_crds(env)
    daemonsets = env.daemonsets()
    before = await wait_running(env)
    drivers = {u for u, p in before.items() if p["metadata"]["name"].startswith("nvidia-driver")}
    assert len(drivers) == len(GPU_NODES)
    await check_the_plan(env, daemonsets)
    await take_over(env, daemonsets, uid, tmp_path / "operands.yaml")
    assert set(operand_pods(env)) >= drivers  # the same driver pods still run
    # What a user sees.
    listing = await kubectl(env.sim, "-n", NAMESPACE, "get", "ds")
    assert "nvidia-driver-daemonset" in listing


def upstream_documents(change: Callable[[dict[str, Any]], None] | None = None) -> list[Obj]:
    documents = [d for d in yaml.safe_load_all((FIXTURES / "operands.yaml").read_text()) if d]
    for doc in documents:
        if change is not None:
            change(doc)
    return documents


def namespace_as_a_literal(doc: Obj) -> None:
    """The MIG manager as an operator that wrote the namespace as a literal `value` would have
    left it (26.7's, and ours, read it with a fieldRef: the other half of a one-of)."""
    if doc["kind"] != "DaemonSet" or doc["metadata"]["name"] != "nvidia-mig-manager":
        return
    for container in doc["spec"]["template"]["spec"]["containers"]:
        for var in container.get("env") or []:
            if var["name"] == "DEFAULT_GPU_CLIENTS_NAMESPACE":
                var.pop("valueFrom")
                var["value"] = NAMESPACE


async def lay_down(env: Env, tmp_path: Path, documents: list[Obj]) -> None:
    await kubectl(env.sim, "create", "-f", str(FIXTURES / "policy.yaml"))
    for node in GPU_NODES:
        labels, annotations = upstream_node_labels(node, env)
        await kubectl(env.sim, "label", "node", node, "--overwrite", *labels)
        await kubectl(env.sim, "annotate", "node", node, "--overwrite", *annotations)
    await create_as_upstream(env, owned_by(documents, env.policy()), tmp_path / "operands.yaml")
    await kubectl(env.sim, "create", "-f", "-", stdin=json.dumps(nvidia_operator_scaled_to_zero()))


@needs_kubectl
async def test_a_field_only_nvidias_manager_set_goes_instead_of_making_every_write_invalid(
    env: Env, tmp_path: Path
) -> None:
    # Server-side apply keeps a field another manager owns: NVIDIA's `value` beside our
    # `valueFrom` would make every write of the MIG manager a 422, retried forever.
    await lay_down(env, tmp_path, upstream_documents(namespace_as_a_literal))
    daemonsets = env.daemonsets()
    await wait_running(env)
    mig_pods = sorted(
        p["metadata"]["name"]
        for p in operand_pods(env).values()
        if p["metadata"]["name"].startswith("nvidia-mig-manager")
    )
    assert mig_pods
    code, plan = await plan_of(env)
    assert code == adoption.EXIT_OK, plan
    verdicts = verdicts_of(plan)
    mig = verdicts["DaemonSet/nvidia-mig-manager"]
    assert mig["verdict"] == "patch", mig
    assert mig["rolls"], mig
    assert mig["restarts"] == mig_pods
    assert plan["restarts"] == mig_pods  # exactly these pods, no other
    env_path = (
        "spec.template.spec.containers[nvidia-mig-manager].env[DEFAULT_GPU_CLIENTS_NAMESPACE]"
    )
    assert {f"{env_path}.value", f"{env_path}.valueFrom"} <= set(mig["changes"]), mig
    for name in set(daemonsets) - {"nvidia-mig-manager"}:
        assert verdicts[f"DaemonSet/{name}"]["verdict"] == "adopt", name
    code, table = await adopt_dry_run(env, "table")
    assert code == adoption.EXIT_OK
    assert f"pods that would restart ({len(mig_pods)}): {', '.join(mig_pods)}" in table

    env.start_operator()
    await env.wait_ready()
    await env.wait(
        lambda: not any(previous_writers(d) for d in env.daemonsets().values()),
        "no DaemonSet with fields of NVIDIA's manager",
    )
    mig_ds = env.daemonsets()["nvidia-mig-manager"]
    [var] = [
        v
        for c in mig_ds["spec"]["template"]["spec"]["containers"]
        for v in c.get("env") or []
        if v["name"] == "DEFAULT_GPU_CLIENTS_NAMESPACE"
    ]
    assert var == {
        "name": "DEFAULT_GPU_CLIENTS_NAMESPACE",
        "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}},
    }
    for name, ds in env.daemonsets().items():
        if name != "nvidia-mig-manager":
            assert ds["metadata"]["generation"] == daemonsets[name]["metadata"]["generation"]


@needs_kubectl
async def test_adopt_reports_a_write_the_api_server_would_reject_as_blocked(
    env: Env, tmp_path: Path
) -> None:
    def older_binding(doc: Obj) -> None:
        if doc["kind"] == "RoleBinding" and doc["metadata"]["name"] == "nvidia-driver":
            doc["roleRef"] = {**doc["roleRef"], "name": "nvidia-driver-legacy"}

    await lay_down(env, tmp_path, upstream_documents(older_binding))
    code, plan = await plan_of(env)
    assert code == adoption.EXIT_BLOCKED, plan
    binding = verdicts_of(plan)["RoleBinding/nvidia-driver"]
    assert binding["verdict"] == "blocked"
    assert "cannot change roleRef" in binding["reason"], binding
    code, table = await adopt_dry_run(env, "table")
    assert code == adoption.EXIT_BLOCKED
    assert "RoleBinding/nvidia-driver" in table
    assert "blocked" in table


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
    async with kubesim.Cluster(
        kubelet=KubeletConfig(instant=True), authorization=mode, images=TEST_IMAGES
    ) as sim:
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
    as_nvidias_crds(env)
    daemonsets = env.daemonsets()
    assert len(daemonsets) == 8
    before = await wait_running(env)
    assert len(before) > 0
    await check_the_plan(env, daemonsets)
    await take_over(env, daemonsets, uid, tmp_path / "o.yaml")
