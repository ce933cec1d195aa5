"""Structural-schema admission for custom resources: pruning unknown fields and type validation."""

from __future__ import annotations

import contextvars
from typing import Any

from kubesim import errors
from kubesim.resources import ResourceType

# Set per request by the server: "Strict" turns pruned fields into errors, as the real server does.
FIELD_VALIDATION: contextvars.ContextVar[str] = contextvars.ContextVar(
    "field_validation", default="Warn"
)
# Unknown fields pruned by the last admission, reported to clients as warnings.
PRUNED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("pruned", default=None)
# Paths of keys that appeared twice in the request body (the last one wins, as on the server).
DUPLICATES: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "duplicates", default=None
)

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


def admit(rt: ResourceType, obj: dict[str, Any]) -> None:
    """Prune fields the schema does not know and reject values of the wrong shape (422)."""
    root = rt.schema or {}
    causes: list[tuple[str, str]] = []
    pruned: list[str] = []
    properties = root.get("properties") or {}
    if not root.get("x-kubernetes-preserve-unknown-fields"):
        for key in list(obj):
            if key in ("apiVersion", "kind", "metadata"):
                continue
            if key not in properties:
                pruned.append(key)
                del obj[key]
    for key, sub_schema in properties.items():
        if key in obj and key not in ("apiVersion", "kind", "metadata"):
            obj[key] = _walk(obj[key], sub_schema, key, causes, pruned)
    for field in root.get("required") or []:
        if field not in obj:
            causes.append((field, "Required value"))
    mode = FIELD_VALIDATION.get()
    duplicates = DUPLICATES.get() or []
    if (pruned or duplicates) and mode == "Strict":
        unknown = ", ".join(
            [f'duplicate field "{d}"' for d in duplicates]
            + [f'unknown field "{p}"' for p in pruned]
        )
        raise errors.bad_request(
            f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
            f"strict decoding error: {unknown}"
        )
    sink = PRUNED.get()
    if sink is not None and mode == "Warn":
        sink.extend(pruned)
    if causes:
        name = (obj.get("metadata") or {}).get("name", "")
        raise errors.invalid(rt.kind, rt.group, name, causes)


def _walk(
    value: Any,
    schema: dict[str, Any],
    path: str,
    causes: list[tuple[str, str]],
    pruned: list[str],
) -> Any:
    if not schema:
        return value
    if value is None:
        if not schema.get("nullable"):
            # The real server drops nulls for non-nullable fields rather than failing.
            return None
        return value
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, int | str) or isinstance(value, bool):
            causes.append((path, f"Invalid value: {type(value).__name__}: must be int or string"))
        return value
    expected = schema.get("type")
    if expected in _TYPES:
        valid = isinstance(value, _TYPES[expected]) and not (
            isinstance(value, bool) and expected in ("integer", "number")
        )
        if expected == "integer" and isinstance(value, float) and value.is_integer():
            value, valid = int(value), True
        if not valid:
            causes.append((path, f'Invalid value: "{type(value).__name__}": must be {expected}'))
            return value
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(repr(v) for v in schema["enum"])
        causes.append((path, f"Unsupported value: {value!r}: supported values: {allowed}"))
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            causes.append((path, f"Invalid value: {value}: must be >= {schema['minimum']}"))
        if "maximum" in schema and value > schema["maximum"]:
            causes.append((path, f"Invalid value: {value}: must be <= {schema['maximum']}"))
    if isinstance(value, dict):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields")
        if properties is not None or extra is not None:
            for key in list(value):
                sub = (properties or {}).get(key)
                if sub is None and isinstance(extra, dict):
                    sub = extra
                if sub is None:
                    if not preserve and extra is not True:
                        pruned.append(f"{path}.{key}")
                        del value[key]
                    continue
                value[key] = _walk(value[key], sub, f"{path}.{key}", causes, pruned)
        elif (
            not preserve
            and expected == "object"
            and not schema.get("x-kubernetes-embedded-resource")
        ):
            for key in list(value):
                pruned.append(f"{path}.{key}")
                del value[key]
        for field in schema.get("required") or []:
            if field not in value:
                causes.append((f"{path}.{field}", "Required value"))
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            value[:] = [
                _walk(v, items, f"{path}[{i}]", causes, pruned) for i, v in enumerate(value)
            ]
    return value
