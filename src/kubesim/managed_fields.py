"""Field sets in the `FieldsV1` format and the ownership bookkeeping of `managedFields`.

A field set is a nested dict keyed by `f:<field>`, `k:<merge-key json>` (list item by key),
`v:<json>` (set member) and `.` (the list item itself); an empty dict is an owned leaf.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

FieldSet = dict[str, Any]
Path = tuple[str, ...]

# Built-in lists merged by key (the `patchMergeKey` of the real types); everything else is atomic.
MERGE_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "volumeDevices": ("devicePath",),
    "imagePullSecrets": ("name",),
    "conditions": ("type",),
    "addresses": ("type",),
    "ownerReferences": ("uid",),
    "hostAliases": ("ip",),
    "topologySpreadConstraints": ("topologyKey",),
    "ports": ("containerPort", "port"),
}
# Primitive lists merged as sets.
SET_LISTS = {"finalizers"}
_METADATA_FIELDS = ("labels", "annotations", "finalizers", "ownerReferences")


def list_strategy(
    name: str, items: list[Any], schema: dict[str, Any] | None
) -> tuple[str, tuple[str, ...]]:
    """How a list merges: ("map", keys), ("set", ()) or ("atomic", ())."""
    if schema is not None:
        list_type = schema.get("x-kubernetes-list-type")
        if list_type == "map":
            return ("map", tuple(schema.get("x-kubernetes-list-map-keys") or ()))
        if list_type == "set":
            return ("set", ())
        return ("atomic", ())
    if name in SET_LISTS:
        return ("set", ())
    candidates = MERGE_KEYS.get(name)
    if not candidates:
        return ("atomic", ())
    dicts = [i for i in items if isinstance(i, dict)]
    for key in candidates:
        if dicts and all(key in i for i in dicts):
            return ("map", (key,))
    return ("map", (candidates[0],))


def child_schema(schema: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
    """The schema of a property; `{}` (no knowledge, atomic lists) inside CRD-described objects."""
    if schema is None:
        return None
    props = schema.get("properties") or {}
    if name in props:
        return dict(props[name])
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        return extra
    return {}


def items_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """The schema of list items."""
    if schema is None:
        return None
    items = schema.get("items")
    return dict(items) if isinstance(items, dict) else {}


def item_key(item: Any, keys: tuple[str, ...]) -> str:
    """The `k:` path element of a keyed list item."""
    if not isinstance(item, dict):
        return "v:" + json.dumps(item, separators=(",", ":"))
    return "k:" + json.dumps({k: item.get(k) for k in keys}, separators=(",", ":"), sort_keys=True)


def set_key(item: Any) -> str:
    """The `v:` path element of a set member."""
    return "v:" + json.dumps(item, separators=(",", ":"))


def top_schema(schema: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    """Schema for a top-level field; metadata always follows the built-in rules."""
    if key == "metadata":
        return None
    return child_schema(schema, key)


def fields_of(value: Any, name: str = "", schema: dict[str, Any] | None = None) -> FieldSet:
    """The field set an object (or applied configuration) specifies."""
    if isinstance(value, dict):
        result: FieldSet = {}
        for key, sub in value.items():
            result["f:" + key] = fields_of(sub, key, child_schema(schema, key))
        return result
    if isinstance(value, list) and value:
        strategy, keys = list_strategy(name, value, schema)
        if strategy == "map":
            inner = items_schema(schema)
            return {item_key(i, keys): {".": {}, **fields_of(i, "", inner)} for i in value}
        if strategy == "set":
            return {set_key(i): {} for i in value}
    return {}


def object_fields(obj: dict[str, Any], schema: dict[str, Any] | None, part: str | None) -> FieldSet:
    """The field set of a whole object: selected metadata plus spec-like fields, or only status."""
    result: FieldSet = {}
    for key, value in obj.items():
        if key in ("apiVersion", "kind"):
            continue
        if key == "metadata":
            meta = {k: value[k] for k in _METADATA_FIELDS if isinstance(value, dict) and k in value}
            if meta and part != "status":
                result["f:metadata"] = fields_of(meta, "metadata", None)
            continue
        if (part == "status") != (key == "status"):
            continue
        result["f:" + key] = fields_of(value, key, top_schema(schema, key))
    return result


def diff(
    old: Any, new: Any, name: str = "", schema: dict[str, Any] | None = None
) -> tuple[FieldSet, FieldSet]:
    """Fields set or changed in `new`, and fields present only in `old`."""
    if isinstance(old, dict) and isinstance(new, dict):
        changed: FieldSet = {}
        removed: FieldSet = {}
        for key, value in new.items():
            if key not in old:
                changed["f:" + key] = fields_of(value, key, child_schema(schema, key))
            elif old[key] != value:
                c, r = diff(old[key], value, key, child_schema(schema, key))
                changed["f:" + key] = c
                if r:
                    removed["f:" + key] = r
        for key in old:
            if key not in new:
                removed["f:" + key] = {}
        return changed, removed
    if isinstance(old, list) and isinstance(new, list) and new:
        strategy, keys = list_strategy(name, new, schema)
        if strategy == "map":
            inner = items_schema(schema)
            old_items = {item_key(i, keys): i for i in old}
            changed = {}
            removed = {}
            new_keys = set()
            for item in new:
                key = item_key(item, keys)
                new_keys.add(key)
                if key not in old_items:
                    changed[key] = {".": {}, **fields_of(item, "", inner)}
                elif old_items[key] != item:
                    c, r = diff(old_items[key], item, "", inner)
                    changed[key] = c
                    if r:
                        removed[key] = r
            for key in old_items:
                if key not in new_keys:
                    removed[key] = {}
            return changed, removed
        if strategy == "set":
            old_set = {set_key(i) for i in old}
            new_set = {set_key(i) for i in new}
            return {k: {} for k in new_set - old_set}, {k: {} for k in old_set - new_set}
    return {}, {}


def union(a: FieldSet, b: FieldSet) -> FieldSet:
    """Fields in either set."""
    result = dict(a)
    for key, sub in b.items():
        if key in result and result[key] and sub:
            result[key] = union(result[key], sub)
        elif key not in result or not sub:
            # A leaf owns the whole subtree, so it absorbs any finer-grained entry.
            result[key] = {} if (key in result and not result[key]) or not sub else sub
    return result


def subtract(a: FieldSet, b: FieldSet) -> FieldSet:
    """Fields of `a` not in `b`; empty intermediate entries are dropped."""
    result: FieldSet = {}
    for key, sub in a.items():
        if key not in b:
            result[key] = sub
            continue
        other = b[key]
        if not other or not sub:
            continue
        rest = subtract(sub, other)
        if rest:
            result[key] = rest
    return result


def overlap(a: FieldSet, b: FieldSet, prefix: Path = ()) -> Iterator[Path]:
    """Paths owned by both sets (a leaf on either side overlaps the other's subtree)."""
    for key, sub in a.items():
        if key == "." or key not in b:
            continue
        other = b[key]
        if not sub or not other:
            yield (*prefix, key)
        else:
            yield from overlap(sub, other, (*prefix, key))


def leaves(fs: FieldSet, prefix: Path = ()) -> Iterator[Path]:
    """Every leaf path."""
    for key, sub in fs.items():
        if key == ".":
            continue
        if sub and set(sub) != {"."}:
            yield from leaves(sub, (*prefix, key))
        else:
            yield (*prefix, key)


_MISSING = object()


def value_at(obj: Any, path: Path) -> Any:
    """The value at a field-set path, or a sentinel when absent."""
    current = obj
    for element in path:
        kind, _, text = element.partition(":")
        if kind == "f" and isinstance(current, dict):
            if text not in current:
                return _MISSING
            current = current[text]
        elif kind in ("k", "v") and isinstance(current, list):
            wanted = json.loads(text)
            current = next((i for i in current if _item_matches(i, kind, wanted)), _MISSING)
            if current is _MISSING:
                return _MISSING
        else:
            return _MISSING
    return current


def _item_matches(item: Any, kind: str, wanted: Any) -> bool:
    if kind == "v":
        return bool(item == wanted)
    return isinstance(item, dict) and all(item.get(k) == v for k, v in wanted.items())


def remove_at(obj: Any, path: Path) -> None:
    """Delete the field or list item at a path, if present."""
    if not path:
        return
    parent = value_at(obj, path[:-1])
    kind, _, text = path[-1].partition(":")
    if kind == "f" and isinstance(parent, dict):
        parent.pop(text, None)
    elif kind in ("k", "v") and isinstance(parent, list):
        wanted = json.loads(text)
        parent[:] = [i for i in parent if not _item_matches(i, kind, wanted)]


def path_string(path: Path) -> str:
    """A human-readable path such as `.spec.containers[name="x"].image`."""
    out = []
    for element in path:
        kind, _, text = element.partition(":")
        if kind == "f":
            out.append("." + text)
        elif kind == "k":
            pairs = ",".join(f"{k}={json.dumps(v)}" for k, v in json.loads(text).items())
            out.append(f"[{pairs}]")
        else:
            out.append(f"[={text}]")
    return "".join(out)


def record_update(
    obj: dict[str, Any],
    old: dict[str, Any] | None,
    manager: str,
    api_version: str,
    schema: dict[str, Any] | None,
    subresource: str | None,
    now: str,
) -> None:
    """Give `manager` (operation Update) the fields it changed, taking them from other managers."""
    meta = obj.setdefault("metadata", {})
    entries: list[dict[str, Any]] = list(
        (old or {}).get("metadata", {}).get("managedFields") or meta.get("managedFields") or []
    )
    part = "status" if subresource == "status" else None
    if old is None:
        changed = object_fields(obj, schema, part)
        removed: FieldSet = {}
    else:
        old_view = {k: v for k, v in old.items() if k != "metadata"}
        new_view = {k: v for k, v in obj.items() if k != "metadata"}
        old_meta = {k: v for k, v in (old.get("metadata") or {}).items() if k in _METADATA_FIELDS}
        new_meta = {k: v for k, v in meta.items() if k in _METADATA_FIELDS}
        old_view["metadata"], new_view["metadata"] = old_meta, new_meta
        changed, removed = diff(old_view, new_view, "", schema)
        changed = {k: v for k, v in changed.items() if k not in ("f:apiVersion", "f:kind")}
    if not changed and not removed:
        meta["managedFields"] = entries
        if not entries:
            meta.pop("managedFields")
        return
    result: list[dict[str, Any]] = []
    mine: dict[str, Any] | None = None
    for entry in entries:
        fields = entry.get("fieldsV1") or {}
        same = (
            entry.get("manager") == manager
            and entry.get("operation") == "Update"
            and entry.get("subresource") == subresource
        )
        if same:
            mine = entry
            continue
        remaining = subtract(subtract(fields, changed), removed)
        if remaining != fields:
            entry = {**entry, "fieldsV1": remaining}
        if remaining:
            result.append(entry)
    mine_fields = subtract((mine or {}).get("fieldsV1") or {}, removed)
    mine_fields = union(mine_fields, changed)
    if mine_fields:
        new_entry: dict[str, Any] = {
            "manager": manager,
            "operation": "Update",
            "apiVersion": api_version,
            "time": now,
            "fieldsType": "FieldsV1",
            "fieldsV1": mine_fields,
        }
        if subresource:
            new_entry["subresource"] = subresource
        result.append(new_entry)
    meta["managedFields"] = result
