"""Reading manifest files: YAML or JSON, several documents, `-` for stdin."""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic
import yaml

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# Limits on one document, so that nothing downstream (PyYAML's composer, which recurses in C and
# segfaults near 30,000 levels; deepcopy; pydantic) can run out of stack or memory. Real
# manifests nest about 10 levels and hold a few thousand values.
MAX_DEPTH = 100
MAX_VALUES = 1_000_000
# The API server reads a JSON number as a 64-bit integer or, failing that, a 64-bit float, and
# refuses one neither holds (Go's strconv: "value out of range"); JSON has no NaN or infinities
# and kubectl's YAML-to-JSON conversion cannot write them. Python would read 1e999 as inf and
# refuses integers of more than 4,300 digits with a ValueError of its own.
FLOAT_MAX = sys.float_info.max

_MERGE_TAG = "tag:yaml.org,2002:merge"
_CONTAINER_EVENTS = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_END_EVENTS = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


class ManifestError(Exception):
    """Input that cannot be read as manifests at all (missing file, not YAML or JSON)."""


@dataclass
class Document:
    """One object read from a manifest, with the problems found while decoding it."""

    obj: dict[str, Any]
    # (field path, message): duplicate fields, which the API server's strict decoding rejects.
    problems: list[tuple[str, str]] = field(default_factory=list)


class _StrictLoader(_Loader):  # type: ignore[misc,valid-type]
    """A safe loader that records duplicate keys and turns bad tagged values into YAML errors."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        # id(dict) -> [(key, line, first line)] for every mapping with a key given twice.
        self.duplicates: dict[int, list[tuple[str, int, int]]] = {}

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError, IndexError):
            # `!!float x`, `!!int x`, `!!bool maybe`, `!!timestamp x`: the tag's constructor fails.
            shown = node.value if isinstance(node.value, str) else "..."
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"cannot read {_clip(shown)!r} as {_short_tag(node.tag)}",
                node.start_mark,
            ) from None


def _construct_map(loader: _StrictLoader, node: yaml.Node) -> Iterator[dict[Any, Any]]:
    if not isinstance(node, yaml.MappingNode):
        # `!!map [1, 2]`, `!!map 5`: raised before the first yield, inside construct_object.
        raise yaml.constructor.ConstructorError(
            None, None, f"!!map needs a mapping, found {_node_kind(node)}", node.start_mark
        )
    data: dict[Any, Any] = {}
    yield data
    # Keys merged in with `<<` may be overridden; only keys written twice are duplicates.
    explicit = [key for key, _ in node.value if key.tag != _MERGE_TAG]
    data.update(loader.construct_mapping(node))
    first: dict[tuple[str, str], int] = {}
    for key in explicit:
        if not isinstance(key, yaml.ScalarNode):
            continue
        line = key.start_mark.line + 1
        if (key.tag, key.value) in first:
            seen = first[(key.tag, key.value)]
            loader.duplicates.setdefault(id(data), []).append((key.value, line, seen))
        else:
            first[(key.tag, key.value)] = line


def _node_kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.SequenceNode):
        return "a sequence"
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    return f"the scalar {_clip(str(node.value))!r}"


class NumberError(ValueError):
    """A number the API server cannot hold (out of float64's range, NaN or an infinity)."""

    def __init__(self, text: str, why: str) -> None:
        super().__init__(f"{why}; quote it if it is meant as a string")
        self.text = text


def _shown_number(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text):,} characters)"


def _out_of_range(text: str) -> NumberError:
    return NumberError(
        text,
        f"the number {_shown_number(text)} is out of range (the API server holds 64-bit "
        "integers and floats, at most about 1.8e308)",
    )


def _not_a_number(text: str) -> NumberError:
    return NumberError(
        text,
        f"{text} is not a number JSON can hold (kubectl and the API server refuse NaN and "
        "infinities)",
    )


