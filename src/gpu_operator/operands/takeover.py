"""Taking an object over from the field manager that wrote it before ours (docs/swap-in.md).

NVIDIA's operator creates and updates its objects (operation `Update`) as field manager
`gpu-operator`, the name of its binary; ours server-side applies (operation `Apply`) under the same
name. Server-side apply never removes a field another manager entry owns, so a field the previous
writer set and ours does not render would stay. Mostly harmless, but wrong where it is the other
half of a one-of (an env var's `valueFrom` beside the `value` ours sets: the API server rejects
every write with 422), and the split ownership means a field ours stops rendering later lingers.

Taking an object over therefore writes, once:
1. one JSON patch (testing the resourceVersion it was computed from) that removes the fields only
   the previous writer owns and ours does not render, and sets what ours renders: the object never
   passes through an invalid state; fields the API server defaults come back with the same values;
2. the usual forced server-side apply;
3. a JSON patch of `metadata.managedFields` without the previous writer's entries, so ours owns
   what it renders.
Fields other managers own (a label someone set, `kubectl rollout restart`'s annotation), all of
`metadata` and `status` stay. Pure: `kube/writer.py` sends the patches, `gpu-operator adopt`
sends them as a server-side dry run.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

# The field manager NVIDIA's operator writes with (its binary's name), and ours.
PREVIOUS_WRITER: Final = "gpu-operator"
# Lists the API server merges by key under server-side apply (x-kubernetes-list-map-keys), by
# field name; any other list is atomic: the applied list replaces the live one.
LIST_MAP_KEYS: Final[dict[str, tuple[str, ...]]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "volumeDevices": ("devicePath",),
    "imagePullSecrets": ("name",),
    "hostAliases": ("ip",),
    "resourceClaims": ("name",),
    "schedulingGates": ("name",),
    "resizePolicy": ("resourceName",),
    "topologySpreadConstraints": ("topologyKey", "whenUnsatisfiable"),
    "ownerReferences": ("uid",),
}
# Key fields the API server defaults, so an item without one matches the defaulted value.
KEY_DEFAULTS: Final[dict[str, Any]] = {"protocol": "TCP"}
# Top-level fields that are not an object's content.
NOT_CONTENT: Final = frozenset({"apiVersion", "kind", "metadata", "status"})
SELF: Final = "."

Path = tuple[str, ...]
_MISSING: Any = object()


def list_keys(name: str | None, items: Sequence[Any]) -> tuple[str, ...] | None:
    """The keys a list of this name is merged by, or None for an atomic list. `ports` are keyed
    by port and protocol: a container's by `containerPort`, a Service's by `port`."""
    if name == "ports":
        dicts = [i for i in items if isinstance(i, Mapping)]
        if dicts and all("containerPort" in i for i in dicts):
            return ("containerPort", "protocol")
        if dicts and all("port" in i for i in dicts):
            return ("port", "protocol")
        return None
    return LIST_MAP_KEYS.get(name or "")


def _key_of(item: Any, keys: tuple[str, ...]) -> tuple[Any, ...] | None:
    if not isinstance(item, Mapping):
        return None
    return tuple(json.dumps(item.get(k, KEY_DEFAULTS.get(k))) for k in keys)


def previous_entries(
    obj: Mapping[str, Any], manager: str = PREVIOUS_WRITER
) -> list[dict[str, Any]]:
    """The managedFields entries of the previous writer: `manager` updating the object itself
    (not a subresource), owning something."""
    entries = (obj.get("metadata") or {}).get("managedFields") or []
    return [
        e
        for e in entries
        if isinstance(e, dict)
        and e.get("manager") == manager
        and e.get("operation") == "Update"
        and not e.get("subresource")
        and e.get("fieldsV1")
    ]


def has_previous_writer(obj: Mapping[str, Any], manager: str = PREVIOUS_WRITER) -> bool:
    return bool(previous_entries(obj, manager))


def kept_entries(obj: Mapping[str, Any], manager: str = PREVIOUS_WRITER) -> list[dict[str, Any]]:
    """The managedFields entries that stay once the previous writer's are dropped."""
    dropped = [id(e) for e in previous_entries(obj, manager)]
    entries = (obj.get("metadata") or {}).get("managedFields") or []
    return [e for e in entries if id(e) not in dropped]


