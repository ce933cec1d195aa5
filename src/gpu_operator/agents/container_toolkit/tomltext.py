"""TOML as text: statements with their spans, so edits touch only the lines we own.

A node's runtime config is somebody else's file. Rather than re-serialising it (which reflows
comments, blank lines and quoting), the editors read it with `tomllib` for meaning and change it
as text: whole statements are inserted or replaced, and every statement we add carries a marker
comment (replaced ones also carry the original text), so reverting needs nothing but the file.
Go template lines (`{{ ... }}`, k3s/RKE2 `config.toml.tmpl`) are kept as opaque lines.

Also a small writer for the files we own entirely (drop-ins, the toolkit's own config).
"""

from __future__ import annotations

import functools
import json
import re
import tomllib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_operator.agents.container_toolkit.edits import bulk

MARK = "nvidia-container-toolkit"
BLOCK_BEGIN = f"# BEGIN {MARK}: added by the GPU operator's toolkit agent, removed on uninstall"
BLOCK_END = f"# END {MARK}"
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_MARKER = re.compile(rf"^# {re.escape(MARK)}(?:, was: (\".*\"))?\s*$")
_MOVED = re.compile(rf"^\s*# {re.escape(MARK)} moved this into its block below, was: (\".*\")\s*$")
# What the scanners jump between: quotes, brackets, comments, newlines (all else is skipped in C).
_SPECIAL = re.compile(r"[\"'\[\]{}#\n]")
_BASIC_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_LITERAL_STRING = re.compile(r"'[^'\n]*'")
_TEMPLATE_LINE = re.compile(r"^[ \t\r\f\v]*\{\{", re.MULTILINE)
# Whole statements of the common shapes, matched in one go (anything else takes the scanner):
# a key (bare or quoted parts, no escapes) = a string, a bare token (number, boolean, date) or a
# one-line array of such; a [table] or [[array]] header; each with an optional comment.
_PART = r"""(?:[A-Za-z0-9_-]+|"[^"\\\n]*"|'[^'\n]*')"""
_KEY = rf"{_PART}(?:[ \t]*\.[ \t]*{_PART})*"
_ITEM = r"""(?:"[^"\\\n]*"|'[^'\n]*'|[A-Za-z0-9_:.+-]+)"""
_VALUE = rf"""(?:{_ITEM}|\[[ \t]*(?:{_ITEM}[ \t]*,[ \t]*)*(?:{_ITEM}[ \t]*)?\])"""
_TAIL = r"[ \t]*(?P<comment>#[^\n]*)?(?:\n|\Z)"
_WHOLE_KEY = re.compile(_KEY)
_KEY_PART = re.compile(_PART)
_SIMPLE_KEYVAL = re.compile(rf"[ \t]*(?P<key>{_KEY})[ \t]*=[ \t]*{_VALUE}(?![\"'])" + _TAIL)
_SIMPLE_HEADER = re.compile(
    rf"[ \t]*\[(?P<array>\[)?[ \t]*(?P<key>{_KEY})[ \t]*\](?(array)\])" + _TAIL
)


class TomlTextError(ValueError):
    """A file we cannot edit safely; the message names the file and the reason."""


@dataclass(frozen=True)
class Statement:
    """One logical statement: a table header, a key/value (possibly over several lines), a
    comment or blank line, or a template line. `start`/`end` index the text (end after the
    newline); `comment` is where its trailing comment starts (-1: none)."""

    kind: str  # "table", "array-table", "keyval", "trivia", "template"
    start: int
    end: int
    path: tuple[str, ...] = ()  # the header's table, or the key's full path
    table: tuple[str, ...] = ()  # for keyvals: the table the statement sits in
    comment: int = -1


