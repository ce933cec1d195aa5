"""Picking a pod's container for logs, exec and attach, with the API server's 400 messages."""

from __future__ import annotations

from typing import Any

from kubesim import errors
from kubesim.store import Store

POD_KEY = ("", "pods")
KINDS = ("initContainers", "containers", "ephemeralContainers")


def get_pod(store: Store, namespace: str, name: str) -> dict[str, Any]:
    """The stored pod (not a copy; callers must not mutate it), or 404."""
    stored = store.peek(POD_KEY, namespace, name)
    if stored is None:
        raise errors.not_found("pods", "", name)
    return stored.obj


def _names(pod: dict[str, Any], kind: str) -> list[str]:
    return [c.get("name", "") for c in (pod.get("spec") or {}).get(kind) or []]


def find(pod: dict[str, Any], name: str) -> tuple[str, dict[str, Any]] | None:
    """(kind, container spec) for a container name of any kind."""
    for kind in KINDS:
        for container in (pod.get("spec") or {}).get(kind) or []:
            if container.get("name") == name:
                return kind, container
    return None


def choose(pod: dict[str, Any], requested: str | None) -> str:
    """The named container (it must exist) or the only app container."""
    name = pod["metadata"]["name"]
    if requested:
        if find(pod, requested) is None:
            raise errors.bad_request(f"container {requested} is not valid for pod {name}")
        return requested
    containers = _names(pod, "containers")
    if len(containers) == 1:
        return containers[0]
    if not containers:
        raise errors.bad_request(f"a container name must be specified for pod {name}")
    message = (
        f"a container name must be specified for pod {name}, "
        f"choose one of: [{' '.join(containers)}]"
    )
    inits = _names(pod, "initContainers")
    if inits:
        message += f" or one of the init containers: [{' '.join(inits)}]"
    ephemeral = _names(pod, "ephemeralContainers")
    if ephemeral:
        message += f" or one of the ephemeral containers: [{' '.join(ephemeral)}]"
    raise errors.bad_request(message)


def status_of(pod: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The container's status entry, from whichever list holds it."""
    status = pod.get("status") or {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for entry in status.get(key) or []:
            if entry.get("name") == name:
                return dict(entry)
    return None
