"""Server-side apply and field ownership as structured-merge-diff (the real server's library) does.

Apply: merge the applied configuration into the live object (keyed lists matched by key, in the
merged order the library uses), give the applier exactly the fields of its configuration, remove
what it applied last time and no longer applies unless another manager owns it, and check every
other manager whose fields change (409 with one cause per field unless `force`). Update (create,
update, patch): the manager takes the fields the write added or changed; everyone loses the fields
that were removed. Lists are indexed by key once per merge, so work is linear in the object size.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubesim import errors, typed
from kubesim import managed_fields as mf
from kubesim.managed_fields import SELF, FieldSet
from kubesim.typed import KEYED, LIST, SCALAR, SET, Shape

# How a value is walked: a leaf (scalar, null, atomic list/map, or a value its schema does not
# expect), a map with entries, a keyed list, or a set of scalars.
LEAF = 0
MAPLIKE = 1
KEYED_LIST = 2
SET_LIST = 3

_MISSING: Any = object()
_REMOVE: Any = object()

# Paths the server never records as owned (`stripMeta`): identity and system fields.
STRIPPED: FieldSet = {
    "f:apiVersion": {},
    "f:kind": {},
    "f:metadata": {
        SELF: {},
        "f:name": {},
        "f:namespace": {},
        "f:creationTimestamp": {},
        "f:selfLink": {},
        "f:uid": {},
        "f:clusterName": {},
        "f:generation": {},
        "f:managedFields": {},
        "f:resourceVersion": {},
    },
}


def _mode(value: Any, shape: Shape) -> int:
    if isinstance(value, dict):
        if shape.atomic or shape.kind in (LIST, SCALAR):
            return LEAF
        return MAPLIKE
    if isinstance(value, list):
        if shape.kind != LIST:
            return LEAF
        if shape.list_type == KEYED:
            return KEYED_LIST
        return SET_LIST if shape.list_type == SET else LEAF
    return LEAF


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_encode_string = json.encoder.encode_basestring  # the C encoder when there is one


def _dumps(value: Any) -> str:
    # Key values are almost always strings or integers; those skip the encoder's set-up.
    if isinstance(value, str):
        return _encode_string(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return _ENCODER.encode(value)


class _Walk:
    """Per-operation state: the path elements of lists already indexed (nothing is mutated while
    one operation runs, so a list's elements are computed once)."""

    __slots__ = ("_lists", "problems", "saw_null", "strict")

    def __init__(self, strict: bool = False) -> None:
        self.strict = strict
        self.problems: list[str] = []
        self.saw_null = False
        self._lists: dict[int, tuple[list[Any], list[str | None]]] = {}

    def problem(self, path: tuple[str, ...], message: str) -> None:
        self.problems.append(f"{mf.path_string(path)}: {message}" if path else message)

    def elements(self, items: list[Any], shape: Shape) -> list[str | None]:
        """The path element of each item: `k:{...}` for keyed lists, `v:...` for sets, None for
        an item the schema rejects."""
        cached = self._lists.get(id(items))
        if cached is not None and cached[0] is items:
            return cached[1]
        if shape.list_type == SET:
            found = [
                None if item is None or isinstance(item, dict | list) else "v:" + _dumps(item)
                for item in items
            ]
        else:
            keys, defaults = _sorted_keys(shape, items)
            if len(keys) == 1 and not defaults:
                # The common case (a name): one prefix, one encoded value per item.
                key = keys[0]
                prefix = "k:{" + _encode_string(key) + ":"
                found = [
                    prefix + _dumps(item[key]) + "}"
                    if isinstance(item, dict) and key in item
                    else None
                    for item in items
                ]
            else:
                found = [_keyed_element(item, keys, defaults) for item in items]
        self._lists[id(items)] = (items, found)
        return found

    def remember(self, items: list[Any], found: list[str | None]) -> None:
        """Record the elements of a list built from already indexed items."""
        self._lists[id(items)] = (items, found)

    def item_problem(self, item: Any, shape: Shape, keys: tuple[str, ...], defaults: Any) -> str:
        """Why a list item has no path element, worded as the server's typed conversion."""
        if shape.list_type == SET:
            if item is None:
                return "associative list without keys has an element that's an explicit null"
            if isinstance(item, dict):
                return "associative list without keys has an element that's a map type"
            return "not supported: associative list with lists as elements"
        if item is None:
            return "associative list with keys may not have a null element"
        if not isinstance(item, dict):
            return "associative list with keys may not have non-map elements"
        missing = next((k for k in keys if k not in item and k not in defaults), "")
        return (
            f'associative list with keys has an element that omits key field "{missing}" '
            "(and doesn't have default value)"
        )


def _sorted_keys(shape: Shape, items: list[Any]) -> tuple[tuple[str, ...], Any]:
    keys, defaults = shape.list_keys(items)
    return tuple(sorted(keys)), defaults


def _keyed_element(item: Any, keys: tuple[str, ...], defaults: Any) -> str | None:
    if not isinstance(item, dict):
        return None
    parts: list[str] = []
    for name in keys:
        if name in item:
            value = item[name]
        elif name in defaults:
            value = defaults[name]
        else:
            return None
        parts.append(f"{_encode_string(name)}:{_dumps(value)}")
    return "k:{" + ",".join(parts) + "}"


# ----- field sets of values ---------------------------------------------------------------------


def field_set(value: Mapping[str, Any], shape: Shape, walk: _Walk | None = None) -> FieldSet:
    """The set of fields a value specifies (ToFieldSet): leaves, list items and map entries."""
    return _fields(value, shape, walk or _Walk(), ())


def _fields(value: Any, shape: Shape, walk: _Walk, path: tuple[str, ...]) -> FieldSet:
    out: FieldSet = {}
    if isinstance(value, dict):
        for name, sub in value.items():
            element = "f:" + name
            sub_shape = shape.field(name)
            mode = _mode(sub, sub_shape)
            declared = shape.declares(name)
            if mode == LEAF or not sub:
                if sub is None:
                    walk.saw_null = True
                # Empty maps are members; an empty list under a named field specifies nothing.
                if mode in (KEYED_LIST, SET_LIST) and declared:
                    continue
                out[element] = {}
                continue
            kids = _fields(sub, sub_shape, walk, (*path, element))
            if not declared:
                out[element] = {SELF: {}, **kids} if kids else {}
            elif kids:
                out[element] = kids
        return out
    # A keyed list or a set.
    elem = shape.elem()
    seen: set[str] = set()
    duplicated: set[str] = set()
    elements = walk.elements(value, shape)
    for index, pe in enumerate(elements):
        if pe is None:
            if walk.strict:
                keys, defaults = _sorted_keys(shape, value)
                problem = walk.item_problem(value[index], shape, keys, defaults)
                walk.problem(path, f"element {index}: {problem}")
            continue
        if pe in seen:
            duplicated.add(pe)
        seen.add(pe)
    if duplicated and walk.strict:
        for pe in sorted(duplicated, key=elements.index):
            walk.problem(path, f"duplicate entries for key {mf.path_string((pe,))}")
    for item, pe in zip(value, elements, strict=True):
        if pe is None:
            continue
        if pe in duplicated:
            out[pe] = {}
            continue
        if isinstance(item, dict) and item and _mode(item, elem) == MAPLIKE:
            kids = _fields(item, elem, walk, (*path, pe))
            out[pe] = {SELF: {}, **kids} if kids else {}
        else:
            out[pe] = {}
    return out


def _all_paths(value: Any, shape: Shape, walk: _Walk) -> FieldSet:
    """Every path under a value, containers included (what a comparison sees added or removed)."""
    mode = _mode(value, shape)
    if mode == LEAF or not value:
        return {}
    out: FieldSet = {}
    if mode == MAPLIKE:
        for name, sub in value.items():
            kids = _all_paths(sub, shape.field(name), walk)
            out["f:" + name] = {SELF: {}, **kids} if kids else {}
        return out
    elem = shape.elem()
    for item, pe in zip(value, walk.elements(value, shape), strict=True):
        if pe is None:
            continue
        kids = _all_paths(item, elem, walk)
        out[pe] = {SELF: {}, **kids} if kids else {}
    return out


# ----- merging ----------------------------------------------------------------------------------


def merge(live: Any, config: Any, shape: Shape, walk: _Walk) -> Any:
    """The applied configuration merged into the live value (config wins for leaves)."""
    mode = _mode(config, shape)
    if mode == LEAF or _mode(live, shape) != mode or (not live and not config):
        return config
    if mode == MAPLIKE:
        result: dict[str, Any] | None = None
        for name, sub in config.items():
            # A null is a value like any other here (it conflicts, it is owned); it is dropped
            # from the stored object at the end, as decoding into the Go types would.
            before = live.get(name, _MISSING)
            after = sub if before is _MISSING else merge(before, sub, shape.field(name), walk)
            if after is before or (after == before and type(after) is type(before)):
                continue  # unchanged values keep their identity (comparisons stop at `is`)
            if result is None:
                result = dict(live)
            result[name] = after
        return live if result is None else result
    merged = _merge_list(live, config, shape, walk)
    return live if merged == live else merged


def _merge_list(live: list[Any], config: list[Any], shape: Shape, walk: _Walk) -> list[Any]:
    elem = shape.elem()
    r_pes: list[str] = []
    observed_r: dict[str, Any] = {}
    for item, pe in zip(config, walk.elements(config, shape), strict=True):
        if pe is None or pe in observed_r:
            continue  # rejected while the configuration's field set was computed
        observed_r[pe] = item
        r_pes.append(pe)
    l_pes: list[str] = []
    observed_l: dict[str, Any] = {}
    for index, (item, found) in enumerate(zip(live, walk.elements(live, shape), strict=True)):
        pe = f"#{index}" if found is None else found  # a rejected item is kept where it is
        # Live duplicates are never merged with the configuration; they collapse into it.
        observed_l[pe] = None if pe in observed_l else item
        l_pes.append(pe)
    shared = [pe for pe in r_pes if pe in observed_l]
    next_shared = shared[0] if shared else None
    shared_at = 1
    merged_r: set[str] = set()
    out: list[Any] = []
    out_pes: list[str] = []
    li = ri = 0
    ln, rn = len(l_pes), len(r_pes)
    # The library's merged order: live items keep their places, applied items follow the
    # applier's order, and shared items move to where the applier puts them.
    while li < ln or ri < rn:
        if li < ln and ri < rn:
            pe = l_pes[li]
            if pe == r_pes[ri]:
                merged_r.add(pe)
                out.append(_merge_item(observed_l[pe], observed_r[pe], elem, walk))
                out_pes.append(pe)
                li += 1
                ri += 1
                next_shared = shared[shared_at] if shared_at < len(shared) else None
                shared_at += 1
                continue
            if pe in observed_r and next_shared is not None and next_shared != pe:
                li += 1
                continue
        if li < ln:
            pe = l_pes[li]
            if pe not in observed_r:
                out.append(live[li])
                out_pes.append(pe)
                li += 1
                continue
            if pe in merged_r:
                li += 1
        if ri < rn:
            pe = r_pes[ri]
            merged_r.add(pe)
            out.append(_merge_item(observed_l.get(pe), observed_r[pe], elem, walk))
            out_pes.append(pe)
            ri += 1
            if next_shared is not None and next_shared == pe:
                next_shared = shared[shared_at] if shared_at < len(shared) else None
                shared_at += 1
    walk.remember(out, [None if pe.startswith("#") else pe for pe in out_pes])
    return out


def _merge_item(live: Any, config: Any, elem: Shape, walk: _Walk) -> Any:
    if live is None:
        return config
    return merge(live, config, elem, walk)


# ----- comparing --------------------------------------------------------------------------------


@dataclass
class Comparison:
    """Paths added, modified (leaves whose value changed) and removed between two values."""

    added: FieldSet = field(default_factory=dict)
    modified: FieldSet = field(default_factory=dict)
    removed: FieldSet = field(default_factory=dict)

    def same(self) -> bool:
        """Whether nothing changed."""
        return not (self.added or self.modified or self.removed)


def compare(old: Any, new: Any, shape: Shape, walk: _Walk | None = None) -> Comparison:
    """What changed from `old` to `new` (both whole objects)."""
    result = Comparison()
    _compare(old, new, shape, walk or _Walk(), result.added, result.modified, result.removed)
    return result


def _compare(
    old: Any, new: Any, shape: Shape, walk: _Walk, add: FieldSet, mod: FieldSet, rem: FieldSet
) -> None:
    """Compare two containers of the same mode, writing their children's changes."""
    if isinstance(new, dict):
        for name, sub in new.items():
            before = old.get(name, _MISSING)
            if before is sub or before == sub:
                continue  # most fields of an update are unchanged: no call for them
            _compare_child("f:" + name, before, sub, shape.field(name), walk, add, mod, rem)
        if not old.keys() <= new.keys():
            for name, sub in old.items():
                if name not in new:
                    child = shape.field(name)
                    _compare_child("f:" + name, sub, _MISSING, child, walk, add, mod, rem)
        return
    elem = shape.elem()
    old_items = _group(old, shape, walk)
    new_items = _group(new, shape, walk)
    for pe, before in old_items.items():
        after = new_items.get(pe)
        if after is None:
            if len(before) == 1:
                _compare_child(pe, before[0], _MISSING, elem, walk, add, mod, rem)
            else:
                rem[pe] = {}
        elif len(before) <= 1 and len(after) <= 1:
            if before[0] is not after[0] and before[0] != after[0]:
                _compare_child(pe, before[0], after[0], elem, walk, add, mod, rem)
        elif len(before) >= 2 and len(after) >= 2:
            if before != after:
                mod[pe] = {}
        elif len(before) >= 2:
            # Duplicates resolved into one item: a new item, and the duplicate marker removed.
            _compare_child(pe, _MISSING, after[0], elem, walk, add, mod, rem)
            rem[pe] = {}
        else:
            _compare_child(pe, before[0], _MISSING, elem, walk, add, mod, rem)
            add[pe] = {}
    for pe, after in new_items.items():
        if pe not in old_items:
            if len(after) == 1:
                _compare_child(pe, _MISSING, after[0], elem, walk, add, mod, rem)
            else:
                add[pe] = {}


def _group(items: list[Any], shape: Shape, walk: _Walk) -> dict[str, list[Any]]:
    grouped: dict[str, list[Any]] = {}
    for item, pe in zip(items, walk.elements(items, shape), strict=True):
        if pe is not None:
            grouped.setdefault(pe, []).append(item)
    return grouped


def _compare_child(
    pe: str,
    old: Any,
    new: Any,
    shape: Shape,
    walk: _Walk,
    add: FieldSet,
    mod: FieldSet,
    rem: FieldSet,
) -> None:
    if old is _MISSING:
        kids = _all_paths(new, shape, walk)
        add[pe] = {SELF: {}, **kids} if kids else {}
        return
    if new is _MISSING:
        kids = _all_paths(old, shape, walk)
        rem[pe] = {SELF: {}, **kids} if kids else {}
        return
    # Callers pass two present values only when they differ (the check is theirs, so a
    # changed map is not compared whole a second time on the way down).
    mode = _mode(new, shape)
    old_mode = _mode(old, shape)
    # A null next to a map or list compares as an empty one: its entries are removed (or
    # added), the field itself stays; that is how a pruned-empty field reads to the library.
    if new is None and old_mode != LEAF:
        new, mode = type(old)(), old_mode
    elif old is None and mode != LEAF:
        old, old_mode = type(new)(), mode
    if mode == LEAF or old_mode != mode or (not old and not new):
        mod[pe] = {}
        return
    sub_add: FieldSet = {}
    sub_mod: FieldSet = {}
    sub_rem: FieldSet = {}
    _compare(old, new, shape, walk, sub_add, sub_mod, sub_rem)
    if sub_add:
        add[pe] = sub_add
    if sub_mod:
        mod[pe] = sub_mod
    if sub_rem:
        rem[pe] = sub_rem


# ----- pruning what the applier stopped applying -----------------------------------------------


def _visible(value: Any, shape: Shape) -> bool:
    """Whether a named field shows in the value's field set (named fields holding only empty
    lists do not)."""
    mode = _mode(value, shape)
    if mode == LEAF:
        return True
    if not value:
        return mode == MAPLIKE
    if mode != MAPLIKE:
        return True
    return any(
        not shape.declares(name) or _visible(sub, shape.field(name)) for name, sub in value.items()
    )


def _owned(node: FieldSet | None, named: bool) -> bool:
    """Membership after `EnsureNamedFieldsAreMembers`: named fields with members below count."""
    if node is None:
        return False
    return mf.is_member(node) or (named and mf.has_children(node))


def prune(
    value: dict[str, Any],
    shape: Shape,
    last: FieldSet,
    dropped: FieldSet,
    managed: list[FieldSet],
    walk: _Walk,
) -> dict[str, Any]:
    """Remove what the applier applied last time (`last`) and dropped now, unless still owned.

    This is the library's prune, remove-owned-back and remove-dangling-back passes folded into
    one walk along `dropped` (the applier's last set minus its new one): a path goes when the
    applier owned it and it, or an ancestor, is neither owned by any manager (`managed` holds
    every manager's set, the applier's new one included) nor outside what the applier owned.
    """
    result = _prune(value, shape, last, dropped, managed, False, False, walk)
    return {} if result is None else dict(result)


def _prune(
    value: Any,
    shape: Shape,
    last: FieldSet,
    dropped: FieldSet,
    managed: list[FieldSet],
    gone_first: bool,
    gone_second: bool,
    walk: _Walk,
) -> Any:
    if isinstance(value, dict):
        result: dict[str, Any] | None = None
        for pe, below in dropped.items():
            if pe == SELF or not pe.startswith("f:"):
                continue
            name = pe[2:]
            if name not in value:
                continue
            child = value[name]
            outcome = _decide(
                child, shape.field(name), shape.declares(name), pe, below, last, managed,
                gone_first, gone_second, walk,
            )  # fmt: skip
            if outcome is child:
                continue
            if result is None:
                result = dict(value)
            if outcome is _REMOVE:
                del result[name]
            else:
                result[name] = outcome
        if result is None:
            return value
        if not result:
            walk.saw_null = True  # emptied: null until the end, as the library leaves it
            return None
        return result
    positions: dict[str, list[int]] = {}
    for index, found in enumerate(walk.elements(value, shape)):
        if found is not None:
            positions.setdefault(found, []).append(index)
    elem = shape.elem()
    changes: dict[int, Any] = {}
    for pe, below in dropped.items():
        if pe == SELF:
            continue
        for index in positions.get(pe, ()):
            item = value[index]
            outcome = _decide(
                item, elem, False, pe, below, last, managed, gone_first, gone_second, walk
            )
            if outcome is not item:
                changes[index] = outcome
    if not changes:
        return value
    items = [changes.get(i, item) for i, item in enumerate(value)]
    kept = [item for item in items if item is not _REMOVE]
    if not kept or None in kept:
        walk.saw_null = True
    return kept if kept else None


def _decide(
    child: Any,
    shape: Shape,
    named: bool,
    pe: str,
    below: FieldSet,
    last: FieldSet,
    managed: list[FieldSet],
    gone_first: bool,
    gone_second: bool,
    walk: _Walk,
) -> Any:
    last_node = last.get(pe)
    managed_nodes = [node for node in (m.get(pe) for m in managed) if node is not None]
    in_last = _owned(last_node, named)
    in_managed = any(_owned(node, named) for node in managed_nodes)
    visible = not named or _visible(child, shape)
    first = gone_first or in_last
    second = gone_second or (visible and first and not in_managed)
    if in_last and visible and second:
        return _REMOVE
    if not mf.has_children(below) or _mode(child, shape) == LEAF or not child:
        return child
    return _prune(child, shape, last_node or {}, below, managed_nodes, first, second, walk)


# ----- managed fields ---------------------------------------------------------------------------


@dataclass
class Manager:
    """One managedFields entry."""

    manager: str
    operation: str
    api_version: str
    subresource: str
    time: str | None
    fields: FieldSet
    original: dict[str, Any] | None = None

    @property
    def identity(self) -> tuple[str, str, str, str]:
        """What tells entries apart: appliers regardless of apiVersion, updaters per apiVersion."""
        version = "" if self.operation == "Apply" else self.api_version
        return (self.manager, self.operation, version, self.subresource)

    def describe(self) -> str:
        """The manager as conflict messages name it."""
        text = json.dumps(self.manager)
        if self.subresource:
            text += f" with subresource {json.dumps(self.subresource)}"
        if self.operation == "Update":
            text += f" using {self.api_version}"
        return text

    def encode(self) -> dict[str, Any]:
        """The wire form (the original dict when nothing about the entry changed)."""
        if self.original is not None:
            return self.original
        entry: dict[str, Any] = {
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
        }
        if self.time is not None:
            entry["time"] = self.time
        entry["fieldsType"] = "FieldsV1"
        entry["fieldsV1"] = mf.canonical(self.fields)
        if self.subresource:
            entry["subresource"] = self.subresource
        return entry

    def with_fields(self, fields: FieldSet, time: str | None = None) -> Manager:
        """A copy with another field set (and time)."""
        if fields is self.fields and time is None:
            return self
        return Manager(
            self.manager,
            self.operation,
            self.api_version,
            self.subresource,
            self.time if time is None else time,
            fields,
        )


def decode_managers(entries: Any) -> list[Manager]:
    """Managers from `metadata.managedFields` (malformed entries are skipped)."""
    result: list[Manager] = []
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, dict) or not isinstance(entry.get("fieldsV1", {}), dict):
            continue
        result.append(
            Manager(
                str(entry.get("manager") or ""),
                str(entry.get("operation") or "Update"),
                str(entry.get("apiVersion") or ""),
                str(entry.get("subresource") or ""),
                entry.get("time"),
                entry.get("fieldsV1") or {},
                entry,
            )
        )
    return result


