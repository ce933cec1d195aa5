"""The only code that writes to the API: apply-if-changed, prune, label and status patches, events.

Every write goes through here, so the scale benchmark's request counts and the "no write in steady
state" rule are properties of one small module.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import time
from collections.abc import Mapping
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


def selector_immutable(obj: Mapping[str, Any], err: ApiError) -> bool:
    """Whether a rejected write of a workload failed only because it changes `spec.selector`."""
    if obj.get("kind") not in ("DaemonSet", "Deployment", "StatefulSet") or err.status.code != 422:
        return False
    details = err.status.details
    causes = (details.causes if details is not None else None) or []
    fields = {c.field for c in causes if c.field}
    if fields:
        return fields == {"spec.selector"}
    message = str(err.status.message or "")
    return "spec.selector" in message and "immutable" in message


def labels_match(match_labels: Mapping[str, str], labels: Mapping[str, str] | None) -> bool:
    """Whether `labels` satisfy a selector's matchLabels."""
    have = labels or {}
    return all(have.get(k) == v for k, v in match_labels.items())


def selector_text(match_labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items())) or "<none>"


# Where Events about cluster-scoped objects (ClusterPolicy, NVIDIADriver, Node) are recorded.
# client-go's event recorder puts an Event in its involved object's namespace and, when that is
# empty, in `default` (tools/record makeEvent); `kubectl describe` finds them there, and they
# outlive the operator's namespace.
CLUSTER_EVENTS_NAMESPACE = "default"

# How long a replaced DaemonSet may take to go away (its pods are orphaned or deleted first).
REPLACE_TIMEOUT = 60.0
REPLACE_POLL = 0.2


class Writer:
    """Executes plans against the API server."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        namespace: str,
        component: str = "gpu-operator",
        cluster_events_namespace: str = CLUSTER_EVENTS_NAMESPACE,
    ):
        self.client = client
        self.namespace = namespace
        self.component = component
        # Agents pass their own namespace: their RBAC grants Events there only.
        self.cluster_events_namespace = cluster_events_namespace

    async def apply(self, desired: dict[str, Any]) -> None:
        """Server-side apply (create or update) with our field manager, taking over conflicts.

        A DaemonSet whose selector differs from the live one (selectors are immutable, e.g. one
        written by another operator version) is replaced instead of failing on every pass."""
        # lightkube takes the namespace from the object's metadata.
        try:
            await self.client.apply(resources.wrap(with_hash(desired)), force=True)
        except ApiError as err:
            if desired.get("kind") != "DaemonSet" or not selector_immutable(desired, err):
                raise
            await self.replace_daemonset(desired)

    async def replace_daemonset(self, desired: dict[str, Any]) -> None:
        """Delete and create a DaemonSet whose selector changed, with an Event saying so.

        When the new selector matches the old pod template, the old DaemonSet is deleted with
        orphan propagation and its pods are adopted by the new one (as the DaemonSet controller
        adopts matching orphans): nothing restarts, and OnDelete operands such as the driver keep
        running until the upgrade flow replaces them. Otherwise the old pods go with it."""
        meta = desired["metadata"]
        name, namespace = meta["name"], meta.get("namespace") or self.namespace
        live = await self._get_daemonset(name, namespace)
        if live is None:  # gone meanwhile: a plain apply creates it
            await self.client.apply(resources.wrap(with_hash(desired)), force=True)
            return
        old_selector = ((live.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        new_selector = desired["spec"]["selector"].get("matchLabels") or {}
        old_labels = (((live.get("spec") or {}).get("template") or {}).get("metadata") or {}).get(
            "labels"
        )
        keep_pods = labels_match(new_selector, old_labels)
        log.warning(
            "DaemonSet %s: selector %s -> %s is immutable; replacing it (%s)",
            name, selector_text(old_selector), selector_text(new_selector),
            "pods kept" if keep_pods else "pods replaced",
        )  # fmt: skip
        await self.delete(live, orphan=keep_pods)
        deadline = time.monotonic() + REPLACE_TIMEOUT
        while await self._get_daemonset(name, namespace) is not None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"DaemonSet {namespace}/{name} was not deleted in time")
            await asyncio.sleep(REPLACE_POLL)
        await self.client.apply(resources.wrap(with_hash(desired)), force=True)
        created = await self._get_daemonset(name, namespace) or desired
        adopted = await self._adopt_pods(created, new_selector) if keep_pods else 0
        kept = (
            f"its {adopted} pod(s) were kept and adopted"
            if keep_pods
            else "its pods are replaced (the new selector does not match them)"
        )
        await self.event(
            created,
            reason="SelectorChanged",
            type_="Warning",
            message=(
                f"spec.selector changed from {selector_text(old_selector)} to "
                f"{selector_text(new_selector)}; a selector cannot be updated, so the DaemonSet "
                f"was deleted and created again; {kept}"
            ),
        )

    async def _get_daemonset(self, name: str, namespace: str) -> dict[str, Any] | None:
        # A list by name needs only the list permission the operator's caches already use.
        async for item in self.client.list(
            resources.DAEMONSET, namespace=namespace, fields={"metadata.name": name}
        ):
            return dict(item)
        return None

    async def _adopt_pods(self, ds: dict[str, Any], selector: Mapping[str, str]) -> int:
        """Point the orphaned pods the new DaemonSet selects at it (its controller adopts them)."""
        meta = ds["metadata"]
        reference = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "name": meta["name"],
            "uid": meta.get("uid"),
            "controller": True,
            "blockOwnerDeletion": True,
        }
        adopted = 0
        async for pod in self.client.list(
            resources.POD, namespace=meta.get("namespace") or self.namespace, labels=dict(selector)
        ):
            pod_meta = pod.get("metadata") or {}
            owners = pod_meta.get("ownerReferences") or []
            if any(o.get("controller") and o.get("uid") != meta.get("uid") for o in owners):
                continue  # still controlled by something else
            if pod_meta.get("deletionTimestamp"):
                continue
            if not any(o.get("uid") == meta.get("uid") for o in owners):
                await self.patch_pod(
                    pod_meta["namespace"], pod_meta["name"],
                    {"metadata": {"ownerReferences": [reference]}},
                )  # fmt: skip
            adopted += 1
        return adopted

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

    async def json_patch_node(self, name: str, ops: list[dict[str, Any]]) -> bool:
        """Apply a JSON patch to a node; False when one of its `test` operations failed (the
        server answers 422; 409 for a stale resourceVersion) or the node is gone."""
        try:
            await self.client.patch(resources.NODE, name, ops, patch_type=PatchType.JSON)
        except ApiError as err:
            if err.status.code in (404, 409, 422):
                return False
            raise
        return True

    async def json_patch(self, obj: dict[str, Any], ops: list[dict[str, Any]]) -> bool:
        """Apply a JSON patch to the object `obj` names; False when one of its `test`
        operations failed (422; 409 for a stale resourceVersion) or the object is gone."""
        meta = obj["metadata"]
        try:
            await self.client.patch(
                resources.of(obj), meta["name"], ops,
                namespace=meta.get("namespace") or self.namespace, patch_type=PatchType.JSON,
            )  # fmt: skip
        except ApiError as err:
            if err.status.code in (404, 409, 422):
                return False
            raise
        return True

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
        """Record a core/v1 Event about an object, in its namespace (`cluster_events_namespace`
        for a cluster-scoped one); best effort: a failed event is only logged."""
        meta = involved.get("metadata") or {}
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "generateName": f"{meta.get('name', 'object')}.",
                "namespace": meta.get("namespace") or self.cluster_events_namespace,
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
