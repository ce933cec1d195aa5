"""Node eligibility rules shared by the DaemonSet controller and the scheduler."""

from __future__ import annotations

import datetime as dt
from collections.abc import Hashable
from typing import Any

from kubesim import quantity, selectors
from kubesim.store import parse_time

# Tolerations the DaemonSet controller adds to every daemon pod.
DAEMON_TOLERATIONS: tuple[dict[str, Any], ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
NETWORK_TOLERATION = {
    "key": "node.kubernetes.io/network-unavailable",
    "operator": "Exists",
    "effect": "NoSchedule",
}


def daemon_tolerations(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod's tolerations plus the DaemonSet defaults it lacks."""
    result = list(spec.get("tolerations") or [])
    extra = list(DAEMON_TOLERATIONS)
    if spec.get("hostNetwork"):
        extra.append(NETWORK_TOLERATION)
    for toleration in extra:
        if not any(
            t.get("key") == toleration["key"] and t.get("effect") == toleration["effect"]
            for t in result
        ):
            result.append(dict(toleration))
    return result


def tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """Whether one toleration tolerates one taint (the real matching rules)."""
    effect = toleration.get("effect")
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key")
    operator = toleration.get("operator") or "Equal"
    if not key:
        return operator == "Exists"
    if key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    return bool(toleration.get("value", "") == taint.get("value", ""))


def node_selected(node: dict[str, Any], spec: dict[str, Any]) -> bool:
    """nodeSelector plus required node affinity (matchExpressions and matchFields)."""
    labels = node["metadata"].get("labels") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not affinity:
        return True
    fields = {"metadata.name": node["metadata"]["name"]}
    for term in affinity.get("nodeSelectorTerms") or []:
        expressions = term.get("matchExpressions") or []
        field_exprs = term.get("matchFields") or []
        if not expressions and not field_exprs:
            continue
        if all(selectors.match_node_selector_requirement(e, labels) for e in expressions) and all(
            selectors.match_node_selector_requirement(e, labels, fields) for e in field_exprs
        ):
            return True
    return False


def daemon_placement(node: dict[str, Any], spec: dict[str, Any]) -> tuple[bool, bool]:
    """(should run, should continue running) for a daemon pod with this spec on this node."""
    if not node_selected(node, spec):
        return False, False
    tolerations = daemon_tolerations(spec)
    should_run = should_continue = True
    for taint in (node.get("spec") or {}).get("taints") or []:
        effect = taint.get("effect")
        if effect not in ("NoSchedule", "NoExecute"):
            continue
        if any(tolerates(t, taint) for t in tolerations):
            continue
        should_run = False
        if effect == "NoExecute":
            should_continue = False
    return should_run, should_continue


def schedulable(node: dict[str, Any], spec: dict[str, Any]) -> bool:
    """Whether the scheduler may place an ordinary pod on a node."""
    if (node.get("spec") or {}).get("unschedulable"):
        tolerations = spec.get("tolerations") or []
        taint = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
        if not any(tolerates(t, taint) for t in tolerations):
            return False
    if not node_selected(node, spec):
        return False
    if not node_ready(node):
        return False
    tolerations = spec.get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(
            tolerates(t, taint) for t in tolerations
        ):
            return False
    return True


def node_ready(node: dict[str, Any]) -> bool:
    """The node's Ready condition is True."""
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def pod_ready(pod: dict[str, Any]) -> bool:
    """The pod's Ready condition is True."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def ready_for(pod: dict[str, Any], min_ready_seconds: int) -> float:
    """Seconds until a ready pod counts as available (0 when available, -1 when not ready)."""
    if not pod_ready(pod) or pod["metadata"].get("deletionTimestamp"):
        return -1
    if min_ready_seconds <= 0:
        return 0
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("lastTransitionTime"):
            since = parse_time(condition["lastTransitionTime"])
            elapsed = (dt.datetime.now(dt.UTC) - since).total_seconds()
            return max(0.0, min_ready_seconds - elapsed)
    return 0


def scaled_value(value: Any, total: int, round_up: bool) -> int:
    """Resolve an int-or-percent (`maxUnavailable: 10%`) against a total."""
    if isinstance(value, str) and value.endswith("%"):
        percent = int(value[:-1])
        amount = total * percent / 100
        return int(-(-amount // 1)) if round_up else int(amount)
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def is_controlled_by(obj: dict[str, Any], uid: str) -> bool:
    """Whether `uid` is the controller ownerReference of an object."""
    return any(
        r.get("uid") == uid and r.get("controller")
        for r in obj["metadata"].get("ownerReferences") or []
    )


def template_hash(template: Any) -> str:
    """A short, stable hash of a pod template (the controller-revision-hash / pod-template-hash)."""
    import hashlib
    import json

    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest()
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    return "".join(alphabet[b % len(alphabet)] for b in digest[:10])


# ----- resources and ports (shared by the scheduler and the kubelet) ---------------------------

# What the scheduler assumes for a container without a CPU or memory request when it scores
# nodes (the real scheduler's non-zero defaults: 0.1 core and 200 MiB); filtering uses zero.
DEFAULT_MILLI_CPU = 100
DEFAULT_MEMORY = 200 * 1024 * 1024
NATIVE_RESOURCES = ("cpu", "memory", "pods", "ephemeral-storage")


def is_scalar_resource(name: str) -> bool:
    """Extended (`nvidia.com/gpu`), hugepages and prefixed native resources, which the scheduler
    counts in whole units; unknown unprefixed names are ignored as the real scheduler does."""
    return "/" in name or name.startswith(("hugepages-", "attachable-volumes-"))


def resource_amount(name: str, value: Any) -> int:
    """A quantity in the scheduler's integer unit: millicores for CPU, whole units otherwise."""
    return quantity.milli(value) if name == "cpu" else quantity.units(value)


def container_requests(container: dict[str, Any], *, non_zero: bool = False) -> dict[str, int]:
    """A container's requests, each falling back to its limit (as API defaulting fills them);
    `non_zero` substitutes the scoring defaults for missing CPU and memory."""
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    result: dict[str, int] = {}
    for name, value in merged.items():
        if name in ("cpu", "memory", "ephemeral-storage") or is_scalar_resource(name):
            result[name] = resource_amount(name, value)
    if non_zero:
        result.setdefault("cpu", DEFAULT_MILLI_CPU)
        result.setdefault("memory", DEFAULT_MEMORY)
    return result


def _add(total: dict[str, int], extra: dict[str, int]) -> None:
    for name, value in extra.items():
        total[name] = total.get(name, 0) + value


def pod_requests(spec: dict[str, Any], *, non_zero: bool = False) -> dict[str, int]:
    """The pod's effective request: max(sum of containers plus sidecars, each init container on
    top of the sidecars started before it) plus overhead, with pod-level requests winning."""
    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        _add(total, container_requests(container, non_zero=non_zero))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for container in spec.get("initContainers") or []:
        requests = container_requests(container, non_zero=non_zero)
        if container.get("restartPolicy") == "Always":
            # A sidecar keeps running beside everything that starts after it.
            _add(total, requests)
            _add(sidecars, requests)
            continue
        running = dict(sidecars)
        _add(running, requests)
        for name, value in running.items():
            init_peak[name] = max(init_peak.get(name, 0), value)
    for name, value in init_peak.items():
        total[name] = max(total.get(name, 0), value)
    pod_level = (spec.get("resources") or {}).get("requests") or {}
    for name in ("cpu", "memory"):
        if name in pod_level:
            total[name] = resource_amount(name, pod_level[name])
    _add(
        total,
        {
            name: resource_amount(name, value)
            for name, value in (spec.get("overhead") or {}).items()
            if name in NATIVE_RESOURCES or is_scalar_resource(name)
        },
    )
    return {name: value for name, value in total.items() if value}


# Pods of a workload share their requests: the scheduler accounts both forms for every bound
# pod it sees, so they are kept per resource shape (~14 µs a pod before, most of it walking
# containers without any requests).
_REQUESTS_MEMO: dict[Hashable, tuple[dict[str, int], dict[str, int]]] = {}
_MEMO_LIMIT = 4096


def _resources_shape(container: dict[str, Any]) -> Hashable:
    resources = container.get("resources") or {}
    return (
        tuple((resources.get("limits") or {}).items()),
        tuple((resources.get("requests") or {}).items()),
        container.get("restartPolicy"),
    )


def pod_requests_and_non_zero(spec: dict[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
    """`pod_requests(spec)` and `pod_requests(spec, non_zero=True)` (fresh dicts), looked up
    by what they read: each container's limits, requests and restartPolicy, the pod-level
    requests and the overhead."""
    try:
        shape: Hashable = (
            tuple(_resources_shape(c) for c in spec.get("containers") or ()),
            tuple(_resources_shape(c) for c in spec.get("initContainers") or ()),
            tuple(((spec.get("resources") or {}).get("requests") or {}).items()),
            tuple((spec.get("overhead") or {}).items()),
        )
        found = _REQUESTS_MEMO.get(shape)
    except TypeError:  # a quantity that is not a scalar: nothing to share
        return pod_requests(spec), pod_requests(spec, non_zero=True)
    if found is None:
        if len(_REQUESTS_MEMO) >= _MEMO_LIMIT:
            _REQUESTS_MEMO.clear()
        found = _REQUESTS_MEMO[shape] = (pod_requests(spec), pod_requests(spec, non_zero=True))
    return dict(found[0]), dict(found[1])


def node_allocatable(node: dict[str, Any]) -> dict[str, int]:
    """A node's allocatable resources in the scheduler's integer units."""
    status = node.get("status") or {}
    source = status.get("allocatable") or status.get("capacity") or {}
    result: dict[str, int] = {}
    for name, value in source.items():
        if name in NATIVE_RESOURCES or is_scalar_resource(name):
            try:
                result[name] = resource_amount(name, value)
            except ValueError:
                continue
    return result


def host_ports(spec: dict[str, Any]) -> list[tuple[str, int, str]]:
    """(protocol, hostPort, hostIP) the pod claims on its node; hostNetwork pods claim their
    container ports (API defaulting copies containerPort to hostPort for them)."""
    result = []
    containers = list(spec.get("containers") or []) + [
        c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"
    ]
    for container in containers:
        for port in container.get("ports") or []:
            host_port = port.get("hostPort") or (
                port.get("containerPort") if spec.get("hostNetwork") else None
            )
            if not host_port:
                continue
            result.append(
                (port.get("protocol") or "TCP", int(host_port), port.get("hostIP") or "0.0.0.0")
            )
    return result


def untolerated_taint(
    taints: list[dict[str, Any]], tolerations: list[dict[str, Any]], effects: tuple[str, ...]
) -> dict[str, Any] | None:
    """The first taint with one of `effects` that no toleration tolerates."""
    for taint in taints:
        if taint.get("effect") not in effects:
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None
