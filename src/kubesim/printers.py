"""Printer columns of the workload, service, batch, RBAC and cluster kinds, as the real server's
table printers define them (names, order, `-o wide` priority 1, cell formats).

`tables.columns_for` looks here first; the generic table machinery stays in `tables`.
Kinds the real server has no printer for get its default table: NAME and CREATED AT (RFC 3339).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from kubesim import columns, scale
from kubesim.store import parse_time

Column = columns.Column
Cell = Callable[[dict[str, Any]], Any]
NAME = columns.NAME
AGE = columns.AGE


def since(stamp: Any) -> str:
    """Time since an RFC 3339 timestamp, as the printers' translateTimestampSince."""
    if not stamp:
        return "<unknown>"
    try:
        moment = parse_time(str(stamp))
    except ValueError:
        return "<unknown>"
    return columns.duration((dt.datetime.now(dt.UTC) - moment).total_seconds())


def created_at(obj: dict[str, Any]) -> str:
    """The creation time in RFC 3339 UTC (the default table's `Created At`)."""
    return str((obj.get("metadata") or {}).get("creationTimestamp") or "")


def _get(obj: Any, *path: str) -> Any:
    for part in path:
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def label_selector(selector: Any) -> str:
    """metav1.FormatLabelSelector: requirements by key, `<none>` when empty."""
    return scale.format_selector(selector if isinstance(selector, dict) else None) or "<none>"


def format_labels(labels: Any) -> str:
    """labels.FormatLabels: `k=v` pairs by key, `<none>` when empty."""
    if not labels:
        return "<none>"
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _containers(*path: str) -> tuple[Cell, Cell]:
    """(names, images) cells of the pod template at `path` (layoutContainerCells)."""

    def listed(obj: dict[str, Any]) -> list[dict[str, Any]]:
        return list(_get(obj, *path, "containers") or [])

    return (
        lambda o: ",".join(str(c.get("name", "")) for c in listed(o)),
        lambda o: ",".join(str(c.get("image", "")) for c in listed(o)),
    )


def _wide_containers(*path: str) -> list[Column]:
    names, images = _containers(*path)
    return [
        ("Containers", "string", 1, names),
        ("Images", "string", 1, images),
    ]


# ----- workloads -----------------------------------------------------------------------------


def _ready_of(obj: dict[str, Any]) -> str:
    return f"{_int(_get(obj, 'status', 'readyReplicas'))}/{_int(_get(obj, 'spec', 'replicas'))}"


def _job_status(obj: dict[str, Any]) -> str:
    def has(ctype: str) -> bool:
        return any(
            c.get("type") == ctype and c.get("status") == "True"
            for c in _get(obj, "status", "conditions") or []
        )

    if has("Complete"):
        return "Complete"
    if has("Failed"):
        return "Failed"
    if obj["metadata"].get("deletionTimestamp"):
        return "Terminating"
    if has("Suspended"):
        return "Suspended"
    if has("FailureTarget"):
        return "FailureTarget"
    return "Running"


def _job_completions(obj: dict[str, Any]) -> str:
    succeeded = _int(_get(obj, "status", "succeeded"))
    completions = _get(obj, "spec", "completions")
    if completions is not None:
        return f"{succeeded}/{completions}"
    parallelism = _int(_get(obj, "spec", "parallelism"))
    if parallelism > 1:
        return f"{succeeded}/1 of {parallelism}"
    return f"{succeeded}/1"


def _job_duration(obj: dict[str, Any]) -> str:
    start = _get(obj, "status", "startTime")
    if not start:
        return ""
    end = _get(obj, "status", "completionTime")
    finish = parse_time(end) if end else dt.datetime.now(dt.UTC)
    return columns.duration((finish - parse_time(start)).total_seconds())


def _bool(value: Any) -> bool:
    return bool(value)


def _bool_text(value: Any) -> str:
    """printBoolPtr: `True`/`False`, `<unset>` when absent (the CronJob SUSPEND cell)."""
    if value is None:
        return "<unset>"
    return "True" if value else "False"


def _controller_of(obj: dict[str, Any]) -> str:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            group = str(ref.get("apiVersion", "")).rpartition("/")[0]
            kind = str(ref.get("kind", ""))
            qualified = f"{kind}.{group}" if group else kind
            return f"{qualified.lower()}/{ref.get('name', '')}"
    return "<none>"


# ----- services --------------------------------------------------------------------------------


