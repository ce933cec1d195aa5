"""Validation of the smaller kinds: PodDisruptionBudgets, Leases, RBAC and PriorityClasses."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubesim.validation import apps, field, meta
from kubesim.validation.field import FieldError

RBAC_GROUP = "rbac.authorization.k8s.io"
SUBJECT_KINDS = ("ServiceAccount", "User", "Group")
MAX_USER_PRIORITY = 1_000_000_000


def pod_disruption_budget(
    obj: Mapping[str, Any], old: Mapping[str, Any] | None
) -> list[FieldError]:
    """A PDB: minAvailable or maxUnavailable (not both), each an int or a percentage."""
    spec = obj.get("spec") or {}
    problems: list[FieldError] = []
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        problems.append(
            field.invalid(
                "spec",
                field.GoValue("policy.PodDisruptionBudgetSpec{...}"),
                "minAvailable and maxUnavailable cannot be both set",
            )
        )
    problems.extend(
        apps.int_or_percent(spec.get("minAvailable"), "spec.minAvailable", at_most_100=True)
    )
    problems.extend(
        apps.int_or_percent(spec.get("maxUnavailable"), "spec.maxUnavailable", at_most_100=True)
    )
    problems.extend(meta.label_selector(spec.get("selector"), "spec.selector"))
    policy = spec.get("unhealthyPodEvictionPolicy")
    if policy is not None and policy not in ("AlwaysAllow", "IfHealthyBudget"):
        problems.append(
            field.not_supported(
                "spec.unhealthyPodEvictionPolicy", policy, ("AlwaysAllow", "IfHealthyBudget")
            )
        )
    return problems


def lease(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """A Lease: a positive duration and non-negative transitions."""
    spec = obj.get("spec") or {}
    problems: list[FieldError] = []
    duration = spec.get("leaseDurationSeconds")
    if isinstance(duration, int) and duration <= 0:
        problems.append(
            field.invalid("spec.leaseDurationSeconds", duration, "must be greater than 0")
        )
    problems.extend(apps.non_negative(spec, "spec", "leaseTransitions"))
    return problems


def _rules(rules: Any, namespaced: bool) -> list[FieldError]:
    problems: list[FieldError] = []
    for index, rule in enumerate(rules or ()):
        if not isinstance(rule, Mapping):
            continue
        where = f"rules[{index}]"
        if not rule.get("verbs"):
            problems.append(
                field.required(f"{where}.verbs", "verbs must contain at least one value")
            )
        urls = rule.get("nonResourceURLs") or []
        if urls:
            if namespaced:
                problems.append(
                    field.invalid(
                        f"{where}.nonResourceURLs",
                        urls,
                        "namespaced rules cannot apply to non-resource URLs",
                    )
                )
            if rule.get("apiGroups") or rule.get("resources"):
                problems.append(
                    field.invalid(
                        f"{where}.nonResourceURLs",
                        urls,
                        "rules cannot apply to both regular resources and non-resource URLs",
                    )
                )
            continue
        if not rule.get("apiGroups"):
            problems.append(
                field.required(
                    f"{where}.apiGroups", "resource rules must supply at least one api group"
                )
            )
        if not rule.get("resources"):
            problems.append(
                field.required(
                    f"{where}.resources", "resource rules must supply at least one resource"
                )
            )
    return problems


def role(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """A Role's rules."""
    return _rules(obj.get("rules"), namespaced=True)


def cluster_role(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """A ClusterRole's rules (aggregated roles may have none)."""
    return _rules(obj.get("rules"), namespaced=False)


def _binding(
    obj: Mapping[str, Any], old: Mapping[str, Any] | None, kinds: tuple[str, ...]
) -> list[FieldError]:
    problems: list[FieldError] = []
    ref = obj.get("roleRef") or {}
    if ref.get("apiGroup") != RBAC_GROUP:
        problems.append(
            field.not_supported("roleRef.apiGroup", ref.get("apiGroup", ""), (RBAC_GROUP,))
        )
    if ref.get("kind") not in kinds:
        problems.append(field.not_supported("roleRef.kind", ref.get("kind", ""), kinds))
    if not ref.get("name"):
        problems.append(field.required("roleRef.name"))
    for index, subject in enumerate(obj.get("subjects") or ()):
        if not isinstance(subject, Mapping):
            continue
        where = f"subjects[{index}]"
        kind = subject.get("kind")
        if kind not in SUBJECT_KINDS:
            problems.append(field.not_supported(f"{where}.kind", kind or "", SUBJECT_KINDS))
        if not subject.get("name"):
            problems.append(field.required(f"{where}.name"))
        if kind == "ServiceAccount":
            if subject.get("apiGroup"):
                problems.append(
                    field.not_supported(f"{where}.apiGroup", subject["apiGroup"], ("",))
                )
            if not subject.get("namespace") and obj.get("kind") == "ClusterRoleBinding":
                problems.append(field.required(f"{where}.namespace"))
        elif kind in ("User", "Group") and subject.get("apiGroup") != RBAC_GROUP:
            problems.append(
                field.not_supported(f"{where}.apiGroup", subject.get("apiGroup", ""), (RBAC_GROUP,))
            )
    if old is not None and (old.get("roleRef") or {}) != ref:
        problems.append(
            field.invalid(
                "roleRef",
                field.GoValue(
                    f'rbac.RoleRef{{APIGroup:"{ref.get("apiGroup", "")}", '
                    f'Kind:"{ref.get("kind", "")}", Name:"{ref.get("name", "")}"}}'
                ),
                "cannot change roleRef",
            )
        )
    return problems


def role_binding(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """A RoleBinding: a Role or ClusterRole reference and well-formed subjects."""
    return _binding(obj, old, ("Role", "ClusterRole"))


def cluster_role_binding(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """A ClusterRoleBinding: a ClusterRole reference and well-formed subjects."""
    return _binding(obj, old, ("ClusterRole",))


def priority_class(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """A PriorityClass: user-defined values stay at or below one billion."""
    name = (obj.get("metadata") or {}).get("name", "")
    value = obj.get("value")
    problems: list[FieldError] = []
    if isinstance(value, int) and value > MAX_USER_PRIORITY and not name.startswith("system-"):
        problems.append(
            field.forbidden(
                "value", f"maximum allowed value of a user defined priority is {MAX_USER_PRIORITY}"
            )
        )
    policy = obj.get("preemptionPolicy")
    if policy is not None and policy not in ("Never", "PreemptLowerPriority"):
        problems.append(
            field.not_supported("preemptionPolicy", policy, ("Never", "PreemptLowerPriority"))
        )
    if old is not None and old.get("value") != value:
        problems.append(field.forbidden("value", "may not be changed in an update."))
    return problems


VALIDATORS = {
    "PodDisruptionBudget": pod_disruption_budget,
    "Lease": lease,
    "Role": role,
    "ClusterRole": cluster_role,
    "RoleBinding": role_binding,
    "ClusterRoleBinding": cluster_role_binding,
    "PriorityClass": priority_class,
}
