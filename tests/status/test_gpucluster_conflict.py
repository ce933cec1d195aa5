"""Who runs when a GPUCluster and a ClusterPolicy both exist (status/gpucluster.py): the older,
and on a same-second tie what the statuses already say, so the verdict never flips."""

from __future__ import annotations

from typing import Any

from gpu_operator.status import gpucluster as gc_status

T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T00:00:01Z"


def obj(kind: str, name: str, created: str, **status: Any) -> dict[str, Any]:
    return {
        "kind": kind,
        "metadata": {"name": name, "creationTimestamp": created},
        **({"status": status} if status else {}),
    }


def refused_status() -> dict[str, Any]:
    return {
        "state": "notReady",
        "conditions": [
            {"type": "Ready", "status": "False", "reason": gc_status.CONFLICT_REASON},
        ],
    }


def winner_status() -> dict[str, Any]:
    # The winner also carries a Conflict condition with the same reason: not a refusal.
    return {
        "state": "ready",
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Reconciled"},
            {"type": "Conflict", "status": "True", "reason": gc_status.CONFLICT_REASON},
        ],
    }


def refused_kind(cluster: dict[str, Any], policy: dict[str, Any]) -> str | None:
    clash = gc_status.conflict(cluster, [policy])
    return None if clash is None else clash.refused_kind


def test_the_newer_object_is_refused() -> None:
    assert refused_kind(obj("GPUCluster", "gpu-cluster", T0), obj("ClusterPolicy", "cp", T1)) == (
        "ClusterPolicy"
    )
    assert refused_kind(obj("GPUCluster", "gpu-cluster", T1), obj("ClusterPolicy", "cp", T0)) == (
        "GPUCluster"
    )


def test_a_same_second_tie_keeps_the_one_that_ran_first() -> None:
    """The GPUCluster ran (it has a status) when the ClusterPolicy came within the same second:
    the ClusterPolicy is refused, not the running GPUCluster (the flaky controller test's case)."""
    running = obj("GPUCluster", "gpu-cluster", T0, **winner_status())
    assert refused_kind(running, obj("ClusterPolicy", "cp", T0)) == "ClusterPolicy"
    running_cp = obj("ClusterPolicy", "cp", T0, **winner_status())
    assert refused_kind(obj("GPUCluster", "gpu-cluster", T0), running_cp) == "GPUCluster"


def test_a_tie_stays_settled_once_one_side_is_refused() -> None:
    # Both have a status now; the one already refused stays refused, whichever it is.
    cluster = obj("GPUCluster", "gpu-cluster", T0, **winner_status())
    policy = obj("ClusterPolicy", "cp", T0, **refused_status())
    assert refused_kind(cluster, policy) == "ClusterPolicy"
    cluster = obj("GPUCluster", "gpu-cluster", T0, **refused_status())
    policy = obj("ClusterPolicy", "cp", T0, **winner_status())
    assert refused_kind(cluster, policy) == "GPUCluster"


def test_a_tie_with_nothing_known_refuses_the_gpucluster() -> None:
    assert refused_kind(obj("GPUCluster", "gpu-cluster", T0), obj("ClusterPolicy", "cp", T0)) == (
        "GPUCluster"
    )


def test_policy_in_charge_is_none_when_refused() -> None:
    cluster = obj("GPUCluster", "gpu-cluster", T0)
    older, newer = (
        obj("ClusterPolicy", "cp", "2025-12-31T00:00:00Z"),
        obj("ClusterPolicy", "cp", T1),
    )
    assert gc_status.policy_in_charge([newer], [cluster]) is None
    assert gc_status.policy_in_charge([older], [cluster]) is older
    assert gc_status.policy_in_charge([newer], []) is newer
    deleting = {**cluster, "metadata": {**cluster["metadata"], "deletionTimestamp": T1}}
    assert gc_status.policy_in_charge([newer], [deleting]) is newer