def encode_managers(managers: Iterable[Manager]) -> list[dict[str, Any]]:
    """Entries in the server's order: appliers first, then by time, manager, version."""
    live = [m for m in managers if m.fields]
    if len(live) > 1:
        live.sort(
            key=lambda m: (m.operation, m.time or "", m.manager, m.api_version, m.subresource)
        )
    return [m.encode() for m in live]


def _without_managed_fields(obj: Mapping[str, Any]) -> dict[str, Any]:
    body = dict(obj)
    meta = body.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        meta = body["metadata"] = dict(meta)
        del meta["managedFields"]
    return body


# The metadata fields of STRIPPED (what `_keeps_stripped` looks for in a change).
_STRIPPED_META = frozenset(STRIPPED["f:metadata"])


def _keeps_stripped(changed: FieldSet) -> bool:
    """Whether `difference(changed, STRIPPED)` is `changed` itself: it names no identity field,
    and metadata (if there) is a plain parent of other fields."""
    if "f:apiVersion" in changed or "f:kind" in changed:
        return False
    meta = changed.get("f:metadata")
    return meta is None or (bool(meta) and not any(k in _STRIPPED_META for k in meta))


def _owns(owned: Any, changed: FieldSet) -> bool:
    """Whether every member path of `changed` (a comparison's output: no `.` markers) is a
    member of `owned`, and `owned` is in normal form along those paths (`.` only beside
    children; its value does not matter, encoding writes it as `{}`)."""
    for key, sub in changed.items():
        node = owned.get(key)
        if not isinstance(node, dict):
            return False
        if SELF in node and len(node) == 1:
            return False
        if sub:
            if SELF in sub or not _owns(node, sub):
                return False
        elif node and SELF not in node:
            return False  # a parent of owned fields, not itself owned
    return True