def _external_ip(obj: dict[str, Any]) -> str:
    spec = obj.get("spec") or {}
    external = list(spec.get("externalIPs") or [])
    svc_type = spec.get("type", "ClusterIP")
    if svc_type in ("ClusterIP", "NodePort"):
        return ",".join(external) if external else "<none>"
    if svc_type == "LoadBalancer":
        ingress = _get(obj, "status", "loadBalancer", "ingress") or []
        balancers = [
            i.get("ip") or i.get("hostname") for i in ingress if i.get("ip") or i.get("hostname")
        ]
        found = [*balancers, *external]
        return ",".join(found) if found else "<pending>"
    if svc_type == "ExternalName":
        return str(spec.get("externalName", ""))
    return "<unknown>"


def _ports(obj: dict[str, Any]) -> str:
    pieces = []
    for port in _get(obj, "spec", "ports") or []:
        protocol = port.get("protocol", "TCP")
        if port.get("nodePort"):
            pieces.append(f"{port.get('port')}:{port['nodePort']}/{protocol}")
        else:
            pieces.append(f"{port.get('port')}/{protocol}")
    return ",".join(pieces) or "<none>"


def _with_more(items: list[str], count: int, limit: int = 3, empty: str = "<unset>") -> str:
    text = ",".join(items[:limit])
    if count > limit:
        return f"{text} + {count - limit} more..."
    return text or empty


def _endpoints(obj: dict[str, Any]) -> str:
    subsets = obj.get("subsets") or []
    if not subsets:
        return "<none>"
    listed: list[str] = []
    count = 0
    for subset in subsets:
        addresses = [a.get("ip", "") for a in subset.get("addresses") or []]
        ports = subset.get("ports") or []
        if not ports:
            count += len(addresses)
            listed.extend(addresses)
            continue
        for port in ports:
            count += len(addresses)
            listed.extend(f"{ip}:{port.get('port')}" for ip in addresses)
    return _with_more(listed, count, empty="")


def _slice_ports(obj: dict[str, Any]) -> str:
    ports = obj.get("ports") or []
    names = [str(p["port"]) if p.get("port") is not None else (p.get("name") or "*") for p in ports]
    return _with_more(names, len(names))


def _slice_endpoints(obj: dict[str, Any]) -> str:
    addresses = [a for e in obj.get("endpoints") or [] for a in e.get("addresses") or []]
    return _with_more(addresses, len(addresses))


# ----- autoscaling -----------------------------------------------------------------------------


def _quantity(value: Any) -> str:
    return "<unknown>" if value is None else str(value)


def _hpa_metrics(obj: dict[str, Any]) -> str:
    spec = obj.get("spec") or {}
    metrics = list(spec.get("metrics") or [])
    statuses = list(_get(obj, "status", "currentMetrics") or [])
    if not metrics and spec.get("targetCPUUtilizationPercentage") is not None:
        # An object written through autoscaling/v1 states its CPU target this way.
        current = _get(obj, "status", "currentCPUUtilizationPercentage")
        shown = "<unknown>" if current is None else f"{current}%"
        return f"cpu: {shown}/{spec['targetCPUUtilizationPercentage']}%"
    if not metrics:
        return "<none>"
    listed = []
    for index, metric in enumerate(metrics):
        mtype = metric.get("type", "")
        status = statuses[index] if index < len(statuses) else {}
        key = {
            "Resource": "resource",
            "ContainerResource": "containerResource",
            "Pods": "pods",
            "Object": "object",
            "External": "external",
        }.get(mtype)
        if key is None:
            listed.append("<unknown type>")
            continue
        source = metric.get(key) or {}
        target = source.get("target") or {}
        current = (status.get(key) or {}).get("current") or {}
        if mtype in ("Resource", "ContainerResource"):
            if target.get("averageValue") is not None:
                value = _quantity(current.get("averageValue"))
                listed.append(f"{source.get('name')}: {value}/{target['averageValue']}")
            else:
                utilisation = current.get("averageUtilization")
                shown = "<unknown>" if utilisation is None else f"{utilisation}%"
                goal = target.get("averageUtilization")
                wanted = "<auto>" if goal is None else f"{goal}%"
                listed.append(f"{source.get('name')}: {shown}/{wanted}")
        elif mtype == "Pods":
            value = _quantity(current.get("averageValue"))
            listed.append(f"{value}/{target.get('averageValue')}")
        elif target.get("averageValue") is not None:
            value = _quantity(current.get("averageValue"))
            listed.append(f"{value}/{target['averageValue']} (avg)")
        else:
            value = _quantity(current.get("value"))
            listed.append(f"{value}/{target.get('value')}")
    text = ", ".join(listed[:2])
    return f"{text} + {len(listed) - 2} more..." if len(listed) > 2 else text