def _checked_int(text: str) -> int:
    """A JSON integer literal within float64's range (NumberError otherwise, never Python's
    4,300-digit ValueError)."""
    if len(text) > 400:  # 310 digits already pass 1.8e308
        raise _out_of_range(text)
    value = int(text)
    if abs(value) > FLOAT_MAX:
        raise _out_of_range(text)
    return value


def _checked_float(text: str) -> float:
    """A JSON float literal that is finite as a float64 (`1e999` is NumberError, not inf)."""
    value = float(text)
    if not math.isfinite(value):
        raise _out_of_range(text)
    return value


def _json_constant(text: str) -> Any:
    raise _not_a_number(text)


def json_loads(text: str, **hooks: Any) -> Any:
    """json.loads that refuses numbers the API server cannot hold (NumberError)."""
    return json.loads(
        text,
        parse_int=_checked_int,
        parse_float=_checked_float,
        parse_constant=_json_constant,
        **hooks,
    )


def _number_line(text: str, literal: str) -> int:
    """The line of a number literal in JSON text (its first occurrence outside a word)."""
    found = re.search(rf"(?<![\w.\-+]){re.escape(literal)}(?![\w.])", text)
    return text.count("\n", 0, found.start()) + 1 if found else 0


def _construct_int(loader: _StrictLoader, node: yaml.Node) -> int:
    try:
        value = loader.construct_yaml_int(node)
    except ValueError as err:
        if "digits" not in str(err):
            raise  # not an integer at all (`!!int x`): construct_object says so
        # More than 4,300 decimal digits: Python's int() refuses them.
        raise _number_error(node, _out_of_range(str(node.value))) from None
    if abs(value) > FLOAT_MAX:
        raise _number_error(node, _out_of_range(str(node.value)))
    return int(value)


def _construct_float(loader: _StrictLoader, node: yaml.Node) -> float:
    value = float(loader.construct_yaml_float(node))
    if math.isnan(value) or (math.isinf(value) and "inf" in str(node.value).lower()):
        raise _number_error(node, _not_a_number(str(node.value)))
    if not math.isfinite(value):
        raise _number_error(node, _out_of_range(str(node.value)))
    return value


def _number_error(node: yaml.Node, err: NumberError) -> yaml.constructor.ConstructorError:
    return yaml.constructor.ConstructorError(None, None, str(err), node.start_mark)


_StrictLoader.add_constructor("tag:yaml.org,2002:map", _construct_map)
_StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)


def _short_tag(tag: str) -> str:
    return tag.replace("tag:yaml.org,2002:", "!!", 1)


