"""Cache transforms: keep only the fields the planners read (memory stays flat at scale)."""

from __future__ import annotations

from typing import Any

from gpu_operator.api import crds, keys

_META_KEYS = ("name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
              "deletionTimestamp", "labels", "ownerReferences")  # fmt: skip


def _meta(obj: dict[str, Any], *, annotations: bool | tuple[str, ...] = False) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    out = {k: meta[k] for k in _META_KEYS if k in meta}
    source = meta.get("annotations") or {}
    if annotations is True:
        out["annotations"] = dict(source)
    elif annotations:
        kept = {k: source[k] for k in annotations if k in source}
        if kept:
            out["annotations"] = kept
    return out


def node(obj: dict[str, Any]) -> dict[str, Any]:
    """Labels, annotations, schedulability, taints, readiness and runtime facts."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    info = status.get("nodeInfo") or {}
    return {
        "metadata": _meta(obj, annotations=True),
        "spec": {k: spec[k] for k in ("unschedulable", "taints") if k in spec},
        "status": {
            "conditions": [{"type": "Ready", "status": c.get("status")} for c in ready],
            "nodeInfo": {
                k: info[k]
                for k in ("containerRuntimeVersion", "kernelVersion", "osImage")
                if k in info
            },
        },
    }


def pod(obj: dict[str, Any]) -> dict[str, Any]:
    """Owner, node, phase, readiness and container states (what readiness reasons need)."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return {
        "metadata": _meta(obj),
        "spec": {"nodeName": spec.get("nodeName")},
        "status": {
            k: status[k]
            for k in (
                "phase",
                "conditions",
                "containerStatuses",
                "initContainerStatuses",
                "reason",
                "message",
            )
            if k in status
        },
    }


def owned(obj: dict[str, Any]) -> dict[str, Any]:
    """Objects the operator renders: identity, our hash annotation, and workload status."""
    out: dict[str, Any] = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": _meta(obj, annotations=(keys.LAST_APPLIED_HASH,)),
    }
    if obj.get("kind") in ("DaemonSet", "Deployment"):
        spec = obj.get("spec") or {}
        out["spec"] = {k: spec[k] for k in ("updateStrategy", "selector", "replicas") if k in spec}
        out["status"] = obj.get("status") or {}
    return out


def revision(obj: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": _meta(obj), "revision": obj.get("revision")}


def crd(obj: dict[str, Any]) -> dict[str, Any]:
    """A CRD's name and our schema version marker."""
    return {"metadata": _meta(obj, annotations=(crds.SCHEMA_VERSION_ANNOTATION,))}


def configmap_keys(obj: dict[str, Any]) -> dict[str, Any]:
    """A ConfigMap's name and the keys it holds (the driver mounts referenced ones key by key)."""
    keys_held = sorted({*(obj.get("data") or {}), *(obj.get("binaryData") or {})})
    return {"metadata": {"name": (obj.get("metadata") or {}).get("name")}, "keys": keys_held}
