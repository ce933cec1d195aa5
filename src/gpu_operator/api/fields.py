"""Introspection of model field types, shared by the CRD generator and the manifest checker."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from gpu_operator.api.base import IntOrStringMarker, PreserveUnknownMarker, QuantityMarker


@dataclass(frozen=True)
class TypeInfo:
    """What a field holds, reduced to the shapes an OpenAPI schema can express."""

    kind: Literal[
        "model",
        "list",
        "map",
        "string",
        "integer",
        "boolean",
        "enum",
        "int-or-string",
        "quantity",
        "free-form",
    ]
    optional: bool = False
    model: type[BaseModel] | None = None
    item: TypeInfo | None = None
    enum: tuple[str, ...] = ()
    constraints: dict[str, Any] = field(default_factory=dict)


def _constraints(metadata: list[Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            found["minimum"] = item.ge
        elif isinstance(item, annotated_types.Le):
            found["maximum"] = item.le
        elif isinstance(item, FieldInfo):
            found.update(_constraints(list(item.metadata)))
        elif type(item).__name__ == "_PydanticGeneralMetadata" and hasattr(item, "pattern"):
            found["pattern"] = item.pattern
    return found


def describe(annotation: Any, metadata: list[Any] | None = None) -> TypeInfo:
    """Reduce a field annotation (with its metadata) to a TypeInfo."""
    metadata = list(metadata or [])
    optional = False
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation, *extra = typing.get_args(annotation)
            metadata.extend(extra)
            continue
        if origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) < len(typing.get_args(annotation)):
                optional = True
            if len(args) == 1:
                annotation = args[0]
                continue
        break
    constraints = _constraints(metadata)
    if any(isinstance(m, IntOrStringMarker) for m in metadata):
        return TypeInfo("int-or-string", optional, constraints=constraints)
    if any(isinstance(m, QuantityMarker) for m in metadata):
        return TypeInfo("quantity", optional, constraints=constraints)
    if any(isinstance(m, PreserveUnknownMarker) for m in metadata):
        return TypeInfo("free-form", optional)
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return TypeInfo("enum", optional, enum=tuple(str(v) for v in typing.get_args(annotation)))
    if origin is list:
        (item,) = typing.get_args(annotation)
        return TypeInfo("list", optional, item=describe(item), constraints=constraints)
    if origin is dict:
        _, value = typing.get_args(annotation)
        if value is Any:
            return TypeInfo("free-form", optional)
        return TypeInfo("map", optional, item=describe(value))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return TypeInfo("model", optional, model=annotation)
    scalar = {str: "string", int: "integer", bool: "boolean"}.get(annotation)
    if scalar is None:
        raise TypeError(f"no schema shape for annotation {annotation!r}")
    return TypeInfo(scalar, optional, constraints=constraints)  # type: ignore[arg-type]


def field_info(model: type[BaseModel], name: str) -> TypeInfo:
    """The TypeInfo of one field of a model."""
    info = model.model_fields[name]
    return describe(info.annotation, list(info.metadata))


def wire_names(model: type[BaseModel]) -> dict[str, str]:
    """Map each field's name as written in manifests to its Python attribute name."""
    return {(info.alias or name): name for name, info in model.model_fields.items()}
