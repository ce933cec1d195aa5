"""Field sets in the `FieldsV1` format, the set algebra of structured-merge-diff, and the wire form
of `metadata.managedFields`.

A field set is a nested dict keyed by path elements: `f:<field>`, `k:<key json>` (a keyed list
item), `v:<json>` (a set member) and `i:<index>`; inside an element, `.` marks the element itself
as a member, and an empty dict is a member without children. Sets are never mutated once built:
operations return their inputs (or shared subtrees) when nothing changes, so they cost time in
proportion to the smaller operand rather than deep copies.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from typing import Any

from kubesim.typed import MERGE_KEYS, SET_LISTS

FieldSet = dict[str, Any]
Path = tuple[str, ...]

__all__ = [
    "MERGE_KEYS",
    "SET_LISTS",
    "FieldSet",
    "Path",
    "canonical",
    "difference",
    "has_children",
    "intersection",
    "is_member",
    "iterate",
    "list_strategy",
    "path_string",
    "union",
]

SELF = "."


def is_member(node: Mapping[str, Any] | None) -> bool:
    """Whether a node (the value under a path element) marks its element as a member."""
    return node is not None and (not node or SELF in node)


def has_children(node: Mapping[str, Any] | None) -> bool:
    """Whether a node has members below it."""
    return node is not None and len(node) > (1 if SELF in node else 0)


def _member(node: Mapping[str, Any], root: bool) -> bool:
    return not root and (not node or SELF in node)


def _shape_node(result: FieldSet, member: bool, root: bool) -> FieldSet | None:
    """Fix up the `.` marker of a rebuilt node; None when nothing is left of it."""
    if root:
        result.pop(SELF, None)
        return result
    if not any(k != SELF for k in result):
        return {} if member else None
    if member:
        result[SELF] = {}
    else:
        result.pop(SELF, None)
    return result


def union(a: FieldSet, b: FieldSet) -> FieldSet:
    """Paths in either set (both are whole sets: the root itself is never a member)."""
    return _union(a, b, True)


def _union(a: FieldSet, b: FieldSet, root: bool = False) -> FieldSet:
    if a is b or a == b:
        return a
    a_member = _member(a, root)
    member = a_member or _member(b, root)
    result: FieldSet | None = None
    for key, sub in b.items():
        if key == SELF:
            continue
        mine = a.get(key)
        if mine is None:
            merged = sub
        else:
            merged = _union(mine, sub)
            if merged is mine:
                continue
        if result is None:
            result = dict(a)
        result[key] = merged
    if result is None:
        if member == a_member:
            return a
        result = dict(a)
    shaped = _shape_node(result, member, root)
    return {} if shaped is None else shaped


def difference(a: FieldSet, b: FieldSet) -> FieldSet:
    """Paths of `a` not in `b`, element by element (a parent minus a child keeps the parent)."""
    result = _difference(a, b, True)
    return {} if result is None else result


def _difference(a: FieldSet, b: FieldSet, root: bool = False) -> FieldSet | None:
    if a is b or a == b:
        return {} if root else None
    a_member = _member(a, root)
    member = a_member and not _member(b, root)
    result: FieldSet | None = None
    if b:
        # Walk whichever side is smaller: a few removed paths cost little in a large set.
        common = [k for k in b if k in a] if len(b) < len(a) else [k for k in a if k in b]
        for key in common:
            if key == SELF:
                continue
            sub, other = a[key], b[key]
            rest = _difference(sub, other)
            if rest is sub:
                continue
            if result is None:
                result = dict(a)
            if rest is None:
                del result[key]
            else:
                result[key] = rest
    if result is None:
        if member == a_member:
            return a
        result = dict(a)
    return _shape_node(result, member, root)


def intersection(a: FieldSet, b: FieldSet) -> FieldSet:
    """Paths in both sets."""
    result = _intersection(a, b, True)
    return {} if result is None else result


def _intersection(a: FieldSet, b: FieldSet, root: bool = False) -> FieldSet | None:
    if a is b or a == b:
        return a
    member = _member(a, root) and _member(b, root)
    small, large = (a, b) if len(a) <= len(b) else (b, a)
    result: FieldSet = {}
    for key, sub in small.items():
        if key == SELF:
            continue
        other = large.get(key)
        if other is None:
            continue
        both = _intersection(sub, other)
        if both is not None:
            result[key] = both
    return _shape_node(result, member, root)


def iterate(fs: FieldSet, prefix: Path = ()) -> Iterator[Path]:
    """Every member path, members of a node before its children's members (preorder)."""
    nodes = sorted(((k, v) for k, v in fs.items() if k != SELF), key=lambda kv: _order(kv[0]))
    for key, sub in nodes:
        if is_member(sub):
            yield (*prefix, key)
    for key, sub in nodes:
        if has_children(sub):
            yield from iterate(sub, (*prefix, key))