def _owned_update(
    managers: list[Manager], identity: tuple[str, str, str, str], modified: FieldSet, now: str
) -> list[Manager] | None:
    """The managers after an update that only changed values its manager already owns (a
    controller rewriting its status, a label set again), or None for the general path."""
    # Why this equals the general path: it takes the changed fields from every manager and
    # gives them, less STRIPPED, to the writer. With nothing added or removed, nothing stripped
    # changed, and every changed field the writer's, the writer ends with (owned - changed) +
    # changed = owned as path sets; the set algebra rebuilds the nodes it touches in normal
    # form, which `_owns` checked the writer's set is in along those paths, and encoding
    # canonicalises the rest. So the writer keeps its own set, with the new time, and the other
    # managers lose the changed fields exactly as before.
    if not _keeps_stripped(modified):
        return None
    result: list[Manager] = []
    mine: Manager | None = None
    for entry in managers:
        if entry.identity != identity:
            result.append(entry.with_fields(mf.difference(entry.fields, modified)))
        elif mine is not None:
            return None  # repeated entries of one manager: the general path keeps the last
        else:
            mine = entry
    if mine is None or SELF in mine.fields or not _owns(mine.fields, modified):
        return None
    manager, operation, api_version, subresource = identity
    result.append(Manager(manager, operation, api_version, subresource, now, mine.fields))
    return result


