"""OpenAPI documents: `/openapi/v3` (an index plus one document per group-version) and
`/openapi/v2` (JSON, or gnostic protobuf as kubectl asks for it).

Both carry the schemas of every served kind: built-in kinds from `kubesim.builtin_schemas` with
everything they reference, custom resources from their CRD. kubectl uses them for `explain`,
for server-side field validation detection, and for the strategic-merge patches of client-side
`apply` (the schemas carry the merge keys). In v3 documents references point at
`#/components/schemas/`, and a reference with sibling keywords is wrapped in a one-element
`allOf`, as the real server writes it. Documents are built once per registry generation (CRDs
change it) and served from cached bytes.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Callable
from typing import Any

from kubesim import builtin_schemas, openapi_v2
from kubesim.resources import Registry, ResourceType

V3_REF = "#/components/schemas/"
_WRITE_PARAMS: list[dict[str, Any]] = [
    {"name": "dryRun", "in": "query", "schema": {"type": "string"}, "uniqueItems": True},
    {"name": "fieldManager", "in": "query", "schema": {"type": "string"}, "uniqueItems": True},
    {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}, "uniqueItems": True},
]
_INFO = {"title": "Kubernetes", "version": "v1.35.0"}
# The two types v3 documents describe with oneOf (v2 documents call both strings).
_V3_FORMS: dict[str, dict[str, Any]] = {
    builtin_schemas.INT_OR_STRING: {
        "format": "int-or-string",
        "oneOf": [{"type": "integer"}, {"type": "string"}],
    },
    builtin_schemas.QUANTITY: {"oneOf": [{"type": "string"}, {"type": "number"}]},
}


def _path_key(rt: ResourceType) -> str:
    return f"apis/{rt.group}/{rt.version}" if rt.group else "api/v1"


def _dumps(document: Any) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


class _Documents:
    """The documents of one registry generation, built on first use."""

    def __init__(self, registry: Registry) -> None:
        self.generation = registry.generation
        self.registry = weakref.ref(registry)
        self.v3: dict[str, bytes | None] = {}
        self.v2: dict[bool, bytes] = {}


_CACHE: dict[int, _Documents] = {}


def _documents(registry: Registry) -> _Documents:
    cached = _CACHE.get(id(registry))
    if (
        cached is None
        or cached.registry() is not registry
        or cached.generation != registry.generation
    ):
        cached = _CACHE[id(registry)] = _Documents(registry)
        weakref.finalize(registry, _CACHE.pop, id(registry), None)
    return cached


def index(registry: Registry) -> dict[str, Any]:
    """The `/openapi/v3` index of group-version documents (the hash changes with the registry)."""
    digest = hashlib.sha256(str(registry.generation).encode()).hexdigest()[:16].upper()
    keys = sorted({_path_key(rt) for rt in registry.all()})
    return {"paths": {k: {"serverRelativeURL": f"/openapi/v3/{k}?hash={digest}"} for k in keys}}


def group_version_bytes(registry: Registry, key: str) -> bytes | None:
    """The serialised v3 document of one group/version (`api/v1`, `apis/apps/v1`), or None."""
    docs = _documents(registry)
    if key not in docs.v3:
        document = group_version_document(registry, key)
        docs.v3[key] = _dumps(document) if document is not None else None
    return docs.v3[key]


def v2_bytes(registry: Registry, *, protobuf: bool) -> bytes:
    """The serialised `/openapi/v2` document, as JSON or as gnostic protobuf."""
    docs = _documents(registry)
    if protobuf not in docs.v2:
        document = v2_document(registry)
        docs.v2[protobuf] = openapi_v2.encode_document(document) if protobuf else _dumps(document)
    return docs.v2[protobuf]


def schema_name(rt: ResourceType) -> str:
    """The definition name of a served kind (the built-in one, or reversed-group for CRDs)."""
    if not rt.from_crd:
        name = builtin_schemas.definition_name(rt.group, rt.version, rt.kind)
        if name:
            return name
    group = ".".join(reversed(rt.group.split("."))) if rt.group else "io.k8s.api.core"
    return f"{group}.{rt.version}.{rt.kind}"


def _builtin_roots(types: list[ResourceType]) -> list[str]:
    roots = []
    for rt in types:
        if rt.from_crd:
            continue
        for kind in (rt.kind, rt.list_kind):
            name = builtin_schemas.definition_name(rt.group, rt.version, kind)
            if name:
                roots.append(name)
    return roots


def _crd_schema(rt: ResourceType) -> dict[str, Any]:
    body = dict(rt.schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True})
    body["x-kubernetes-group-version-kind"] = [
        {"group": rt.group, "version": rt.version, "kind": rt.kind}
    ]
    return body


def to_v3(schema: Any) -> Any:
    """A built-in (v2-shaped) schema with v3 references; refs with siblings go into `allOf`."""
    if isinstance(schema, list):
        return [to_v3(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str):
            result[key] = value.replace(builtin_schemas.REF_PREFIX, V3_REF)
        elif key == "properties" and isinstance(value, dict):
            result[key] = {name: to_v3(sub) for name, sub in value.items()}
        elif isinstance(value, dict | list) and not key.startswith("x-"):
            result[key] = to_v3(value)
        else:
            result[key] = value
    if "$ref" in result and len(result) > 1:
        ref = result.pop("$ref")
        result = {"allOf": [{"$ref": ref}], **result}
    return result


def _operation_factory(
    rt: ResourceType, gvk: dict[str, str], response: dict[str, Any]
) -> Callable[[str, list[dict[str, Any]]], dict[str, Any]]:
    def operation(action: str, params: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "operationId": f"{action}{rt.kind}",
            "parameters": params,
            "responses": response,
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
        }

    return operation


def group_version_document(registry: Registry, key: str) -> dict[str, Any] | None:
    """The OpenAPI v3 document of one group/version, or None if it is not served."""
    types = [rt for rt in registry.all() if _path_key(rt) == key]
    if not types:
        return None
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for rt in types:
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        ref = {"$ref": f"{V3_REF}{schema_name(rt)}"}
        response = {"200": {"description": "OK", "content": {"application/json": {"schema": ref}}}}
        operation = _operation_factory(rt, gvk, response)
        prefix = f"/{key}"
        scope = "/namespaces/{namespace}" if rt.namespaced else ""
        collection = f"{prefix}{scope}/{rt.plural}"
        paths[collection] = {
            "get": operation("list", []),
            "post": operation("post", _WRITE_PARAMS),
        }
        patch_params: list[dict[str, Any]] = [
            *_WRITE_PARAMS,
            {"name": "force", "in": "query", "schema": {"type": "boolean"}},
        ]
        item = {
            "get": operation("get", []),
            "put": operation("put", _WRITE_PARAMS),
            "patch": operation("patch", patch_params),
            "delete": operation("delete", []),
        }
        paths[f"{collection}/{{name}}"] = item
        if rt.status_subresource:
            paths[f"{collection}/{{name}}/status"] = dict(item)
        if rt.from_crd:
            schemas[schema_name(rt)] = _crd_schema(rt)
    definitions = builtin_schemas.definitions()
    for name in builtin_schemas.references(_builtin_roots(types)):
        schemas[name] = _V3_FORMS.get(name) or to_v3(definitions[name])
    return {
        "openapi": "3.0.0",
        "info": dict(_INFO),
        "paths": paths,
        "components": {"schemas": dict(sorted(schemas.items()))},
    }


def v2_document(registry: Registry) -> dict[str, Any]:
    """The swagger 2.0 document: the definitions of every served kind and what they reference."""
    types = registry.all()
    definitions_table = builtin_schemas.definitions()
    definitions: dict[str, Any] = {
        name: definitions_table[name] for name in builtin_schemas.references(_builtin_roots(types))
    }
    for rt in types:
        if rt.from_crd:
            definitions[schema_name(rt)] = _crd_schema(rt)
    return {
        "swagger": "2.0",
        "info": dict(_INFO),
        "paths": {},
        "definitions": dict(sorted(definitions.items())),
    }
