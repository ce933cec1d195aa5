"""Reading manifest files: YAML or JSON, several documents, `-` for stdin."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pydantic
import yaml

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ManifestError(Exception):
    """Input that cannot be read as manifests at all (missing file, not YAML or JSON)."""


def parse(text: str, source: str) -> list[dict[str, Any]]:
    """Every object in a YAML/JSON text; `kind: List` objects are expanded into their items."""
    stripped = text.lstrip()
    try:
        if stripped.startswith(("{", "[")):
            loaded: list[Any] = [json.loads(text)]
        else:
            loaded = list(yaml.load_all(text, Loader=_Loader))
    except json.JSONDecodeError as err:
        raise ManifestError(f"{source}: not valid JSON: {err.msg} at line {err.lineno}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ManifestError(f"{source}: not valid YAML{where}: {problem}") from None
    documents: list[dict[str, Any]] = []
    for index, doc in enumerate(loaded, start=1):
        if doc is None:
            continue
        if isinstance(doc, list):
            items: list[Any] = doc
        elif isinstance(doc, dict) and doc.get("kind") == "List":
            items = doc.get("items") or []
        else:
            items = [doc]
        for item in items:
            if not isinstance(item, dict):
                raise ManifestError(
                    f"{source}: document {index} is not an object (got {type(item).__name__})"
                )
            documents.append(item)
    return documents


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
    if source == "-":
        return parse(sys.stdin.read(), "<stdin>")
    return parse(_read_text(source), source)


def load_one(source: str | Path) -> Any:
    """The one YAML or JSON document of a configuration file (None when it is empty)."""
    text = _read_text(source)
    try:
        if text.lstrip().startswith("{"):
            return json.loads(text)
        return yaml.load(text, Loader=_Loader)
    except json.JSONDecodeError as err:
        raise ManifestError(f"{source}: not valid JSON: {err.msg} at line {err.lineno}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ManifestError(f"{source}: not valid YAML{where}: {problem}") from None


def field_errors(err: pydantic.ValidationError) -> str:
    """Every error of a pydantic validation as `field.path: message`, joined by "; "."""
    parts = []
    for error in err.errors():
        loc = [str(p) for p in error["loc"] if not str(p).startswith(("function-", "literal["))]
        message = str(error["msg"]).removeprefix("Value error, ")
        parts.append(f"{'.'.join(loc) or '(top level)'}: {message}")
    return "; ".join(parts)
