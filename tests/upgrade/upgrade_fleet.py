"""Builders for upgrade planner tests: a fleet of nodes in one driver pool, as snapshots."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.api.upgrade_policy import DriverUpgradePolicySpec
from gpu_operator.nodes import ledger
from gpu_operator.upgrade import actions, planner, states
from gpu_operator.upgrade import policy as policy_mod
from gpu_operator.upgrade.selectors import from_object
from gpu_operator.upgrade.snapshot import (
    Budget,
    DaemonSet,
    Node,
    Owner,
    Pod,
    Revision,
    Snapshot,
)

NS = "gpu-operator"
POOL = "nvidia-driver-daemonset"
POOL_UID = "uid-driver-ds"
OWNER_UID = "uid-cluster-policy"
OLD = "aaaa"
NEW = "bbbb"
T0 = 1_800_000_000.0


def owner(
    annotations: Mapping[str, str] | None = None, *, auto_upgrade: bool = True, **spec: Any
) -> Owner:
    body = DriverUpgradePolicySpec.model_validate({"autoUpgrade": auto_upgrade, **spec})
    return Owner(
        kind="ClusterPolicy",
        name="cluster-policy",
        uid=OWNER_UID,
        policy=policy_mod.effective(body, annotations or {}),
    )


def pool(
    name: str = POOL, uid: str = POOL_UID, *, digest: str | None = None, **selector: str
) -> DaemonSet:
    return DaemonSet(
        namespace=NS,
        name=name,
        uid=uid,
        labels={"app": states.DRIVER_APP},
        owner_kind="ClusterPolicy",
        owner_name="cluster-policy",
        owner_uid=OWNER_UID,
        node_selector={states.DRIVER_DEPLOY_LABEL: "true", **selector},
        on_delete=True,
        config_digest=digest,
        image="nvcr.io/nvidia/driver:580-ubuntu22.04",
        precompiled=False,
    )


def validator_ds() -> DaemonSet:
    return DaemonSet(
        namespace=NS,
        name=states.VALIDATOR_APP,
        uid="uid-validator",
        labels={"app": states.VALIDATOR_APP},
        owner_kind="ClusterPolicy",
        owner_name="cluster-policy",
        owner_uid=OWNER_UID,
        node_selector={},
        on_delete=False,
        config_digest=None,
        image="",
        precompiled=False,
    )


def revisions(uid: str = POOL_UID, *hashes: str) -> list[Revision]:
    chosen = hashes or (OLD, NEW)
    return [
        Revision(name=f"{POOL}-{h}", hash=h, number=i + 1, owner_uid=uid)
        for i, h in enumerate(chosen)
    ]


def node(
    name: str,
    state: str = "",
    *,
    unschedulable: bool = False,
    ready: bool = True,
    ours: bool = False,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Node:
    all_labels = {states.DRIVER_DEPLOY_LABEL: "true", **(labels or {})}
    if state:
        all_labels[states.STATE_LABEL] = state
    all_annotations = dict(annotations or {})
    if ours:
        all_annotations[ledger.ANNOTATION] = json.dumps({ledger.CORDON: "driver-upgrade"})
    return Node(
        name=name,
        labels=all_labels,
        annotations=all_annotations,
        unschedulable=unschedulable,
        ready=ready,
        resource_version="1",
    )


def driver_pod(
    node_name: str,
    revision: str = OLD,
    *,
    ready: bool = True,
    phase: str = "Running",
    restarts: int = 0,
    created: float = T0 - 3600,
    deleting: bool = False,
    uid: str = POOL_UID,
    digest: str | None = None,
) -> Pod:
    return Pod(
        namespace=NS,
        name=f"driver-{node_name}",
        node=node_name,
        phase=phase,
        ready=ready,
        deleting=deleting,
        created=created,
        labels={"app": states.DRIVER_APP, states.REVISION_HASH_LABEL: revision},
        controller_kind="DaemonSet",
        controller_uid=uid,
        gpu=False,
        empty_dir=False,
        restarts=restarts,
        grace_seconds=30,
        config_digest=digest,
    )


def gpu_pod(
    node_name: str,
    name: str,
    *,
    namespace: str = "ml",
    controller: str | None = "ReplicaSet",
    labels: Mapping[str, str] | None = None,
    empty_dir: bool = False,
    deleting: bool = False,
    gpu: bool = True,
    phase: str = "Running",
) -> Pod:
    return Pod(
        namespace=namespace,
        name=name,
        node=node_name,
        phase=phase,
        ready=True,
        deleting=deleting,
        created=T0 - 600,
        labels=dict(labels or {"app": name}),
        controller_kind=controller,
        controller_uid=f"uid-{name}" if controller else None,
        gpu=gpu,
        empty_dir=empty_dir,
        restarts=0,
        grace_seconds=30,
    )


def validator_pod(node_name: str, *, created: float, ready: bool = True) -> Pod:
    return Pod(
        namespace=NS,
        name=f"validator-{node_name}",
        node=node_name,
        phase="Running",
        ready=ready,
        deleting=False,
        created=created,
        labels={"app": states.VALIDATOR_APP},
        controller_kind="DaemonSet",
        controller_uid="uid-validator",
        gpu=False,
        empty_dir=False,
        restarts=0,
        grace_seconds=30,
    )


def pdb(name: str, match: Mapping[str, str], allowed: int = 0, namespace: str = "ml") -> Budget:
    return Budget(namespace, name, from_object({"matchLabels": dict(match)}), allowed)


@dataclass
class Fleet:
    """A mutable fleet for planner tests: build a snapshot, plan, look at what came out."""

    nodes: dict[str, Node] = field(default_factory=dict)
    pods: list[Pod] = field(default_factory=list)
    budgets: list[Budget] = field(default_factory=list)
    owner: Owner = field(default_factory=owner)
    daemonsets: list[DaemonSet] = field(default_factory=lambda: [pool()])
    revisions: list[Revision] = field(default_factory=revisions)
    now: float = T0

    @classmethod
    def of(cls, count: int, *, state: str = states.UPGRADE_DONE, **kwargs: Any) -> Fleet:
        fleet = cls(**kwargs)
        for i in range(1, count + 1):
            name = f"gpu-{i:02d}"
            fleet.add(node(name, state), driver_pod(name))
        return fleet

    def add(self, new: Node, *pods: Pod) -> None:
        self.nodes[new.name] = new
        self.pods.extend(pods)

    def set_node(self, name: str, **changes: Any) -> None:
        self.nodes[name] = dataclasses.replace(self.nodes[name], **changes)

    def snapshot(self) -> Snapshot:
        return Snapshot.build(
            now=self.now,
            nodes=self.nodes.values(),
            daemonsets=self.daemonsets,
            revisions=self.revisions,
            pods=self.pods,
            budgets=self.budgets,
            owners=[self.owner],
            namespace=NS,
        )

    def plan(self) -> actions.Plan:
        return planner.plan(self.snapshot())


def patch_for(plan: actions.Plan, name: str) -> actions.PatchNode:
    found = [a for a in plan.actions if isinstance(a, actions.PatchNode) and a.node == name]
    assert len(found) == 1, f"expected one patch of {name}, got {found}"
    return found[0]


def no_patch(plan: actions.Plan, name: str) -> bool:
    return not any(isinstance(a, actions.PatchNode) and a.node == name for a in plan.actions)


def state_after(plan: actions.Plan, name: str) -> str:
    return plan.nodes[name].state


def of_type(plan: actions.Plan, kind: type[Any]) -> list[Any]:
    return [a for a in plan.actions if isinstance(a, kind)]