def _hpa_min(obj: dict[str, Any]) -> str:
    value = _get(obj, "spec", "minReplicas")
    return "<unset>" if value is None else str(value)


# ----- RBAC and storage ------------------------------------------------------------------------


def _subjects(kind: str) -> Cell:
    def cell(obj: dict[str, Any]) -> str:
        found = []
        for subject in obj.get("subjects") or []:
            if subject.get("kind") != kind:
                continue
            if kind == "ServiceAccount":
                found.append(f"{subject.get('namespace', '')}:{subject.get('name', '')}")
            else:
                found.append(str(subject.get("name", "")))
        return ", ".join(found)

    return cell


_ACCESS_MODES = {
    "ReadWriteOnce": "RWO",
    "ReadOnlyMany": "ROX",
    "ReadWriteMany": "RWX",
    "ReadWriteOncePod": "RWOP",
}


def _pvc_status(obj: dict[str, Any]) -> str:
    if obj["metadata"].get("deletionTimestamp"):
        return "Terminating"
    return str(_get(obj, "status", "phase") or "")


def _pvc_bound(field: str) -> Cell:
    def cell(obj: dict[str, Any]) -> str:
        if not _get(obj, "spec", "volumeName"):
            return ""
        if field == "capacity":
            return str(_get(obj, "status", "capacity", "storage") or "")
        modes = _get(obj, "status", "accessModes") or []
        return ",".join(_ACCESS_MODES.get(m, m) for m in modes)

    return cell


def _storage_class(obj: dict[str, Any]) -> str:
    annotation = (obj["metadata"].get("annotations") or {}).get(
        "volume.beta.kubernetes.io/storage-class"
    )
    return str(annotation or _get(obj, "spec", "storageClassName") or "")


def _pv_claim(obj: dict[str, Any]) -> str:
    ref = _get(obj, "spec", "claimRef")
    return f"{ref.get('namespace', '')}/{ref.get('name', '')}" if isinstance(ref, dict) else ""


def _pv_status(obj: dict[str, Any]) -> str:
    if obj["metadata"].get("deletionTimestamp"):
        return "Terminating"
    return str(_get(obj, "status", "phase") or "")


def _quota(limits: bool) -> Cell:
    """The REQUEST or LIMIT cell of a ResourceQuota: `name: used/hard` for each resource."""

    def cell(obj: dict[str, Any]) -> str:
        hard = _get(obj, "status", "hard") or {}
        used = _get(obj, "status", "used") or {}
        pieces = []
        for resource in sorted(hard):
            parts = resource.split(".")
            if (len(parts) > 1 and parts[0] == "limits") != limits:
                continue
            pieces.append(f"{resource}: {used.get(resource, '0')}/{hard[resource]}")
        return ", ".join(pieces)

    return cell


def _ingress_hosts(obj: dict[str, Any]) -> str:
    rules = _get(obj, "spec", "rules") or []
    hosts = [r["host"] for r in rules if r.get("host")]
    if not hosts:
        return "*"
    text = ",".join(hosts[:3])
    return f"{text} + {len(rules) - 3} more..." if len(hosts) > 3 else text


def _ingress_address(obj: dict[str, Any]) -> str:
    ingress = _get(obj, "status", "loadBalancer", "ingress") or []
    found = [i.get("ip") or i.get("hostname") for i in ingress if i.get("ip") or i.get("hostname")]
    return ",".join(dict.fromkeys(found))


def _ingress_class_parameters(obj: dict[str, Any]) -> str:
    parameters = _get(obj, "spec", "parameters")
    if not isinstance(parameters, dict):
        return "<none>"
    kind = str(parameters.get("kind", ""))
    if parameters.get("apiGroup"):
        kind = f"{kind}.{parameters['apiGroup']}"
    return f"{kind}/{parameters.get('name', '')}"


# ----- events ----------------------------------------------------------------------------------


def _claim_state(obj: dict[str, Any]) -> str:
    """A ResourceClaim's State cell: deleted, pending, allocated, reserved (comma-joined)."""
    states = []
    deleting = bool(_get(obj, "metadata", "deletionTimestamp"))
    if deleting:
        states.append("deleted")
    if not _get(obj, "status", "allocation"):
        if not deleting:
            states.append("pending")
    else:
        states.append("allocated")
        if _get(obj, "status", "reservedFor"):
            states.append("reserved")
    return ",".join(states)


