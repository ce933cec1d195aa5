"""Validation of workloads that own pods through a selector: Deployments, ReplicaSets,
DaemonSets, StatefulSets (apps/v1) and ReplicationControllers (core/v1)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kubesim.validation import core, field, meta
from kubesim.validation.field import FieldError

_PERCENT = re.compile(r"^[0-9]+%$")
PERCENT_MESSAGE = (
    "a valid percent string must be a numeric string followed by an ending '%' "
    "(e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')"
)
STATEFULSET_UPDATABLE = (
    "replicas",
    "ordinals",
    "template",
    "updateStrategy",
    "persistentVolumeClaimRetentionPolicy",
    "minReadySeconds",
)


def non_negative(spec: Mapping[str, Any], path: str, *names: str) -> list[FieldError]:
    """Integer fields that must be >= 0."""
    problems = []
    for name in names:
        value = spec.get(name)
        if isinstance(value, int) and value < 0:
            problems.append(
                field.invalid(f"{path}.{name}", value, "must be greater than or equal to 0")
            )
    return problems


def int_or_percent(value: Any, path: str, *, at_most_100: bool = False) -> list[FieldError]:
    """An int-or-string that must be a non-negative integer or a percentage."""
    if value is None:
        return []
    if isinstance(value, int):
        if value < 0:
            return [field.invalid(path, value, "must be greater than or equal to 0")]
        return []
    if not _PERCENT.match(str(value)):
        return [field.invalid(path, value, PERCENT_MESSAGE)]
    if at_most_100 and int(str(value)[:-1]) > 100:
        return [field.invalid(path, value, "must not be greater than 100%")]
    return []


def _is_zero(value: Any) -> bool:
    return value in (0, "0%")


def selector_and_template(
    spec: Mapping[str, Any], what: str, restart_policies: tuple[str, ...]
) -> list[FieldError]:
    """A LabelSelector that is present, not empty, and selects the template's labels."""
    problems: list[FieldError] = []
    selector = spec.get("selector")
    template = spec.get("template")
    if selector is None:
        problems.append(field.required("spec.selector"))
    else:
        problems.extend(meta.label_selector(selector, "spec.selector"))
        if meta.selector_empty(selector):
            problems.append(
                field.invalid(
                    "spec.selector",
                    field.label_selector_repr(selector),
                    f"empty selector is invalid for {what}",
                )
            )
    if isinstance(template, Mapping):
        labels = (template.get("metadata") or {}).get("labels") or {}
        if (
            selector is not None
            and not meta.selector_empty(selector)
            and not meta.selector_matches(selector, labels)
        ):
            problems.append(
                field.invalid(
                    "spec.template.metadata.labels",
                    labels,
                    "`selector` does not match template `labels`",
                )
            )
    problems.extend(core.pod_template_spec(template, "spec.template", restart_policies))
    if isinstance(template, Mapping) and (template.get("spec") or {}).get("activeDeadlineSeconds"):
        problems.append(
            field.forbidden(
                "spec.template.spec.activeDeadlineSeconds",
                f"activeDeadlineSeconds in {what_kind(what)} is not Supported",
            )
        )
    return problems


def what_kind(what: str) -> str:
    """The kind name used in a few messages."""
    return {"deployment": "ReplicaSet", "daemonset": "DaemonSet", "statefulset": "StatefulSet"}[
        what
    ]


