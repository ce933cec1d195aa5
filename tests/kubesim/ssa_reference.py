"""A slow, literal model of structured-merge-diff's Apply and Update, for checking kubesim.ssa.

Field sets here are plain Python sets of path tuples (members only), and every step is done the
way the library describes it: prune removes the applier's last set, adds back what any manager
owns, then adds back what the applier never owned; conflicts are the other managers' fields the
change modifies or adds. Only kubesim.ssa.merge is shared (the merged order is tested separately
against the library's own examples).
"""

from __future__ import annotations

import json
from typing import Any

from kubesim import managed_fields as mf
from kubesim import ssa, typed
from kubesim.typed import Shape

PathSet = set[tuple[str, ...]]
MISSING: Any = object()


def _pe(item: Any, shape: Shape, items: list[Any]) -> str:
    if shape.list_type == typed.SET:
        return "v:" + json.dumps(item, separators=(",", ":"))
    keys, defaults = shape.list_keys(items)
    key = {k: item[k] if k in item else defaults[k] for k in sorted(keys)}
    return "k:" + json.dumps(key, separators=(",", ":"))


def _granular(value: Any, shape: Shape) -> bool:
    return ssa._mode(value, shape) != ssa.LEAF


def to_set(value: Any, shape: Shape, path: tuple[str, ...] = ()) -> PathSet:
    """ToFieldSet: scalars, atomics, list items, map entries, null and empty-map fields."""
    out: PathSet = set()
    if not _granular(value, shape):
        if path:
            out.add(path)
        return out
    if isinstance(value, dict):
        for name, sub in value.items():
            child = (*path, "f:" + name)
            out |= to_set(sub, shape.field(name), child)
            if sub is None or sub == {} or not shape.declares(name):
                out.add(child)
        return out
    for item in value:
        child = (*path, _pe(item, shape, value))
        out |= to_set(item, shape.elem(), child)
        out.add(child)
    return out


def _shape_at(root: Shape, path: tuple[str, ...]) -> tuple[Shape, bool]:
    """The shape at a path and whether its last element is a named field."""
    shape = root
    named = False
    for element in path:
        if element.startswith("f:"):
            named = shape.declares(element[2:])
            shape = shape.field(element[2:])
        else:
            named = False
            shape = shape.elem()
    return shape, named


def ensure_named(paths: PathSet, root: Shape) -> PathSet:
    """Add every named field that has members below it."""
    out = set(paths)
    for path in paths:
        for end in range(1, len(path)):
            prefix = path[:end]
            if prefix[-1].startswith("f:") and _shape_at(root, prefix)[1]:
                out.add(prefix)
    return out


def remove(value: Any, paths: PathSet, shape: Shape, path: tuple[str, ...] = ()) -> Any:
    """RemoveItems: drop members of `paths`, descend where paths continue; emptied maps and
    lists become null."""
    if not _granular(value, shape) or not value:
        return value
    below = {p for p in paths if len(p) > len(path) and p[: len(path)] == path}
    if not below:
        return value
    if isinstance(value, dict):
        out = {}
        for name, sub in value.items():
            child = (*path, "f:" + name)
            if child in paths:
                continue
            out[name] = remove(sub, paths, shape.field(name), child)
        return out or None
    items = []
    for item in value:
        child = (*path, _pe(item, shape, value))
        if child in paths:
            continue
        items.append(remove(item, paths, shape.elem(), child))
    return items or None


def compare(old: Any, new: Any, shape: Shape) -> tuple[PathSet, PathSet, PathSet]:
    """(added, modified, removed) as the library's comparison walks two values."""
    added: PathSet = set()
    modified: PathSet = set()
    removed: PathSet = set()

    def walk(left_value: Any, right_value: Any, shape: Shape, path: tuple[str, ...]) -> None:
        # A null next to a container reads as an empty one of that container's kind.
        if (
            left_value is None
            and right_value is not MISSING
            and right_value is not None
            and _granular(right_value, shape)
        ):
            l_null, left_value = True, type(right_value)()
        else:
            l_null = False
        if (
            right_value is None
            and left_value is not MISSING
            and _granular(left_value, shape)
            and not l_null
        ):
            right_value = type(left_value)()
        left_empty = left_value is MISSING or left_value is None or left_value in ({}, [])
        right_empty = right_value is MISSING or right_value is None or right_value in ({}, [])
        granular = (left_value is MISSING or _granular(left_value, shape)) and (
            right_value is MISSING or _granular(right_value, shape)
        )
        if (
            left_value is not MISSING
            and right_value is not MISSING
            and type(left_value) is not type(right_value)
        ):
            granular = False
        if not granular or (left_empty and right_empty):
            if left_value is MISSING:
                added.add(path)
            elif right_value is MISSING:
                removed.add(path)
            elif left_value != right_value:
                modified.add(path)
            return
        if isinstance(left_value if left_value is not MISSING else right_value, dict):
            left = left_value if left_value is not MISSING else {}
            right = right_value if right_value is not MISSING else {}
            for name in {**left, **right}:
                walk(left.get(name, MISSING), right.get(name, MISSING), shape.field(name),
                     (*path, "f:" + name))  # fmt: skip
        else:
            left_items = {
                _pe(i, shape, left_value): i
                for i in (left_value if left_value is not MISSING else [])
            }
            right_items = {
                _pe(i, shape, right_value): i
                for i in (right_value if right_value is not MISSING else [])
            }
            for pe in {**left_items, **right_items}:
                walk(left_items.get(pe, MISSING), right_items.get(pe, MISSING), shape.elem(),
                     (*path, pe))  # fmt: skip
        if path and left_value is MISSING:
            added.add(path)
        elif path and right_value is MISSING:
            removed.add(path)

    walk(old, new, shape, ())
    return added, modified, removed


