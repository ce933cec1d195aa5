"""Per-message protobuf encoders, generated once from the schemas and compiled to Python.

The schema-walking encoder of `kubesim.protobuf.codec` looks every field's shape up in the
schema and builds a field path for its error messages on every call: about 1.7 ms for a
DaemonSet pod. This module turns each message of schemas.json into one Python function, written
out as source text and compiled on first use: field keys are byte constants, the field walk is
straight-line code, strings and small ints take a fast path, and nested messages append to one
growing buffer.

The functions only encode what they are sure of: any value they do not expect (the wrong JSON
type, an int out of range, a dict subclass...) raises, and the codec then re-encodes the object
with its schema-walking encoder, which gives the same bytes for good input and the error naming
the field for bad input. So the compiled functions produce byte-for-byte what the schema walk
produces, or nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from kubesim.protobuf import wire
from kubesim.protobuf.registry import Field, Message, Registry, Type

# (field number, value type, value) -> the field's bytes, or a ProtobufError: the schema walk's
# encoding of one value, for the values the compiled code leaves to it.
SlowValue = Callable[[int, Type, Any], bytes]
# value -> message bytes: the hand-written encoders (Time, Quantity, IntOrString...).
Special = Callable[[Any], bytes]
Encoder = Callable[[Any], bytes | bytearray]

_INT_RANGES = {
    "int32": (-(1 << 31), (1 << 31) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
    "uint32": (0, (1 << 32) - 1),
    "uint64": (0, (1 << 64) - 1),
}
_ZERO_BYTES = {"float64": b"\x00" * 8, "float32": b"\x00" * 4}


class Unsure(Exception):
    """A value the compiled code does not encode itself (the schema walk will)."""


def _emit_length_and(target: str, data: str, indent: str) -> list[str]:
    """Lines appending `data`'s varint length, then `data`, to `target`."""
    return [
        f"{indent}n = len({data})",
        f"{indent}if n < 128:",
        f"{indent}    {target}.append(n)",
        f"{indent}else:",
        f"{indent}    {target} += VAR(n)",
        f"{indent}{target} += {data}",
    ]