def _event_field(obj: dict[str, Any], core: str, events_k8s_io: str) -> Any:
    """A field of a core/v1 Event, or its events.k8s.io/v1 spelling."""
    value = obj.get(core)
    return value if value not in (None, "", {}) else obj.get(events_k8s_io)


def _event_first(obj: dict[str, Any]) -> str:
    first = _event_field(obj, "firstTimestamp", "deprecatedFirstTimestamp")
    return since(first or obj.get("eventTime"))


def _event_last(obj: dict[str, Any]) -> str:
    series = obj.get("series") or {}
    if series.get("lastObservedTime"):
        return since(series["lastObservedTime"])
    last = _event_field(obj, "lastTimestamp", "deprecatedLastTimestamp")
    return since(last) if last else _event_first(obj)


def _event_object(obj: dict[str, Any]) -> str:
    involved = _event_field(obj, "involvedObject", "regarding") or {}
    kind = str(involved.get("kind", "")).lower()
    return f"{kind}/{involved['name']}" if involved.get("name") else kind


def _event_source(obj: dict[str, Any]) -> str:
    source = _event_field(obj, "source", "deprecatedSource") or {}
    component = source.get("component") or obj.get("reportingController") or ""
    host = source.get("host") or obj.get("reportingInstance") or ""
    return f"{component}, {host}" if host else str(component)


def _event_count(obj: dict[str, Any]) -> int:
    series = obj.get("series") or {}
    if series.get("count"):
        return int(series["count"])
    return _int(_event_field(obj, "count", "deprecatedCount")) or 1


EVENT_COLUMNS: list[Column] = [
    ("Last Seen", "string", 0, _event_last),
    ("Type", "string", 0, lambda o: o.get("type", "")),
    ("Reason", "string", 0, lambda o: o.get("reason", "")),
    ("Object", "string", 0, _event_object),
    (
        "Subobject",
        "string",
        1,
        lambda o: (_event_field(o, "involvedObject", "regarding") or {}).get("fieldPath", ""),
    ),
    ("Source", "string", 1, _event_source),
    ("Message", "string", 0, lambda o: str(_event_field(o, "message", "note") or "").strip()),
    ("First Seen", "string", 1, _event_first),
    ("Count", "string", 1, _event_count),
    ("Name", "string", 1, lambda o: o["metadata"]["name"]),
]

_DS_NAMES, _DS_IMAGES = _containers("spec", "template", "spec")