def _zero(obj: Mapping[str, Any], shape: Shape) -> dict[str, Any]:
    """The empty object a create is compared with: top-level structs exist (Go zero values)."""
    return {
        name: {}
        for name, value in obj.items()
        if isinstance(value, dict) and shape.declares(name) and name != "metadata"
        and shape.field(name).kind == typed.STRUCT
    }  # fmt: skip


def record_update(
    obj: dict[str, Any],
    old: dict[str, Any] | None,
    manager: str,
    api_version: str,
    crd_schema: dict[str, Any] | None,
    subresource: str | None,
    now: str,
    *,
    status_reset: bool = False,
) -> None:
    """Record a create/update/patch by `manager` in `obj`'s managedFields (operation Update).

    `status_reset` says the write's status is not the client's (a kind whose status is a
    subresource, written through the object): like the server's reset fields, it is not compared.
    """
    meta = obj.setdefault("metadata", {})
    source = (old or {}).get("metadata", {}).get("managedFields") if old else None
    if source is None or (not subresource and meta.get("managedFields")):
        source = meta.get("managedFields")
    managers = decode_managers(source)
    shape = typed.object_shape(obj, crd_schema)
    new = _without_managed_fields(obj)
    if status_reset and not subresource:
        new.pop("status", None)
    before = _without_managed_fields(old) if old is not None else _zero(new, shape)
    if status_reset and not subresource:
        before.pop("status", None)
    walk = _Walk()
    changes = compare(before, new, shape, walk)
    if changes.same():
        # Entries left owning nothing (a client's `[{}]` clears them all) are not kept.
        encoded = encode_managers(managers) if managers else []
        if encoded:
            meta["managedFields"] = encoded
        else:
            meta.pop("managedFields", None)
        return
    identity = (manager, "Update", api_version, subresource or "")
    if not changes.added and not changes.removed:
        owned = _owned_update(managers, identity, changes.modified, now)
        if owned is not None:
            meta["managedFields"] = encode_managers(owned)
            return
    # A comparison's sets never mark their root, so a union with an empty one is the other.
    if changes.modified and changes.added:
        touched = mf.union(changes.modified, changes.added)
    else:
        touched = changes.modified or changes.added
    lost = mf.union(touched, changes.removed) if changes.removed else touched
    result: list[Manager] = []
    mine: Manager | None = None
    for entry in managers:
        kept = entry.with_fields(mf.difference(entry.fields, lost))
        if entry.identity == identity:
            mine = kept
        else:
            result.append(kept)
    fields = mf.difference(touched, STRIPPED)
    if mine is not None:
        fields = mf.union(mine.fields, fields)
    if fields:
        result.append(Manager(manager, "Update", api_version, subresource or "", now, fields))
    encoded = encode_managers(result)
    if encoded:
        meta["managedFields"] = encoded
    else:
        meta.pop("managedFields", None)


