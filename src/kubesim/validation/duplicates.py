"""JSON and YAML body loading that notices duplicate keys (for fieldValidation), last one wins.

The server's decoder reports each duplicated field by its path from the root (`spec.replicas`,
`spec.containers[0].name`). Python's loaders build objects bottom-up, so objects with a repeated
key are marked while loading and the paths are worked out in one pass afterwards.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from kubesim import schema


class _Marked(dict[str, Any]):
    """A JSON object that had repeated keys (only ever seen while a body is being loaded)."""

    repeated: list[str]


# How many objects with repeated keys have been loaded (a body without any skips _unmark).
_MARKED = [0]


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = dict(pairs)
    if len(result) == len(pairs):
        return result  # the usual case, decided in C
    result = {}
    repeated: list[str] = []
    for key, value in pairs:
        if key in result and key not in repeated:
            repeated.append(key)
        result[key] = value
    marked = _Marked(result)
    marked.repeated = repeated
    _MARKED[0] += 1
    return marked


def _unmark(value: Any, path: str, found: list[str]) -> Any:
    if isinstance(value, dict):
        if isinstance(value, _Marked):
            found.extend(f"{path}.{k}" if path else k for k in value.repeated)
            value = dict(value)
        for key in value:
            value[key] = _unmark(value[key], f"{path}.{key}" if path else key, found)
        return value
    if isinstance(value, list):
        return [_unmark(item, f"{path}[{index}]", found) for index, item in enumerate(value)]
    return value


def _record(found: list[str]) -> None:
    sink = schema.DUPLICATES.get()
    if sink is not None:
        sink.extend(found)


def loads_json(body: bytes | str) -> Any:
    """Parse JSON, recording the paths of duplicated keys in the request's DUPLICATES sink."""
    marked = _MARKED[0]
    value = json.loads(body, object_pairs_hook=_pairs)
    if _MARKED[0] == marked:
        return value  # no repeated keys: nothing to unmark or report
    found: list[str] = []
    value = _unmark(value, "", found)
    _record(found)
    return value


class _Loader(yaml.SafeLoader):
    """A safe YAML loader whose mappings note repeated keys."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> Any:
    loader.flatten_mapping(node)
    pairs = [
        (loader.construct_object(k, deep=deep), loader.construct_object(v, deep=deep))
        for k, v in node.value
    ]
    if all(isinstance(k, str) for k, _ in pairs):
        return _pairs(pairs)
    return dict(pairs)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def loads_yaml(body: bytes | str) -> Any:
    """Parse YAML safely, recording the paths of duplicated keys like `loads_json`."""
    found: list[str] = []
    value = _unmark(yaml.load(body, Loader=_Loader), "", found)  # a SafeLoader subclass
    _record(found)
    return value
