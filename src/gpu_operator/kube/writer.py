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
from gpu_operator.kube import lean_http, resources
from gpu_operator.operands import takeover

log = logging.getLogger(__name__)


def content_hash(obj: dict[str, Any]) -> str:
    """A stable hash of an object's desired content (our own hash annotation excluded).

    Every pass hashes every rendered object: only the dicts on the way to the annotation are
    copied (a deep copy of each DaemonSet cost more than the hash)."""
    clean = dict(obj)
    meta = clean.get("metadata") or {}
    annotations = meta.get("annotations")
    if annotations is not None:
        meta = clean["metadata"] = dict(meta)
        kept = {k: v for k, v in annotations.items() if k != keys.LAST_APPLIED_HASH}
        if kept:
            meta["annotations"] = kept
        else:
            del meta["annotations"]
    encoded = json.dumps(clean, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:20]


def with_hash(obj: dict[str, Any]) -> dict[str, Any]:
    stamped = copy.deepcopy(obj)
    meta = stamped.setdefault("metadata", {})
    meta.setdefault("annotations", {})[keys.LAST_APPLIED_HASH] = content_hash(obj)
    return stamped


# Set by the controller's cache transform on an object a previous writer (NVIDIA's operator) still
# owns fields of: it is taken over (`Writer.take_over`) on the next pass, whatever its hash.
PREVIOUS_WRITER_FLAG = "previousWriter"


def taken_over_yet(live: Mapping[str, Any]) -> bool:
    """Whether no previous writer owns fields of the live object (a cached or a full one)."""
    return not live.get(PREVIOUS_WRITER_FLAG) and not takeover.has_previous_writer(live)


def needs_write(desired: dict[str, Any], live: dict[str, Any] | None) -> bool:
    """Whether the live object differs from what we would apply (by our hash annotation), or
    still has fields of a previous writer to take over."""
    if live is None or not taken_over_yet(live):
        return True
    annotations = (live.get("metadata") or {}).get("annotations") or {}
    return bool(annotations.get(keys.LAST_APPLIED_HASH) != content_hash(desired))


WORKLOADS = ("DaemonSet", "Deployment", "StatefulSet")


def selector_immutable(obj: Mapping[str, Any], err: ApiError) -> bool:
    """Whether a rejected write of a workload failed only because it changes `spec.selector`."""
    if obj.get("kind") not in WORKLOADS or err.status.code != 422:
        return False
    details = err.status.details
    causes = (details.causes if details is not None else None) or []
    fields = {c.field for c in causes if c.field}
    if fields:
        return fields == {"spec.selector"}
    message = str(err.status.message or "")
    return "spec.selector" in message and "immutable" in message


def _selector(obj: Mapping[str, Any]) -> Any:
    return (obj.get("spec") or {}).get("selector") if obj.get("kind") in WORKLOADS else None


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