def _union(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for key, sub in b.items():
        out[key] = _union(out[key], sub) if key in out else sub
    return out


def _tree(entries: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for entry in entries:
        fields = entry.get("fieldsV1")
        if isinstance(fields, Mapping):
            found = _union(found, fields)
    return found


def _resolve(value: Any, element: str, parent: str | None) -> tuple[Any, Any]:
    """The child a FieldsV1 path element names in `value`: (its key or index, the child), with
    the child _MISSING when absent."""
    kind, _, text = element.partition(":")
    if kind == "f":
        if isinstance(value, Mapping) and text in value:
            return text, value[text]
        return text, _MISSING
    if not isinstance(value, list):
        return None, _MISSING
    if kind == "k":
        try:
            wanted = json.loads(text)
        except ValueError:
            return None, _MISSING
        if not isinstance(wanted, dict):
            return None, _MISSING
        for index, item in enumerate(value):
            if isinstance(item, Mapping) and all(
                item.get(k, KEY_DEFAULTS.get(k)) == v for k, v in wanted.items()
            ):
                return index, item
        return None, _MISSING
    if kind == "v":
        try:
            wanted = json.loads(text)
        except ValueError:
            return None, _MISSING
        for index, item in enumerate(value):
            if item == wanted:
                return index, item
        return None, _MISSING
    return None, _MISSING  # by index: an atomic list's item, replaced whole or kept whole


def _removals(
    dropped: Mapping[str, Any],
    kept: Mapping[str, Any] | None,
    live: Any,
    desired: Any,
    path: Path,
    parent: str | None,
) -> list[Path]:
    found: list[Path] = []
    for element, sub in dropped.items():
        if element == SELF:
            continue
        _, have = _resolve(live, element, parent)
        if have is _MISSING:
            continue
        _, want = (
            _resolve(desired, element, parent) if desired is not _MISSING else (None, _MISSING)
        )
        other = kept.get(element) if kept is not None else None
        name = element[2:] if element.startswith("f:") else parent
        if want is _MISSING and other is None:
            found.append((*path, element))  # only the previous writer has it; ours does not
        elif isinstance(sub, Mapping) and any(k != SELF for k in sub):
            found += _removals(sub, other, have, want, (*path, element), name)
    return found


def removals(
    desired: Mapping[str, Any], live: Mapping[str, Any], manager: str = PREVIOUS_WRITER
) -> list[Path]:
    """FieldsV1 paths of the live object's content that only the previous writer owns and ours
    does not render (metadata and status are left alone)."""
    dropped = _tree(previous_entries(live, manager))
    kept = _tree(kept_entries(live, manager))
    content = {k: v for k, v in dropped.items() if k[2:] not in NOT_CONTENT}
    return _removals(content, kept, live, desired, (), None)


def _remove(obj: Any, path: Path) -> None:
    value, parent = obj, None
    for element in path[:-1]:
        _, value = _resolve(value, element, parent)
        if value is _MISSING:
            return
        parent = element[2:] if element.startswith("f:") else parent
    where, _ = _resolve(value, path[-1], parent)
    if where is None:
        return
    if isinstance(value, dict) and isinstance(where, str):
        del value[where]
    elif isinstance(value, list) and isinstance(where, int):
        del value[where]


def merge(live: Any, desired: Any, name: str | None = None) -> Any:
    """`desired` merged into `live` as server-side apply merges a configuration: maps field by
    field, keyed lists item by item (in the library's merged order), anything else replaced."""
    if isinstance(desired, Mapping) and isinstance(live, Mapping):
        out = dict(live)
        for key, value in desired.items():
            out[key] = merge(live[key], value, key) if key in live else copy.deepcopy(value)
        return out
    if isinstance(desired, list) and isinstance(live, list):
        keys = list_keys(name, [*desired, *live])
        if keys is not None:
            return _merge_list(live, desired, lambda item: _key_of(item, keys), name)
    return copy.deepcopy(desired)


def _merge_list(
    live: list[Any], desired: list[Any], key: Callable[[Any], Any], name: str | None
) -> list[Any]:
    # Structured-merge-diff's order: live items keep their places, applied items follow the
    # applier's order, and items in both move to where the applier puts them.
    r_keys: list[Any] = []
    applied: dict[Any, Any] = {}
    for item in desired:
        k = key(item)
        if k is None or k in applied:
            continue
        applied[k] = item
        r_keys.append(k)
    l_keys: list[Any] = []
    have: dict[Any, Any] = {}
    for index, item in enumerate(live):
        k = key(item)
        k = ("#", index) if k is None else k
        have.setdefault(k, item)
        l_keys.append(k)
    shared = [k for k in r_keys if k in have]
    next_shared = shared[0] if shared else None
    shared_at = 1
    done: set[Any] = set()
    out: list[Any] = []
    li = ri = 0
    while li < len(l_keys) or ri < len(r_keys):
        if li < len(l_keys) and ri < len(r_keys):
            k = l_keys[li]
            if k == r_keys[ri]:
                done.add(k)
                out.append(merge(have[k], applied[k], name))
                li += 1
                ri += 1
                next_shared = shared[shared_at] if shared_at < len(shared) else None
                shared_at += 1
                continue
            if k in applied and next_shared is not None and next_shared != k:
                li += 1
                continue
        if li < len(l_keys):
            k = l_keys[li]
            if k not in applied:
                out.append(copy.deepcopy(live[li]))
                li += 1
                continue
            if k in done:
                li += 1
        if ri < len(r_keys):
            k = r_keys[ri]
            done.add(k)
            out.append(merge(have[k], applied[k], name) if k in have else copy.deepcopy(applied[k]))
            ri += 1
            if next_shared is not None and next_shared == k:
                next_shared = shared[shared_at] if shared_at < len(shared) else None
                shared_at += 1
    return out


def path_text(path: Path) -> str:
    """A FieldsV1 path as `spec.template.spec.containers[x].env[NAME].valueFrom`."""
    out = ""
    for element in path:
        kind, _, text = element.partition(":")
        if kind == "f":
            out += f".{text}" if out else text
            continue
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        if kind == "k" and isinstance(value, dict):
            shown = [str(v) for k, v in value.items() if k not in KEY_DEFAULTS]
            out += f"[{','.join(shown) or ','.join(str(v) for v in value.values())}]"
        else:
            out += f"[{value}]"
    return out


@dataclass(frozen=True)
class Takeover:
    """What taking an object over writes before the usual apply.

    `patch`: the JSON patch of the object's content (None when the content stays as it is);
    `content`: the object's content after it; `removed`: the fields it removes."""

    patch: list[dict[str, Any]] | None
    content: dict[str, Any]
    removed: tuple[str, ...]


def _pointer(key: str) -> str:
    return "/" + key.replace("~", "~0").replace("/", "~1")


def plan(
    desired: Mapping[str, Any], live: Mapping[str, Any], manager: str = PREVIOUS_WRITER
) -> Takeover | None:
    """The content patch that takes `live` over from its previous writer, or None when no
    previous writer owns anything in it."""
    if not has_previous_writer(live, manager):
        return None
    gone = removals(desired, live, manager)
    reduced = {k: copy.deepcopy(v) for k, v in live.items() if k not in NOT_CONTENT}
    for path in gone:
        _remove(reduced, path)
    wanted = {k: v for k, v in desired.items() if k not in NOT_CONTENT}
    content = merge(reduced, wanted)
    ops: list[dict[str, Any]] = []
    before = {k: v for k, v in live.items() if k not in NOT_CONTENT}
    for key in sorted({*before, *content}):
        if key not in content:
            ops.append({"op": "remove", "path": _pointer(key)})
        elif key not in before:
            ops.append({"op": "add", "path": _pointer(key), "value": content[key]})
        elif content[key] != before[key]:
            ops.append({"op": "replace", "path": _pointer(key), "value": content[key]})
    version = str((live.get("metadata") or {}).get("resourceVersion") or "")
    patch = None
    if ops:
        patch = [{"op": "test", "path": "/metadata/resourceVersion", "value": version}, *ops]
    return Takeover(patch, content, tuple(path_text(p) for p in gone))


def managed_fields_patch(
    obj: Mapping[str, Any], manager: str = PREVIOUS_WRITER
) -> list[dict[str, Any]] | None:
    """The JSON patch that drops the previous writer's managedFields entries from `obj` (as it
    stands after our apply), or None when it has none."""
    if not has_previous_writer(obj, manager):
        return None
    meta = obj.get("metadata") or {}
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")},
        {"op": "replace", "path": "/metadata/managedFields", "value": kept_entries(obj, manager)},
    ]


__all__ = [
    "LIST_MAP_KEYS",
    "PREVIOUS_WRITER",
    "Takeover",
    "has_previous_writer",
    "kept_entries",
    "list_keys",
    "managed_fields_patch",
    "merge",
    "path_text",
    "plan",
    "previous_entries",
    "removals",
]
