"""OpenAPI v3 discovery: enough for kubectl to detect server-side field validation and apply."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from kubesim.resources import Registry, ResourceType

_WRITE_PARAMS: list[dict[str, Any]] = [
    {"name": "dryRun", "in": "query", "schema": {"type": "string"}, "uniqueItems": True},
    {"name": "fieldManager", "in": "query", "schema": {"type": "string"}, "uniqueItems": True},
    {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}, "uniqueItems": True},
]


def _path_key(rt: ResourceType) -> str:
    return f"apis/{rt.group}/{rt.version}" if rt.group else "api/v1"


def index(registry: Registry) -> dict[str, Any]:
    """The `/openapi/v3` index of group-version documents."""
    digest = hashlib.sha256(str(registry.generation).encode()).hexdigest()[:16].upper()
    keys = sorted({_path_key(rt) for rt in registry.all()})
    return {"paths": {k: {"serverRelativeURL": f"/openapi/v3/{k}?hash={digest}"} for k in keys}}


def _schema_name(rt: ResourceType) -> str:
    group = ".".join(reversed(rt.group.split("."))) if rt.group else "io.k8s.api.core"
    return f"{group}.{rt.version}.{rt.kind}"


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
    """The OpenAPI document of one group/version, or None if it is not served."""
    types = [rt for rt in registry.all() if _path_key(rt) == key]
    if not types:
        return None
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for rt in types:
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        ref = {"$ref": f"#/components/schemas/{_schema_name(rt)}"}
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
            body = dict(
                rt.schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            )
            body["x-kubernetes-group-version-kind"] = [gvk]
            schemas[_schema_name(rt)] = body
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "kubesim"},
        "paths": paths,
        "components": {"schemas": schemas},
    }