# How often taking an object over re-reads it when a status write got in between.
TAKEOVER_ATTEMPTS = 5

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

    async def apply(self, desired: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply (create or update) with our field manager, taking over conflicts;
        returns the object as stored.

        A DaemonSet whose selector differs from the live one (selectors are immutable, e.g. one
        written by another operator version) is replaced instead of failing on every pass."""
        # lightkube takes the namespace from the object's metadata.
        try:
            return dict(await self.client.apply(resources.wrap(with_hash(desired)), force=True))
        except ApiError as err:
            if desired.get("kind") != "DaemonSet" or not selector_immutable(desired, err):
                raise
            return await self.replace_daemonset(desired)

    async def take_over(self, desired: dict[str, Any]) -> dict[str, Any]:
        """Apply `desired` to an object a previous writer (NVIDIA's operator) still owns fields
        of, leaving ours the owner of what it renders (operands/takeover.py): first one JSON patch
        that removes what only the previous writer set and ours does not render and sets ours,
        then the usual apply, then its managedFields entries go. Each patch tests the
        resourceVersion it was computed from; a status write in between is retried."""
        for _ in range(TAKEOVER_ATTEMPTS):
            live = await self.get(desired)
            if live is not None and _selector(live) != _selector(desired):
                return await self.apply(desired)  # replaced whole: the new one is ours alone
            change = takeover.plan(desired, live) if live is not None else None
            if change is None or change.patch is None:
                break
            meta = live["metadata"] if live is not None else {}
            log.info("%s %s: taking it over from its previous writer", desired.get("kind"),
                     meta.get("name"))  # fmt: skip
            # Most of these are fields the API server defaults: they come back as they were.
            log.debug("%s %s: fields only the previous writer set: %s", desired.get("kind"),
                      meta.get("name"), ", ".join(change.removed) or "none")  # fmt: skip
            if await self._json_patch_tested(desired, change.patch):
                break
        applied = await self.apply(desired)
        for _ in range(TAKEOVER_ATTEMPTS):
            cleanup = takeover.managed_fields_patch(applied)
            if cleanup is None or await self._json_patch_tested(applied, cleanup):
                break
            # Changed since (a status write): judge it again; the next pass finishes otherwise.
            found = await self.get(applied)
            if found is None:
                break
            applied = found
        return applied

    async def _json_patch_tested(self, obj: Mapping[str, Any], ops: list[dict[str, Any]]) -> bool:
        """Send a JSON patch whose first operation tests the resourceVersion; False when that
        test failed (the object changed since), any other refusal raises."""
        try:
            await self.client.patch(
                resources.of(dict(obj)), obj["metadata"]["name"], ops,
                namespace=self._namespace_of(obj), patch_type=PatchType.JSON,
            )  # fmt: skip
        except ApiError as err:
            if err.status.code == 409 or (
                err.status.code == 422 and "test failed" in str(err.status.message or "")
            ):
                return False
            raise
        return True

    def _namespace_of(self, obj: Mapping[str, Any]) -> str | None:
        kind = resources.kind_of(str(obj["apiVersion"]), str(obj["kind"]))
        if not kind.namespaced:
            return None
        return str((obj.get("metadata") or {}).get("namespace") or self.namespace)

    async def get(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        """The whole live object `obj` names, or None. A list by name: it needs only the list
        permission the operator's caches already use."""
        name = str((obj.get("metadata") or {}).get("name"))
        namespace = self._namespace_of(obj)
        res = resources.of(dict(obj))
        listing = (
            self.client.list(res, namespace=namespace, fields={"metadata.name": name})
            if namespace is not None
            else self.client.list(res, fields={"metadata.name": name})
        )
        async for item in listing:
            return dict(item)
        return None

    async def replace_daemonset(self, desired: dict[str, Any]) -> dict[str, Any]:
        """Delete and create a DaemonSet whose selector changed, with an Event saying so.

        When the new selector matches the old pod template, the old DaemonSet is deleted with
        orphan propagation and its pods are adopted by the new one (as the DaemonSet controller
        adopts matching orphans): nothing restarts, and OnDelete operands such as the driver keep
        running until the upgrade flow replaces them. Otherwise the old pods go with it."""
        meta = desired["metadata"]
        name, namespace = meta["name"], meta.get("namespace") or self.namespace
        live = await self._get_daemonset(name, namespace)
        if live is None:  # gone meanwhile: a plain apply creates it
            return dict(await self.client.apply(resources.wrap(with_hash(desired)), force=True))
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
        return created

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

    async def label_node(self, name: str, patch: dict[str, Any]) -> None:
        """Merge-patch a node's labels and annotations, discarding the server's answer: the
        same request as `patch_node`, sent on the lean path (kube/lean_http.py: the same
        auth, TLS, field manager and an ApiError for a refusal) and not decoded into a
        resource object that the node labelling reconciler would throw away (its cache brings
        the node back)."""
        await self._lean_write("patch", resources.NODE, patch, name=name,
                               content_type=PatchType.MERGE.value)  # fmt: skip

    async def _lean_write(
        self,
        method: str,
        res: Any,
        body: Any,
        *,
        name: str | None = None,
        namespace: str | None = None,
        content_type: str = "application/json",
        obj: Any = None,
    ) -> None:
        """One write whose answer nobody reads: lightkube prepares its path and query (field
        manager, dryRun), kube/lean_http.py sends it; through lightkube's own client where the
        lean path cannot speak for it (exec auth plugins, proxies)."""
        inner = self.client._client
        prepared = inner.prepare_request(
            method, res=res, obj=body if obj is None else obj, name=name, namespace=namespace,
            headers={"Content-Type": content_type},
        )  # fmt: skip
        lean = lean_http.shared(self.client)
        if lean is not None:
            target = lean.target(prepared.url, prepared.params)
            await lean.send(prepared.method, target, body, content_type)
            return
        prepared.data = body
        response = await inner._client.send(inner.build_adapter_request(prepared))
        inner.raise_for_status(response)  # type: ignore[no-untyped-call]

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
        """Merge-patch an object's status subresource (lean path: the answer is not read)."""
        await self._lean_write("patch", res.Status, {"status": status}, name=name,
                               content_type=PatchType.MERGE.value)  # fmt: skip

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
            namespace = str(meta.get("namespace") or self.cluster_events_namespace)
            await self._lean_write("post", resources.EVENT, body, namespace=namespace,
                                   obj=resources.EVENT(body))  # fmt: skip
        except Exception as err:
            log.warning("could not record event %s on %s: %s", reason, meta.get("name"), err)
