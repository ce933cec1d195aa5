"""Object metadata and label selectors: the checks every kind gets, custom resources included."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kubesim.validation import field, syntax
from kubesim.validation.field import FieldError

ANNOTATIONS_LIMIT = 256 * 1024
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")

# How a kind's names are checked; everything else is an RFC 1123 subdomain.
_NAME_RULES: dict[str, Callable[[str], list[str]]] = {
    "Namespace": syntax.dns1123_label,
    "Service": syntax.dns1035_label,
    "Role": syntax.path_segment_name,
    "RoleBinding": syntax.path_segment_name,
    "ClusterRole": syntax.path_segment_name,
    "ClusterRoleBinding": syntax.path_segment_name,
}


def name_problems(kind: str, name: str) -> list[str]:
    """Why a name is not acceptable for a kind (empty when it is)."""
    rule = _NAME_RULES.get(kind, syntax.dns1123_subdomain)
    return rule(name)


def labels(values: Any, path: str) -> list[FieldError]:
    """Label keys must be qualified names and values label values."""
    problems: list[FieldError] = []
    if not isinstance(values, Mapping):
        return problems
    # Every write of a labelled object passes here: the usual valid label costs two calls.
    for key, value in values.items():
        bad = syntax.qualified_name(key)
        if bad:
            problems.extend(field.invalid(path, key, p) for p in bad)
        if isinstance(value, str):
            bad = syntax.label_value(value)
            if bad:
                problems.extend(field.invalid(path, value, p) for p in bad)
    return problems


def annotation_map(values: Any, path: str) -> list[FieldError]:
    """Annotation keys must be qualified names; all of them together at most 256 KiB."""
    problems: list[FieldError] = []
    if not isinstance(values, Mapping):
        return problems
    total = 0
    for key, value in values.items():
        bad = syntax.qualified_name(key.lower())
        if bad:
            problems.extend(field.invalid(path, key, p) for p in bad)
        total += len(key) + len(str(value).encode())
    if total > ANNOTATIONS_LIMIT:
        problems.append(field.too_long(path, ANNOTATIONS_LIMIT))
    return problems


def object_meta(kind: str, meta: Mapping[str, Any], path: str = "metadata") -> list[FieldError]:
    """Name, labels, annotations, owner references and finalizers of an object."""
    problems: list[FieldError] = []
    name = meta.get("name")
    if isinstance(name, str) and name:
        problems.extend(field.invalid(f"{path}.name", name, p) for p in name_problems(kind, name))
    problems.extend(labels(meta.get("labels"), f"{path}.labels"))
    problems.extend(annotation_map(meta.get("annotations"), f"{path}.annotations"))
    problems.extend(owner_references(meta.get("ownerReferences"), f"{path}.ownerReferences"))
    for index, finalizer in enumerate(meta.get("finalizers") or ()):
        problems.extend(
            field.invalid(f"{path}.finalizers[{index}]", finalizer, p)
            for p in syntax.qualified_name(finalizer)
        )
    return problems


def template_meta(meta: Mapping[str, Any] | None, path: str) -> list[FieldError]:
    """Labels and annotations of a pod template (its name and namespace are ignored)."""
    meta = meta or {}
    return labels(meta.get("labels"), f"{path}.labels") + annotation_map(
        meta.get("annotations"), f"{path}.annotations"
    )


def owner_references(refs: Any, path: str) -> list[FieldError]:
    """Each owner reference names its owner fully; at most one is the controller."""
    problems: list[FieldError] = []
    controllers = []
    for ref in refs or ():
        if not isinstance(ref, Mapping):
            continue
        for key, what in (
            ("apiVersion", "version"),
            ("kind", "kind"),
            ("name", "name"),
            ("uid", "uid"),
        ):
            if not ref.get(key):
                problems.append(field.invalid(f"{path}.{key}", "", f"{what} must not be empty"))
        if ref.get("controller"):
            controllers.append(f"{ref.get('kind')}/{ref.get('name')}")
    if len(controllers) > 1:
        problems.append(
            field.invalid(
                path,
                field.GoValue("[]v1.OwnerReference{...}"),
                'Only one reference can have Controller set to true. Found "true" in '
                f"references for {' and '.join(controllers)}",
            )
        )
    return problems


def label_selector(selector: Any, path: str) -> list[FieldError]:
    """matchLabels syntax and matchExpressions operators and values."""
    problems: list[FieldError] = []
    if not isinstance(selector, Mapping):
        return problems
    problems.extend(labels(selector.get("matchLabels"), f"{path}.matchLabels"))
    for index, expr in enumerate(selector.get("matchExpressions") or ()):
        where = f"{path}.matchExpressions[{index}]"
        operator = expr.get("operator", "")
        values = expr.get("values") or []
        if operator in ("In", "NotIn") and not values:
            problems.append(
                field.required(
                    f"{where}.values", "must be specified when `operator` is 'In' or 'NotIn'"
                )
            )
        elif operator in ("Exists", "DoesNotExist") and values:
            problems.append(
                field.forbidden(
                    f"{where}.values",
                    "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                )
            )
        elif operator not in SELECTOR_OPERATORS:
            problems.append(
                field.invalid(f"{where}.operator", operator, "not a valid selector operator")
            )
        key = expr.get("key", "")
        problems.extend(field.invalid(f"{where}.key", key, p) for p in syntax.qualified_name(key))
    return problems


def selector_empty(selector: Mapping[str, Any] | None) -> bool:
    """Whether a LabelSelector selects everything (no labels and no expressions)."""
    return not selector or (
        not selector.get("matchLabels") and not selector.get("matchExpressions")
    )


def selector_matches(selector: Mapping[str, Any], target: Mapping[str, str] | None) -> bool:
    """Whether a LabelSelector selects a label set."""
    target = target or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if target.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or ():
        key = expr.get("key", "")
        operator = expr.get("operator")
        values = expr.get("values") or []
        present = key in target
        if operator == "In" and (not present or target[key] not in values):
            return False
        if operator == "NotIn" and present and target[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True
