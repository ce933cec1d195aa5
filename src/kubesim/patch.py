"""Patch types: JSON merge patch, JSON patch, strategic merge patch and server-side apply."""

from __future__ import annotations

import contextlib
import copy
import json
from typing import Any

from kubesim import errors, managed_fields, request_limits, ssa
from kubesim.protobuf import negotiation
from kubesim.resources import ResourceType
from kubesim.validation import duplicates

MERGE = "application/merge-patch+json"
JSON = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY_YAML = "application/apply-patch+yaml"
APPLY_CBOR = "application/apply-patch+cbor"
PROTOBUF = "application/vnd.kubernetes.protobuf"


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
    limit = request_limits.MAX_JSON_PATCH_OPERATIONS
    if len(operations) > limit:
        raise request_limits.too_large(
            f"The allowed maximum operations in a JSON patch is {limit}, got {len(operations)}"
        )
    copied = 0
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
            if kind == "copy":
                # Copies can double a document per operation; the server bounds what they add.
                copied += len(json.dumps(value, separators=(",", ":")))
                if copied > request_limits.MAX_JSON_PATCH_COPY_BYTES:
                    raise errors.ApiError(
                        422,
                        "the server rejected our request: Unable to complete the copy, the "
                        f"accumulated size increase of copy is {copied}, exceeding the limit "
                        f"{request_limits.MAX_JSON_PATCH_COPY_BYTES}",
                    )
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
    if request_limits.nesting_depth(doc) > request_limits.MAX_DEPTH:
        raise errors.ApiError(
            422, "the server rejected our request: the patched document exceeded max depth"
        )
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
        present = {_identity(i) for i in result}
        for item in patch:
            if _identity(item) not in present:
                present.add(_identity(item))
                result.append(copy.deepcopy(item))
        return result
    if strategy != "map":
        return [copy.deepcopy(i) for i in patch]
    key = keys[0]
    result = [copy.deepcopy(i) for i in original]
    # Items indexed by merge key once (the first of duplicates, as a scan would find it).
    index: dict[str, int] = {}
    for at, existing in enumerate(result):
        if isinstance(existing, dict) and key in existing:
            index.setdefault(_identity(existing[key]), at)
    removed: set[int] = set()
    for item in patch:
        if not isinstance(item, dict):
            raise errors.bad_request(f"list {name!r} must hold objects with the merge key {key!r}")
        if key not in item:
            raise errors.bad_request(f"an item of {name!r} is missing its merge key {key!r}")
        wanted = _identity(item[key])
        position = index.get(wanted)
        if item.get("$patch") == "delete":
            if position is not None:
                removed.add(position)
                del index[wanted]
            continue
        if position is None:
            index[wanted] = len(result)
            result.append(strategic_merge_patch({}, item, ""))
        else:
            result[position] = strategic_merge_patch(result[position], item, "")
    return [item for i, item in enumerate(result) if i not in removed] if removed else result


def _identity(value: Any) -> str:
    """A hashable stand-in for a JSON value (merge keys and set members may be anything)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# ----- server-side apply -------------------------------------------------------------------------


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
    result = ssa.apply(
        current,
        config,
        crd_schema=rt.schema if rt.from_crd else None,
        manager=manager,
        force=force,
        subresource=subresource,
        status_split=rt.status_subresource,
        stamp=stamp,
    )
    meta_config = config.get("metadata") if isinstance(config.get("metadata"), dict) else {}
    # A resourceVersion in the configuration is a precondition, checked when storing.
    if isinstance(meta_config, dict) and "resourceVersion" in meta_config:
        result["metadata"]["resourceVersion"] = meta_config["resourceVersion"]
    elif current is not None:
        result["metadata"]["resourceVersion"] = current["metadata"].get("resourceVersion")
    else:
        result["metadata"].pop("resourceVersion", None)
        if not result["metadata"].get("managedFields"):
            result["metadata"].pop("managedFields", None)
    return result


def decode_body(body: bytes, content_type: str) -> Any:
    """Decode a request body as JSON, YAML (apply patches) or Kubernetes protobuf (objects and
    options of built-in kinds); malformed input is a 400, an undecodable kind a 415."""
    if not body:
        raise errors.bad_request("the request body is empty")
    if content_type == PROTOBUF:
        return negotiation.decode_body(body)
    if "protobuf" in content_type or "cbor" in content_type:
        raise errors.ApiError(
            415,
            f"the body of the request was in an unknown format - accepted media types include: "
            f"application/json, application/yaml (kubesim does not decode {content_type})",
        )
    # The loaders record duplicated keys for fieldValidation (kubesim.validation.duplicates).
    if content_type == APPLY_YAML or content_type.endswith("yaml"):
        import yaml

        if body.lstrip()[:1] == b"{":
            # kubectl and lightkube send apply configurations as JSON, which is YAML too; the
            # JSON decoder takes milliseconds where the pure-Python YAML one takes seconds.
            with contextlib.suppress(ValueError, UnicodeDecodeError):
                return duplicates.loads_json(body)
        try:
            return duplicates.loads_yaml(body)
        except yaml.YAMLError as exc:
            raise errors.bad_request(f"error decoding YAML: {exc}") from exc
    try:
        return duplicates.loads_json(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.bad_request(f"error decoding JSON body: {exc}") from exc
