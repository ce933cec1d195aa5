"""The RuntimeClass admission step for new pods, and the kubelet's lookup of a pod's handler.

On the real server a pod naming a RuntimeClass that does not exist is refused at creation (403
`pod rejected: RuntimeClass "x" not found`); a class with `overhead.podFixed` sets the pod's
`spec.overhead` (a different overhead already there is refused, as is an overhead without such a
class), and its `scheduling` adds node selector terms (a conflicting value is refused) and
tolerations. A class deleted after the pod was created is the kubelet's problem: it cannot
resolve the handler and reports `FailedCreatePodSandBox` (see kubesim.cri).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kubesim import cri, errors
from kubesim.resources import ResourceType

if TYPE_CHECKING:
    from kubesim.store import Store

RUNTIME_CLASSES = ("node.k8s.io", "runtimeclasses")


class HandlerNotFound(LookupError):
    """The pod's RuntimeClass does not exist (any more); the message is the API's NotFound."""


def admit(store: Store, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    """Resolve a new pod's RuntimeClass: overhead and scheduling, or a 403."""
    if rt.key != ("", "pods") or rt.from_crd or old is not None:
        return
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    name = obj["metadata"].get("name", "") or obj["metadata"].get("generateName", "")
    class_name = spec.get("runtimeClassName") or ""
    runtime_class: dict[str, Any] | None = None
    if class_name:
        found = store.peek(RUNTIME_CLASSES, "", class_name)
        if found is None or found.obj["metadata"].get("deletionTimestamp"):
            raise _forbidden(name, f'pod rejected: RuntimeClass "{class_name}" not found')
        runtime_class = found.obj
    _overhead(name, spec, runtime_class)
    if runtime_class is not None:
        _scheduling(name, spec, runtime_class.get("scheduling") or {})


def _overhead(name: str, spec: dict[str, Any], runtime_class: dict[str, Any] | None) -> None:
    fixed = ((runtime_class or {}).get("overhead") or {}).get("podFixed")
    given = spec.get("overhead")
    if fixed:
        if given and given != fixed:
            raise _forbidden(
                name, "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead"
            )
        spec["overhead"] = dict(fixed)
    elif given:
        raise _forbidden(
            name,
            "pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead",
        )


def _scheduling(name: str, spec: dict[str, Any], scheduling: dict[str, Any]) -> None:
    selector = dict(spec.get("nodeSelector") or {})
    for key, value in (scheduling.get("nodeSelector") or {}).items():
        if key in selector and selector[key] != value:
            raise _forbidden(
                name,
                f"conflict: runtimeClass.scheduling.nodeSelector[{key}] = {value}; "
                f"pod.spec.nodeSelector[{key}] = {selector[key]}",
            )
        selector[key] = value
    if selector:
        spec["nodeSelector"] = selector
    tolerations = list(spec.get("tolerations") or [])
    for toleration in scheduling.get("tolerations") or []:
        if toleration not in tolerations:
            tolerations.append(toleration)
    if tolerations:
        spec["tolerations"] = tolerations


def lookup_handler(store: Store, pod: dict[str, Any]) -> str:
    """The CRI runtime handler of a pod: its RuntimeClass's `handler`, "" (the runtime's
    default) without one; raises HandlerNotFound when the class is gone."""
    class_name = (pod.get("spec") or {}).get("runtimeClassName") or ""
    if not class_name:
        return ""
    found = store.peek(RUNTIME_CLASSES, "", class_name)
    if found is None:
        raise HandlerNotFound(cri.runtime_class_not_found(class_name))
    return str(found.obj.get("handler") or "")


def _forbidden(name: str, why: str) -> errors.ApiError:
    return errors.ApiError(
        403,
        f'pods "{name}" is forbidden: {why}',
        reason="Forbidden",
        details={"name": name, "kind": "pods"},
    )