def newline_of(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


def is_template_line(line: str) -> bool:
    return line.lstrip().startswith("{{")


def _skip_string(text: str, i: int) -> int:
    """Index after the string starting at `i` (which is a quote)."""
    for quote in ('"""', "'''"):
        if text.startswith(quote, i):
            j = i + 3
            while True:
                k = text.find(quote, j)
                if k < 0:
                    return len(text)
                if quote == '"""' and _escaped(text, k):
                    j = k + 1
                    continue
                # A closing delimiter may be followed by up to two more quotes of content.
                while text.startswith(quote[0], k + 3):
                    k += 1
                return k + 3
    match = (_BASIC_STRING if text[i] == '"' else _LITERAL_STRING).match(text, i)
    if match is not None:
        return match.end()
    nl = text.find("\n", i)  # unterminated: the rest of the line
    return len(text) if nl < 0 else nl


def _escaped(text: str, k: int) -> bool:
    backslashes = 0
    while k - 1 - backslashes >= 0 and text[k - 1 - backslashes] == "\\":
        backslashes += 1
    return backslashes % 2 == 1


def _statement_end(text: str, i: int) -> tuple[int, int]:
    """End of the statement starting at `i` (after its newline) and its trailing comment start."""
    depth = 0
    comment = -1
    j = i
    while True:
        special = _SPECIAL.search(text, j)
        if special is None:
            break
        j = special.start()
        c = text[j]
        if c in "\"'":
            j = _skip_string(text, j)
            continue
        if c == "#":
            if depth == 0 and comment < 0:
                comment = j
            nl = text.find("\n", j)
            j = len(text) if nl < 0 else nl
            continue
        if c in "[{":
            depth += 1
        elif c in "]}":
            depth = max(0, depth - 1)
        elif c == "\n":
            if depth == 0:
                return j + 1, comment
            comment = -1  # a comment inside a multi-line array is not the statement's
        j += 1
    return len(text), comment


def _single_path(data: Mapping[str, Any]) -> tuple[str, ...]:
    path: list[str] = []
    node: Any = data
    while isinstance(node, Mapping) and len(node) == 1:
        key = next(iter(node))
        path.append(key)
        node = node[key]
    return tuple(path)


def _key_path(raw: str, name: str) -> tuple[str, ...]:
    key = raw.strip()
    try:
        return _parsed_key(key)
    except tomllib.TOMLDecodeError as err:
        raise TomlTextError(f"{name}: cannot read the key {key!r}: {err}") from None


@functools.lru_cache(maxsize=4096)
def _parsed_key(key: str) -> tuple[str, ...]:
    """A dotted key's parts: bare and escape-free quoted parts directly, the rest by `tomllib`
    (keys repeat a lot in a big config, hence the cache)."""
    if _WHOLE_KEY.fullmatch(key) is not None:
        return tuple(part[1:-1] if part[0] in "\"'" else part for part in _KEY_PART.findall(key))
    return _single_path(tomllib.loads(f"{key} = 0"))


def _header_path(raw: str, name: str) -> tuple[str, ...]:
    inner = raw.strip()
    inner = inner[2:-2] if inner.startswith("[[") else inner[1:-1]
    return _key_path(inner, name)


def key_text(stmt_text: str) -> str:
    """The key part of a key/value statement (up to the first `=` outside quotes)."""
    j = 0
    while j < len(stmt_text):
        c = stmt_text[j]
        if c in "\"'":
            j = _skip_string(stmt_text, j)
            continue
        if c == "=":
            return stmt_text[:j]
        j += 1
    return stmt_text


def statements(
    text: str, name: str = "config", *, root_only: bool = False, until: int | None = None
) -> list[Statement]:
    """Split a TOML text into statements (template lines included as opaque ones); with
    `root_only`, stop after the first table header; with `until`, after the statement that
    holds that offset."""
    with bulk():
        return _statements(text, name, root_only, until)


def _statements(text: str, name: str, root_only: bool, until: int | None) -> list[Statement]:
    out: list[Statement] = []
    table: tuple[str, ...] = ()
    i = 0
    size = len(text) if until is None else min(len(text), until + 1)
    while i < size:
        simple = _SIMPLE_KEYVAL.match(text, i)
        if simple is not None:
            end = simple.end()
            key = _key_path(simple["key"], name)
            comment = simple.start("comment")
            out.append(Statement("keyval", i, end, table + key, table, comment))
            i = end
            continue
        simple = _SIMPLE_HEADER.match(text, i)
        if simple is not None:
            end = simple.end()
            table = _key_path(simple["key"], name)
            kind = "table" if simple["array"] is None else "array-table"
            out.append(Statement(kind, i, end, table, (), simple.start("comment")))
            if root_only:
                break
            i = end
            continue
        nl = text.find("\n", i)
        line = text[i : len(text) if nl < 0 else nl + 1]
        stripped = line.strip()
        if is_template_line(line):
            out.append(Statement("template", i, i + len(line)))
            i += len(line)
            continue
        if not stripped or stripped.startswith("#"):
            out.append(Statement("trivia", i, i + len(line)))
            i += len(line)
            continue
        end, comment = _statement_end(text, i)
        body = text[i : comment if comment >= 0 else end].strip()
        if body.startswith("["):
            kind = "array-table" if body.startswith("[[") else "table"
            table = _header_path(body, name)
            out.append(Statement(kind, i, end, table, (), comment))
            if root_only:
                break
        else:
            key = _key_path(key_text(body), name)
            out.append(Statement("keyval", i, end, table + key, table, comment))
        i = end
    return out


def masked(text: str) -> str:
    """The text with template lines blanked, for `tomllib`."""
    if _TEMPLATE_LINE.search(text) is None:
        return text
    return "".join(
        "\n" if is_template_line(line) else line for line in text.splitlines(keepends=True)
    )


def parse(text: str, name: str) -> dict[str, Any]:
    """The document's meaning (template lines ignored); TomlTextError names the file."""
    try:
        with bulk():
            return tomllib.loads(masked(text))
    except tomllib.TOMLDecodeError as err:
        raise TomlTextError(f"{name}: not valid TOML: {err}") from None


def has_template_lines(text: str) -> bool:
    return _TEMPLATE_LINE.search(text) is not None


def overlaps(path: Sequence[str], prefixes: Iterable[Sequence[str]]) -> bool:
    """Whether `path` is a prefix of one of `prefixes` or extends one of them."""
    path = tuple(path)
    return any(path[: len(p)] == tuple(p)[: len(path)] for p in prefixes)


def has_content(stmts: Sequence[Statement]) -> bool:
    """Whether the statements define anything (a file of comments and blank lines does not)."""
    return any(s.kind in ("keyval", "table", "array-table") for s in stmts)


def parse_subset(
    text: str, stmts: Sequence[Statement], prefixes: Iterable[Sequence[str]], name: str
) -> dict[str, Any]:
    """The meaning of the statements whose paths overlap `prefixes` (see `overlaps`), in file
    order: the same subtrees the whole document has, at the cost of parsing only them.

    Sound because every TOML rule that relates two statements (a key defined twice, a table
    defined twice or after dotted keys made it, an inline table or array extended) relates paths
    one of which is a prefix of the other; and a key/value whose path overlaps sits in a table
    whose path overlaps, so its header comes along. Statements that overlap nothing are not read
    at all: syntax errors there are not seen (`parse` of the whole text is the gate for that)."""
    prefixes = [tuple(p) for p in prefixes]
    pieces: list[str] = []
    for s in stmts:
        if s.kind in ("keyval", "table", "array-table") and overlaps(s.path, prefixes):
            piece = text[s.start : s.end]
            pieces.append(piece if piece.endswith("\n") else piece + "\n")
    try:
        with bulk():
            return tomllib.loads("".join(pieces))
    except tomllib.TOMLDecodeError as err:
        # Name the place in the file itself: the whole text's error when it has one.
        parse(text, name)
        raise TomlTextError(f"{name}: not valid TOML: {err}") from None


def lookup(data: Mapping[str, Any], path: Sequence[str]) -> Any:
    node: Any = data
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


# ----- markers ---------------------------------------------------------------------------------


def marker_of(text: str, stmt: Statement) -> tuple[bool, str | None]:
    """Whether a statement carries our marker, and the original statement it replaced."""
    if stmt.comment < 0:
        return False, None
    comment = text[stmt.comment : stmt.end].strip()
    match = _MARKER.match(comment)
    if match is None:
        return False, None
    was = match.group(1)
    return True, (json.loads(was) if was else None)


def marked_statement(body: str, newline: str, was: str | None = None) -> str:
    """A statement we add (`was`: the statement it replaces, kept for the revert)."""
    note = f"# {MARK}" if was is None else f"# {MARK}, was: {json.dumps(was)}"
    return f"{body}  {note}{newline}"


def strip_ours(text: str, name: str) -> str:
    """The text without anything we added: our block goes (tables it displaced come back), our
    marked statements go or get their original text back."""
    if MARK not in text:
        return text
    text = _strip_block(text)
    pieces: list[str] = []
    last = 0
    # Nothing after the last marker is ours: the statements up to it are enough.
    for stmt in statements(text, name, until=text.rfind(MARK)):
        ours, was = marker_of(text, stmt)
        if stmt.kind == "trivia":
            moved = _MOVED.match(text[stmt.start : stmt.end])
            ours, was = moved is not None, json.loads(moved.group(1)) if moved else None
        if not ours:
            continue
        pieces.append(text[last : stmt.start])
        if was is not None:
            pieces.append(was)
        last = stmt.end
    pieces.append(text[last:])
    return "".join(pieces)


def _strip_block(text: str) -> str:
    lines = text.splitlines(keepends=True)
    begin = next((n for n, line in enumerate(lines) if line.strip() == BLOCK_BEGIN), None)
    if begin is None:
        return text
    end = next(
        (n for n in range(begin, len(lines)) if lines[n].strip() == BLOCK_END), len(lines) - 1
    )
    start = begin - 1 if begin > 0 and not lines[begin - 1].strip() else begin
    return "".join(lines[:start] + lines[end + 1 :])


def moved_placeholder(original: str, newline: str) -> str:
    """The line left where we took a table of the file over (the revert puts it back)."""
    return f"# {MARK} moved this into its block below, was: {json.dumps(original)}{newline}"


def block(body: str, newline: str) -> str:
    """Our block of owned tables, appended at the end of a file."""
    return "".join([newline, BLOCK_BEGIN, newline, body.replace("\n", newline), BLOCK_END, newline])


# ----- writing ---------------------------------------------------------------------------------


def key(k: str) -> str:
    return k if _BARE_KEY.match(k) else json.dumps(k)


def value(v: Any) -> str:
    """A TOML value: strings as basic strings, booleans, numbers, arrays, inline tables."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{key(k)} = {value(x)}" for k, x in v.items()) + "}"
    raise TomlTextError(f"cannot write {type(v).__name__} values to TOML")


def _tables(path: tuple[str, ...], table: Mapping[str, Any]) -> Iterator[str]:
    scalars = [(k, v) for k, v in table.items() if not isinstance(v, Mapping)]
    subs = [(k, v) for k, v in table.items() if isinstance(v, Mapping)]
    if path and (scalars or not subs):
        yield "[" + ".".join(key(k) for k in path) + "]"
        yield from (f"  {key(k)} = {value(v)}" for k, v in scalars)
        yield ""
    elif not path:
        yield from (f"{key(k)} = {value(v)}" for k, v in scalars)
        if scalars:
            yield ""
    for k, v in subs:
        yield from _tables((*path, k), v)


def dumps(data: Mapping[str, Any], prefix: Sequence[str] = ()) -> str:
    """A TOML document for nested mappings: top-level keys first, then one header per table that
    holds values (tables holding only tables get none), each path written in full."""
    lines = list(_tables(tuple(prefix), data))
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n" if lines else ""
