"""The generated message schemas (schemas.json), compiled on first use, and kind lookup.

schemas.json is written by scripts/gen_kubesim_protobuf.py from the Go struct tags compiled into
kubectl and helm. Each field is `[json name, proto number, type, flags]`; types use a small
grammar: scalars (`string`, `bool`, `int32`, `int64`, `uint32`, `uint64`, `float32`, `float64`),
`bytes` ([]byte), `*T` (pointer), `[]T` (slice), `map[K]V`, and message names
(`<go package path>.<Type>`).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

SCHEMAS = Path(__file__).with_name("schemas.json")
META = "k8s.io/apimachinery/pkg/apis/meta/v1"
TYPE_META = f"{META}.TypeMeta"
SCALARS = frozenset(
    {"string", "bool", "int32", "int64", "uint32", "uint64", "float32", "float64", "bytes"}
)
# API groups whose Go package is not k8s.io/api/<first label of the group>.
_GROUP_PACKAGES = {
    "": "k8s.io/api/core",
    "meta.k8s.io": "k8s.io/apimachinery/pkg/apis/meta",
    "apiextensions.k8s.io": "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions",
    "internal.apiserver.k8s.io": "k8s.io/api/apiserverinternal",
}


@dataclass(frozen=True)
class Type:
    """One parsed type expression: exactly one of the shapes is set."""

    scalar: str = ""
    message: str = ""
    pointer: Type | None = None
    slice: Type | None = None
    key: Type | None = None
    value: Type | None = None

    @property
    def is_map(self) -> bool:
        """A Go map (a repeated entry message {key = 1, value = 2} on the wire)."""
        return self.value is not None


@dataclass
class Field:
    """One Go struct field as the codec needs it."""

    json: str
    number: int
    type: Type
    omitempty: bool
    omitzero: bool
    inline: bool


@dataclass
class Message:
    """A Go struct: its fields in declaration order (JSON order) and by proto number."""

    name: str
    fields: list[Field]
    by_number: dict[int, Field] = field(default_factory=dict)
    wire_order: list[Field] = field(default_factory=list)
    list_wrapper: bool = False

    @property
    def is_kind(self) -> bool:
        """A top-level object: its first field is the inline TypeMeta."""
        return bool(self.fields) and self.fields[0].type.message == TYPE_META


@cache
def parse_type(expr: str) -> Type:
    """Parse one type expression of schemas.json."""
    if expr.startswith("*"):
        return Type(pointer=parse_type(expr[1:]))
    if expr.startswith("[]"):
        return Type(slice=parse_type(expr[2:]))
    if expr.startswith("map["):
        close = expr.index("]")
        return Type(key=parse_type(expr[4:close]), value=parse_type(expr[close + 1 :]))
    if expr in SCALARS:
        return Type(scalar=expr)
    return Type(message=expr)


class Registry:
    """All messages of schemas.json; the file is read once, messages compiled lazily."""

    def __init__(self, raw: dict[str, list[list[Any]]]) -> None:
        self._raw = raw
        self._compiled: dict[str, Message] = {}
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: Path = SCHEMAS) -> Registry:
        """Read a schemas.json file."""
        document = json.loads(path.read_text())
        messages: dict[str, list[list[Any]]] = document["messages"]
        return cls(messages)

    def __contains__(self, name: str) -> bool:
        return name in self._raw

    def names(self) -> list[str]:
        """Every message name."""
        return sorted(self._raw)

    def message(self, name: str) -> Message:
        """A compiled message; KeyError when the schema does not have it."""
        compiled = self._compiled.get(name)
        if compiled is not None:
            return compiled
        with self._lock:
            fields = [
                Field(
                    json=json_name,
                    number=number,
                    type=parse_type(type_expr),
                    omitempty="e" in flags,
                    omitzero="z" in flags,
                    inline="i" in flags,
                )
                for json_name, number, type_expr, flags in self._raw[name]
            ]
            message = Message(name, fields)
            message.by_number = {f.number: f for f in fields if f.number}
            message.wire_order = sorted(message.by_number.values(), key=lambda f: f.number)
            message.list_wrapper = any("l" in raw[3] for raw in self._raw[name])
            self._compiled[name] = message
            return message

    def kind(self, api_version: str, kind: str) -> Message | None:
        """The message of a kind as named in an object's apiVersion and kind, if it has one."""
        group, _, version = api_version.rpartition("/")
        package = _GROUP_PACKAGES.get(group) or "k8s.io/api/" + group.split(".", 1)[0]
        # Options, Status and WatchEvent are meta/v1 types registered in every group version.
        for name in (f"{package}/{version}.{kind}", f"{META}.{kind}"):
            if name in self._raw:
                message = self.message(name)
                if message.is_kind:
                    return message
        return None


_default: Registry | None = None


def default() -> Registry:
    """The registry of the committed schemas.json (loaded on first use)."""
    global _default
    if _default is None:
        _default = Registry.load()
    return _default