STRIP: PathSet = {
    ("f:apiVersion",),
    ("f:kind",),
    ("f:metadata",),
    *(
        ("f:metadata", "f:" + name)
        for name in (
            "name", "namespace", "creationTimestamp", "selfLink", "uid", "clusterName",
            "generation", "managedFields", "resourceVersion",
        )
    ),
}  # fmt: skip


class Conflict(Exception):
    """The apply conflicts; `paths` maps managers to the conflicting paths."""

    def __init__(self, paths: dict[str, PathSet]) -> None:
        super().__init__(paths)
        self.paths = paths


def apply(
    live: dict[str, Any],
    config: dict[str, Any],
    shape: Shape,
    managers: dict[str, PathSet],
    manager: str,
    force: bool,
) -> tuple[dict[str, Any], dict[str, PathSet]]:
    """The library's Updater.Apply, then the server's stripping of identity fields."""
    managers = dict(managers)
    merged = ssa.merge(live, config, shape, ssa._Walk())
    last = managers.get(manager)
    managers[manager] = to_set(config, shape)
    if last:
        merged = _prune(merged, managers, last, shape)
    merged, managers = _update(live, merged, shape, managers, manager, force)
    return merged, {m: s - STRIP for m, s in managers.items() if s - STRIP}


def _prune(
    merged: dict[str, Any], managers: dict[str, PathSet], last: PathSet, shape: Shape
) -> dict[str, Any]:
    named_last = ensure_named(last, shape)
    pruned = remove(merged, named_last, shape) or {}
    owned = ensure_named(set().union(*managers.values()), shape)
    merged_set = ensure_named(to_set(merged, shape), shape)
    pruned_set = ensure_named(to_set(pruned, shape), shape)
    pruned = remove(merged, merged_set - (pruned_set | owned), shape) or {}
    pruned_set = ensure_named(to_set(pruned, shape), shape)
    return remove(merged, (merged_set - pruned_set) & named_last, shape) or {}  # type: ignore[no-any-return]


def _update(
    live: dict[str, Any],
    new: dict[str, Any],
    shape: Shape,
    managers: dict[str, PathSet],
    manager: str,
    force: bool,
) -> tuple[dict[str, Any], dict[str, PathSet]]:
    added, modified, removed = compare(live, new, shape)
    conflicts = {
        m: s & (modified | added)
        for m, s in managers.items()
        if m != manager and s & (added | modified)
    }
    if conflicts and not force:
        raise Conflict(conflicts)
    result = {}
    for m, s in managers.items():
        if m != manager:
            s = s - conflicts.get(m, set()) - removed
        if s:
            result[m] = s
    return new, result


def update(
    live: dict[str, Any],
    new: dict[str, Any],
    shape: Shape,
    managers: dict[str, PathSet],
    manager: str,
) -> dict[str, PathSet]:
    """The library's Update for manager `manager` (which keeps what it had)."""
    added, modified, removed = compare(live, new, shape)
    result = {}
    for m, s in managers.items():
        s = s - modified - added - removed
        if m == manager:
            s |= (modified | added) - STRIP
        if s:
            result[m] = s
    if manager not in managers and (modified | added) - STRIP:
        result[manager] = (modified | added) - STRIP
    return result


def paths_of(fields: dict[str, Any]) -> PathSet:
    """A FieldsV1 set as path tuples."""
    return set(mf.iterate(fields))


def normalized(value: Any) -> Any:
    """Nulls and emptied lists dropped, as the stored object has them."""
    if isinstance(value, dict):
        return {k: normalized(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [normalized(v) for v in value if v is not None]
    return value
