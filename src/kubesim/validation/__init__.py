"""Admission of built-in kinds as the real API server does it: decode, then validate.

`decode` runs first on every create/update body: type errors are a 400 worded like the server's
Go decoder, unknown fields are dropped and reported per `fieldValidation` (warnings for Warn, a
400 strict decoding error for Strict, silence for Ignore), duplicate JSON keys likewise. `validate`
runs after defaulting: field errors become one 422 `Invalid` Status with `details.causes`.
Custom resources get the metadata part of both (their bodies are the CRD schema's business).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kubesim import builtin_schemas, errors, schema
from kubesim.resources import ResourceType
from kubesim.validation import apps, batch, core, field, meta, other, resource
from kubesim.validation.decode import decode_metadata, decode_object
from kubesim.validation.field import FieldError

Validator = Callable[[Mapping[str, Any], Mapping[str, Any] | None], list[FieldError]]
VALIDATORS: dict[str, Validator] = {
    **core.VALIDATORS,
    **apps.VALIDATORS,
    **batch.VALIDATORS,
    **other.VALIDATORS,
    **resource.VALIDATORS,
}


def definition(rt: ResourceType) -> str | None:
    """The built-in definition of a served built-in kind, or None (custom resources)."""
    if rt.from_crd:
        return None
    return builtin_schemas.definition_name(rt.group, rt.version, rt.kind)


def cannot_handle(rt: ResourceType, reason: str) -> errors.ApiError:
    """The 400 the server answers when a body does not decode into the kind."""
    return errors.bad_request(
        f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: {reason}'
    )


def decode(rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None = None) -> None:
    """Type-check a body in place (400 on the first mismatch), drop and report unknown fields.

    `old` is the stored version an update replaces: parts equal to it are not decoded again.
    """
    name = definition(rt)
    decoder = decode_object(obj, name, old) if name is not None else decode_metadata(obj, old)
    if decoder.error:
        raise cannot_handle(rt, decoder.error)
    report_strict(rt, decoder.unknown)


def report_strict(rt: ResourceType, unknown: list[str]) -> None:
    """Apply the request's fieldValidation to unknown fields and duplicate keys."""
    mode = schema.FIELD_VALIDATION.get()
    duplicates = schema.DUPLICATES.get() or []
    if mode == "Strict" and (unknown or duplicates):
        problems = [f'duplicate field "{d}"' for d in duplicates]
        problems += [f'unknown field "{u}"' for u in unknown]
        raise cannot_handle(rt, "strict decoding error: " + ", ".join(problems))
    sink = schema.PRUNED.get()
    if sink is not None and mode == "Warn":
        sink.extend(unknown)


def validate(rt: ResourceType, obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> None:
    """Raise the 422 the server gives for an object that breaks its kind's rules."""
    metadata = obj.get("metadata") or {}
    problems = meta.object_meta(rt.kind, metadata)
    if not rt.from_crd:
        validator = VALIDATORS.get(rt.kind)
        if validator is not None:
            problems.extend(validator(obj, old))
    field.raise_invalid(rt.kind, rt.group, metadata.get("name", ""), problems)


def validate_name(rt: ResourceType, name: str) -> None:
    """Raise the 422 for a name the kind does not accept."""
    problems = [field.invalid("metadata.name", name, p) for p in meta.name_problems(rt.kind, name)]
    field.raise_invalid(rt.kind, rt.group, name, problems)
