"""Field errors worded like the real server's (`spec.x: Invalid value: "v": detail`), and the 422.

The error types, their display names and the `Status` cause reasons are the API's own: Required
value (FieldValueRequired), Invalid value (FieldValueInvalid), Unsupported value
(FieldValueNotSupported), Duplicate value (FieldValueDuplicate), Forbidden (FieldValueForbidden),
Too long (FieldValueTooLong), Too many (FieldValueTooMany). Values are printed as the Go server
prints them: strings quoted, numbers and booleans bare, maps and structs in Go syntax.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubesim import errors

_NAMES = {
    "FieldValueRequired": "Required value",
    "FieldValueInvalid": "Invalid value",
    "FieldValueNotSupported": "Unsupported value",
    "FieldValueDuplicate": "Duplicate value",
    "FieldValueForbidden": "Forbidden",
    "FieldValueTooLong": "Too long",
    "FieldValueTooMany": "Too many",
    "FieldValueNotFound": "Not found",
}
# Types whose message carries no value, only the detail.
_VALUELESS = {"FieldValueRequired", "FieldValueForbidden", "FieldValueTooLong"}


class GoValue:
    """A value that prints as given (for the Go-syntax renderings of structs)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class FieldError:
    """One field error: its type (a cause reason), field path, offending value and detail."""

    reason: str
    field: str
    value: Any = None
    detail: str = ""

    def body(self) -> str:
        """The message without the field, as carried in `details.causes[].message`."""
        name = _NAMES[self.reason]
        text = name if self.reason in _VALUELESS else f"{name}: {go_repr(self.value)}"
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"


def required(field: str, detail: str = "") -> FieldError:
    """A missing value."""
    return FieldError("FieldValueRequired", field, "", detail)


def invalid(field: str, value: Any, detail: str) -> FieldError:
    """A malformed value."""
    return FieldError("FieldValueInvalid", field, value, detail)


def not_supported(field: str, value: Any, allowed: Iterable[str]) -> FieldError:
    """A value outside an enumeration."""
    quoted = ", ".join(json.dumps(v) for v in allowed)
    return FieldError("FieldValueNotSupported", field, value, f"supported values: {quoted}")


def duplicate(field: str, value: Any) -> FieldError:
    """A value that must be unique."""
    return FieldError("FieldValueDuplicate", field, value)


def not_found(field: str, value: Any) -> FieldError:
    """A value naming something that does not exist."""
    return FieldError("FieldValueNotFound", field, value)


def forbidden(field: str, detail: str) -> FieldError:
    """A value not allowed in this situation."""
    return FieldError("FieldValueForbidden", field, "", detail)


def too_long(field: str, limit: int) -> FieldError:
    """A value over a byte limit."""
    return FieldError("FieldValueTooLong", field, "", f"must have at most {limit} bytes")


def too_many(field: str, count: int, limit: int) -> FieldError:
    """A list with too many items."""
    return FieldError("FieldValueTooMany", field, count, f"must have at most {limit} items")


def go_repr(value: Any) -> str:
    """A value as the server's field errors print it."""
    if isinstance(value, GoValue):
        return value.text
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        if all(isinstance(v, str) for v in value.values()):
            entries = ", ".join(
                f"{json.dumps(k)}:{json.dumps(value[k])}" for k in sorted(value, key=str)
            )
            return f"map[string]string{{{entries}}}"
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "[]string{" + ", ".join(json.dumps(v) for v in value) + "}"
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def label_selector_repr(selector: Mapping[str, Any] | None) -> GoValue:
    """A LabelSelector in the Go syntax the server prints (`v1.LabelSelector{MatchLabels:...}`)."""
    selector = selector or {}
    labels = selector.get("matchLabels")
    labels_text = go_repr(labels) if labels else "map[string]string(nil)"
    expressions = selector.get("matchExpressions")
    if expressions:
        parts = []
        for expr in expressions:
            values = expr.get("values")
            values_text = go_repr(values) if values else "[]string(nil)"
            parts.append(
                f"v1.LabelSelectorRequirement{{Key:{json.dumps(expr.get('key', ''))}, "
                f"Operator:{json.dumps(expr.get('operator', ''))}, Values:{values_text}}}"
            )
        expressions_text = "[]v1.LabelSelectorRequirement{" + ", ".join(parts) + "}"
    else:
        expressions_text = "[]v1.LabelSelectorRequirement(nil)"
    return GoValue(
        f"v1.LabelSelector{{MatchLabels:{labels_text}, MatchExpressions:{expressions_text}}}"
    )


def qualified_kind(kind: str, group: str) -> str:
    """`Kind.group` as the server names a kind in messages (the core group adds nothing)."""
    return f"{kind}.{group}" if group else kind


def raise_invalid(kind: str, group: str, name: str, problems: list[FieldError]) -> None:
    """Raise the 422 `Invalid` Status for a non-empty error list (repeats folded, as upstream)."""
    unique: list[FieldError] = []
    seen: set[str] = set()
    for problem in problems:
        text = str(problem)
        if text not in seen:
            seen.add(text)
            unique.append(problem)
    if not unique:
        return
    texts = [str(p) for p in unique]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    # The real Status leaves out an empty name (options kinds such as ListOptions have none).
    details: dict[str, Any] = {"name": name, "kind": kind} if name else {"kind": kind}
    if group:
        details["group"] = group
    details["causes"] = [
        {"reason": p.reason, "message": p.body(), "field": p.field} for p in unique
    ]
    raise errors.ApiError(
        422,
        f'{qualified_kind(kind, group)} "{name}" is invalid: {joined}',
        reason="Invalid",
        details=details,
    )