COLUMNS: dict[str, list[Column]] = {
    "deployments": [
        NAME,
        ("Ready", "string", 0, _ready_of),
        ("Up-to-date", "string", 0, lambda o: _int(_get(o, "status", "updatedReplicas"))),
        ("Available", "string", 0, lambda o: _int(_get(o, "status", "availableReplicas"))),
        AGE,
        *_wide_containers("spec", "template", "spec"),
        (
            "Selector",
            "string",
            1,
            lambda o: scale.format_selector(_get(o, "spec", "selector")),
        ),
    ],
    "replicasets": [
        NAME,
        ("Desired", "integer", 0, lambda o: _int(_get(o, "spec", "replicas"))),
        ("Current", "integer", 0, lambda o: _int(_get(o, "status", "replicas"))),
        ("Ready", "integer", 0, lambda o: _int(_get(o, "status", "readyReplicas"))),
        AGE,
        *_wide_containers("spec", "template", "spec"),
        ("Selector", "string", 1, lambda o: label_selector(_get(o, "spec", "selector"))),
    ],
    "daemonsets": [
        NAME,
        ("Desired", "integer", 0, lambda o: _int(_get(o, "status", "desiredNumberScheduled"))),
        ("Current", "integer", 0, lambda o: _int(_get(o, "status", "currentNumberScheduled"))),
        ("Ready", "integer", 0, lambda o: _int(_get(o, "status", "numberReady"))),
        ("Up-to-date", "integer", 0, lambda o: _int(_get(o, "status", "updatedNumberScheduled"))),
        ("Available", "integer", 0, lambda o: _int(_get(o, "status", "numberAvailable"))),
        (
            "Node Selector",
            "string",
            0,
            lambda o: format_labels(_get(o, "spec", "template", "spec", "nodeSelector")),
        ),
        AGE,
        ("Containers", "string", 1, _DS_NAMES),
        ("Images", "string", 1, _DS_IMAGES),
        ("Selector", "string", 1, lambda o: label_selector(_get(o, "spec", "selector"))),
    ],
    "statefulsets": [
        NAME,
        ("Ready", "string", 0, _ready_of),
        AGE,
        *_wide_containers("spec", "template", "spec"),
    ],
    "controllerrevisions": [
        NAME,
        ("Controller", "string", 0, _controller_of),
        ("Revision", "string", 0, lambda o: _int(o.get("revision"))),
        AGE,
    ],
    "jobs": [
        NAME,
        ("Status", "string", 0, _job_status),
        ("Completions", "string", 0, _job_completions),
        ("Duration", "string", 0, _job_duration),
        AGE,
        *_wide_containers("spec", "template", "spec"),
        ("Selector", "string", 1, lambda o: label_selector(_get(o, "spec", "selector"))),
    ],
    "cronjobs": [
        NAME,
        ("Schedule", "string", 0, lambda o: _get(o, "spec", "schedule") or ""),
        ("Timezone", "string", 0, lambda o: _get(o, "spec", "timeZone") or "<none>"),
        ("Suspend", "boolean", 0, lambda o: _bool_text(_get(o, "spec", "suspend"))),
        ("Active", "integer", 0, lambda o: len(_get(o, "status", "active") or [])),
        (
            "Last Schedule",
            "string",
            0,
            lambda o: (
                since(_get(o, "status", "lastScheduleTime"))
                if _get(o, "status", "lastScheduleTime")
                else "<none>"
            ),
        ),
        AGE,
        *_wide_containers("spec", "jobTemplate", "spec", "template", "spec"),
        (
            "Selector",
            "string",
            1,
            lambda o: label_selector(_get(o, "spec", "jobTemplate", "spec", "selector")),
        ),
    ],
    "horizontalpodautoscalers": [
        NAME,
        (
            "Reference",
            "string",
            0,
            lambda o: (
                f"{_get(o, 'spec', 'scaleTargetRef', 'kind') or ''}/"
                f"{_get(o, 'spec', 'scaleTargetRef', 'name') or ''}"
            ),
        ),
        ("Targets", "string", 0, _hpa_metrics),
        ("MinPods", "string", 0, _hpa_min),
        ("MaxPods", "string", 0, lambda o: _int(_get(o, "spec", "maxReplicas"))),
        ("Replicas", "string", 0, lambda o: _int(_get(o, "status", "currentReplicas"))),
        AGE,
    ],
    "services": [
        NAME,
        ("Type", "string", 0, lambda o: _get(o, "spec", "type") or ""),
        (
            "Cluster-IP",
            "string",
            0,
            lambda o: (_get(o, "spec", "clusterIPs") or ["<none>"])[0],
        ),
        ("External-IP", "string", 0, _external_ip),
        ("Port(s)", "string", 0, _ports),
        AGE,
        ("Selector", "string", 1, lambda o: format_labels(_get(o, "spec", "selector"))),
    ],
    "endpoints": [NAME, ("Endpoints", "string", 0, _endpoints), AGE],
    "endpointslices": [
        NAME,
        ("AddressType", "string", 0, lambda o: o.get("addressType", "")),
        ("Ports", "string", 0, _slice_ports),
        ("Endpoints", "string", 0, _slice_endpoints),
        AGE,
    ],
    "persistentvolumeclaims": [
        NAME,
        ("Status", "string", 0, _pvc_status),
        ("Volume", "string", 0, lambda o: _get(o, "spec", "volumeName") or ""),
        ("Capacity", "string", 0, _pvc_bound("capacity")),
        ("Access Modes", "string", 0, _pvc_bound("accessModes")),
        ("StorageClass", "string", 0, _storage_class),
        (
            "VolumeAttributesClass",
            "string",
            0,
            lambda o: _get(o, "spec", "volumeAttributesClassName") or "<unset>",
        ),
        AGE,
        ("VolumeMode", "string", 1, lambda o: _get(o, "spec", "volumeMode") or "<unset>"),
    ],
    "persistentvolumes": [
        NAME,
        ("Capacity", "string", 0, lambda o: _get(o, "spec", "capacity", "storage") or ""),
        (
            "Access Modes",
            "string",
            0,
            lambda o: ",".join(
                _ACCESS_MODES.get(m, m) for m in _get(o, "spec", "accessModes") or []
            ),
        ),
        (
            "Reclaim Policy",
            "string",
            0,
            lambda o: _get(o, "spec", "persistentVolumeReclaimPolicy") or "",
        ),
        ("Status", "string", 0, _pv_status),
        ("Claim", "string", 0, _pv_claim),
        ("StorageClass", "string", 0, _storage_class),
        (
            "VolumeAttributesClass",
            "string",
            0,
            lambda o: _get(o, "spec", "volumeAttributesClassName") or "<unset>",
        ),
        ("Reason", "string", 0, lambda o: _get(o, "status", "reason") or ""),
        AGE,
        ("VolumeMode", "string", 1, lambda o: _get(o, "spec", "volumeMode") or "<unset>"),
    ],
    "replicationcontrollers": [
        NAME,
        ("Desired", "integer", 0, lambda o: _int(_get(o, "spec", "replicas"))),
        ("Current", "integer", 0, lambda o: _int(_get(o, "status", "replicas"))),
        ("Ready", "integer", 0, lambda o: _int(_get(o, "status", "readyReplicas"))),
        AGE,
        *_wide_containers("spec", "template", "spec"),
        ("Selector", "string", 1, lambda o: format_labels(_get(o, "spec", "selector"))),
    ],
    "resourcequotas": [
        NAME,
        AGE,
        ("Request", "string", 0, _quota(limits=False)),
        ("Limit", "string", 0, _quota(limits=True)),
    ],
    "ingresses": [
        NAME,
        ("Class", "string", 0, lambda o: _get(o, "spec", "ingressClassName") or "<none>"),
        ("Hosts", "string", 0, _ingress_hosts),
        ("Address", "string", 0, _ingress_address),
        ("Ports", "string", 0, lambda o: "80, 443" if _get(o, "spec", "tls") else "80"),
        AGE,
    ],
    "ingressclasses": [
        NAME,
        ("Controller", "string", 0, lambda o: _get(o, "spec", "controller") or ""),
        ("Parameters", "string", 0, _ingress_class_parameters),
        AGE,
    ],
    "secrets": [
        NAME,
        ("Type", "string", 0, lambda o: o.get("type", "")),
        ("Data", "string", 0, lambda o: len(o.get("data") or {})),
        AGE,
    ],
    "serviceaccounts": [
        NAME,
        ("Secrets", "string", 0, lambda o: len(o.get("secrets") or [])),
        AGE,
    ],
    "leases": [
        NAME,
        ("Holder", "string", 0, lambda o: _get(o, "spec", "holderIdentity") or ""),
        AGE,
    ],
    "priorityclasses": [
        NAME,
        ("Value", "integer", 0, lambda o: _int(o.get("value"))),
        ("Global-Default", "boolean", 0, lambda o: _bool(o.get("globalDefault"))),
        AGE,
        ("PreemptionPolicy", "string", 0, lambda o: o.get("preemptionPolicy") or ""),
    ],
    "runtimeclasses": [NAME, ("Handler", "string", 0, lambda o: o.get("handler", "")), AGE],
    "deviceclasses": [NAME, AGE],
    "resourceclaims": [NAME, ("State", "string", 0, lambda o: _claim_state(o)), AGE],
    "resourceclaimtemplates": [NAME, AGE],
    "resourceslices": [
        NAME,
        ("Node", "string", 0, lambda o: _get(o, "spec", "nodeName") or ""),
        ("Driver", "string", 0, lambda o: _get(o, "spec", "driver") or ""),
        ("Pool", "string", 0, lambda o: _get(o, "spec", "pool", "name") or ""),
        AGE,
    ],
    "roles": [NAME, ("Created At", "date", 0, created_at)],
    "clusterroles": [NAME, ("Created At", "date", 0, created_at)],
    "rolebindings": [
        NAME,
        (
            "Role",
            "string",
            0,
            lambda o: f"{_get(o, 'roleRef', 'kind') or ''}/{_get(o, 'roleRef', 'name') or ''}",
        ),
        AGE,
        ("Users", "string", 1, _subjects("User")),
        ("Groups", "string", 1, _subjects("Group")),
        ("ServiceAccounts", "string", 1, _subjects("ServiceAccount")),
    ],
    "mutatingwebhookconfigurations": [
        NAME,
        ("Webhooks", "integer", 0, lambda o: len(o.get("webhooks") or [])),
        AGE,
    ],
    "events": EVENT_COLUMNS,
}
COLUMNS["clusterrolebindings"] = COLUMNS["rolebindings"]
COLUMNS["validatingwebhookconfigurations"] = COLUMNS["mutatingwebhookconfigurations"]

# The real server's table for kinds without a printer of their own.
DEFAULT_COLUMNS: list[Column] = [NAME, ("Created At", "date", 0, created_at)]
