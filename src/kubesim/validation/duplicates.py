"""JSON and YAML body loading that notices duplicate keys (for fieldValidation), last one wins.

The server's decoder reports each duplicated field by its path from the root (`spec.replicas`,
`spec.containers[0].name`). Python's loaders build objects bottom-up, so objects with a repeated
key are marked while loading and the paths are worked out in one pass afterwards. JSON bodies
that provably repeat no key (most of them) are decoded by msgspec instead.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
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


_DECODER = msgspec.json.Decoder()
_SLOW: Any = object()
# A colon preceded by whitespace: without one, every member's colon follows its key's quote.
_SPACED_COLONS = (b" :", b"\t:", b"\n:", b"\r:")


def _key_count(value: Any) -> int:
    """How many members the objects of a decoded JSON value hold, at every depth."""
    count = 0
    pending = [value]
    while pending:
        current = pending.pop()
        if type(current) is dict:
            count += len(current)
            current = current.values()
        for item in current:
            if type(item) is dict or type(item) is list:
                pending.append(item)
    return count


def _without_repeats(body: bytes | str) -> Any:
    """The body decoded by msgspec (in C, several times faster than json with a pairs hook) when
    it provably repeats no key, else `_SLOW`."""
    # Why this is exact: every object member has a colon after its key, so a body with no more
    # colons than the decoded value has keys lost no member to a repeated key; colons inside
    # strings (timestamps) only add to the count. The same holds for `":` pairs when no colon
    # follows whitespace (then each member's colon follows its key's closing quote). Bodies
    # msgspec refuses but json takes (NaN, a byte-order mark, lone surrogates, numbers beyond a
    # double) go json's way, so their values and error messages are json's; where both decode,
    # the values are equal, floats included.
    if not isinstance(body, bytes):
        return _SLOW
    try:
        value = _DECODER.decode(body)
    except (msgspec.DecodeError, ValueError):
        return _SLOW
    if type(value) is not dict and type(value) is not list:
        return value
    keys = _key_count(value)
    if body.count(b":") == keys:
        return value
    if body.count(b'":') == keys and not any(spaced in body for spaced in _SPACED_COLONS):
        return value
    return _SLOW


def loads_json(body: bytes | str) -> Any:
    """Parse JSON, recording the paths of duplicated keys in the request's DUPLICATES sink."""
    fast = _without_repeats(body)
    if fast is not _SLOW:
        return fast
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