def _clip(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _check_yaml_depth(text: str, source: str) -> None:
    """Refuse YAML nested deeper than MAX_DEPTH before the (recursive) composer sees it.

    libyaml 0.2.5 as bundled since PyYAML 6.0.4 has a flow-nesting limit of its own (1,000), and
    its scanner reads up to 1,024 characters ahead of the events for a possible implicit key, so
    on `[[[[...` it stops with "exceeded maximum nesting depth" before our count reaches
    MAX_DEPTH. The pure-Python parser has no such limit: walking its events reports the same
    level, line and column whichever PyYAML is installed.
    """
    try:
        _walk_depth(yaml.parse(text, Loader=_Loader), source)
    except yaml.scanner.ScannerError as err:
        if "nesting depth" not in str(err.problem):
            raise
        _walk_depth(yaml.parse(text, Loader=yaml.SafeLoader), source)
        raise  # unreachable: the parser only stops past 1,000 levels, far beyond MAX_DEPTH


def _walk_depth(events: Iterator[yaml.Event], source: str) -> None:
    # The event parsers keep their own stack, so walking the events cannot overflow.
    depth = 0
    for event in events:
        if isinstance(event, _CONTAINER_EVENTS):
            depth += 1
            if depth > MAX_DEPTH:
                mark = event.start_mark
                where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
                raise ManifestError(f"{source}: {where}nested more than {MAX_DEPTH} levels deep")
        elif isinstance(event, _END_EVENTS):
            depth -= 1


def _children(value: Any) -> list[tuple[Any, Any]]:
    if isinstance(value, dict):
        return list(value.items())
    if isinstance(value, list):
        return list(enumerate(value))
    return []


def _measure(
    root: Any, source: str, index: int, duplicates: dict[int, list[tuple[str, int, int]]]
) -> list[tuple[tuple[Any, ...], str]]:
    """Check one decoded document's depth, size and cycles without recursion; its duplicates.

    Aliases can share a value many times (and make cycles), so heights and sizes are memoized
    per object: a "billion laughs" document is refused by its expanded size in linear time.
    """
    if not isinstance(root, dict | list):
        return []  # a bare scalar: parse_documents reports it as not an object
    height: dict[int, int] = {}
    size: dict[int, int] = {}
    pending: set[int] = set()
    problems: list[tuple[tuple[Any, ...], str]] = []
    stack: list[tuple[Any, bool, tuple[Any, ...]]] = [(root, False, ())]
    while stack:
        value, done, loc = stack.pop()
        key = id(value)
        if done:
            children = [c for _, c in _children(value) if isinstance(c, dict | list)]
            pending.discard(key)
            height[key] = 1 + max((height[id(c)] for c in children), default=0)
            size[key] = 1 + len(value) + sum(size[id(c)] - 1 for c in children)
            if height[key] > MAX_DEPTH:
                raise ManifestError(
                    f"{source}: document {index}: {_format_loc(loc) or '(top level)'}: "
                    f"nested more than {MAX_DEPTH} levels deep"
                )
            if size[key] > MAX_VALUES:
                raise ManifestError(
                    f"{source}: document {index}: more than {MAX_VALUES:,} values once aliases "
                    "are expanded"
                )
            continue
        if key in height:
            continue
        if key in pending:
            raise ManifestError(
                f"{source}: document {index}: {_format_loc(loc)}: refers to itself (an alias "
                "cycle), which JSON cannot represent"
            )
        pending.add(key)
        for name, line, seen in duplicates.get(key, []):
            problems.append(((*loc, name), f"duplicate field (line {line}, first at line {seen})"))
        stack.append((value, True, loc))
        stack.extend(
            (child, False, (*loc, name))
            for name, child in _children(value)
            if isinstance(child, dict | list)
        )
    return problems


def _load(text: str, source: str) -> list[tuple[Any, list[tuple[tuple[Any, ...], str]]]]:
    """The decoded documents of a text, each with its duplicate-field problems."""
    stripped = text.lstrip()
    out = []
    try:
        if stripped.startswith(("{", "[")):
            json_dupes: dict[int, list[tuple[str, int, int]]] = {}

            def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
                obj = dict(items)
                if len(obj) < len(items):
                    names = [k for k, _ in items]
                    json_dupes[id(obj)] = [
                        (k, 0, 0) for k in dict.fromkeys(names) if names.count(k) > 1
                    ]
                return obj

            try:
                doc = json_loads(text, object_pairs_hook=pairs)
            except NumberError as err:
                line = _number_line(text, err.text)
                where = f" at line {line}" if line else ""
                raise ManifestError(f"{source}: not valid JSON{where}: {err}") from None
            found = _measure(doc, source, 1, json_dupes)
            out.append((doc, [(loc, "duplicate field") for loc, _ in found]))
            return out
        _check_yaml_depth(text, source)
        loader = _StrictLoader(text)
        try:
            index = 0
            while loader.check_node():
                index += 1
                doc = loader.construct_document(loader.get_node())
                out.append((doc, _measure(doc, source, index, loader.duplicates)))
        finally:
            loader.dispose()
    except json.JSONDecodeError as err:
        raise ManifestError(f"{source}: not valid JSON: {err.msg} at line {err.lineno}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ManifestError(f"{source}: not valid YAML{where}: {problem}") from None
    except RecursionError:
        # json.loads on very deep JSON, or a long chain of YAML merge keys.
        raise ManifestError(f"{source}: nested more than {MAX_DEPTH} levels deep") from None
    return out


def parse_documents(text: str, source: str) -> list[Document]:
    """Every object in a YAML/JSON text with its decoding problems; `kind: List` is expanded."""
    documents: list[Document] = []
    for index, (doc, problems) in enumerate(_load(text, source), start=1):
        if doc is None:
            continue
        if isinstance(doc, list):
            items: list[Any] = doc
            prefix: tuple[Any, ...] = ()
        elif isinstance(doc, dict) and doc.get("kind") == "List":
            items = doc.get("items") or []
            prefix = ("items",)
            if not isinstance(items, list):
                raise ManifestError(
                    f"{source}: document {index}: items: expected a list, "
                    f"got {type(items).__name__}"
                )
        else:
            items = [doc]
            prefix = ()
        found: list[list[tuple[str, str]]] = [[] for _ in items]
        for loc, message in problems:
            if not prefix and not isinstance(doc, list):
                found[0].append((_format_loc(loc), message))
                continue
            # In a list of objects, a problem belongs to the item its path goes through.
            rest = loc[len(prefix) :]
            if loc[: len(prefix)] != prefix or len(rest) < 2 or not isinstance(rest[0], int):
                raise ManifestError(f"{source}: document {index}: {_format_loc(loc)}: {message}")
            found[rest[0]].append((_format_loc(rest[1:]), message))
        for position, item in enumerate(items):
            if not isinstance(item, dict):
                raise ManifestError(
                    f"{source}: document {index} is not an object (got {type(item).__name__})"
                )
            documents.append(Document(item, found[position]))
    return documents


def parse(text: str, source: str) -> list[dict[str, Any]]:
    """Every object in a YAML/JSON text; `kind: List` objects are expanded into their items."""
    return [document.obj for document in parse_documents(text, source)]


def _read_text(source: str | Path) -> str:
    try:
        return Path(source).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise ManifestError(f"{source}: is a directory, expected a file") from None
    except UnicodeDecodeError:
        raise ManifestError(f"{source}: not a text file (invalid UTF-8)") from None
    except OSError as err:
        raise ManifestError(f"{source}: cannot read: {err.strerror}") from None


def read(source: str) -> list[dict[str, Any]]:
    """Read and parse a file, or standard input for `-`."""
    return [document.obj for document in read_documents(source)]


def read_documents(source: str) -> list[Document]:
    """Read and parse a file, or standard input for `-`, keeping each object's decode problems."""
    if source == "-":
        return parse_documents(sys.stdin.read(), "<stdin>")
    return parse_documents(_read_text(source), source)


def load_one(source: str | Path) -> Any:
    """The one YAML or JSON document of a configuration file (None when it is empty)."""
    return load_text(_read_text(source), str(source))


def load_text(text: str, source: str) -> Any:
    """The one YAML or JSON document of a configuration text (None when it is empty), read
    with the limits and checks of `parse` (nesting, alias expansion, tags, numbers); duplicate
    keys are not reported (the last one wins, as in the tools that read these files)."""
    documents = _load(text, source)
    if len(documents) > 1:
        raise ManifestError(f"{source}: expected one document, found {len(documents)}")
    return documents[0][0] if documents else None


def field_errors(err: pydantic.ValidationError) -> str:
    """Every error of a pydantic validation as `field.path: message`, joined by "; "."""
    parts = []
    for error in err.errors():
        loc = [str(p) for p in error["loc"] if not str(p).startswith(("function-", "literal["))]
        message = str(error["msg"]).removeprefix("Value error, ")
        parts.append(f"{'.'.join(loc) or '(top level)'}: {message}")
    return "; ".join(parts)
