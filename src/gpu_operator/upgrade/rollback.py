"""The rollback DaemonSet: a pool's previous driver revision, for the nodes rolled back to it.

A DaemonSet has one template, so the nodes that go back to the previous driver leave the pool's
own DaemonSet (their driver deploy label is paused, the way k8s-driver-manager pauses operands)
and are served by this one, built from the pool's ControllerRevision of that driver. It selects
nodes by our rollback label, so retrying a node hands it back by removing that label.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from gpu_operator.upgrade import states


def daemonset(
    *,
    name: str,
    namespace: str,
    pool: str,
    pool_uid: str,
    revision_hash: str,
    template: Mapping[str, Any],
) -> dict[str, Any]:
    """The rollback DaemonSet for `pool` at the revision whose pod template is `template`."""
    body = copy.deepcopy(dict(template))
    # A DaemonSet's ControllerRevision stores its template as a strategic-merge patch.
    body.pop("$patch", None)
    meta = body.setdefault("metadata", {})
    labels = dict(meta.get("labels") or {})
    labels[states.ROLLBACK_LABEL] = revision_hash
    meta["labels"] = labels
    spec = body.setdefault("spec", {})
    selector = {
        k: v for k, v in (spec.get("nodeSelector") or {}).items() if k != states.DRIVER_DEPLOY_LABEL
    }
    selector[states.ROLLBACK_LABEL] = revision_hash
    spec["nodeSelector"] = selector
    match = {states.ROLLBACK_LABEL: revision_hash}
    if "app" in labels:
        match["app"] = labels["app"]
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": name,
            "namespace": namespace,
            # No operand state label and not owned by the policy: the policy's pruning and
            # readiness leave it alone; it goes with the pool's DaemonSet (garbage collection).
            "labels": {
                states.ROLLBACK_LABEL: revision_hash,
                "app.kubernetes.io/managed-by": "gpu-operator",
            },
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": pool, "uid": pool_uid}
            ],
        },
        "spec": {
            "selector": {"matchLabels": match},
            "updateStrategy": {"type": "OnDelete"},
            "template": body,
        },
    }
