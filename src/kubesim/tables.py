"""Server-side `Table` output (what `kubectl get` asks for), including CRD printer columns."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping
from typing import Any

from kubesim import printers
from kubesim.columns import AGE, NAME, Column, duration
from kubesim.resources import ResourceType
from kubesim.store import Stored, parse_time


def _node_status(obj: dict[str, Any]) -> str:
    conditions = (obj.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    text = "Ready" if ready and ready.get("status") == "True" else "NotReady"
    if ready is None:
        text = "Unknown"
    if (obj.get("spec") or {}).get("unschedulable"):
        text += ",SchedulingDisabled"
    return text


def _node_roles(obj: dict[str, Any]) -> str:
    prefix = "node-role.kubernetes.io/"
    roles = sorted(
        k[len(prefix) :] for k in obj["metadata"].get("labels") or {} if k.startswith(prefix)
    )
    return ",".join(roles) or "<none>"


def _node_address(obj: dict[str, Any], kind: str = "InternalIP") -> str:
    for address in (obj.get("status") or {}).get("addresses") or []:
        if address.get("type") == kind:
            return str(address.get("address"))
    return "<none>"


def _info(field: str) -> Callable[[dict[str, Any]], str]:
    return lambda o: str(((o.get("status") or {}).get("nodeInfo") or {}).get(field, "<none>"))


def _pod_ready(obj: dict[str, Any]) -> str:
    statuses = (obj.get("status") or {}).get("containerStatuses") or []
    total = len((obj.get("spec") or {}).get("containers") or [])
    ready = sum(1 for s in statuses if s.get("ready"))
    return f"{ready}/{total}"


def pod_status_text(obj: dict[str, Any]) -> str:
    """The STATUS column of `kubectl get pods`."""
    if obj["metadata"].get("deletionTimestamp"):
        return "Terminating"
    status = obj.get("status") or {}
    inits = (obj.get("spec") or {}).get("initContainers") or []
    init_statuses = status.get("initContainerStatuses") or []
    done = sum(
        1
        for s in init_statuses
        if ((s.get("state") or {}).get("terminated") or {}).get("exitCode") == 0
    )
    if inits and done < len(inits):
        for s in init_statuses:
            waiting = (s.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") not in (None, "PodInitializing"):
                return f"Init:{waiting['reason']}"
        return f"Init:{done}/{len(inits)}"
    for s in status.get("containerStatuses") or []:
        state = s.get("state") or {}
        waiting = state.get("waiting") or {}
        if waiting.get("reason"):
            return str(waiting["reason"])
        terminated = state.get("terminated") or {}
        if terminated.get("reason"):
            # kubectl shows a finished container's reason: `Completed` for a Succeeded pod.
            return str(terminated["reason"])
    # The pod's own reason (UnexpectedAdmissionError, Evicted) stands in for its phase.
    return str(status.get("reason") or status.get("phase") or "Pending")


def _restarts(obj: dict[str, Any]) -> str:
    """Restarts with the time since the last one, as `3 (5m ago)`."""
    statuses = (obj.get("status") or {}).get("containerStatuses") or []
    count = sum(int(s.get("restartCount") or 0) for s in statuses)
    finished = [
        ((s.get("lastState") or {}).get("terminated") or {}).get("finishedAt") for s in statuses
    ]
    last = max((f for f in finished if f), default=None)
    if count and last:
        seconds = (dt.datetime.now(dt.UTC) - parse_time(last)).total_seconds()
        return f"{count} ({duration(seconds)} ago)"
    return str(count)


def _readiness_gates(obj: dict[str, Any]) -> str:
    gates = (obj.get("spec") or {}).get("readinessGates") or []
    if not gates:
        return "<none>"
    conditions = {
        c.get("type"): c.get("status") for c in (obj.get("status") or {}).get("conditions") or []
    }
    ready = sum(1 for g in gates if conditions.get(g.get("conditionType")) == "True")
    return f"{ready}/{len(gates)}"


def _status(*path: str) -> Callable[[dict[str, Any]], Any]:
    def read(obj: dict[str, Any]) -> Any:
        current: Any = obj
        for part in path:
            current = current.get(part) if isinstance(current, dict) else None
        return 0 if current is None else current

    return read


PRINTERS: dict[str, list[Column]] = {
    "nodes": [
        NAME,
        ("Status", "string", 0, _node_status),
        ("Roles", "string", 0, _node_roles),
        AGE,
        ("Version", "string", 0, _info("kubeletVersion")),
        ("Internal-IP", "string", 1, _node_address),
        ("External-IP", "string", 1, lambda o: _node_address(o, "ExternalIP")),
        ("OS-Image", "string", 1, _info("osImage")),
        ("Kernel-Version", "string", 1, _info("kernelVersion")),
        ("Container-Runtime", "string", 1, _info("containerRuntimeVersion")),
    ],
    "pods": [
        NAME,
        ("Ready", "string", 0, _pod_ready),
        ("Status", "string", 0, pod_status_text),
        ("Restarts", "string", 0, _restarts),
        AGE,
        ("IP", "string", 1, lambda o: (o.get("status") or {}).get("podIP") or "<none>"),
        ("Node", "string", 1, lambda o: (o.get("spec") or {}).get("nodeName") or "<none>"),
        (
            "Nominated Node",
            "string",
            1,
            lambda o: (o.get("status") or {}).get("nominatedNodeName") or "<none>",
        ),
        ("Readiness Gates", "string", 1, _readiness_gates),
    ],
    "namespaces": [
        NAME,
        ("Status", "string", 0, lambda o: (o.get("status") or {}).get("phase", "")),
        AGE,
    ],
    "configmaps": [
        NAME,
        ("Data", "integer", 0, lambda o: len(o.get("data") or {}) + len(o.get("binaryData") or {})),
        AGE,
    ],
    "poddisruptionbudgets": [
        NAME,
        (
            "Min Available",
            "string",
            0,
            lambda o: str((o.get("spec") or {}).get("minAvailable", "N/A")),
        ),
        (
            "Max Unavailable",
            "string",
            0,
            lambda o: str((o.get("spec") or {}).get("maxUnavailable", "N/A")),
        ),
        ("Allowed Disruptions", "integer", 0, _status("status", "disruptionsAllowed")),
        AGE,
    ],
    "customresourcedefinitions": [
        NAME,
        ("Created At", "date", 0, lambda o: o["metadata"].get("creationTimestamp", "")),
    ],
}


_SEGMENT = re.compile(
    r"\.([A-Za-z0-9_\-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_\-]+)==['\"]([^'\"]*)['\"]\)\]"
)


def json_path(obj: Any, path: str) -> Any:
    """Evaluate the simple JSONPath used by printer columns (`.a.b[0]`, `[?(@.type=="Ready")]`)."""
    current = obj
    for match in _SEGMENT.finditer(path.strip().lstrip("{").rstrip("}")):
        field, index, filter_key, filter_value = match.groups()
        if current is None:
            return None
        if field is not None:
            current = current.get(field) if isinstance(current, Mapping) else None
        elif index is not None:
            current = (
                current[int(index)]
                if isinstance(current, list) and int(index) < len(current)
                else None
            )
        else:
            items = current if isinstance(current, list) else []
            current = next(
                (
                    i
                    for i in items
                    if isinstance(i, Mapping) and str(i.get(filter_key)) == filter_value
                ),
                None,
            )
    return current


def _crd_columns(rt: ResourceType) -> list[Column]:
    columns: list[Column] = [NAME]
    has_age = False
    for spec in rt.printer_columns:
        path = str(spec.get("jsonPath", ""))
        ctype = str(spec.get("type", "string"))
        if path == ".metadata.creationTimestamp":
            has_age = True
        name = str(spec.get("name", ""))
        priority = int(spec.get("priority", 0))
        if ctype == "date":
            columns.append((name, "string", priority, _date_reader(path)))
        else:
            columns.append((name, ctype, priority, _cell_reader(path)))
    if not has_age:
        columns.append(AGE)
    return columns


def _date_reader(path: str) -> Callable[[dict[str, Any]], Any]:
    return lambda obj: _date_cell(json_path(obj, path))


def _cell_reader(path: str) -> Callable[[dict[str, Any]], Any]:
    return lambda obj: _cell(json_path(obj, path))


def _date_cell(value: Any) -> str:
    if not value:
        return "<unknown>"
    try:
        return duration((dt.datetime.now(dt.UTC) - parse_time(str(value))).total_seconds())
    except ValueError:
        return str(value)


def _cell(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, dict | list):
        import json

        return json.dumps(value)
    return value


def columns_for(rt: ResourceType) -> list[Column]:
    """The printer columns of a type."""
    if rt.from_crd:
        return _crd_columns(rt)
    return printers.COLUMNS.get(rt.plural) or PRINTERS.get(rt.plural) or printers.DEFAULT_COLUMNS


def row(columns: list[Column], stored: Stored, include: str) -> dict[str, Any]:
    """One object's Table row: its cells and, per includeObject, its metadata or the object."""
    obj = stored.obj
    if include == "Object":
        row_object: dict[str, Any] = obj
    elif include == "None":
        row_object = {}
    else:
        row_object = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {k: v for k, v in obj["metadata"].items() if k != "managedFields"},
        }
    return {"cells": [fn(obj) for _, _, _, fn in columns], "object": row_object}


def table(
    rt: ResourceType,
    items: list[Stored],
    rv: int,
    query: Mapping[str, str],
    continue_token: str | None = None,
    *,
    watch: bool = False,
) -> dict[str, Any]:
    """A meta.k8s.io/v1 Table of objects; rows carry metadata (or the object with includeObject)."""
    columns = columns_for(rt)
    include = query.get("includeObject", "PartialObjectMetadata")
    rows = [row(columns, stored, include) for stored in items]
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if continue_token:
        meta["continue"] = continue_token
    definitions = [
        {
            "name": name,
            "type": ctype,
            "format": "name" if name == "Name" else "",
            "description": name,
            "priority": priority,
        }
        for name, ctype, priority, _ in columns
    ]
    result: dict[str, Any] = {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": definitions,
        "rows": rows,
    }
    if watch:
        result["columnDefinitions"] = definitions
    return result
