"""A DaemonSet's pod template as plain dicts: its containers and their literal env vars.

The smallest layer of the operand builders: `common` (the shared transforms) and `builtin` (what
our own agents' containers need, the last of those transforms) both build on it.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def pod_spec(ds: Obj) -> Obj:
    spec: Obj = ds["spec"]["template"]["spec"]
    return spec


def containers(ds: Obj) -> list[Obj]:
    found: list[Obj] = pod_spec(ds)["containers"]
    return found


def init_containers(ds: Obj) -> list[Obj]:
    found: list[Obj] = pod_spec(ds).setdefault("initContainers", [])
    return found


def all_containers(ds: Obj) -> list[Obj]:
    return [*init_containers(ds), *containers(ds)]


def env(name: str, value: str) -> Obj:
    return {"name": name, "value": value}


def set_env(ctr: Obj, name: str, value: str) -> None:
    """Upsert a literal env var, keeping its position when it exists."""
    items: list[Obj] = ctr.setdefault("env", [])
    for item in items:
        if item["name"] == name:
            item.pop("valueFrom", None)
            item["value"] = value
            return
    items.append(env(name, value))


def get_env(ctr: Obj, name: str) -> str | None:
    for item in ctr.get("env", []):
        if item["name"] == name:
            value = item.get("value")
            return None if value is None else str(value)
    return None
