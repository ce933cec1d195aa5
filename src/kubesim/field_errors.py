"""Field validation errors worded like apimachinery's `field.Error`, and the 422 they make."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kubesim import errors

_LABELS = {
    "FieldValueForbidden": "Forbidden",
    "FieldValueRequired": "Required value",
    "FieldValueInvalid": "Invalid value",
    "FieldValueNotSupported": "Unsupported value",
    "FieldValueDuplicate": "Duplicate value",
    "FieldValueNotFound": "Not found",
}


def _go_value(value: Any) -> str:
    """A value as Go's `%#v`-like rendering in field errors: strings quoted, numbers bare."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class FieldError:
    """One invalid field: its path, the error type and the detail text."""

    field: str
    type: str
    detail: str = ""
    value: Any = None
    has_value: bool = False

    @classmethod
    def forbidden(cls, field: str, detail: str) -> FieldError:
        """The field may not be set (or changed) this way."""
        return cls(field, "FieldValueForbidden", detail)

    @classmethod
    def required(cls, field: str, detail: str = "") -> FieldError:
        """The field must be set."""
        return cls(field, "FieldValueRequired", detail)

    @classmethod
    def invalid_value(cls, field: str, value: Any, detail: str) -> FieldError:
        """The field has a value that breaks a rule."""
        return cls(field, "FieldValueInvalid", detail, value, True)

    @classmethod
    def not_supported(cls, field: str, value: Any, supported: Sequence[str]) -> FieldError:
        """The field's value is not one of the allowed ones."""
        listed = ", ".join(json.dumps(s) for s in supported)
        return cls(field, "FieldValueNotSupported", f"supported values: {listed}", value, True)

    @classmethod
    def duplicate(cls, field: str, value: Any) -> FieldError:
        """The value repeats one that must be unique."""
        return cls(field, "FieldValueDuplicate", "", value, True)

    @classmethod
    def not_found(cls, field: str, value: Any) -> FieldError:
        """The value refers to something that does not exist."""
        return cls(field, "FieldValueNotFound", "", value, True)

    def body(self) -> str:
        """The text after the field path (what Status causes carry as `message`)."""
        text = _LABELS.get(self.type, self.type)
        if self.has_value:
            text += f": {_go_value(self.value)}"
        if self.detail:
            text += f": {self.detail}"
        return text

    def __str__(self) -> str:
        # Like Go's field.Error, an empty path still gets its separator (": Forbidden: ...").
        return f"{self.field}: {self.body()}"


def invalid(kind: str, group: str, name: str, problems: Sequence[FieldError]) -> errors.ApiError:
    """A 422 Invalid Status as `errors.NewInvalid` builds it (several errors are bracketed)."""
    qualified = f"{kind}.{group}" if group else kind
    texts = [str(p) for p in problems]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    details: dict[str, Any] = {"kind": kind}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    details["causes"] = [
        {"reason": p.type, "message": p.body(), "field": p.field} for p in problems
    ]
    return errors.ApiError(
        422,
        f"{qualified} {json.dumps(name)} is invalid: {joined}",
        reason="Invalid",
        details=details,
    )
