"""Hand edits to the DaemonSets we render: which of our fields differ on the live object, and who
changed them (from `metadata.managedFields`).

Our hash annotation only says what we last applied; an edit such as `kubectl set image` leaves it
alone. Upstream compares a hash annotation too, and so never notices. Here the cache keeps a
compact view of the pod template fields an attacker or a hurried human would change (container
images, commands, arguments and literal env values) and the field managers other than ours;
`differences` compares that view with what we render. Pure functions: no client code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

CONTAINER_LISTS = ("initContainers", "containers")
# Container fields compared with what we render (lists compare whole, as SSA treats them).
CONTAINER_FIELDS = ("image", "command", "args")

View = dict[str, dict[str, dict[str, Any]]]


def _pod_spec(workload: Mapping[str, Any]) -> Mapping[str, Any]:
    template = (workload.get("spec") or {}).get("template") or {}
    spec = template.get("spec") if isinstance(template, Mapping) else None
    return spec if isinstance(spec, Mapping) else {}


def view(workload: Mapping[str, Any]) -> View:
    """The compared fields of a workload's pod template: per container list, per container name,
    the container fields and literal env values (`valueFrom` entries are left out)."""
    out: View = {}
    spec = _pod_spec(workload)
    for list_name in CONTAINER_LISTS:
        containers = spec.get(list_name) or []
        by_name: dict[str, dict[str, Any]] = {}
        for container in containers if isinstance(containers, list) else []:
            if not isinstance(container, Mapping) or not container.get("name"):
                continue
            fields = {f: container[f] for f in CONTAINER_FIELDS if f in container}
            env = {
                str(e["name"]): str(e.get("value") or "")  # the server drops an empty value
                for e in container.get("env") or []
                if isinstance(e, Mapping) and e.get("name") and "valueFrom" not in e
            }
            if env:
                fields["env"] = env
            by_name[str(container["name"])] = fields
        if by_name:
            out[list_name] = by_name
    return out


def differences(desired: View, live: View | None) -> list[tuple[str, Any, Any]]:
    """(field path, live value, desired value) for each rendered field the live object lacks or
    holds differently. Fields we do not render are not ours to judge."""
    if live is None:
        return []
    found: list[tuple[str, Any, Any]] = []
    for list_name, containers in desired.items():
        live_containers = live.get(list_name) or {}
        for name, fields in containers.items():
            at = f"spec.template.spec.{list_name}[name={name}]"
            have = live_containers.get(name)
            if have is None:
                found.append((at, None, "(the container)"))
                continue
            for field, want in fields.items():
                if field == "env":
                    have_env = have.get("env") or {}
                    for var, value in want.items():
                        if have_env.get(var) != value:
                            found.append((f"{at}.env[name={var}].value", have_env.get(var), value))
                elif have.get(field) != want:
                    found.append((f"{at}.{field}", have.get(field), want))
    return found


def editors(managed_fields: Any, ours: str) -> list[dict[str, Any]]:
    """The managedFields entries of other managers on the main resource (not the status),
    compacted to manager, operation, time and the container names their fields touch."""
    out: list[dict[str, Any]] = []
    for entry in managed_fields if isinstance(managed_fields, list) else []:
        if not isinstance(entry, Mapping) or entry.get("subresource"):
            continue
        manager = str(entry.get("manager") or "")
        if not manager or manager == ours:
            continue
        fields = entry.get("fieldsV1")
        spec = (((fields or {}).get("f:spec") or {}).get("f:template") or {}).get("f:spec") or {}
        touched = sorted(
            str(json.loads(key[2:]).get("name"))
            for list_name in CONTAINER_LISTS
            for key in (spec.get(f"f:{list_name}") or {})
            if key.startswith("k:")
        )
        out.append(
            {
                "manager": manager,
                "operation": str(entry.get("operation") or ""),
                "time": str(entry.get("time") or ""),
                "containers": touched,
            }
        )
    return out


def who_changed(path: str, found: list[dict[str, Any]]) -> str:
    """The manager most likely behind a changed field: the latest one that touched its container,
    else the latest other manager; "" when the server recorded none."""
    container = path.split("[name=", 1)[1].split("]", 1)[0] if "[name=" in path else ""
    touching = [e for e in found if container and container in e["containers"]]
    candidates = touching or found
    if not candidates:
        return ""
    latest = max(candidates, key=lambda e: e["time"])
    return str(latest["manager"])


def message(kind_name: str, diffs: list[tuple[str, Any, Any]], manager: str) -> str:
    """The Event text for restoring hand-edited fields."""
    by = f" by {manager}" if manager else ""
    parts = [f"{path} was {_short(live)}, restored to {_short(want)}" for path, live, want in diffs]
    return f"{kind_name}: fields we own were changed{by}; " + "; ".join(parts[:5])


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 120 else text[:117] + "..."
