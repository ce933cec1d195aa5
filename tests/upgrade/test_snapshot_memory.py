"""The upgrade planner's pod cache at scale (issue 32): at 20,000 nodes it holds 140,000 pods, so
each pod keeps no __dict__, shares its DaemonSet's strings and one labels dict per label set."""

from __future__ import annotations

from typing import Any

from gpu_operator.upgrade import snapshot


def pod(name: str, node: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name, "namespace": "gpu-operator", "labels": dict(labels),
            "ownerReferences": [{"kind": "DaemonSet", "uid": "u" * 36, "controller": True}],
        },
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "r/driver:1"}]},
        "status": {"phase": "Running"},
    }  # fmt: skip


def test_pods_of_one_daemonset_share_labels_and_strings() -> None:
    labels = {"app": "nvidia-driver-daemonset", "controller-revision-hash": "abc"}
    first = snapshot.pod_from(pod("a", "n1", labels))
    second = snapshot.pod_from(pod("b", "n2", labels))
    assert first.labels == second.labels == labels
    assert first.labels is second.labels
    assert first.controller_uid is second.controller_uid
    assert first.image is second.image
    assert first.phase is second.phase
    assert not hasattr(first, "__dict__")
    # Different labels are never confused with a shared set.
    other = snapshot.pod_from(pod("c", "n3", {**labels, "controller-revision-hash": "def"}))
    assert other.labels["controller-revision-hash"] == "def"
    assert first.labels["controller-revision-hash"] == "abc"
    assert snapshot.pod_from(pod("d", "n4", {})).labels == {}
