"""The Priority admission step for new pods: `spec.priority` and `spec.preemptionPolicy`.

The value comes from the PriorityClass the pod names (the two system classes are always known:
system-node-critical 2000001000, system-cluster-critical 2000000000), else from the class marked
`globalDefault`, else 0 with PreemptLowerPriority. Naming a class that does not exist, or giving
a priority that disagrees with the class, is a 403 as on the real server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kubesim import errors
from kubesim.resources import ResourceType

if TYPE_CHECKING:
    from kubesim.store import Store

PRIORITY_CLASSES = ("scheduling.k8s.io", "priorityclasses")
SYSTEM_CLASSES = {"system-node-critical": 2000001000, "system-cluster-critical": 2000000000}
DEFAULT_POLICY = "PreemptLowerPriority"


def admit(store: Store, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    """Resolve a new pod's priority from its PriorityClass."""
    if rt.key != ("", "pods") or rt.from_crd or old is not None:
        return
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    name = obj["metadata"].get("name", "")
    class_name = spec.get("priorityClassName") or ""
    value, policy = 0, DEFAULT_POLICY
    if class_name:
        found = store.peek(PRIORITY_CLASSES, "", class_name)
        if found is not None:
            value = int(found.obj.get("value") or 0)
            policy = found.obj.get("preemptionPolicy") or DEFAULT_POLICY
        elif class_name in SYSTEM_CLASSES:
            value = SYSTEM_CLASSES[class_name]
        else:
            raise _forbidden(name, f"no PriorityClass with name {class_name} was found")
    else:
        for stored in store.scan(PRIORITY_CLASSES):
            if stored.obj.get("globalDefault"):
                value = int(stored.obj.get("value") or 0)
                policy = stored.obj.get("preemptionPolicy") or DEFAULT_POLICY
                break
    given = spec.get("priority")
    if given is not None and given != value:
        raise _forbidden(
            name,
            f"the integer value of priority ({given}) must not be provided in pod spec; "
            f"priority admission controller computed {value} from the given PriorityClass name",
        )
    spec["priority"] = value
    spec.setdefault("preemptionPolicy", policy)


def _forbidden(name: str, why: str) -> errors.ApiError:
    return errors.ApiError(
        403,
        f'pods "{name}" is forbidden: {why}',
        reason="Forbidden",
        details={"name": name, "kind": "pods"},
    )