# ----- apply ------------------------------------------------------------------------------------


def _typed_failure(config: Mapping[str, Any], problems: list[str]) -> errors.ApiError:
    meta = config.get("metadata") if isinstance(config.get("metadata"), dict) else {}
    assert isinstance(meta, dict)
    api_version = str(config.get("apiVersion") or "")
    group_version = api_version if "/" in api_version else f"/{api_version}"
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    where = f"{name}; {group_version}, Kind={config.get('kind')}"
    detail = (
        problems[0] if len(problems) == 1 else "errors:\n" + "\n".join(f"  {p}" for p in problems)
    )
    # The real server answers these with a bare 500 (no reason), as it does not classify them.
    return UnclassifiedError(500, f"failed to create typed patch object ({where}): {detail}")


class UnclassifiedError(errors.ApiError):
    """A failure the real server reports without a reason (a plain Go error)."""

    def status(self) -> dict[str, Any]:
        """The Status body, without `reason`."""
        body = super().status()
        body.pop("reason", None)
        return body


def _conflict(conflicts: list[tuple[Manager, mf.Path]]) -> errors.ApiError:
    causes = [
        {
            "reason": "FieldManagerConflict",
            "message": f"conflict with {entry.describe()}",
            "field": mf.path_string(path),
        }
        for entry, path in conflicts
    ]
    if len(conflicts) == 1:
        entry, path = conflicts[0]
        message = (
            f"Apply failed with 1 conflict: conflict with {entry.describe()}: "
            f"{mf.path_string(path)}"
        )
    else:
        lines: list[str] = []
        seen: list[str] = []
        for entry, _ in conflicts:
            if entry.describe() not in seen:
                seen.append(entry.describe())
        for who in sorted(seen):
            lines.append(f"conflicts with {who}:")
            lines.extend(f"- {mf.path_string(p)}" for e, p in conflicts if e.describe() == who)
        message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return errors.ApiError(409, message, reason="Conflict", details={"causes": causes})


