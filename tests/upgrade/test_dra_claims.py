"""Pods holding `gpu.nvidia.com` ResourceClaims are GPU pods for driver upgrades (as upstream
26.7 counts them): evicted before the driver restarts. Admin-access claims (monitoring and
validation) and other drivers' claims are not; a claim not seen yet counts, as upstream counts a
claim it cannot read."""

from __future__ import annotations

import dataclasses
from typing import Any

from upgrade_fleet import NS, T0, Fleet, driver_pod, gpu_pod, node, of_type

from gpu_operator.upgrade import actions, planner, states
from gpu_operator.upgrade.snapshot import Claim, Snapshot, claim_from, pod_from


def claim(name: str, driver: str = "gpu.nvidia.com", admin: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = {"request": "gpu", "driver": driver, "pool": "n", "device": "gpu-0"}
    if admin:
        result["adminAccess"] = True
    return {
        "metadata": {"namespace": "ml", "name": name},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def pod_object(name: str, **spec: Any) -> dict[str, Any]:
    status = spec.pop("status", {})
    return {
        "metadata": {"namespace": "ml", "name": name, "ownerReferences": [
            {"kind": "ReplicaSet", "uid": "rs", "controller": True}]},
        "spec": {"nodeName": "gpu-01", "containers": [{"name": "c", "image": "i"}], **spec},
        "status": {"phase": "Running", **status},
    }  # fmt: skip


def test_claim_from_counts_only_gpu_nvidia_com_without_admin_access() -> None:
    assert claim_from(claim("a")).gpu
    assert not claim_from(claim("b", admin=True)).gpu
    assert not claim_from(claim("c", driver="nic.example.com")).gpu
    assert not claim_from({"metadata": {"namespace": "ml", "name": "d"}}).gpu  # unallocated


def test_pod_from_reads_named_claims_and_claims_made_from_templates() -> None:
    pod = pod_from(pod_object(
        "p",
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"},
                        {"name": "fixed", "resourceClaimName": "shared"},
                        {"name": "later", "resourceClaimTemplateName": "one-gpu"}],
        status={"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x1"}]},
    ))  # fmt: skip
    assert pod.claims == ("p-gpu-x1", "shared")
    assert not pod.gpu  # no nvidia.com/gpu request: the snapshot decides from the claims


def snapshot_of(fleet: Fleet, claims: list[Claim] | None) -> Snapshot:
    return Snapshot.build(
        now=fleet.now, nodes=fleet.nodes.values(), daemonsets=fleet.daemonsets,
        revisions=fleet.revisions, pods=fleet.pods, owners=[fleet.owner], namespace=NS,
        claims=claims,
    )  # fmt: skip


def deleting_fleet(*pods: Any) -> Fleet:
    fleet = Fleet()
    annotations = {states.STATE_SINCE: str(int(T0))}
    fleet.add(
        node("gpu-01", states.POD_DELETION_REQUIRED, unschedulable=True, ours=True,
             annotations=annotations),
        driver_pod("gpu-01"), *pods,
    )  # fmt: skip
    return fleet


def test_claim_pods_are_evicted_before_the_driver_restarts() -> None:
    claims = [claim_from(claim(n)) for n in ("train-gpu",)] + [
        claim_from(claim("monitor-gpu", admin=True)),
        claim_from(claim("nic", driver="nic.example.com")),
    ]
    pods = [
        dataclasses.replace(gpu_pod("gpu-01", "train", gpu=False), claims=("train-gpu",)),
        dataclasses.replace(gpu_pod("gpu-01", "monitor", gpu=False), claims=("monitor-gpu",)),
        dataclasses.replace(gpu_pod("gpu-01", "net", gpu=False), claims=("nic",)),
        dataclasses.replace(gpu_pod("gpu-01", "unseen", gpu=False), claims=("not-cached-yet",)),
        gpu_pod("gpu-01", "web", gpu=False),
    ]
    fleet = deleting_fleet(*pods)
    plan = planner.plan(snapshot_of(fleet, claims))
    evicted = sorted(e.name for e in of_type(plan, actions.EvictPod))
    assert evicted == ["train", "unseen"]
    # Without the DRA API (no claim cache) only nvidia.com/gpu requests count, as before.
    assert of_type(planner.plan(snapshot_of(fleet, None)), actions.EvictPod) == []


def test_the_node_moves_on_once_the_claim_pod_is_gone() -> None:
    claims = [claim_from(claim("train-gpu"))]
    pod = dataclasses.replace(gpu_pod("gpu-01", "train", gpu=False), claims=("train-gpu",))
    fleet = deleting_fleet(pod)
    plan = planner.plan(snapshot_of(fleet, claims))
    assert all(a.node != "gpu-01" for a in of_type(plan, actions.PatchNode))
    fleet.pods = [p for p in fleet.pods if p.name != "train"]
    patches = of_type(planner.plan(snapshot_of(fleet, claims)), actions.PatchNode)
    assert patches[0].labels[states.STATE_LABEL] == states.POD_RESTART_REQUIRED
