"""A checker for the apiextensions.k8s.io/v1 structural-schema rules our CRDs must follow."""

from __future__ import annotations

from typing import Any

_JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
_FORBIDDEN_IN_JUNCTOR = ("description", "type", "default", "additionalProperties", "nullable")
_TYPES = ("object", "array", "string", "integer", "number", "boolean")


def _matches_type(value: Any, type_name: str) -> bool:
    checks: dict[str, Any] = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
    }
    return bool(checks[type_name](value))


def _junctor_problems(schema: dict[str, Any], path: str, int_or_string: bool) -> list[str]:
    problems = []
    for junctor in _JUNCTORS:
        if junctor not in schema:
            continue
        branches = schema[junctor] if junctor != "not" else [schema[junctor]]
        for i, branch in enumerate(branches):
            where = f"{path}.{junctor}[{i}]"
            for key in _FORBIDDEN_IN_JUNCTOR:
                allowed = int_or_string and key == "type" and junctor == "anyOf"
                if key in branch and not allowed:
                    problems.append(f"{where}: {key} is not allowed inside {junctor}")
            for prop in branch.get("properties", {}):
                if prop not in schema.get("properties", {}):
                    problems.append(f"{where}: property {prop} must also be declared outside")
    return problems


def check(schema: dict[str, Any], path: str = "openAPIV3Schema", *, root: bool = True) -> list[str]:
    """Return every structural-schema violation in a schema, each prefixed with its path."""
    problems: list[str] = []
    if "$ref" in schema:
        problems.append(f"{path}: $ref is not allowed")
    int_or_string = schema.get("x-kubernetes-int-or-string") is True
    preserve = schema.get("x-kubernetes-preserve-unknown-fields")
    if preserve is not None and preserve is not True:
        problems.append(f"{path}: x-kubernetes-preserve-unknown-fields must be true when set")
    type_name = schema.get("type")
    if int_or_string:
        if type_name is not None:
            problems.append(f"{path}: x-kubernetes-int-or-string must not set a type")
    elif not type_name and preserve is not True:
        problems.append(f"{path}: type must be set")
    elif type_name and type_name not in _TYPES:
        problems.append(f"{path}: unknown type {type_name!r}")
    if "properties" in schema and "additionalProperties" in schema:
        problems.append(f"{path}: properties and additionalProperties are mutually exclusive")
    if schema.get("uniqueItems") is True:
        problems.append(f"{path}: uniqueItems must not be true")
    if type_name == "array" and not isinstance(schema.get("items"), dict):
        problems.append(f"{path}: an array needs exactly one items schema")
    if isinstance(type_name, str) and type_name in _TYPES:
        if "default" in schema and not _matches_type(schema["default"], type_name):
            problems.append(f"{path}: default {schema['default']!r} is not of type {type_name}")
        for value in schema.get("enum", []):
            if not _matches_type(value, type_name):
                problems.append(f"{path}: enum value {value!r} is not of type {type_name}")
    for key in schema.get("required", []):
        if key not in schema.get("properties", {}):
            problems.append(f"{path}: required property {key} is not declared")
    problems.extend(_junctor_problems(schema, path, int_or_string))
    for name, sub in schema.get("properties", {}).items():
        sub_path = f"{path}.properties.{name}"
        if root and name == "metadata":
            extra = set(sub) - {"type", "properties", "description"}
            if extra or set(sub.get("properties", {})) - {"name", "generateName"}:
                problems.append(f"{sub_path}: only name and generateName may be restricted")
        problems.extend(check(sub, sub_path, root=False))
    if isinstance(schema.get("items"), dict):
        problems.extend(check(schema["items"], f"{path}.items", root=False))
    if isinstance(schema.get("additionalProperties"), dict):
        problems.extend(
            check(schema["additionalProperties"], f"{path}.additionalProperties", root=False)
        )
    return problems
