"""apiextensions.k8s.io/v1 CRDs generated from the models: structural schemas, no $ref."""

from __future__ import annotations

import inspect
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from gpu_operator.api import clusterpolicy, nvidiadriver
from gpu_operator.api.fields import TypeInfo, describe

_EXTRA_KEYS = ("format", "x-kubernetes-validations")
_AGE_COLUMN = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def _doc(model: type[BaseModel]) -> str | None:
    doc = inspect.getdoc(model)
    return " ".join(doc.split()) if doc else None


def _type_schema(info: TypeInfo) -> dict[str, Any]:
    if info.kind == "model":
        assert info.model is not None
        return model_schema(info.model)
    if info.kind == "list":
        assert info.item is not None
        return {"type": "array", "items": _type_schema(info.item)}
    if info.kind == "map":
        assert info.item is not None
        return {"type": "object", "additionalProperties": _type_schema(info.item)}
    if info.kind == "enum":
        return {"type": "string", "enum": list(info.enum)}
    if info.kind == "int-or-string":
        return {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
        }
    if info.kind == "quantity":
        return {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": info.constraints.get("pattern")
            or r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?"
            r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
            "x-kubernetes-int-or-string": True,
        }
    if info.kind == "free-form":
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    schema: dict[str, Any] = {"type": info.kind}
    if info.kind == "integer":
        schema["format"] = "int64"
    for key in ("minimum", "maximum", "pattern"):
        if key in info.constraints:
            schema[key] = info.constraints[key]
    return schema


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of one model (properties inlined, never $ref)."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, field in model.model_fields.items():
        wire = field.alias or name
        info = describe(field.annotation, list(field.metadata))
        schema = _type_schema(info)
        if field.description:
            schema = {"description": field.description, **schema}
        default = field.default
        has_default = default is not PydanticUndefined and default is not None
        if has_default:
            schema["default"] = default
        elif info.optional:
            schema["nullable"] = True
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        for key in _EXTRA_KEYS:
            if key in extra:
                schema[key] = extra[key]
        if field.is_required():
            required.append(wire)
        properties[wire] = schema
    model_extra = model.model_config.get("json_schema_extra")
    crd_required = model_extra.get("crd_required") if isinstance(model_extra, dict) else None
    for extra_wire in crd_required if isinstance(crd_required, list) else []:
        if isinstance(extra_wire, str) and extra_wire not in required:
            required.append(extra_wire)
    out: dict[str, Any] = {"type": "object"}
    doc = _doc(model)
    if doc:
        out["description"] = doc
    out["properties"] = properties
    if required:
        out["required"] = required
    return out


def _root_schema(model: type[BaseModel], spec_rules: list[dict[str, str]]) -> dict[str, Any]:
    root = model_schema(model)
    props = root["properties"]
    props["apiVersion"] = {"type": "string", "description": "Versioned schema of this object."}
    props["kind"] = {"type": "string", "description": "The REST resource this object represents."}
    props["metadata"] = {"type": "object"}
    if spec_rules:
        props["spec"]["x-kubernetes-validations"] = spec_rules
    root["required"] = [r for r in root.get("required", []) if r not in ("apiVersion", "kind")]
    return root


def _crd(
    *,
    group: str,
    version: str,
    kind: str,
    plural: str,
    model: type[BaseModel],
    short_names: list[str],
    columns: list[dict[str, str]],
    spec_rules: list[dict[str, str]],
) -> dict[str, Any]:
    names: dict[str, Any] = {
        "kind": kind,
        "listKind": f"{kind}List",
        "plural": plural,
        "singular": kind.lower(),
    }
    if short_names:
        names["shortNames"] = short_names
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": names,
            "scope": "Cluster",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": _root_schema(model, spec_rules)},
                    "subresources": {"status": {}},
                }
            ],
        },
    }


def clusterpolicy_crd() -> dict[str, Any]:
    return _crd(
        group=clusterpolicy.GROUP,
        version=clusterpolicy.VERSION,
        kind=clusterpolicy.KIND,
        plural=clusterpolicy.PLURAL,
        model=clusterpolicy.ClusterPolicy,
        short_names=[],
        columns=[
            {"name": "Status", "type": "string", "jsonPath": ".status.state"},
            _AGE_COLUMN,
        ],
        spec_rules=[],
    )


def nvidiadriver_crd() -> dict[str, Any]:
    return _crd(
        group=nvidiadriver.GROUP,
        version=nvidiadriver.VERSION,
        kind=nvidiadriver.KIND,
        plural=nvidiadriver.PLURAL,
        model=nvidiadriver.NVIDIADriver,
        short_names=["nvd", "nvdriver", "nvdrivers"],
        columns=[
            {"name": "Status", "type": "string", "jsonPath": ".status.state"},
            {"name": "Default", "type": "boolean", "jsonPath": ".spec.default"},
            _AGE_COLUMN,
        ],
        spec_rules=[nvidiadriver.DEFAULT_DRIVER_SELECTOR_RULE],
    )


def all_crds() -> dict[str, dict[str, Any]]:
    """Every CRD we own, keyed by upstream's file name."""
    return {
        "nvidia.com_clusterpolicies.yaml": clusterpolicy_crd(),
        "nvidia.com_nvidiadrivers.yaml": nvidiadriver_crd(),
    }
