"""`gpu-operator upgrade plan`: what a driver upgrade will do, before anything changes.

The snapshot comes from a live cluster (`--kubeconfig`, optionally with the policy you are about to
apply) or from files (a policy and the facts file `render` takes). Either way the controller's own
planner runs against a modelled clock (`upgrade.simulate`), so the batches shown are the ones the
controller would form.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic

from gpu_operator import api
from gpu_operator.api import keys, manifests
from gpu_operator.cli import render as render_mod
from gpu_operator.operands import driver as driver_operand
from gpu_operator.upgrade import selectors, simulate, snapshot, states
from gpu_operator.upgrade.snapshot import DaemonSet, Node, Pod, Revision, Snapshot

NAMESPACE = "gpu-operator"
CURRENT = "current"
NEXT = "next"
_SYNTHETIC_TIME = 1_800_000_000.0
# Kernel flavours NVIDIA publishes precompiled driver images for (Ubuntu only):
# ../shared/reference/users-and-peers.md §1.1 (GO#910, GO#1203).
PUBLISHED_FLAVOURS = ("generic", "aws", "azure", "oracle")


class PlanError(ValueError):
    """Input the plan cannot use; the message names the file and what is wrong."""


# ----- offline facts ----------------------------------------------------------------------------


class _Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Budget(_Strict):
    name: str
    disruptions_allowed: int = pydantic.Field(default=0, ge=0, alias="disruptionsAllowed")


class PoolWork(_Strict):
    """GPU pods each node of a pool runs, and the PDB covering them, if any."""

    gpu_pods: int = pydantic.Field(default=0, ge=0, alias="gpuPods")
    pdb: Budget | None = None


class UpgradeFacts(_Strict):
    """The facts file's optional `upgrade:` section (read only by `upgrade plan`)."""

    workloads: dict[str, PoolWork] = pydantic.Field(default_factory=dict)
    cordoned: list[str] = pydantic.Field(default_factory=list)
    precompiled_kernels: list[str] | None = pydantic.Field(default=None, alias="precompiledKernels")


def load_facts(path: str | Path) -> tuple[render_mod.FactsFile, UpgradeFacts]:
    """The render facts file plus its `upgrade:` section (errors name the file and field)."""
    try:
        data = manifests.load_one(path)
    except manifests.ManifestError as err:
        raise PlanError(str(err)) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PlanError(f"{path}: expected a mapping of facts")
    data = dict(data)
    raw = data.pop("upgrade", None) or {}
    try:
        upgrade = UpgradeFacts.model_validate(raw)
    except pydantic.ValidationError as err:
        raise PlanError(f"{path}: upgrade.{manifests.field_errors(err)}") from None
    try:
        facts = render_mod.parse_facts(data, str(path))
    except render_mod.FactsError as err:
        raise PlanError(str(err)) from None
    pools = {p.name for p in facts.pools}
    unknown = sorted(set(upgrade.workloads) - pools)
    if unknown:
        raise PlanError(f"{path}: upgrade.workloads: no pool named {', '.join(unknown)}")
    return facts, upgrade


def _pod(name: str, node: str, *, namespace: str, labels: Mapping[str, str], **kw: Any) -> Pod:
    defaults: dict[str, Any] = {
        "phase": "Running",
        "ready": True,
        "deleting": False,
        "created": _SYNTHETIC_TIME - 3600,
        "controller_kind": "ReplicaSet",
        "controller_uid": f"uid-{name}",
        "gpu": False,
        "empty_dir": False,
        "restarts": 0,
        "grace_seconds": 30,
    }
    defaults.update(kw)
    return Pod(namespace=namespace, name=name, node=node, labels=dict(labels), **defaults)