def canonical(fs: FieldSet) -> FieldSet:
    """The set with `.` first and elements in the server's order (fields, keys, values, indexes):
    `fs` itself, or its unchanged parts, where they are in that order already."""
    if len(fs) == 1 and SELF not in fs:
        # One element (a path down to a single field, the usual update) is in order as it is.
        [(key, sub)] = fs.items()
        fixed = canonical(sub) if sub else sub
        return fs if fixed is sub else {key: fixed}
    result: FieldSet = {SELF: {}} if SELF in fs else {}
    names = sorted(k for k in fs if k != SELF)
    if names and not names[-1].startswith("f:"):
        # Fields sort as plain strings and come first; keys and values sort by their values.
        first = next(i for i, k in enumerate(names) if not k.startswith("f:"))
        names[first:] = sorted(names[first:], key=_order)
    same = not result or fs[SELF] == {}
    for key in names:
        sub = fs[key]
        fixed = result[key] = canonical(sub) if sub else sub
        same = same and fixed is sub
    # Sets are never mutated, so an equal one may be shared (stored entries keep theirs).
    return fs if same and list(result) == list(fs) else result


_TYPE_RANK = {"f": 0, "k": 1, "v": 2, "i": 3}


@functools.lru_cache(maxsize=1 << 16)
def _order(element: str) -> tuple[int, Any]:
    kind, _, text = element.partition(":")
    rank = _TYPE_RANK.get(kind, 4)
    if kind == "f":
        return (rank, text)
    if kind == "i":
        return (rank, int(text) if text.isdigit() else text)
    try:
        value = json.loads(text)
    except ValueError:
        return (rank, (9, text))
    if kind == "k" and isinstance(value, dict):
        return (rank, tuple((name, _value_order(v)) for name, v in value.items()))
    return (rank, _value_order(value))


def _value_order(value: Any) -> tuple[int, Any]:
    # Numbers, then strings, booleans, lists, maps and null, as the server's value ordering.
    if isinstance(value, bool):
        return (2, value)
    if isinstance(value, int | float):
        return (0, value)
    if isinstance(value, str):
        return (1, value)
    if isinstance(value, list):
        return (3, json.dumps(value, sort_keys=True))
    if isinstance(value, dict):
        return (4, json.dumps(value, sort_keys=True))
    return (5, 0)


def path_string(path: Path) -> str:
    """A path as the server prints it: `.spec.containers[name="x"].ports[containerPort=80,...]`."""
    out = []
    for element in path:
        kind, _, text = element.partition(":")
        if kind == "f":
            out.append("." + text)
        elif kind == "k":
            pairs = json.loads(text)
            out.append(
                "["
                + ",".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in pairs.items())
                + "]"
            )
        elif kind == "v":
            out.append(f"[={text}]")
        else:
            out.append(f"[{text}]")
    return "".join(out)


def list_strategy(
    name: str, items: list[Any], schema: dict[str, Any] | None
) -> tuple[str, tuple[str, ...]]:
    """How strategic merge patch merges a list by name: ("map", keys), ("set", ()) or atomic."""
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
