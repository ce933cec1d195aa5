"""Indexes that serve label- and field-selected lists without scanning every object of a kind.

Each resource kind gets, on its first selected list, an index by label `key=value` and one by
the value of each field path registered for it (`register_field`). A list's equality and `in`
label requirements and its equality field requirements on indexed paths narrow the candidates to
the smallest such set; every candidate is then matched against the whole selector, so results
are exactly those of a scan. Selectors with nothing indexable (`!=`, `notin`, `exists`, a field
path not registered) fall back to a scan of the namespace's (or the kind's) objects.

The real API server's watch cache indexes pods by `spec.nodeName` (what every kubelet lists and
watches); that is registered here. Other modules register theirs (DRA's ResourceSlices:
`spec.nodeName`, `spec.driver`) before the store indexes the kind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kubesim import selectors

Key = tuple[str, str]
ObjKey = tuple[str, str]

_FIELDS: dict[Key, tuple[str, ...]] = {("", "pods"): ("spec.nodeName",)}


def register_field(key: Key, path: str) -> None:
    """Index `path` (a dotted field path, as in a field selector) for the kind `key`
    ((group, plural)). Call it at import time: a kind already indexed keeps its paths."""
    paths = _FIELDS.get(key, ())
    if path not in paths:
        _FIELDS[key] = (*paths, path)


def indexed_fields(key: Key) -> tuple[str, ...]:
    """The field paths indexed for a kind."""
    return _FIELDS.get(key, ())


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    labels = obj["metadata"].get("labels")
    return labels if isinstance(labels, Mapping) else {}


class KindIndex:
    """The label and field indexes of one kind, kept in step with every commit."""

    __slots__ = ("fields", "labels")

    def __init__(self, paths: Iterable[str]) -> None:
        self.labels: dict[tuple[str, str], set[ObjKey]] = {}
        self.fields: dict[str, dict[str, set[ObjKey]]] = {path: {} for path in paths}

    def add(self, obj_key: ObjKey, obj: Mapping[str, Any]) -> None:
        """Index a new object."""
        for pair in _labels(obj).items():
            self.labels.setdefault(pair, set()).add(obj_key)
        for path, values in self.fields.items():
            values.setdefault(selectors.field_value(obj, path), set()).add(obj_key)

    def remove(self, obj_key: ObjKey, obj: Mapping[str, Any]) -> None:
        """Forget an object that is gone."""
        for pair in _labels(obj).items():
            _discard(self.labels, pair, obj_key)
        for path, values in self.fields.items():
            _discard(values, selectors.field_value(obj, path), obj_key)

    def update(self, obj_key: ObjKey, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        """Move an updated object's entries (most updates change neither labels nor fields)."""
        old_labels, new_labels = _labels(old), _labels(new)
        if old_labels != new_labels:
            for pair in old_labels.items():
                if new_labels.get(pair[0]) != pair[1]:
                    _discard(self.labels, pair, obj_key)
            for pair in new_labels.items():
                if old_labels.get(pair[0]) != pair[1]:
                    self.labels.setdefault(pair, set()).add(obj_key)
        for path, values in self.fields.items():
            before = selectors.field_value(old, path)
            after = selectors.field_value(new, path)
            if before != after:
                _discard(values, before, obj_key)
                values.setdefault(after, set()).add(obj_key)

    def candidates(
        self, labels: selectors.LabelSelector, fields: selectors.FieldSelector
    ) -> set[ObjKey] | None:
        """The smallest set of objects that can match, or None when nothing narrows it."""
        best: set[ObjKey] | None = None
        for requirement in labels.requirements:
            if requirement.op != "In":
                continue
            found: set[ObjKey] = set()
            for value in requirement.values:
                found |= self.labels.get((requirement.key, value), set())
            if best is None or len(found) < len(best):
                best = found
        for path, equal, value in fields.clauses:
            values = self.fields.get(path)
            if not equal or values is None:
                continue
            found = values.get(value, set())
            if best is None or len(found) < len(best):
                best = found
        return best


def _discard(index: dict[Any, set[ObjKey]], value: Any, obj_key: ObjKey) -> None:
    holders = index.get(value)
    if holders is not None:
        holders.discard(obj_key)
        if not holders:
            del index[value]
