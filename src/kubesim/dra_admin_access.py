"""DRA admin access needs a labelled namespace: the resource.k8s.io storage check.

In Kubernetes 1.35 (DRAAdminAccess, beta and on by default since 1.34) a ResourceClaim or
ResourceClaimTemplate whose request asks for `exactly.adminAccess: true`, and a claim status
whose allocation grants `adminAccess`, are only stored in a namespace labelled
`resource.kubernetes.io/admin-access: "true"`; anywhere else the write is a 422 whose cause is
Forbidden on the first such request (`spec.devices.requests[i].exactly.adminAccess`, the same
path for templates) or result (`status.allocation.devices.results[i].adminAccess`). Specs are
immutable, so only creates are checked; a status that already granted admin access is not
checked again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kubesim.resources import ResourceType
from kubesim.validation import field

if TYPE_CHECKING:
    from kubesim.store import Store

LABEL = "resource.kubernetes.io/admin-access"
CLAIMS = ("resource.k8s.io", "resourceclaims")
TEMPLATES = ("resource.k8s.io", "resourceclaimtemplates")
NAMESPACES = ("", "namespaces")
DETAIL = f"admin access to devices requires the `{LABEL}: true` label on the containing namespace"


def _requested(devices: Any) -> str | None:
    requests = (devices or {}).get("requests") if isinstance(devices, Mapping) else None
    for index, request in enumerate(requests or []):
        exactly = request.get("exactly") if isinstance(request, Mapping) else None
        if isinstance(exactly, Mapping) and exactly.get("adminAccess") is True:
            return f"spec.devices.requests[{index}].exactly.adminAccess"
    return None


def _granted(obj: Mapping[str, Any] | None) -> str | None:
    allocation = ((obj or {}).get("status") or {}).get("allocation") or {}
    for index, result in enumerate((allocation.get("devices") or {}).get("results") or []):
        if isinstance(result, Mapping) and result.get("adminAccess") is True:
            return f"status.allocation.devices.results[{index}].adminAccess"
    return None


def admit(store: Store, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    """Refuse admin access outside a namespace labelled for it."""
    if rt.from_crd or rt.key not in (CLAIMS, TEMPLATES):
        return
    spec = obj.get("spec") or {}
    path: str | None = None
    if old is None:
        holder = spec if rt.key == CLAIMS else (spec.get("spec") or {})
        devices = holder.get("devices") if isinstance(holder, Mapping) else None
        path = _requested(devices)
    if path is None and rt.key == CLAIMS and _granted(old) is None:
        path = _granted(obj)
    if path is None:
        return
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace", "")
    found = store.peek(NAMESPACES, "", namespace)
    labels = ((found.obj.get("metadata") or {}).get("labels") or {}) if found else {}
    if labels.get(LABEL) != "true":
        kind = "ResourceClaim" if rt.key == CLAIMS else "ResourceClaimTemplate"
        name = meta.get("name", "") or meta.get("generateName", "")
        field.raise_invalid(kind, "resource.k8s.io", name, [field.forbidden(path, DETAIL)])