def applied_part(
    config: Mapping[str, Any], subresource: str | None, status_split: bool
) -> dict[str, Any]:
    """The part of a configuration an apply writes: all of it, the object without status (when
    status is a subresource), or only status (through `/status`)."""
    if subresource == "status":
        meta = config.get("metadata") if isinstance(config.get("metadata"), dict) else {}
        assert isinstance(meta, dict)
        part: dict[str, Any] = {k: config[k] for k in ("apiVersion", "kind") if k in config}
        part["metadata"] = {k: meta[k] for k in ("name", "namespace") if k in meta}
        if "status" in config:
            part["status"] = config["status"]
        return part
    if status_split:
        return {k: v for k, v in config.items() if k != "status"}
    return dict(config)


def apply(
    live: dict[str, Any] | None,
    config: dict[str, Any],
    *,
    crd_schema: dict[str, Any] | None,
    manager: str,
    force: bool,
    subresource: str | None,
    status_split: bool,
    stamp: str,
) -> dict[str, Any]:
    """The object after applying `config` as `manager`, with its managedFields; raises 409 on
    conflicts (unless `force`) and 500 on configurations the schema rejects, as the server."""
    meta = config.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        raise errors.bad_request("metadata.managedFields must be nil")
    shape = typed.object_shape(config, crd_schema)
    part = applied_part(config, subresource, status_split)
    walk = _Walk(strict=True)
    full_set = field_set(part, shape, walk)
    if walk.problems:
        raise _typed_failure(config, walk.problems)
    walk.strict = False
    # Identity fields are not recorded as owned, but while pruning they still count as applied.
    new_set = mf.difference(full_set, STRIPPED)
    live_body = _without_managed_fields(live) if live is not None else {}
    managers = decode_managers((live or {}).get("metadata", {}).get("managedFields"))
    sub = subresource or ""
    identity = (manager, "Apply", "", sub)
    mine = next((m for m in managers if m.identity == identity), None)
    others = [m for m in managers if m.identity != identity]
    merged = merge(live_body, part, shape, walk)
    if mine is not None and mine.fields:
        dropped = mf.difference(mine.fields, full_set)
        if dropped:
            owned = [m.fields for m in others] + [full_set]
            merged = prune(merged, shape, mine.fields, dropped, owned, walk)
    changes = compare(live_body, merged, shape, walk)
    result: list[Manager] = []
    if not changes.same():
        touched = mf.union(changes.modified, changes.added)
        conflicts: list[tuple[Manager, mf.Path]] = []
        for entry in sorted(others, key=lambda m: m.describe()):
            overlap = mf.intersection(entry.fields, touched)
            conflicts.extend((entry, path) for path in mf.iterate(overlap))
        if conflicts and not force:
            raise _conflict(conflicts)
        lost = mf.union(touched, changes.removed)
        others = [m.with_fields(mf.difference(m.fields, lost)) for m in others]
    result.extend(others)
    changed = not changes.same()
    api_version = str(config.get("apiVersion") or "")
    if (
        mine is not None
        and not changed
        and mine.api_version == api_version
        and mine.fields == new_set
    ):
        result.append(mine)  # the entry as stored, time included
    else:
        # The time moves only when the object changes, as the server's managed-fields updater.
        time = stamp if changed else (mine.time if mine is not None else None)
        result.append(Manager(manager, "Apply", api_version, sub, time, new_set))
    if walk.saw_null:
        _drop_nulls(merged)
    out = merged if isinstance(merged, dict) else {}
    out_meta = dict(out.get("metadata") or {})
    # Always present (possibly empty) so the store keeps this set rather than the stored one.
    out_meta["managedFields"] = encode_managers(result)
    out = dict(out)
    out["metadata"] = out_meta
    return out


def _drop_nulls(value: Any) -> None:
    """Remove null fields and items in place (the merged object is private to the request), as
    decoding into the Go types leaves such fields unset."""
    if isinstance(value, dict):
        for name in [k for k, v in value.items() if v is None]:
            del value[name]
        for sub in value.values():
            _drop_nulls(sub)
    elif isinstance(value, list):
        if None in value:
            value[:] = [item for item in value if item is not None]
        for item in value:
            _drop_nulls(item)
