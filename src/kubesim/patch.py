"""Patch types: JSON merge patch, JSON patch, strategic merge patch and server-side apply."""

from __future__ import annotations

import copy
import json
from typing import Any

from kubesim import errors, managed_fields
from kubesim.managed_fields import FieldSet, Path
from kubesim.resources import ResourceType

MERGE = "application/merge-patch+json"
JSON = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY_YAML = "application/apply-patch+yaml"
APPLY_CBOR = "application/apply-patch+cbor"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = merge_patch(target.get(key), value)
    return target


# ----- JSON patch (RFC 6902) ---------------------------------------------------------------------


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise errors.bad_request(f"invalid JSON pointer {path!r}")
    if path == "":
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _resolve(doc: Any, parts: list[str], path: str) -> Any:
    current = doc
    for part in parts:
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            raise errors.ApiError(
                422, f"the server rejected our request: path {path!r} does not exist"
            )
    return current


def _add(doc: Any, parts: list[str], value: Any, path: str) -> Any:
    if not parts:
        return value
    parent = _resolve(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise errors.ApiError(
                422, f"the server rejected our request: invalid index in {path!r}"
            )
    else:
        raise errors.ApiError(422, f"the server rejected our request: cannot add at {path!r}")
    return doc


def _remove(doc: Any, parts: list[str], path: str) -> Any:
    if not parts:
        raise errors.ApiError(422, "the server rejected our request: cannot remove the root")
    parent = _resolve(doc, parts[:-1], path)
    _resolve(parent, parts[-1:], path)
    return parent.pop(parts[-1] if isinstance(parent, dict) else int(parts[-1]))


def json_patch(doc: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch; a failing `test` or missing path is 422, a malformed patch 400."""
    if not isinstance(operations, list):
        raise errors.bad_request("a JSON patch must be a list of operations")
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise errors.bad_request(f"invalid JSON patch operation: {op!r}")
        kind = op["op"]
        path = op["path"]
        parts = _pointer(path)
        if kind in ("add", "replace", "test") and "value" not in op:
            raise errors.bad_request(f"JSON patch operation {kind!r} needs a value")
        if kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op["value"]), path)
        elif kind == "remove":
            _remove(doc, parts, path)
        elif kind == "replace":
            _resolve(doc, parts, path)
            if parts:
                _remove(doc, parts, path)
            doc = _add(doc, parts, copy.deepcopy(op["value"]), path)
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from"))
            value = _resolve(doc, source, str(op.get("from")))
            if kind == "move":
                _remove(doc, source, str(op.get("from")))
            doc = _add(doc, parts, copy.deepcopy(value), path)
        elif kind == "test":
            if _resolve(doc, parts, path) != op["value"]:
                raise errors.ApiError(
                    422, f"the server rejected our request: test failed at {path!r}"
                )
        else:
            raise errors.bad_request(f"unknown JSON patch operation {kind!r}")
    return doc


# ----- strategic merge patch ---------------------------------------------------------------------


def strategic_merge_patch(original: Any, patch: Any, name: str = "") -> Any:
    """Kubernetes strategic merge patch using the merge keys of the built-in types."""
    if not isinstance(patch, dict):
        if isinstance(patch, list):
            return _merge_list(original if isinstance(original, list) else [], patch, name)
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result: dict[str, Any] = dict(original) if isinstance(original, dict) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            drop = value if isinstance(value, list) else []
            result[field] = [v for v in result.get(field) or [] if v not in drop]
            continue
        if value is None:
            result.pop(key, None)
            continue
        merged = strategic_merge_patch(result.get(key), value, key)
        if merged is None:
            result.pop(key, None)
        else:
            result[key] = merged
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(original: list[Any], patch: list[Any], name: str) -> list[Any]:
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, dict) and "$patch" in i)]
    strategy, keys = managed_fields.list_strategy(name, patch or original, None)
    if strategy == "set":
        result = list(original)
        result.extend(copy.deepcopy(i) for i in patch if i not in result)
        return result
    if strategy != "map":
        return [copy.deepcopy(i) for i in patch]
    key = keys[0]
    result = [copy.deepcopy(i) for i in original]
    for item in patch:
        if not isinstance(item, dict):
            raise errors.bad_request(f"list {name!r} must hold objects with the merge key {key!r}")
        if key not in item:
            raise errors.bad_request(f"an item of {name!r} is missing its merge key {key!r}")
        index = next(
            (i for i, o in enumerate(result) if isinstance(o, dict) and o.get(key) == item[key]),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
            continue
        if index is None:
            result.append(strategic_merge_patch({}, item, ""))
        else:
            result[index] = strategic_merge_patch(result[index], item, "")
    return result


# ----- server-side apply -------------------------------------------------------------------------


def _apply_merge(current: Any, config: Any, name: str, schema: dict[str, Any] | None) -> Any:
    if isinstance(config, dict) and isinstance(current, dict):
        result = dict(current)
        for key, value in config.items():
            sub_schema = managed_fields.child_schema(schema, key)
            if key == "metadata" and schema is not None and name == "":
                sub_schema = None
            if value is None:
                result.pop(key, None)
            else:
                result[key] = _apply_merge(current.get(key), value, key, sub_schema)
        return result
    if isinstance(config, list) and isinstance(current, list):
        strategy, keys = managed_fields.list_strategy(name, config or current, schema)
        if strategy == "map":
            inner = managed_fields.items_schema(schema)
            result_list = list(current)
            for item in config:
                item_id = managed_fields.item_key(item, keys)
                index = next(
                    (
                        i
                        for i, o in enumerate(result_list)
                        if managed_fields.item_key(o, keys) == item_id
                    ),
                    None,
                )
                if index is None:
                    result_list.append(copy.deepcopy(item))
                else:
                    result_list[index] = _apply_merge(result_list[index], item, "", inner)
            return result_list
        if strategy == "set":
            return list(current) + [copy.deepcopy(i) for i in config if i not in current]
    return copy.deepcopy(config)


def _path_set(path: Path) -> FieldSet:
    result: FieldSet = {}
    for element in reversed(path):
        result = {element: result}
    return result


def server_side_apply(
    rt: ResourceType,
    current: dict[str, Any] | None,
    config: Any,
    *,
    manager: str,
    force: bool,
    subresource: str | None,
    stamp: str,
) -> dict[str, Any]:
    """Merge an applied configuration into the live object, tracking field ownership."""
    if not isinstance(config, dict):
        raise errors.bad_request("the applied configuration must be an object")
    if not config.get("apiVersion") or not config.get("kind"):
        raise errors.bad_request("apiVersion and kind must be set in an applied configuration")
    if not manager:
        raise errors.bad_request("fieldManager is required for apply requests")
    part = "status" if subresource == "status" else None
    applied = managed_fields.object_fields(config, rt.schema, part)
    base: dict[str, Any] = current if current is not None else {}
    entries = (base.get("metadata") or {}).get("managedFields") or []
    mine: dict[str, Any] | None = None
    others: list[dict[str, Any]] = []
    for entry in entries:
        if (
            entry.get("manager") == manager
            and entry.get("operation") == "Apply"
            and entry.get("subresource") == subresource
        ):
            mine = entry
        else:
            others.append(dict(entry))
    conflicts: list[tuple[dict[str, Any], Path]] = []
    for entry in others:
        for path in managed_fields.overlap(applied, entry.get("fieldsV1") or {}):
            if managed_fields.value_at(base, path) != managed_fields.value_at(config, path):
                conflicts.append((entry, path))
    if conflicts and not force:
        causes = [
            {
                "reason": "FieldManagerConflict",
                "message": f'conflict with "{e.get("manager")}"'
                + (f" using {e.get('apiVersion')}" if e.get("apiVersion") else ""),
                "field": managed_fields.path_string(p),
            }
            for e, p in conflicts
        ]
        lines = "\n".join(f"- {c['message']}: {c['field']}" for c in causes)
        plural = "conflict" if len(causes) == 1 else "conflicts"
        raise errors.ApiError(
            409,
            f"Apply failed with {len(causes)} {plural}: {lines}"
            if len(causes) > 1
            else f"Apply failed with 1 conflict: {causes[0]['message']}: {causes[0]['field']}",
            reason="Conflict",
            details={
                "name": (config.get("metadata") or {}).get("name", ""),
                "group": rt.group,
                "kind": rt.plural,
                "causes": causes,
            },
        )
    for entry, path in conflicts:
        entry["fieldsV1"] = managed_fields.subtract(entry.get("fieldsV1") or {}, _path_set(path))
    others = [e for e in others if e.get("fieldsV1")]
    owned_by_others: FieldSet = {}
    for entry in others:
        owned_by_others = managed_fields.union(owned_by_others, entry.get("fieldsV1") or {})
    result = copy.deepcopy(base) if current is not None else {}
    dropped = managed_fields.subtract((mine or {}).get("fieldsV1") or {}, applied)
    for path in managed_fields.leaves(dropped):
        if not any(managed_fields.overlap(_path_set(path), owned_by_others)):
            managed_fields.remove_at(result, path)
    body = {k: v for k, v in config.items() if (part == "status") == (k == "status")}
    body["apiVersion"] = config["apiVersion"]
    body["kind"] = config["kind"]
    meta_config = config.get("metadata") or {}
    body["metadata"] = {
        k: v for k, v in meta_config.items() if k not in ("managedFields", "resourceVersion")
    }
    result = _apply_merge(result, body, "", rt.schema)
    if "resourceVersion" in meta_config:
        result["metadata"]["resourceVersion"] = meta_config["resourceVersion"]
    elif current is not None:
        result["metadata"]["resourceVersion"] = base["metadata"].get("resourceVersion")
    new_entry: dict[str, Any] = {
        "manager": manager,
        "operation": "Apply",
        "apiVersion": config["apiVersion"],
        "time": stamp
        if (mine or {}).get("fieldsV1") != applied
        else (mine or {}).get("time", stamp),
        "fieldsType": "FieldsV1",
        "fieldsV1": applied,
    }
    if subresource:
        new_entry["subresource"] = subresource
    result["metadata"]["managedFields"] = [new_entry, *others] if applied else others
    if not isinstance(result, dict):
        raise errors.bad_request("the applied configuration must be an object")
    return result


def decode_body(body: bytes, content_type: str) -> Any:
    """Decode a request body as JSON, or as YAML for apply patches; malformed input is a 400."""
    if not body:
        raise errors.bad_request("the request body is empty")
    if "protobuf" in content_type or "cbor" in content_type:
        raise errors.ApiError(
            415,
            f"the body of the request was in an unknown format - accepted media types include: "
            f"application/json, application/yaml (kubesim does not decode {content_type})",
        )
    if content_type == APPLY_YAML or content_type.endswith("yaml"):
        import yaml

        try:
            return yaml.safe_load(body)
        except yaml.YAMLError as exc:
            raise errors.bad_request(f"error decoding YAML: {exc}") from exc
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.bad_request(f"error decoding JSON body: {exc}") from exc
