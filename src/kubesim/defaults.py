"""Server-side defaulting and basic validation the real API server performs on built-in kinds."""

from __future__ import annotations

import re
from typing import Any

from kubesim import errors
from kubesim.resources import ResourceType

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Kinds whose names must be DNS-1123 labels rather than subdomains.
_LABEL_NAMED = {"Namespace", "Service"}
# RBAC kinds accept path-segment names such as "system:controller:foo".
_PATH_SEGMENT_NAMED = {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


# Status the real server reports right after create (required fields of these kinds' status).
_INITIAL_STATUS: dict[str, dict[str, Any]] = {
    "DaemonSet": {
        "currentNumberScheduled": 0,
        "numberMisscheduled": 0,
        "desiredNumberScheduled": 0,
        "numberReady": 0,
    },
    "Deployment": {},
    "ReplicaSet": {"replicas": 0},
    "StatefulSet": {"replicas": 0, "availableReplicas": 0},
    "PodDisruptionBudget": {
        "disruptionsAllowed": 0,
        "currentHealthy": 0,
        "desiredHealthy": 0,
        "expectedPods": 0,
    },
}


def validate_name(rt: ResourceType, name: str) -> None:
    """Reject names the real server rejects, with a 422 naming metadata.name."""
    if rt.kind in _PATH_SEGMENT_NAMED:
        ok = bool(name) and name not in (".", "..") and "/" not in name and "%" not in name
        limit = 253
    elif rt.kind in _LABEL_NAMED:
        ok = bool(_LABEL.match(name))
        limit = 63
    else:
        ok = bool(_SUBDOMAIN.match(name))
        limit = 253
    if not ok or len(name) > limit:
        raise errors.invalid(
            rt.kind,
            rt.group,
            name,
            [("metadata.name", f"Invalid value: {name!r}: must be a lowercase RFC 1123 name")],
        )


def _container_defaults(container: dict[str, Any]) -> None:
    image = str(container.get("image", ""))
    tag = image.rsplit("/", 1)[-1]
    latest = "@" not in image and (":" not in tag or tag.endswith(":latest"))
    container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    container.setdefault("resources", {})
    for port in container.get("ports") or []:
        port.setdefault("protocol", "TCP")


def pod_spec_defaults(spec: dict[str, Any]) -> None:
    """Defaults of a PodSpec (also applied to templates, as the real server does)."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            _container_defaults(container)
    if spec.get("serviceAccountName"):
        spec.setdefault("serviceAccount", spec["serviceAccountName"])


def _template_defaults(obj: dict[str, Any]) -> None:
    template = (obj.get("spec") or {}).get("template")
    if isinstance(template, dict):
        template.setdefault("metadata", {})
        pod_spec_defaults(template.setdefault("spec", {}))


def qos_class(spec: dict[str, Any]) -> str:
    """The pod QoS class from container requests and limits."""
    containers = spec.get("containers") or []
    requests_or_limits = False
    guaranteed = True
    for container in containers:
        resources = container.get("resources") or {}
        requests = resources.get("requests") or {}
        limits = resources.get("limits") or {}
        if requests or limits:
            requests_or_limits = True
        for res in ("cpu", "memory"):
            if res not in limits or requests.get(res, limits[res]) != limits[res]:
                guaranteed = False
    if not requests_or_limits:
        return "BestEffort"
    return "Guaranteed" if guaranteed and containers else "Burstable"


def apply_create_defaults(rt: ResourceType, obj: dict[str, Any]) -> None:
    """Fill in the defaults the real server adds on create."""
    kind = rt.kind if not rt.from_crd else ""
    spec = obj.get("spec")
    if kind == "Pod":
        pod_spec = obj.setdefault("spec", {})
        pod_spec_defaults(pod_spec)
        obj["status"] = {"phase": "Pending", "qosClass": qos_class(pod_spec)}
    elif kind == "Namespace":
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj["status"] = {"phase": "Active"}
        labels = obj["metadata"].setdefault("labels", {})
        labels["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
    elif kind == "DaemonSet" and isinstance(spec, dict):
        strategy = spec.setdefault("updateStrategy", {"type": "RollingUpdate"})
        if strategy.get("type", "RollingUpdate") == "RollingUpdate":
            strategy["type"] = "RollingUpdate"
            rolling = strategy.setdefault("rollingUpdate", {})
            rolling.setdefault("maxUnavailable", 1)
            rolling.setdefault("maxSurge", 0)
        spec.setdefault("revisionHistoryLimit", 10)
        _template_defaults(obj)
    elif kind in ("Deployment", "ReplicaSet", "StatefulSet") and isinstance(spec, dict):
        spec.setdefault("replicas", 1)
        if kind == "Deployment":
            strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
            if strategy.get("type") == "RollingUpdate":
                strategy.setdefault("rollingUpdate", {"maxUnavailable": "25%", "maxSurge": "25%"})
            spec.setdefault("revisionHistoryLimit", 10)
            spec.setdefault("progressDeadlineSeconds", 600)
        _template_defaults(obj)
    elif kind == "Service" and isinstance(spec, dict):
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for port in spec.get("ports") or []:
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
    elif kind == "Node":
        obj.setdefault("spec", {})
    if kind in _INITIAL_STATUS and "status" not in obj:
        obj["status"] = dict(_INITIAL_STATUS[kind])


def apply_update_defaults(rt: ResourceType, obj: dict[str, Any]) -> None:
    """Defaults re-applied on update so templates stay normalised."""
    if rt.from_crd:
        return
    if rt.kind == "Pod" and isinstance(obj.get("spec"), dict):
        pod_spec_defaults(obj["spec"])
    elif rt.kind in ("DaemonSet", "Deployment", "ReplicaSet", "StatefulSet"):
        _template_defaults(obj)
