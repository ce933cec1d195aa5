"""The `scale` subresource of Deployments, ReplicaSets and StatefulSets (autoscaling/v1 Scale).

A Scale is a view of its parent: `spec.replicas` is the parent's, `status.replicas` the parent's
status count and `status.selector` its label selector in query-string form. GET reads the view;
PUT and PATCH (merge, JSON, strategic) change only the parent's `spec.replicas`, honouring a
`metadata.resourceVersion` precondition, as `kubectl scale` and HorizontalPodAutoscalers use it.
"""

from __future__ import annotations

from typing import Any

from kubesim import errors, patch
from kubesim.resources import ResourceType
from kubesim.store import Store

SCALE_API_VERSION = "autoscaling/v1"


def format_selector(selector: dict[str, Any] | None) -> str:
    """A LabelSelector in query-string form (`app=web,tier in (a,b)`), requirements by key."""
    if not selector:
        return ""
    parts = [(k, f"{k}={v}") for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        key, op = str(expr.get("key", "")), expr.get("operator", "")
        values = ",".join(sorted(str(v) for v in expr.get("values") or []))
        text = {
            "In": f"{key} in ({values})",
            "NotIn": f"{key} notin ({values})",
            "Exists": key,
            "DoesNotExist": f"!{key}",
        }.get(op)
        if text is not None:
            parts.append((key, text))
    return ",".join(text for _, text in sorted(parts, key=lambda part: part[0]))


def scale_of(obj: dict[str, Any]) -> dict[str, Any]:
    """The Scale view of a Deployment, ReplicaSet or StatefulSet."""
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    scale_meta = {
        key: meta[key]
        for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
        if key in meta
    }
    scale_spec: dict[str, Any] = {}
    if spec.get("replicas"):
        scale_spec["replicas"] = int(spec["replicas"])
    status: dict[str, Any] = {"replicas": int((obj.get("status") or {}).get("replicas") or 0)}
    selector = format_selector(spec.get("selector"))
    if selector:
        status["selector"] = selector
    return {
        "kind": "Scale",
        "apiVersion": SCALE_API_VERSION,
        "metadata": scale_meta,
        "spec": scale_spec,
        "status": status,
    }


def get(store: Store, rt: ResourceType, namespace: str, name: str) -> dict[str, Any]:
    """GET .../{name}/scale."""
    stored = store.peek(rt.key, namespace, name)
    if stored is None:
        raise errors.not_found(rt.plural, rt.group, name)
    return scale_of(stored.obj)


def update(
    store: Store,
    rt: ResourceType,
    namespace: str,
    name: str,
    body: Any,
    *,
    manager: str | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """PUT .../{name}/scale: set the parent's replicas from a Scale body."""
    stored = store.peek(rt.key, namespace, name)
    if stored is None:
        raise errors.not_found(rt.plural, rt.group, name)
    if not isinstance(body, dict):
        raise errors.bad_request("a Scale must be a JSON object")
    kind = body.get("kind")
    if kind and kind != "Scale":
        raise errors.bad_request(f"the kind {kind!r} of the body is not Scale")
    meta = body.get("metadata") or {}
    if not isinstance(meta, dict):
        raise errors.bad_request("metadata must be an object")
    if meta.get("name", name) != name:
        raise errors.bad_request(
            f"the name of the object ({meta.get('name')}) does not match the name on the URL "
            f"({name})"
        )
    replicas = (body.get("spec") or {}).get("replicas", 0)
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise _invalid(name, f"Invalid value: {replicas!r}: must be an integer")
    if replicas < 0:
        raise _invalid(name, f"Invalid value: {replicas}: must be greater than or equal to 0")
    wanted_rv = meta.get("resourceVersion")
    if wanted_rv and wanted_rv != stored.obj["metadata"].get("resourceVersion"):
        raise errors.conflict(
            rt.plural,
            rt.group,
            name,
            "the object has been modified; please apply your changes to the latest version "
            "and try again",
        )
    obj = stored.copy()
    obj.setdefault("spec", {})["replicas"] = replicas
    obj["metadata"].pop("resourceVersion", None)
    result = store.replace(
        rt, obj, namespace=namespace, name=name, manager=manager, dry_run=dry_run
    )
    return scale_of(result.obj)


def patch_scale(
    store: Store,
    rt: ResourceType,
    namespace: str,
    name: str,
    body: Any,
    content_type: str,
    *,
    manager: str | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """PATCH .../{name}/scale: patch the Scale view, then write its replicas to the parent."""
    current = get(store, rt, namespace, name)
    if content_type == patch.JSON:
        merged = patch.json_patch(current, body)
    elif not isinstance(body, dict):
        raise errors.bad_request("a merge patch must be a JSON object")
    elif content_type == patch.STRATEGIC:
        merged = patch.strategic_merge_patch(current, body)
    else:
        # Merge patches, and apply configurations (which only carry spec.replicas here).
        merged = patch.merge_patch(current, body)
    if not isinstance(merged, dict):
        raise errors.ApiError(422, "the patched document is not an object", reason="Invalid")
    (merged.get("metadata") or {}).pop("resourceVersion", None)
    if "resourceVersion" in (body.get("metadata") or {} if isinstance(body, dict) else {}):
        merged["metadata"]["resourceVersion"] = body["metadata"]["resourceVersion"]
    return update(store, rt, namespace, name, merged, manager=manager, dry_run=dry_run)


def _invalid(name: str, message: str) -> errors.ApiError:
    return errors.invalid("Scale", "autoscaling", name, [("spec.replicas", message)])