class Compiler:
    """Compiles and keeps the encoder of every message asked for (and of those they use)."""

    def __init__(
        self, schemas: Registry, specials: dict[str, Special], slow_value: SlowValue
    ) -> None:
        self._schemas = schemas
        self._specials = specials
        self._names: dict[str, str] = {}
        self._lock = threading.RLock()
        self._namespace: dict[str, Any] = {
            "VAR": wire.encode_varint,
            "SLOW": slow_value,
            "Unsure": Unsure,
            "EMPTY": {},
        }
        self._constants: dict[int, str] = {}
        # Compiled messages, and those with a stand-in that compiles them when first called.
        self._ready: dict[str, Encoder] = {}
        self._stubbed: set[str] = set()

    def encoder(self, message: str) -> Encoder:
        """The compiled encoder of a message (value -> bytes; raises on values it is unsure of)."""
        function = self._ready.get(message)
        if function is None:
            function = self._compile(message)
        return function

    # ----- generation -------------------------------------------------------------------------

    def _compile(self, message: str) -> Encoder:
        """Compile one message's function. The messages it uses get a stand-in that compiles
        them on their first call, so only what objects really hold is ever compiled (a pod uses
        about 40 of the 140 messages its schema reaches)."""
        with self._lock:
            function: Encoder | None = self._ready.get(message)
            if function is not None:
                return function
            name = self._names.get(message) or self._function_name(message)
            special = self._specials.get(message)
            if special is not None:
                function = special
            else:
                lines, used = self._message_source(self._schemas.message(message))
                for other in sorted(used):
                    if other not in self._ready and other not in self._stubbed:
                        self._stubbed.add(other)
                        self._namespace[self._names[other]] = self._stand_in(other)
                code = compile("\n".join(lines), f"<protobuf encoder of {message}>", "exec")
                exec(code, self._namespace)
                function = self._namespace[name]
                assert function is not None
            self._namespace[name] = function
            self._ready[message] = function
            return function

    def field_encoder(self, message: str, number: int) -> Encoder:
        """The compiled encoder of one field of a message: the message's value (a dict) in, that
        field's bytes out (raises, as `encoder` does, on values it is unsure of)."""
        function = self._ready.get(f"{message}#{number}")
        if function is None:
            with self._lock:
                f = self._schemas.message(message).by_number[number]
                used: set[str] = set()
                lines = [
                    "def F(v):",
                    "    if v.__class__ is not dict:",
                    "        raise Unsure",
                    "    o = bytearray()",
                    *self._field_source(f, used),
                    "    return o",
                ]
                for other in sorted(used):
                    if other not in self._ready and other not in self._stubbed:
                        self._stubbed.add(other)
                        self._namespace[self._names[other]] = self._stand_in(other)
                scope: dict[str, Any] = {}
                code = compile(
                    "\n".join(lines), f"<protobuf encoder of {message} #{number}>", "exec"
                )
                exec(code, self._namespace, scope)
                function = scope["F"]
                assert function is not None
                self._ready[f"{message}#{number}"] = function
        return function

    def _stand_in(self, message: str) -> Encoder:
        def first_call(value: Any) -> bytes | bytearray:
            return self._compile(message)(value)

        return first_call

    def _function_name(self, message: str) -> str:
        name = f"E{len(self._names)}"
        self._names[message] = name
        return name

    def _type_constant(self, t: Type) -> str:
        """A namespace name holding a Type (for the calls into the schema walk)."""
        key = id(t)
        name = self._constants.get(key)
        if name is None:
            name = f"T{len(self._constants)}"
            self._constants[key] = name
            self._namespace[name] = t
        return name

    def _message_source(self, message: Message) -> tuple[list[str], set[str]]:
        used: set[str] = set()
        lines = [f"def {self._names[message.name]}(v):"]
        if message.list_wrapper:
            lines.append("    v = {'items': v}")
        lines += [
            "    if v is None:",
            "        v = EMPTY",
            "    elif v.__class__ is not dict:",
            "        raise Unsure",
            "    o = bytearray()",
        ]
        for f in message.wire_order:
            lines += self._field_source(f, used)
        lines.append("    return o")
        return lines, used

    def _field_source(self, f: Field, used: set[str]) -> list[str]:
        t = f.type
        number = f.number
        get = "x = v" if f.inline else f"x = v.get({f.json!r})"
        lines = [f"    # {f.json or t.message} = {number}", f"    {get}"]
        if t.slice is not None:
            lines += [
                "    if x is not None:",
                "        if x.__class__ is not list:",
                "            raise Unsure",
                "        for y in x:",
            ]
            lines += self._value_source(number, t.slice, "y", "o", "            ", used)
            return lines
        if t.is_map:
            assert t.key is not None
            assert t.value is not None
            if t.key.scalar != "string":
                # Only string keys in the Kubernetes schemas; anything else takes the schema walk.
                return [*lines, "    if x is not None:", "        raise Unsure"]
            lines += [
                "    if x is not None:",
                "        if x.__class__ is not dict:",
                "            raise Unsure",
                "        for k in sorted(x):",
                "            if k.__class__ is not str:",
                "                raise Unsure",
                "            e = bytearray(b'\\n')",
                "            b = k.encode()",
            ]
            lines += _emit_length_and("e", "b", "            ")
            lines.append("            y = x[k]")
            lines += self._value_source(2, t.value, "y", "e", "            ", used)
            lines.append(f"            o += {wire.key(number, wire.LENGTH_DELIMITED)!r}")
            lines += _emit_length_and("o", "e", "            ")
            return lines
        if t.pointer is not None:
            lines.append("    if x is not None:")
            lines += self._value_source(number, t.pointer, "x", "o", "        ", used)
            return lines
        if t.scalar == "bytes":
            lines.append("    if x is not None:")
            lines += self._value_source(number, t, "x", "o", "        ", used)
            return lines
        if t.scalar:
            lines.append("    if x is None:")
            lines.append(f"        o += {self._zero_field(number, t.scalar)!r}")
            lines.append("    else:")
            lines += self._value_source(number, t, "x", "o", "        ", used)
            return lines
        lines += self._value_source(number, t, "x", "o", "    ", used)
        return lines

    def _zero_field(self, number: int, scalar: str) -> bytes:
        """A non-pointer scalar left out of the JSON: its Go zero value, always written."""
        if scalar in _ZERO_BYTES:
            wire_type = wire.FIXED64 if scalar == "float64" else wire.FIXED32
            return wire.key(number, wire_type) + _ZERO_BYTES[scalar]
        wire_type = wire.LENGTH_DELIMITED if scalar == "string" else wire.VARINT
        return wire.key(number, wire_type) + b"\x00"

    def _value_source(
        self, number: int, t: Type, value: str, target: str, indent: str, used: set[str]
    ) -> list[str]:
        """Lines appending one value (never None-defaulted here) as field `number` to `target`."""
        slow = [f"{indent}{target} += SLOW({number}, {self._type_constant(t)}, {value})"]
        scalar = t.scalar
        if scalar == "string":
            key = wire.key(number, wire.LENGTH_DELIMITED)
            return [
                f"{indent}if {value}.__class__ is str:",
                f"{indent}    b = {value}.encode()",
                f"{indent}    {target} += {key!r}",
                *_emit_length_and(target, "b", indent + "    "),
                f"{indent}else:",
                *[f"    {line}" for line in slow],
            ]
        if scalar == "bool":
            true = wire.key(number, wire.VARINT) + b"\x01"
            false = wire.key(number, wire.VARINT) + b"\x00"
            return [
                f"{indent}if {value} is True:",
                f"{indent}    {target} += {true!r}",
                f"{indent}elif {value} is False:",
                f"{indent}    {target} += {false!r}",
                f"{indent}else:",
                *[f"    {line}" for line in slow],
            ]
        if scalar in _INT_RANGES:
            key = wire.key(number, wire.VARINT)
            low, high = _INT_RANGES[scalar]
            return [
                f"{indent}if {value}.__class__ is int and 0 <= {value} < 128:",
                f"{indent}    {target} += {key!r}",
                f"{indent}    {target}.append({value})",
                f"{indent}elif {value}.__class__ is int and {low} <= {value} <= {high}:",
                f"{indent}    {target} += {key!r}",
                f"{indent}    {target} += VAR({value})",
                f"{indent}else:",
                *[f"    {line}" for line in slow],
            ]
        if t.message:
            used.add(t.message)
            function = self._names.get(t.message) or self._function_name(t.message)
            key = wire.key(number, wire.LENGTH_DELIMITED)
            return [
                f"{indent}b = {function}({value})",
                f"{indent}{target} += {key!r}",
                *_emit_length_and(target, "b", indent),
            ]
        # bytes (base64), floats, nested collections: the schema walk encodes (or rejects) them.
        return slow
