"""Server-side defaulting the real API server performs on built-in kinds.

Facts recorded here come from the API's defaulting functions (v1.35): containers get a pull policy
(Always for `:latest` or untagged images) and termination-message settings; probes get
timeoutSeconds 1, periodSeconds 10, successThreshold 1, failureThreshold 3, and HTTP probe and
lifecycle handlers path "/" and scheme HTTP; configMap, secret, downwardAPI and projected volumes
get defaultMode 0644 (420); a volume without a source becomes an emptyDir; pods (not templates)
get requests copied from limits where only a limit is given.
"""

from __future__ import annotations

import base64
from typing import Any

from kubesim import validation
from kubesim.resources import ResourceType

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
    "PersistentVolumeClaim": {"phase": "Pending"},
    "PersistentVolume": {"phase": "Pending"},
    "ReplicationController": {"replicas": 0},
}
DEFAULT_MODE = 0o644  # 420, what the server stores for projected files without a mode
_MODE_VOLUMES = ("configMap", "secret", "downwardAPI", "projected")
_VOLUME_SOURCES = validation.core.VOLUME_SOURCES
_RBAC_GROUP = "rbac.authorization.k8s.io"


def validate_name(rt: ResourceType, name: str) -> None:
    """Reject names the real server rejects, with a 422 naming metadata.name."""
    validation.validate_name(rt, name)


def _http_get_defaults(action: Any) -> None:
    if isinstance(action, dict):
        action.setdefault("path", "/")
        action.setdefault("scheme", "HTTP")


def _probe_defaults(probe: Any) -> None:
    if not isinstance(probe, dict):
        return
    probe.setdefault("timeoutSeconds", 1)
    probe.setdefault("periodSeconds", 10)
    probe.setdefault("successThreshold", 1)
    probe.setdefault("failureThreshold", 3)
    _http_get_defaults(probe.get("httpGet"))


def _container_defaults(container: dict[str, Any], host_network: bool) -> None:
    image = str(container.get("image", ""))
    tag = image.rsplit("/", 1)[-1]
    latest = "@" not in image and (":" not in tag or tag.endswith(":latest"))
    container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    container.setdefault("resources", {})
    for port in container.get("ports") or []:
        port.setdefault("protocol", "TCP")
        # With the host's network a container port is a host port.
        if host_network and port.get("containerPort") and not port.get("hostPort"):
            port["hostPort"] = port["containerPort"]
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        _probe_defaults(container.get(probe))
    lifecycle = container.get("lifecycle")
    if isinstance(lifecycle, dict):
        for hook in ("postStart", "preStop"):
            if isinstance(lifecycle.get(hook), dict):
                _http_get_defaults(lifecycle[hook].get("httpGet"))
    for var in container.get("env") or []:
        source = var.get("valueFrom") if isinstance(var, dict) else None
        if not isinstance(source, dict):
            continue
        if isinstance(source.get("fieldRef"), dict):
            source["fieldRef"].setdefault("apiVersion", "v1")
        if isinstance(source.get("resourceFieldRef"), dict):
            source["resourceFieldRef"].setdefault("divisor", "0")


def _volume_defaults(volume: dict[str, Any]) -> None:
    if not any(volume.get(source) is not None for source in _VOLUME_SOURCES):
        volume["emptyDir"] = {}
    for source in _MODE_VOLUMES:
        if isinstance(volume.get(source), dict):
            volume[source].setdefault("defaultMode", DEFAULT_MODE)
    if isinstance(volume.get("hostPath"), dict):
        volume["hostPath"].setdefault("type", "")
    projected = volume.get("projected")
    if isinstance(projected, dict):
        for item in projected.get("sources") or []:
            token = item.get("serviceAccountToken") if isinstance(item, dict) else None
            if isinstance(token, dict):
                token.setdefault("expirationSeconds", 3600)


