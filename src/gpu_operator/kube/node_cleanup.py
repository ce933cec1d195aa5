"""Uninstall clean-up: remove the node labels the operator and GFD recorded as theirs.

The chart's post-delete hook runs this (`gpu-operator cleanup-nodes`) once the release's objects
are gone, as NFD's chart runs `nfd-master -prune` for NFD's labels. Only labels a ledger lists,
still holding the value that was written, are removed; nothing else on a node is touched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from gpu_operator.api import keys
from gpu_operator.kube.node_features import OWNED_LABELS_ANNOTATION as GFD_LEDGER
from gpu_operator.nodes import labelling
from gpu_operator.operands import dra_driver

log = logging.getLogger(__name__)

# The operator Deployment's pods (its selector labels in the chart).
OPERATOR_SELECTOR = "app.kubernetes.io/component=gpu-operator"
# Node keys only our operands write: the driver-upgrade state machine's (a stale `upgrade-done`
# left by an uninstall confuses the next install, upstream GO#782; the `skip` labels are set by
# people, so they stay) and the MIG manager's outcome.
# The MIG manager's outcome keys describe a MIG manager that no longer runs once the release is
# gone (the MIG layout itself stays on the GPUs; `nvidia.com/mig.config` is the labeller's, in
# its ledger).
UPGRADE_LABELS = (keys.UPGRADE_STATE, keys.MIG_CONFIG_STATE)
# The GPUCluster's deploy labels (controller/gpucluster.py): it writes only "true" and puts
# "true" back over any other value on a GPU node, so a "true" is ours; another value is left.
# The operator itself is gone before it could see its GPUCluster deleted.
DRA_DEPLOY_LABELS = dra_driver.DEPLOY_LABELS
UPGRADE_ANNOTATIONS = (
    keys.MIG_CONFIG_STATE_MESSAGE,
    keys.UPGRADE_ENABLED,
    keys.UPGRADE_SAFE_LOAD,
    keys.UPGRADE_INITIAL_UNSCHEDULABLE,
    keys.UPGRADE_WAIT_FOR_POD_COMPLETION_START,
    keys.UPGRADE_VALIDATION_START,
    keys.UPGRADE_REQUESTED,
)


class CleanupError(Exception):
    """The clean-up could not read or patch the nodes."""


def node_patch(labels: Mapping[str, str], annotations: Mapping[str, str]) -> dict[str, Any]:
    """The merge patch that leaves a node as the operator and GFD found it ({} when clean)."""
    plan = labelling.plan_cleanup(labels, annotations)
    new_labels: dict[str, str | None] = dict(plan.labels)
    new_annotations: dict[str, str | None] = dict(plan.annotations)
    if GFD_LEDGER in annotations:
        gfd = (annotations.get(GFD_LEDGER) or "").split(",")
        new_labels.update({key: None for key in gfd if key in labels})
        new_annotations[GFD_LEDGER] = None
    new_labels.update({key: None for key in UPGRADE_LABELS if key in labels})
    dra = {key: None for key in DRA_DEPLOY_LABELS if labels.get(key) == "true"}
    if dra and labelling.has_gpu(labels) and labels.get(keys.GPU_PRESENT) == "true":
        # Written with them on a node NFD found a GPU on (operands/dra_driver.node_label_patch).
        dra[keys.GPU_PRESENT] = None
    new_labels.update(dra)
    new_annotations.update({key: None for key in UPGRADE_ANNOTATIONS if key in annotations})
    metadata: dict[str, Any] = {}
    if new_labels:
        metadata["labels"] = new_labels
    if new_annotations:
        metadata["annotations"] = new_annotations
    return {"metadata": metadata} if metadata else {}


async def wait_for_pods_gone(
    client: AsyncClient,
    namespace: str,
    selector: str,
    *,
    timeout: float,
    poll_interval: float = 0.5,
) -> bool:
    """Whether every running pod matching `selector` went away within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        pods = [
            p
            async for p in client.list(Pod, namespace=namespace, labels=_selector(selector))
            if (p.status.phase if p.status else None) not in ("Succeeded", "Failed")
        ]
        if not pods:
            return True
        if time.monotonic() >= deadline:
            names = ", ".join(sorted(p.metadata.name or "" for p in pods if p.metadata))
            log.warning("operator pods still running after %.0fs: %s", timeout, names)
            return False
        await asyncio.sleep(poll_interval)


def _selector(text: str) -> dict[str, Any]:
    pairs = (item.split("=", 1) for item in text.split(",") if item)
    return {key.strip(): value.strip() for key, value in pairs}


async def cleanup(client: AsyncClient) -> list[str]:
    """Patch every node that carries a label of ours; returns the names of the nodes changed."""
    changed: list[str] = []
    async for node in client.list(Node):
        meta = node.metadata
        if meta is None or meta.name is None:
            continue
        patch = node_patch(meta.labels or {}, meta.annotations or {})
        if not patch:
            continue
        await client.patch(Node, meta.name, patch, patch_type=PatchType.MERGE)
        changed.append(meta.name)
    return changed
