"""The only code that writes to the API: apply-if-changed, prune, label and status patches, events.

Every write goes through here, so the scale benchmark's request counts and the "no write in steady
state" rule are properties of one small module.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from datetime import UTC, datetime
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import PodEviction
from lightkube.types import CascadeType, PatchType

from gpu_operator.api import keys
from gpu_operator.kube import resources

log = logging.getLogger(__name__)


def content_hash(obj: dict[str, Any]) -> str:
    """A stable hash of an object's desired content (our own hash annotation excluded)."""
    clean = copy.deepcopy(obj)
    meta = clean.get("metadata") or {}
    annotations = meta.get("annotations")
    if annotations is not None:
        annotations.pop(keys.LAST_APPLIED_HASH, None)
        if not annotations:
            del meta["annotations"]
    encoded = json.dumps(clean, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:20]


def with_hash(obj: dict[str, Any]) -> dict[str, Any]:
    stamped = copy.deepcopy(obj)
    meta = stamped.setdefault("metadata", {})
    meta.setdefault("annotations", {})[keys.LAST_APPLIED_HASH] = content_hash(obj)
    return stamped


def needs_write(desired: dict[str, Any], live: dict[str, Any] | None) -> bool:
    """Whether the live object differs from what we would apply (by our hash annotation)."""
    if live is None:
        return True
    annotations = (live.get("metadata") or {}).get("annotations") or {}
    return bool(annotations.get(keys.LAST_APPLIED_HASH) != content_hash(desired))


class Writer:
    """Executes plans against the API server."""

    def __init__(self, client: AsyncClient, *, namespace: str, component: str = "gpu-operator"):
        self.client = client
        self.namespace = namespace
        self.component = component

    async def apply(self, desired: dict[str, Any]) -> None:
        """Server-side apply (create or update) with our field manager, taking over conflicts."""
        # lightkube takes the namespace from the object's metadata.
        await self.client.apply(resources.wrap(with_hash(desired)), force=True)

    async def delete(self, obj: dict[str, Any], *, orphan: bool = False) -> None:
        """Delete an object; already gone is fine."""
        meta = obj.get("metadata") or {}
        res = resources.of(obj)
        kind = resources.kind_of(obj["apiVersion"], obj["kind"])
        try:
            await self.client.delete(
                res,
                meta["name"],
                namespace=meta.get("namespace") if kind.namespaced else None,
                cascade=CascadeType.ORPHAN if orphan else CascadeType.BACKGROUND,
            )
        except ApiError as err:
            if err.status.code != 404:
                raise

    async def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch a node and return it as the server stored it."""
        result = await self.client.patch(resources.NODE, name, patch, patch_type=PatchType.MERGE)
        return dict(result)

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """Merge-patch a pod's metadata (labels, ownerReferences)."""
        await self.client.patch(
            resources.POD, name, patch, namespace=namespace, patch_type=PatchType.MERGE
        )

    async def evict(self, namespace: str, name: str) -> str | None:
        """Evict a pod through the Eviction API, which honours PodDisruptionBudgets. None when the
        pod is going (or already gone); otherwise the server's reason for refusing (429)."""
        body = PodEviction(metadata=ObjectMeta(name=name, namespace=namespace))
        try:
            await self.client.create(body, name=name, namespace=namespace)
        except ApiError as err:
            if err.status.code == 404:
                return None
            if err.status.code == 429:
                return str(err.status.message)
            raise
        return None

    async def patch_namespace_labels(self, name: str, labels: dict[str, str]) -> None:
        await self.client.patch(
            resources.resource("v1", "Namespace"), name, {"metadata": {"labels": labels}},
            patch_type=PatchType.MERGE,
        )  # fmt: skip

    async def patch_status(self, res: Any, name: str, status: dict[str, Any]) -> None:
        await self.client.patch(res.Status, name, {"status": status}, patch_type=PatchType.MERGE)

    async def event(
        self,
        involved: dict[str, Any],
        *,
        reason: str,
        message: str,
        type_: str = "Normal",
    ) -> None:
        """Record a core/v1 Event about an object (best effort: a failed event is only logged)."""
        meta = involved.get("metadata") or {}
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "generateName": f"{meta.get('name', 'object')}.",
                "namespace": meta.get("namespace") or self.namespace,
            },
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta.get("name"),
                "uid": meta.get("uid"),
                **({"namespace": meta["namespace"]} if meta.get("namespace") else {}),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": self.component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.client.create(resources.EVENT(body))
        except Exception as err:
            log.warning("could not record event %s on %s: %s", reason, meta.get("name"), err)