def pod_spec_defaults(spec: dict[str, Any]) -> None:
    """Defaults of a PodSpec (also applied to templates, as the real server does)."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    host_network = bool(spec.get("hostNetwork"))
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            if isinstance(container, dict):
                _container_defaults(container, host_network)
    for volume in spec.get("volumes") or []:
        if isinstance(volume, dict):
            _volume_defaults(volume)
    if spec.get("serviceAccountName"):
        spec.setdefault("serviceAccount", spec["serviceAccountName"])


def _requests_from_limits(spec: dict[str, Any]) -> None:
    # Only pods get this, not templates: a resource with a limit and no request requests it.
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            resources = container.get("resources") if isinstance(container, dict) else None
            if not isinstance(resources, dict) or not resources.get("limits"):
                continue
            requests = resources.setdefault("requests", {})
            for name, amount in resources["limits"].items():
                requests.setdefault(name, amount)


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


def apply_create_defaults(
    rt: ResourceType, obj: dict[str, Any], *, spec_defaulted: bool = False
) -> None:
    """Fill in the defaults the real server adds on create (`spec_defaulted`: a pod whose spec
    is a copy of one already defaulted, as a DaemonSet's admitted prototype: only its status
    is set)."""
    kind = rt.kind if not rt.from_crd else ""
    if kind == "Pod":
        pod_spec = obj.setdefault("spec", {})
        if not spec_defaulted:
            _spec_defaults(kind, obj)
        obj["status"] = {"phase": "Pending", "qosClass": qos_class(pod_spec)}
    elif kind == "Namespace":
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj["status"] = {"phase": "Active"}
        labels = obj["metadata"].setdefault("labels", {})
        labels["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
    elif kind == "Node":
        obj.setdefault("spec", {})
    else:
        _spec_defaults(kind, obj)
    # `status: {}` (a protobuf client's zero struct) is as unset as a missing status.
    if kind in _INITIAL_STATUS and not obj.get("status"):
        obj["status"] = dict(_INITIAL_STATUS[kind])


def apply_update_defaults(rt: ResourceType, obj: dict[str, Any]) -> None:
    """Defaults applied to every update body too (the real server defaults each decoded body)."""
    if rt.from_crd:
        return
    _spec_defaults(rt.kind, obj)


def _spec_defaults(kind: str, obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if kind == "Pod" and isinstance(spec, dict):
        pod_spec_defaults(spec)
        _requests_from_limits(spec)
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
            # An empty strategy (what a protobuf client's zero struct decodes to) defaults too.
            if isinstance(strategy, dict) and not strategy.get("type"):
                strategy["type"] = "RollingUpdate"
            if strategy.get("type") == "RollingUpdate":
                strategy.setdefault("rollingUpdate", {"maxUnavailable": "25%", "maxSurge": "25%"})
            spec.setdefault("revisionHistoryLimit", 10)
            spec.setdefault("progressDeadlineSeconds", 600)
        elif kind == "StatefulSet":
            _stateful_set_defaults(spec)
        _template_defaults(obj)
    elif kind == "ReplicationController" and isinstance(spec, dict):
        spec.setdefault("replicas", 1)
        labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        if labels:
            spec.setdefault("selector", dict(labels))
            if not obj["metadata"].get("labels"):
                obj["metadata"]["labels"] = dict(labels)
        _template_defaults(obj)
    elif kind == "Job" and isinstance(spec, dict):
        _job_defaults(spec)
        _template_defaults(obj)
    elif kind == "CronJob" and isinstance(spec, dict):
        spec.setdefault("concurrencyPolicy", "Allow")
        spec.setdefault("suspend", False)
        spec.setdefault("successfulJobsHistoryLimit", 3)
        spec.setdefault("failedJobsHistoryLimit", 1)
        job_template = spec.get("jobTemplate")
        if isinstance(job_template, dict) and isinstance(job_template.get("spec"), dict):
            _template_defaults(job_template)
    elif kind == "Service" and isinstance(spec, dict):
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for port in spec.get("ports") or []:
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
    elif kind == "Secret":
        obj.setdefault("type", "Opaque")
        _fold_string_data(obj)
    elif kind in ("PersistentVolumeClaim", "PersistentVolume") and isinstance(spec, dict):
        spec.setdefault("volumeMode", "Filesystem")
        if kind == "PersistentVolume":
            spec.setdefault("persistentVolumeReclaimPolicy", "Retain")
    elif kind == "PriorityClass":
        obj.setdefault("preemptionPolicy", "PreemptLowerPriority")
    elif kind == "ResourceClaim" and isinstance(spec, dict):
        _device_request_defaults(spec)
    elif kind == "ResourceClaimTemplate" and isinstance(spec, dict):
        if isinstance(spec.get("spec"), dict):
            _device_request_defaults(spec["spec"])
    elif kind == "EndpointSlice":
        for port in obj.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")
    elif kind in ("RoleBinding", "ClusterRoleBinding"):
        for subject in obj.get("subjects") or []:
            user_or_group = isinstance(subject, dict) and subject.get("kind") in ("User", "Group")
            if user_or_group and not subject.get("apiGroup"):
                subject["apiGroup"] = _RBAC_GROUP
    elif kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        for webhook in obj.get("webhooks") or []:
            if isinstance(webhook, dict):
                _webhook_defaults(webhook, mutating=kind.startswith("Mutating"))


def _device_request_defaults(claim_spec: dict[str, Any]) -> None:
    """A device request's allocationMode defaults to ExactCount, whose count defaults to 1
    (for `exactly` and for each `firstAvailable` alternative)."""
    devices = claim_spec.get("devices")
    if not isinstance(devices, dict):
        return
    for request in devices.get("requests") or []:
        if not isinstance(request, dict):
            continue
        targets = [request.get("exactly"), *(request.get("firstAvailable") or [])]
        for target in targets:
            if isinstance(target, dict):
                target.setdefault("allocationMode", "ExactCount")
                if target["allocationMode"] == "ExactCount":
                    target.setdefault("count", 1)


def _fold_string_data(secret: dict[str, Any]) -> None:
    """`stringData` is write-only: the server folds it into `data` (winning over the same key)
    and never stores it."""
    string_data = secret.pop("stringData", None)
    if not isinstance(string_data, dict) or not string_data:
        return
    data = secret.get("data")
    if not isinstance(data, dict):
        data = secret["data"] = {}
    for key, value in string_data.items():
        data[key] = base64.b64encode(str(value).encode()).decode()


def _stateful_set_defaults(spec: dict[str, Any]) -> None:
    spec.setdefault("podManagementPolicy", "OrderedReady")
    strategy = spec.setdefault("updateStrategy", {"type": "RollingUpdate"})
    if isinstance(strategy, dict):
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            if isinstance(rolling, dict):
                rolling.setdefault("partition", 0)
    spec.setdefault("revisionHistoryLimit", 10)
    retention = spec.setdefault("persistentVolumeClaimRetentionPolicy", {})
    if isinstance(retention, dict):
        retention.setdefault("whenDeleted", "Retain")
        retention.setdefault("whenScaled", "Retain")


def _job_defaults(spec: dict[str, Any]) -> None:
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    # With per-index backoff the global limit is effectively unlimited (max int32).
    spec.setdefault(
        "backoffLimit", 2147483647 if spec.get("backoffLimitPerIndex") is not None else 6
    )
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault(
        "podReplacementPolicy", "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed"
    )


def _webhook_defaults(webhook: dict[str, Any], *, mutating: bool) -> None:
    webhook.setdefault("failurePolicy", "Fail")
    webhook.setdefault("matchPolicy", "Equivalent")
    webhook.setdefault("namespaceSelector", {})
    webhook.setdefault("objectSelector", {})
    webhook.setdefault("timeoutSeconds", 10)
    if mutating:
        webhook.setdefault("reinvocationPolicy", "Never")
    for rule in webhook.get("rules") or []:
        if isinstance(rule, dict):
            rule.setdefault("scope", "*")
    service = (webhook.get("clientConfig") or {}).get("service")
    if isinstance(service, dict):
        service.setdefault("port", 443)