def immutable_selector(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """spec.selector may not change after create."""
    if old is None:
        return []
    new_selector = (obj.get("spec") or {}).get("selector")
    old_selector = (old.get("spec") or {}).get("selector")
    if new_selector != old_selector:
        return [
            field.invalid(
                "spec.selector", field.label_selector_repr(new_selector), "field is immutable"
            )
        ]
    return []


def _rolling(rolling: Mapping[str, Any], path: str) -> list[FieldError]:
    problems = int_or_percent(
        rolling.get("maxUnavailable"), f"{path}.maxUnavailable", at_most_100=True
    )
    problems.extend(int_or_percent(rolling.get("maxSurge"), f"{path}.maxSurge"))
    if _is_zero(rolling.get("maxUnavailable")) and _is_zero(rolling.get("maxSurge")):
        problems.append(
            field.invalid(
                f"{path}.maxUnavailable",
                rolling.get("maxUnavailable"),
                "may not be 0 when `maxSurge` is 0",
            )
        )
    return problems


def deployment(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """A Deployment."""
    spec = obj.get("spec") or {}
    problems = non_negative(
        spec,
        "spec",
        "replicas",
        "revisionHistoryLimit",
        "minReadySeconds",
        "progressDeadlineSeconds",
    )
    problems.extend(selector_and_template(spec, "deployment", ("Always",)))
    strategy = spec.get("strategy") or {}
    kind = strategy.get("type")
    if kind is not None and kind not in ("Recreate", "RollingUpdate"):
        problems.append(
            field.not_supported("spec.strategy.type", kind, ("Recreate", "RollingUpdate"))
        )
    rolling = strategy.get("rollingUpdate")
    if kind == "Recreate" and rolling is not None:
        problems.append(
            field.forbidden(
                "spec.strategy.rollingUpdate",
                "may not be specified when strategy `type` is 'Recreate'",
            )
        )
    elif isinstance(rolling, Mapping):
        problems.extend(_rolling(rolling, "spec.strategy.rollingUpdate"))
    deadline = spec.get("progressDeadlineSeconds")
    ready = spec.get("minReadySeconds") or 0
    if isinstance(deadline, int) and deadline <= ready:
        problems.append(
            field.invalid(
                "spec.progressDeadlineSeconds", deadline, "must be greater than minReadySeconds"
            )
        )
    problems.extend(immutable_selector(obj, old))
    return problems


def replica_set(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """A ReplicaSet (the server's message names deployments for an empty selector)."""
    spec = obj.get("spec") or {}
    problems = non_negative(spec, "spec", "replicas", "minReadySeconds")
    problems.extend(selector_and_template(spec, "deployment", ("Always",)))
    problems.extend(immutable_selector(obj, old))
    return problems


def daemon_set(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """A DaemonSet."""
    spec = obj.get("spec") or {}
    problems = non_negative(spec, "spec", "minReadySeconds", "revisionHistoryLimit")
    problems.extend(selector_and_template(spec, "daemonset", ("Always",)))
    strategy = spec.get("updateStrategy") or {}
    kind = strategy.get("type")
    if kind is not None and kind not in ("OnDelete", "RollingUpdate"):
        problems.append(
            field.not_supported("spec.updateStrategy.type", kind, ("OnDelete", "RollingUpdate"))
        )
    rolling = strategy.get("rollingUpdate")
    if kind == "RollingUpdate" and isinstance(rolling, Mapping):
        problems.extend(_rolling(rolling, "spec.updateStrategy.rollingUpdate"))
    problems.extend(immutable_selector(obj, old))
    return problems


def stateful_set(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """A StatefulSet; after create only a few spec fields may change."""
    spec = obj.get("spec") or {}
    problems = non_negative(spec, "spec", "replicas", "minReadySeconds", "revisionHistoryLimit")
    problems.extend(selector_and_template(spec, "statefulset", ("Always",)))
    policy = spec.get("podManagementPolicy")
    if policy is not None and policy not in ("OrderedReady", "Parallel"):
        problems.append(
            field.not_supported("spec.podManagementPolicy", policy, ("OrderedReady", "Parallel"))
        )
    strategy = spec.get("updateStrategy") or {}
    kind = strategy.get("type")
    if kind is not None and kind not in ("OnDelete", "RollingUpdate"):
        problems.append(
            field.not_supported("spec.updateStrategy.type", kind, ("OnDelete", "RollingUpdate"))
        )
    rolling = strategy.get("rollingUpdate")
    if isinstance(rolling, Mapping):
        problems.extend(non_negative(rolling, "spec.updateStrategy.rollingUpdate", "partition"))
    retention = spec.get("persistentVolumeClaimRetentionPolicy") or {}
    for key in ("whenDeleted", "whenScaled"):
        value = retention.get(key)
        if value is not None and value not in ("Retain", "Delete"):
            problems.append(
                field.not_supported(
                    f"spec.persistentVolumeClaimRetentionPolicy.{key}", value, ("Retain", "Delete")
                )
            )
    if old is not None:
        old_spec = dict(old.get("spec") or {})
        new_spec = dict(spec)
        for key in STATEFULSET_UPDATABLE:
            old_spec.pop(key, None)
            new_spec.pop(key, None)
        if old_spec != new_spec:
            problems.append(
                field.forbidden(
                    "spec",
                    "updates to statefulset spec for fields other than 'replicas', 'ordinals', "
                    "'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and "
                    "'minReadySeconds' are forbidden",
                )
            )
    return problems


def replication_controller(
    obj: Mapping[str, Any], old: Mapping[str, Any] | None
) -> list[FieldError]:
    """A ReplicationController: a map selector that selects its template."""
    spec = obj.get("spec") or {}
    problems = non_negative(spec, "spec", "replicas", "minReadySeconds")
    selector = spec.get("selector") or {}
    problems.extend(meta.labels(selector, "spec.selector"))
    if not selector:
        problems.append(field.required("spec.selector"))
    template = spec.get("template")
    if isinstance(template, Mapping):
        labels = (template.get("metadata") or {}).get("labels") or {}
        if selector and any(labels.get(k) != v for k, v in selector.items()):
            problems.append(
                field.invalid(
                    "spec.template.metadata.labels",
                    labels,
                    "`selector` does not match template `labels`",
                )
            )
        problems.extend(core.pod_template_spec(template, "spec.template", ("Always",)))
    return problems


VALIDATORS = {
    "Deployment": deployment,
    "ReplicaSet": replica_set,
    "DaemonSet": daemon_set,
    "StatefulSet": stateful_set,
    "ReplicationController": replication_controller,
}