def offline_snapshot(
    policy_doc: Mapping[str, Any],
    facts: render_mod.FactsFile,
    upgrade: UpgradeFacts,
    namespace: str | None = None,
) -> Snapshot:
    """A fleet built from the facts, every node on an older driver than the policy's."""
    checked = api.check_document(dict(policy_doc))
    if not checked.ok or not isinstance(checked.obj, api.ClusterPolicy):
        problems = "; ".join(str(p) for p in checked.errors) or "not a ClusterPolicy"
        raise PlanError(f"the policy cannot be planned: {problems}")
    ns = namespace or facts.namespace or NAMESPACE
    rendered = render_mod.render(checked.obj, facts, ns)
    driver_sets = [
        o
        for o in rendered.objects
        if o.get("kind") == "DaemonSet"
        and (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
        == driver_operand.COMPONENT
    ]
    if not driver_sets:
        reasons = "; ".join(f"{n}: {m}" for n, kind, m in rendered.notes if n == "state-driver")
        raise PlanError(
            "the policy deploys no driver DaemonSet" + (f" ({reasons})" if reasons else "")
        )
    owner_doc = copy.deepcopy(dict(policy_doc))
    owner_doc.setdefault("metadata", {})["uid"] = "uid-policy"
    owner = snapshot.owner_from(owner_doc)
    daemonsets: list[DaemonSet] = []
    revisions: list[Revision] = []
    for i, obj in enumerate(driver_sets):
        body = copy.deepcopy(obj)
        body["metadata"]["uid"] = f"uid-pool-{i}"
        body["metadata"]["ownerReferences"] = [
            {"kind": "ClusterPolicy", "name": owner.name, "uid": owner.uid, "controller": True}
        ]
        ds = snapshot.daemonset_from(body)
        daemonsets.append(ds)
        revisions += [
            Revision(f"{ds.name}-{CURRENT}", CURRENT, 1, ds.uid),
            Revision(f"{ds.name}-{NEXT}", NEXT, 2, ds.uid),
        ]
    validator = any(
        o.get("kind") == "DaemonSet" and o["metadata"]["name"] == states.VALIDATOR_APP
        for o in rendered.objects
    )
    if validator:
        daemonsets.append(
            snapshot.daemonset_from(
                {
                    "metadata": {
                        "name": states.VALIDATOR_APP,
                        "namespace": ns,
                        "uid": "uid-validator",
                        "labels": {"app": states.VALIDATOR_APP},
                    },
                }
            )
        )
    nodes: list[Node] = []
    pods: list[Pod] = []
    budgets: list[snapshot.Budget] = []
    cordoned = set(upgrade.cordoned)
    for pool in facts.pools:
        labels = render_mod.pool_labels(pool, nfd=facts.nfd)
        if pool.gpu is not None and pool.workload == "container":
            labels[states.DRIVER_DEPLOY_LABEL] = "true"
        work = upgrade.workloads.get(pool.name, PoolWork())
        if work.pdb is not None:
            budgets.append(
                snapshot.Budget(
                    "workloads",
                    work.pdb.name,
                    selectors.parse(f"pool={pool.name}"),
                    work.pdb.disruptions_allowed,
                )
            )
        for n in range(1, pool.nodes + 1):
            name = f"{pool.name}-{n}"
            nodes.append(
                Node(
                    name=name,
                    labels=dict(labels),
                    annotations={},
                    unschedulable=name in cordoned,
                    ready=True,
                )
            )
            pool_ds = next((d for d in daemonsets if d.driver and _selects(d, labels)), None)
            if pool_ds is None:
                continue
            pods.append(
                _pod(
                    f"{pool_ds.name}-{name}",
                    name,
                    namespace=ns,
                    controller_kind="DaemonSet",
                    controller_uid=pool_ds.uid,
                    labels={"app": states.DRIVER_APP, states.REVISION_HASH_LABEL: CURRENT},
                )
            )
            if validator:
                pods.append(
                    _pod(
                        f"validator-{name}",
                        name,
                        namespace=ns,
                        controller_kind="DaemonSet",
                        controller_uid="uid-validator",
                        labels={"app": states.VALIDATOR_APP},
                    )
                )
            for k in range(work.gpu_pods):
                pods.append(
                    _pod(
                        f"{pool.name}-gpu-{n}-{k}",
                        name,
                        namespace="workloads",
                        gpu=True,
                        labels={"pool": pool.name},
                    )
                )
    return Snapshot.build(
        now=_SYNTHETIC_TIME,
        nodes=nodes,
        daemonsets=daemonsets,
        revisions=revisions,
        pods=pods,
        budgets=budgets,
        owners=[owner],
        namespace=ns,
    )


def _selects(ds: DaemonSet, labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in ds.node_selector.items())


# ----- live cluster -----------------------------------------------------------------------------


@dataclass
class Listed:
    """Objects as listed from a cluster (plain dicts)."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    daemonsets: list[dict[str, Any]] = field(default_factory=list)
    revisions: list[dict[str, Any]] = field(default_factory=list)
    budgets: list[dict[str, Any]] = field(default_factory=list)
    policies: list[dict[str, Any]] = field(default_factory=list)


def _spec_changes(live: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether applying `wanted` changes the driver of `live` (a new DaemonSet revision)."""
    if live.get("kind") == "ClusterPolicy":
        before = (live.get("spec") or {}).get("driver") or {}
        after = (wanted.get("spec") or {}).get("driver") or {}
    else:
        before, after = dict(live.get("spec") or {}), dict(wanted.get("spec") or {})
    strip = ("upgradePolicy",)
    return {k: v for k, v in before.items() if k not in strip} != {
        k: v for k, v in after.items() if k not in strip
    }


def live_snapshot(
    listed: Listed,
    *,
    now: float,
    namespace: str = NAMESPACE,
    changes: Sequence[Mapping[str, Any]] = (),
) -> tuple[Snapshot, list[str]]:
    """The cluster as listed; `changes` are policies about to be applied (their driver changes
    give their pools a new revision, their upgradePolicy replaces the live one). Also returns
    notes on what the changes did."""
    policies = {(p.get("kind"), (p.get("metadata") or {}).get("name")): p for p in listed.policies}
    notes: list[str] = []
    changed_uids: set[str] = set()
    for doc in changes:
        ref = (doc.get("kind"), (doc.get("metadata") or {}).get("name"))
        live = policies.get(ref)
        if live is None:
            notes.append(f"{ref[0]}/{ref[1]}: not in the cluster; nothing of it is planned")
            continue
        merged = copy.deepcopy(dict(doc))
        merged.setdefault("metadata", {})["uid"] = (live.get("metadata") or {}).get("uid")
        policies[ref] = merged
        if _spec_changes(live, doc):
            changed_uids.add(str((live.get("metadata") or {}).get("uid")))
            notes.append(f"{ref[0]}/{ref[1]}: the driver changes; its nodes get a new revision")
        else:
            notes.append(f"{ref[0]}/{ref[1]}: the driver does not change; only the policy")
    daemonsets = [snapshot.daemonset_from(d) for d in listed.daemonsets]
    revisions = [snapshot.revision_from(r) for r in listed.revisions]
    for i, ds in enumerate(daemonsets):
        if ds.driver and ds.owner_uid in changed_uids:
            top = max((r.number for r in revisions if r.owner_uid == ds.uid), default=0)
            revisions.append(Revision(f"{ds.name}-{NEXT}", NEXT, top + 1, ds.uid))
            # The new template is not rendered here, so its config digest is unknown: plan the
            # full upgrade (evictions included), never the restart-only shortcut.
            daemonsets[i] = dataclasses.replace(ds, config_digest=None)
    snap = Snapshot.build(
        now=now,
        nodes=[snapshot.node_from(n) for n in listed.nodes],
        daemonsets=daemonsets,
        revisions=revisions,
        pods=[snapshot.pod_from(p) for p in listed.pods],
        budgets=[snapshot.budget_from(b) for b in listed.budgets],
        owners=[snapshot.owner_from(p) for p in policies.values()],
        namespace=namespace,
    )
    return snap, notes


# ----- the report ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Precompiled:
    """Whether a precompiled driver image exists for a kernel, and where that fact comes from.

    `verdict` is yes/no when known, likely/unlikely when guessed, n/a or unknown."""

    available: bool | None
    verdict: str
    source: str


def precompiled_for(
    kernel: str, os_id: str, *, usable: bool, listed: Iterable[str] | None, running: set[str]
) -> Precompiled:
    if not usable:
        return Precompiled(None, "n/a", "the driver is built on the node (usePrecompiled off)")
    if kernel in running:
        return Precompiled(True, "yes", "a precompiled driver pod for this kernel runs")
    if listed is not None:
        found = kernel in set(listed)
        return Precompiled(found, "yes" if found else "no", "facts file upgrade.precompiledKernels")
    if not kernel:
        return Precompiled(None, "unknown", "the node has no NFD kernel-version label")
    flavour = kernel.rsplit("-", 1)[-1]
    published = "/".join(PUBLISHED_FLAVOURS)
    source = (
        f"NVIDIA publishes precompiled images only for Ubuntu {published} kernels; "
        "the registry was not checked"
    )
    if os_id == "ubuntu" and flavour in PUBLISHED_FLAVOURS:
        return Precompiled(True, "likely", source)
    return Precompiled(False, "unlikely", source)


def report(
    snap: Snapshot,
    outcome: simulate.Outcome,
    timing: simulate.Timing,
    *,
    precompiled_kernels: Iterable[str] | None = None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """The plan as data: what `-o json` prints and the tables show."""
    listed = list(precompiled_kernels) if precompiled_kernels is not None else None
    pools = {d.name: d for d in snap.daemonsets if d.driver}
    by_uid = {d.uid: d for d in pools.values()}
    changing = {r.owner_uid for r in snap.revisions if r.hash == NEXT}
    # A ready precompiled driver pod running its pool's image proves that image exists for its
    # node's kernel (only while the pool is not about to change image).
    running_kernels = {
        snap.nodes[p.node].kernel
        for p in snap.pods
        if p.ready
        and p.node in snap.nodes
        and p.controller_uid in by_uid
        and p.controller_uid not in changing
        and by_uid[p.controller_uid].precompiled
        and p.image == by_uid[p.controller_uid].image
    }
    nodes: list[dict[str, Any]] = []
    for name in sorted(outcome.nodes):
        run = outcome.nodes[name]
        node = snap.nodes.get(name)
        pool = pools.get(run.pool)
        kernel = node.kernel if node else ""
        os_id = node.labels.get(keys.NFD_OS_ID, "") if node else ""
        pre = precompiled_for(
            kernel,
            os_id,
            usable=bool(pool and pool.precompiled),
            listed=listed,
            running=running_kernels,
        )
        nodes.append(
            {
                "name": name,
                "pool": run.pool,
                "batch": run.batch,
                "startSeconds": _rel(run.started, snap.now),
                "doneSeconds": _rel(run.finished, snap.now),
                "state": run.state,
                "canary": run.canary,
                "evicts": run.evicted,
                "blockedBy": sorted(run.blocked_by),
                "message": run.message,
                "kernel": kernel,
                "precompiled": {
                    "available": pre.available,
                    "verdict": pre.verdict,
                    "source": pre.source,
                },
                "cordoned": bool(node and node.unschedulable),
            }
        )
    by_name = {n["name"]: n for n in nodes}
    batches: list[dict[str, Any]] = []
    for index, members in enumerate(outcome.batches):
        starts = [by_name[m]["startSeconds"] for m in members if m in by_name]
        batches.append(
            {
                "batch": index,
                "startSeconds": min(s for s in starts if s is not None) if starts else None,
                "nodes": members,
                "evicts": [p for m in members for p in by_name[m]["evicts"]],
                "blockedBy": sorted({b for m in members for b in by_name[m]["blockedBy"]}),
                "canary": any(by_name[m]["canary"] for m in members),
            }
        )
    # Nodes that need the upgrade: those that started, and those left waiting.
    upgrading = [n for n in nodes if n["batch"] is not None or n["state"] != states.UPGRADE_DONE]
    groups: list[dict[str, Any]] = []
    ideal = 0.0
    for owner in snap.owners:
        owned = [n for n in upgrading if _owner_of(snap, n["pool"]) == owner.uid]
        policy = owner.policy
        parallel = policy.max_parallel or max(len(owned), 1)
        validates = any(d.validator for d in snap.daemonsets)
        per_node = max(
            (
                timing.per_node(
                    precompiled=pools[n["pool"]].precompiled,
                    evicts=bool(n["evicts"]),
                    validates=validates,
                )
                for n in owned
                if n["pool"] in pools
            ),
            default=0.0,
        )
        ideal = max(ideal, math.ceil(len(owned) / parallel) * per_node) if owned else ideal
        groups.append(
            {
                "owner": f"{owner.kind}/{owner.name}",
                "autoUpgrade": policy.auto_upgrade,
                "maxParallelUpgrades": policy.max_parallel,
                "maxUnavailable": policy.max_unavailable,
                "canaryNodes": policy.canary.nodes,
                "maxFailedNodes": policy.canary.max_failed,
                "rollback": policy.canary.rollback,
                "error": policy.error,
                "nodes": sum(1 for n in nodes if _owner_of(snap, n["pool"]) == owner.uid),
                "upgrading": len(owned),
            }
        )
    return {
        "policies": groups,
        "notes": list(notes),
        "timing": {
            "evictionSeconds": timing.eviction,
            "driverStartSeconds": timing.driver_start,
            "driverStartPrecompiledSeconds": timing.driver_start_precompiled,
            "validationSeconds": timing.validation,
            "source": "estimates (defaults or the command's --*-seconds options), not measurements",
        },
        "estimate": {
            "seconds": outcome.duration,
            "idealSeconds": ideal,
            "finished": outcome.finished,
            "peakUnavailable": outcome.peak_unavailable,
            "peakInProgress": outcome.peak_in_progress,
        },
        "batches": batches,
        "nodes": nodes,
    }


def _owner_of(snap: Snapshot, pool: str) -> str | None:
    ds = next((d for d in snap.daemonsets if d.name == pool), None)
    return ds.owner_uid if ds else None


def _rel(value: float | None, start: float) -> float | None:
    return None if value is None else value - start
