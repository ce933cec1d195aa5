"""Kubernetes protobuf <-> the JSON dicts kubesim stores, driven by the generated schemas.

Decoding mirrors what the real server does: the bytes become a Go value (absent fields are zero,
repeated and map fields nil), and the JSON kubesim stores is what Go's encoding/json makes of that
value: non-pointer scalars and structs are emitted even when zero unless `omitempty`/`omitzero`
says otherwise, nil slices and maps are `null`, embedded inline structs are flattened, and the
types with hand-written JSON (Time, Quantity, IntOrString, RawExtension, ...) get their own
mapping. Encoding writes what the generated Go marshallers write: fields in number order,
non-pointer scalars and structs always, pointers/slices/maps/[]byte only when set, map entries
sorted by key.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import struct
from collections.abc import Callable, Iterator
from typing import Any

from kubesim.protobuf import compiled, registry, wire
from kubesim.protobuf.registry import Field, Message, Registry, Type

# Every protobuf body and response starts with this magic, then a runtime.Unknown.
MAGIC = b"k8s\x00"
MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
WATCH_MEDIA_TYPE = MEDIA_TYPE + ";stream=watch"
# runtime.Unknown {typeMeta = 1 {apiVersion = 1, kind = 2}, raw = 2, contentEncoding = 3,
# contentType = 4}: the numbers are in schemas.json (runtime.Unknown, runtime.TypeMeta), which a
# test checks against these constants.
UNKNOWN_TYPE_META, UNKNOWN_RAW, UNKNOWN_CONTENT_ENCODING, UNKNOWN_CONTENT_TYPE = 1, 2, 3, 4
TYPE_META_API_VERSION, TYPE_META_KIND = 1, 2
# metav1.WatchEvent {type = 1, object = 2 (a RawExtension {raw = 1})}.
WATCH_EVENT_TYPE, WATCH_EVENT_OBJECT, RAW_EXTENSION_RAW = 1, 2, 1

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# Go's zero time.Time (0001-01-01T00:00:00Z) in Unix seconds.
_ZERO_TIME_SECONDS = -62135596800
_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(?:([Zz])|([+-])(\d{2}):(\d{2}))$"
)
_INT_RANGES = {
    "int32": (-(1 << 31), (1 << 31) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
    "uint32": (0, (1 << 32) - 1),
    "uint64": (0, (1 << 64) - 1),
}
_VARINT_SCALARS = frozenset({"bool", "int32", "int64", "uint32", "uint64"})


class ProtobufError(ValueError):
    """Bytes or a document the codec cannot translate; the message names the field."""


class UnknownKind(ProtobufError):
    """A kind without a protobuf schema (custom resources, kinds kubesim does not know)."""

    def __init__(self, api_version: str, kind: str) -> None:
        super().__init__(f"no protobuf schema for kind {kind!r} in {api_version!r}")
        self.api_version = api_version
        self.kind = kind


# ----- the envelope -------------------------------------------------------------------------------


def unwrap(data: bytes) -> tuple[str, str, bytes]:
    """(apiVersion, kind, raw) of an enveloped object (`k8s\\0` + runtime.Unknown)."""
    if not data.startswith(MAGIC):
        raise ProtobufError("the body does not start with the protobuf magic 'k8s\\x00'")
    api_version = kind = encoding = content_type = ""
    raw = b""
    try:
        for number, wire_type, value in wire.iter_fields(memoryview(data)[len(MAGIC) :]):
            if wire_type != wire.LENGTH_DELIMITED or not isinstance(value, bytes):
                continue
            if number == UNKNOWN_TYPE_META:
                for inner, inner_type, text in wire.iter_fields(value):
                    if inner_type == wire.LENGTH_DELIMITED and isinstance(text, bytes):
                        if inner == TYPE_META_API_VERSION:
                            api_version = text.decode()
                        elif inner == TYPE_META_KIND:
                            kind = text.decode()
            elif number == UNKNOWN_RAW:
                raw = value
            elif number == UNKNOWN_CONTENT_ENCODING:
                encoding = value.decode()
            elif number == UNKNOWN_CONTENT_TYPE:
                content_type = value.decode()
    except (wire.WireError, UnicodeDecodeError) as exc:
        raise ProtobufError(f"malformed protobuf envelope: {exc}") from exc
    if encoding:
        raise ProtobufError(f"unsupported protobuf content encoding {encoding!r}")
    if content_type and content_type != MEDIA_TYPE:
        raise ProtobufError(f"unsupported embedded content type {content_type!r}")
    if not kind:
        raise ProtobufError("the protobuf envelope names no kind")
    return api_version, kind, raw


def wrap(api_version: str, kind: str, raw: bytes) -> bytes:
    """Envelope an encoded message as the real server does (empty encoding and content type)."""
    type_meta = wire.string_field(TYPE_META_API_VERSION, api_version) + wire.string_field(
        TYPE_META_KIND, kind
    )
    return (
        MAGIC
        + wire.bytes_field(UNKNOWN_TYPE_META, type_meta)
        + wire.bytes_field(UNKNOWN_RAW, raw)
        + wire.string_field(UNKNOWN_CONTENT_ENCODING, "")
        + wire.string_field(UNKNOWN_CONTENT_TYPE, "")
    )


def wrap_parts(api_version: str, kind: str, parts: list[bytes]) -> bytes:
    """`wrap` of the message made of `parts` joined, with one copy of the bytes (a big list)."""
    type_meta = wire.string_field(TYPE_META_API_VERSION, api_version) + wire.string_field(
        TYPE_META_KIND, kind
    )
    raw_key = wire.key(UNKNOWN_RAW, wire.LENGTH_DELIMITED)
    length = wire.encode_varint(sum(len(part) for part in parts))
    tail = wire.string_field(UNKNOWN_CONTENT_ENCODING, "") + wire.string_field(
        UNKNOWN_CONTENT_TYPE, ""
    )
    head = MAGIC + wire.bytes_field(UNKNOWN_TYPE_META, type_meta) + raw_key + length
    return b"".join([head, *parts, tail])


# ----- objects ------------------------------------------------------------------------------------


class Codec:
    """Encodes and decodes the kinds of one registry."""

    def __init__(self, schemas: Registry | None = None) -> None:
        self.schemas = schemas or registry.default()
        self._compiled: compiled.Compiler | None = None

    def _compiler(self) -> compiled.Compiler:
        """The compiled encoders of this codec's messages (kubesim.protobuf.compiled)."""
        if self._compiled is None:
            specials = {
                name: _bound_special(self, name, encoder)
                for name, encoder in _SPECIAL_ENCODERS.items()
            }
            self._compiled = compiled.Compiler(self.schemas, specials, self._slow_value)
        return self._compiled

    def _slow_value(self, number: int, t: Type, value: Any) -> bytes:
        return self._encode_value(number, t, value, "")

    def has_kind(self, api_version: str, kind: str) -> bool:
        """Whether the kind has a protobuf schema."""
        return self.schemas.kind(api_version, kind) is not None

    def decode_object(self, data: bytes) -> dict[str, Any]:
        """An enveloped object as the JSON dict the real server would hold after decoding it."""
        api_version, kind, raw = unwrap(data)
        message = self.schemas.kind(api_version, kind)
        if message is None:
            raise UnknownKind(api_version, kind)
        body, _zero = self.decode_message(message, raw, kind)
        result: dict[str, Any] = {"kind": kind, "apiVersion": api_version}
        result.update((k, v) for k, v in body.items() if k not in result)
        return result

    def encode_object(self, obj: dict[str, Any]) -> bytes:
        """An object dict (with apiVersion and kind) as enveloped protobuf."""
        api_version = obj.get("apiVersion")
        kind = obj.get("kind")
        if not isinstance(api_version, str) or not isinstance(kind, str):
            raise ProtobufError("the object has no apiVersion and kind")
        message = self.schemas.kind(api_version, kind)
        if message is None:
            raise UnknownKind(api_version, kind)
        return wrap(api_version, kind, self.encode_message(message, obj, kind))

    def watch_frame(self, event_type: str, obj: dict[str, Any]) -> bytes:
        """One protobuf watch frame: a 4-byte big-endian length, then a bare metav1.WatchEvent
        whose object.raw holds the enveloped object (the stream serializer adds no envelope)."""
        raw_extension = wire.bytes_field(RAW_EXTENSION_RAW, self.encode_object(obj))
        event = wire.string_field(WATCH_EVENT_TYPE, event_type) + wire.bytes_field(
            WATCH_EVENT_OBJECT, raw_extension
        )
        return len(event).to_bytes(4, "big") + event

    def decode_watch_frames(self, data: bytes) -> Iterator[tuple[str, dict[str, Any]]]:
        """(type, object) of each complete frame in a protobuf watch stream (for tests/clients)."""
        pos = 0
        while pos + 4 <= len(data):
            length = int.from_bytes(data[pos : pos + 4], "big")
            frame = data[pos + 4 : pos + 4 + length]
            if len(frame) < length:
                return
            pos += 4 + length
            event_type = ""
            obj: dict[str, Any] = {}
            for number, _wt, value in wire.iter_fields(frame):
                if number == WATCH_EVENT_TYPE and isinstance(value, bytes):
                    event_type = value.decode()
                elif number == WATCH_EVENT_OBJECT and isinstance(value, bytes):
                    for inner, _t, raw in wire.iter_fields(value):
                        if inner == RAW_EXTENSION_RAW and isinstance(raw, bytes):
                            obj = self.decode_object(raw)
            yield event_type, obj

    # ----- decoding -------------------------------------------------------------------------------

    def decode_message(self, message: Message, data: bytes, path: str) -> tuple[Any, bool]:
        """(JSON value, whether the Go value is the zero value) of one message's bytes."""
        special = _SPECIAL_DECODERS.get(message.name)
        if special is not None:
            return special(self, message, data, path)
        values: dict[int, Any] = {}
        try:
            for number, wire_type, raw in wire.iter_fields(data):
                f = message.by_number.get(number)
                if f is None:
                    continue  # unknown fields are dropped, as the generated Go code does
                self._collect(f, wire_type, raw, values, path)
        except wire.WireError as exc:
            raise ProtobufError(f"{path}: {exc}") from exc
        out: dict[str, Any] = {}
        all_zero = True
        for f in message.fields:
            present = f.number in values
            value, empty, zero = self._field_json(f, values.get(f.number), present, path)
            all_zero = all_zero and zero
            if f.inline:
                if isinstance(value, dict):
                    for k, v in value.items():
                        out.setdefault(k, v)
                continue
            if f.json == "-" or (f.omitempty and empty) or (f.omitzero and zero):
                continue
            out[f.json] = value
        if message.list_wrapper:
            return out.get("items") or [], False
        return out, all_zero

    def _collect(
        self, f: Field, wire_type: int, raw: int | bytes, values: dict[int, Any], path: str
    ) -> None:
        t = f.type
        if t.slice is not None:
            bucket = values.setdefault(f.number, [])
            elem = t.slice
            if (
                elem.scalar in _VARINT_SCALARS or elem.scalar in ("float32", "float64")
            ) and wire_type == wire.LENGTH_DELIMITED:
                assert isinstance(raw, bytes)
                bucket.extend(_packed(elem.scalar, raw))
            else:
                bucket.append((wire_type, raw))
        elif t.is_map:
            entries = values.setdefault(f.number, {})
            if not isinstance(raw, bytes):
                raise ProtobufError(f"{path}.{f.json}: a map entry must be length-delimited")
            key: tuple[int, int | bytes] | None = None
            value: tuple[int, int | bytes] | None = None
            for number, entry_type, entry_raw in wire.iter_fields(raw):
                if number == 1:
                    key = (entry_type, entry_raw)
                elif number == 2:
                    value = (entry_type, entry_raw)
            assert t.key is not None
            assert t.value is not None
            key_json = (
                self._scalar_json(t.key.scalar, key[0], key[1], path)
                if key
                else _zero_scalar(t.key.scalar)
            )
            entries[str(key_json) if not isinstance(key_json, str) else key_json] = value
        else:
            values[f.number] = (wire_type, raw)

    def _field_json(
        self, f: Field, collected: Any, present: bool, path: str
    ) -> tuple[Any, bool, bool]:
        """(JSON value, empty for omitempty, zero for omitzero) of one field."""
        t = f.type
        where = f"{path}.{f.json or f.type.message.rsplit('.', 1)[-1]}"
        if t.slice is not None:
            if not present:
                return None, True, True
            items = [self._value_json(t.slice, wt, raw, where) for wt, raw in collected]
            return items, not items, False
        if t.is_map:
            if not present:
                return None, True, True
            assert t.value is not None
            value_type = t.value
            result = {
                k: (
                    self._value_json(value_type, v[0], v[1], where)
                    if v is not None
                    else self._absent_json(value_type, where)
                )
                for k, v in collected.items()
            }
            return result, not result, False
        if t.pointer is not None:
            if not present:
                return None, True, True
            return self._value_json(t.pointer, collected[0], collected[1], where), False, False
        if t.scalar == "bytes":
            if not present:
                return None, True, True
            data = _expect_bytes(collected[0], collected[1], where)
            return base64.b64encode(data).decode(), not data, False
        if t.scalar:
            if not present:
                zero = _zero_scalar(t.scalar)
                return zero, True, True
            value = self._scalar_json(t.scalar, collected[0], collected[1], where)
            return value, value in ("", 0, False), value in ("", 0, False)
        # A non-pointer struct: encoding/json never omits it for omitempty.
        data = _expect_bytes(collected[0], collected[1], where) if present else b""
        value, zero = self.decode_message(self.schemas.message(t.message), data, where)
        return value, False, zero

    def _value_json(self, t: Type, wire_type: int, raw: int | bytes, path: str) -> Any:
        if t.scalar == "bytes":
            return base64.b64encode(_expect_bytes(wire_type, raw, path)).decode()
        if t.scalar:
            return self._scalar_json(t.scalar, wire_type, raw, path)
        if t.message:
            value, _zero = self.decode_message(
                self.schemas.message(t.message), _expect_bytes(wire_type, raw, path), path
            )
            return value
        raise ProtobufError(f"{path}: unsupported nested collection type")

    def _absent_json(self, t: Type, path: str) -> Any:
        if t.scalar == "bytes":
            return ""
        if t.scalar:
            return _zero_scalar(t.scalar)
        if t.message:
            return self.decode_message(self.schemas.message(t.message), b"", path)[0]
        return None

    def _scalar_json(self, scalar: str, wire_type: int, raw: int | bytes, path: str) -> Any:
        if scalar == "string":
            return _expect_bytes(wire_type, raw, path).decode(errors="replace")
        if scalar in _VARINT_SCALARS:
            if wire_type != wire.VARINT or not isinstance(raw, int):
                raise ProtobufError(f"{path}: expected a varint, got wire type {wire_type}")
            if scalar == "bool":
                return raw != 0
            if scalar == "int32":
                return _int32(raw)
            if scalar == "int64":
                return wire.signed64(raw)
            return raw
        if scalar == "float64":
            if wire_type != wire.FIXED64 or not isinstance(raw, int):
                raise ProtobufError(f"{path}: expected a fixed64 double")
            return _go_float(struct.unpack("<d", raw.to_bytes(8, "little"))[0])
        if scalar == "float32":
            if wire_type != wire.FIXED32 or not isinstance(raw, int):
                raise ProtobufError(f"{path}: expected a fixed32 float")
            return _go_float(struct.unpack("<f", raw.to_bytes(4, "little"))[0])
        raise ProtobufError(f"{path}: unsupported scalar {scalar}")

    # ----- encoding -------------------------------------------------------------------------------

    def encode_message(self, message: Message, value: Any, path: str) -> bytes:
        """The bytes of one message from its JSON value: the message's compiled encoder, or,
        where it is unsure of a value, the schema walk (same bytes; errors name the field)."""
        try:
            return bytes(self._compiler().encoder(message.name)(value))
        except Exception:  # the schema walk encodes it, or says what is wrong with it
            return self.walk_message(message, value, path)

    def walk_message(self, message: Message, value: Any, path: str) -> bytes:
        """The bytes of one message from its JSON value, walking the schema field by field."""
        special = _SPECIAL_ENCODERS.get(message.name)
        if special is not None:
            return special(self, message, value, path)
        if message.list_wrapper:
            value = {"items": value}
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ProtobufError(f"{path}: expected an object, got {_json_type(value)}")
        out = bytearray()
        for f in message.wire_order:
            field_value = value if f.inline else value.get(f.json)
            out += self._encode_field(f, field_value, f"{path}.{f.json}")
        return bytes(out)

    def encode_field(self, message: Message, f: Field, value: dict[str, Any], path: str) -> bytes:
        """The bytes of field `f` of a message whose JSON value is `value` (nothing for an absent
        pointer, slice or map): its compiled encoder, or where unsure, the schema walk."""
        try:
            return bytes(self._compiler().field_encoder(message.name, f.number)(value))
        except Exception:  # the schema walk encodes it, or says what is wrong with it
            return self._encode_field(f, value if f.inline else value.get(f.json), path)

    def _encode_field(self, f: Field, value: Any, path: str) -> bytes:
        t = f.type
        number = f.number
        if t.slice is not None:
            if value is None:
                return b""
            if not isinstance(value, list):
                raise ProtobufError(f"{path}: expected an array, got {_json_type(value)}")
            return b"".join(
                self._encode_value(number, t.slice, item, f"{path}[{i}]")
                for i, item in enumerate(value)
            )
        if t.is_map:
            if value is None:
                return b""
            if not isinstance(value, dict):
                raise ProtobufError(f"{path}: expected an object, got {_json_type(value)}")
            assert t.key is not None
            assert t.value is not None
            out = bytearray()
            for k in sorted(value, key=lambda key: key.encode()):
                entry = self._encode_value(1, t.key, _map_key(t.key.scalar, k, path), path)
                entry += self._encode_value(2, t.value, value[k], f"{path}[{k}]")
                out += wire.bytes_field(number, entry)
            return bytes(out)
        if t.pointer is not None:
            if value is None:
                return b""
            return self._encode_value(number, t.pointer, value, path)
        if t.scalar == "bytes":
            if value is None:
                return b""
            return self._encode_value(number, t, value, path)
        if t.scalar:
            return self._encode_value(
                number, t, _zero_scalar(t.scalar) if value is None else value, path
            )
        return self._encode_value(number, t, value, path)

    def _encode_value(self, number: int, t: Type, value: Any, path: str) -> bytes:
        scalar = t.scalar
        if scalar == "string":
            if not isinstance(value, str):
                raise ProtobufError(f"{path}: expected a string, got {_json_type(value)}")
            return wire.string_field(number, value)
        if scalar == "bytes":
            if not isinstance(value, str):
                raise ProtobufError(f"{path}: expected a base64 string, got {_json_type(value)}")
            try:
                data = base64.b64decode(value, validate=True)
            except ValueError as exc:
                raise ProtobufError(f"{path}: invalid base64 data") from exc
            return wire.bytes_field(number, data)
        if scalar == "bool":
            if not isinstance(value, bool):
                raise ProtobufError(f"{path}: expected a boolean, got {_json_type(value)}")
            return wire.varint_field(number, int(value))
        if scalar in _INT_RANGES:
            return wire.varint_field(number, _integer(scalar, value, path))
        if scalar == "float64":
            return wire.double_field(number, _number(value, path))
        if scalar == "float32":
            return wire.key(number, wire.FIXED32) + struct.pack("<f", _number(value, path))
        if t.message:
            body = self.encode_message(self.schemas.message(t.message), value, path)
            return wire.bytes_field(number, body)
        raise ProtobufError(f"{path}: nested collections are not supported")


# ----- scalars ------------------------------------------------------------------------------------


def _packed(scalar: str, data: bytes) -> list[tuple[int, int]]:
    """Elements of a packed repeated scalar field, as (wire type, value) pairs."""
    items: list[tuple[int, int]] = []
    pos = 0
    if scalar in _VARINT_SCALARS:
        while pos < len(data):
            value, pos = wire.decode_varint(data, pos)
            items.append((wire.VARINT, value))
    else:
        size, wire_type = (8, wire.FIXED64) if scalar == "float64" else (4, wire.FIXED32)
        for start in range(0, len(data) - size + 1, size):
            items.append((wire_type, int.from_bytes(data[start : start + size], "little")))
    return items


def _int32(raw: int) -> int:
    raw &= 0xFFFFFFFF
    return raw - (1 << 32) if raw >= 1 << 31 else raw


def _zero_scalar(scalar: str) -> Any:
    if scalar == "string":
        return ""
    if scalar == "bool":
        return False
    return 0


def _go_float(value: float) -> float | int:
    """encoding/json writes integral floats without a fraction ("1", not "1.0")."""
    if value.is_integer() and abs(value) < 1e21:
        return int(value)
    return value


def _expect_bytes(wire_type: int, raw: int | bytes, path: str) -> bytes:
    if wire_type != wire.LENGTH_DELIMITED or not isinstance(raw, bytes):
        raise ProtobufError(f"{path}: expected a length-delimited field, got wire type {wire_type}")
    return raw


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _integer(scalar: str, value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtobufError(f"{path}: expected an integer, got {_json_type(value)}")
    if isinstance(value, float):
        if not value.is_integer():
            raise ProtobufError(f"{path}: expected an integer, got {value}")
        value = int(value)
    number = int(value)
    low, high = _INT_RANGES[scalar]
    if not low <= number <= high:
        raise ProtobufError(f"{path}: {number} does not fit in {scalar}")
    return number


def _number(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtobufError(f"{path}: expected a number, got {_json_type(value)}")
    return float(value)


def _map_key(scalar: str, key: str, path: str) -> Any:
    if scalar == "string":
        return key
    try:
        return int(key)
    except ValueError as exc:
        raise ProtobufError(f"{path}: map key {key!r} is not an integer") from exc


# ----- types with hand-written JSON ---------------------------------------------------------------

Decoder = Callable[[Codec, Message, bytes, str], tuple[Any, bool]]
Encoder = Callable[[Codec, Message, Any, str], bytes]


def _fields(data: bytes, path: str) -> dict[int, tuple[int, int | bytes]]:
    try:
        return {number: (wt, raw) for number, wt, raw in wire.iter_fields(data)}
    except wire.WireError as exc:
        raise ProtobufError(f"{path}: {exc}") from exc


def _timestamp(data: bytes, path: str) -> tuple[int, int] | None:
    """(seconds, nanos) of a metav1.Time/MicroTime body; None for the zero time."""
    if not data:
        return None
    fields = _fields(data, path)
    seconds = wire.signed64(int(fields.get(1, (0, 0))[1]))
    nanos = wire.signed64(int(fields.get(2, (0, 0))[1]))
    if seconds == _ZERO_TIME_SECONDS and nanos == 0:
        return None
    return seconds, nanos


def _format_time(seconds: int, nanos: int, micro: bool, path: str) -> str:
    try:
        moment = _EPOCH + dt.timedelta(seconds=seconds, microseconds=nanos // 1000)
    except OverflowError as exc:
        raise ProtobufError(f"{path}: time {seconds}s is out of range") from exc
    if micro:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str, path: str) -> tuple[int, int]:
    """(Unix seconds, nanos) of an RFC 3339 timestamp."""
    match = _RFC3339.match(value)
    if not match:
        raise ProtobufError(f"{path}: {value!r} is not an RFC 3339 time")
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction, zulu, sign, off_h, off_m = match.groups()[6:]
    try:
        moment = dt.datetime(year, month, day, hour, minute, second, tzinfo=dt.UTC)
    except ValueError as exc:
        raise ProtobufError(f"{path}: {value!r} is not a valid time") from exc
    seconds = int((moment - _EPOCH).total_seconds())
    if not zulu:
        offset = int(off_h) * 3600 + int(off_m) * 60
        seconds -= offset if sign == "+" else -offset
    nanos = int((fraction or "").ljust(9, "0")) if fraction else 0
    return seconds, nanos


def _decode_time(micro: bool) -> Decoder:
    def decode(codec: Codec, message: Message, data: bytes, path: str) -> tuple[Any, bool]:
        stamp = _timestamp(data, path)
        if stamp is None:
            return None, True
        return _format_time(*stamp, micro, path), False

    return decode


# Encoded Time/MicroTime bodies by their text: objects written in the same second share them.
_TIME_BODIES: dict[str, bytes] = {}
_TIME_BODIES_KEPT = 4096


def _encode_time(micro: bool) -> Encoder:
    def encode(codec: Codec, message: Message, value: Any, path: str) -> bytes:
        if value is None:
            return b""
        if not isinstance(value, str):
            raise ProtobufError(f"{path}: expected an RFC 3339 time string")
        body = _TIME_BODIES.get(value)
        if body is None:
            seconds, nanos = parse_time(value, path)
            body = wire.varint_field(1, seconds) + wire.varint_field(2, nanos)
            if len(_TIME_BODIES) >= _TIME_BODIES_KEPT:
                _TIME_BODIES.clear()
            _TIME_BODIES[value] = body
        return body

    return encode


_DURATION_UNITS = (
    ("h", 3600 * 10**9),
    ("m", 60 * 10**9),
    ("s", 10**9),
    ("ms", 10**6),
    ("us", 10**3),
    ("µs", 10**3),
    ("μs", 10**3),
    ("ns", 1),
)
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def format_duration(nanos: int) -> str:
    """Go's time.Duration.String()."""
    if nanos == 0:
        return "0s"
    sign = "-" if nanos < 0 else ""
    n = abs(nanos)
    if n < 10**9:
        for unit, size in (("ms", 10**6), ("µs", 10**3), ("ns", 1)):
            if n >= size:
                return sign + _fraction(n, size) + unit
    hours, rest = divmod(n, 3600 * 10**9)
    minutes, rest = divmod(rest, 60 * 10**9)
    text = _fraction(rest, 10**9) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{text}"
    if minutes:
        return f"{sign}{minutes}m{text}"
    return sign + text


def _fraction(value: int, unit: int) -> str:
    whole, rest = divmod(value, unit)
    if not rest:
        return str(whole)
    digits = str(rest).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


def parse_duration(text: str, path: str) -> int:
    """Go's time.ParseDuration, in nanoseconds."""
    body = text.lstrip("+-")
    negative = text.startswith("-")
    if body == "0":
        return 0
    total = 0
    pos = 0
    while pos < len(body):
        match = _DURATION_PART.match(body, pos)
        if not match:
            raise ProtobufError(f"{path}: invalid duration {text!r}")
        number, unit = match.groups()
        size = dict(_DURATION_UNITS)[unit]
        whole, _, fraction = number.partition(".")
        total += int(whole or 0) * size
        if fraction:
            total += int(fraction) * size // 10 ** len(fraction)
        pos = match.end()
    if not body:
        raise ProtobufError(f"{path}: invalid duration {text!r}")
    return -total if negative else total


def _decode_duration(codec: Codec, message: Message, data: bytes, path: str) -> tuple[Any, bool]:
    nanos = wire.signed64(int(_fields(data, path).get(1, (0, 0))[1]))
    return format_duration(nanos), nanos == 0


def _encode_duration(codec: Codec, message: Message, value: Any, path: str) -> bytes:
    if value is None:
        value = "0s"
    if not isinstance(value, str):
        raise ProtobufError(f"{path}: expected a duration string such as '1m30s'")
    return wire.varint_field(1, parse_duration(value, path))


def _decode_quantity(codec: Codec, message: Message, data: bytes, path: str) -> tuple[Any, bool]:
    wt, raw = _fields(data, path).get(1, (wire.LENGTH_DELIMITED, b""))
    text = _expect_bytes(wt, raw, path).decode()
    # A zero Quantity prints as "0" in JSON.
    return text or "0", not text


def _encode_quantity(codec: Codec, message: Message, value: Any, path: str) -> bytes:
    if value is None:
        value = "0"
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ProtobufError(f"{path}: expected a quantity such as '100m' or '1Gi'")
    return wire.string_field(1, value if isinstance(value, str) else str(_go_float(value)))


def _decode_int_or_string(
    codec: Codec, message: Message, data: bytes, path: str
) -> tuple[Any, bool]:
    fields = _fields(data, path)
    kind = int(fields.get(1, (0, 0))[1])
    if kind == 1:
        wt, raw = fields.get(3, (wire.LENGTH_DELIMITED, b""))
        return _expect_bytes(wt, raw, path).decode(), False
    value = _int32(int(fields.get(2, (0, 0))[1]))
    return value, value == 0


def _encode_int_or_string(codec: Codec, message: Message, value: Any, path: str) -> bytes:
    if value is None:
        value = 0
    if isinstance(value, str):
        return wire.varint_field(1, 1) + wire.varint_field(2, 0) + wire.string_field(3, value)
    return (
        wire.varint_field(1, 0)
        + wire.varint_field(2, _integer("int32", value, path))
        + wire.string_field(3, "")
    )


def _decode_raw_json(codec: Codec, message: Message, data: bytes, path: str) -> tuple[Any, bool]:
    """RawExtension, FieldsV1 and apiextensions JSON: field 1 holds raw JSON (or an object)."""
    fields = _fields(data, path)
    if 1 not in fields:
        return None, True
    raw = _expect_bytes(*fields[1], path)
    if not raw:
        return None, True
    if raw.startswith(MAGIC):
        # An embedded object a protobuf client encoded as protobuf.
        return codec.decode_object(raw), False
    try:
        return json.loads(raw), False
    except ValueError as exc:
        raise ProtobufError(f"{path}: the embedded raw data is not JSON: {exc}") from exc


def _encode_raw_json(codec: Codec, message: Message, value: Any, path: str) -> bytes:
    if value is None:
        return b""
    return wire.bytes_field(1, json.dumps(value, separators=(",", ":")).encode())


def _generic(codec: Codec, message: Message, data: bytes, path: str) -> dict[str, Any]:
    """The Go-field-named view of a struct that has no JSON tags (the JSONSchemaPropsOr* kinds)."""
    values: dict[str, Any] = {}
    fields = _fields_multi(data, path)
    for f in message.fields:
        t = f.type
        raws = fields.get(f.number, [])
        if t.slice is not None:
            values[f.json] = [codec._value_json(t.slice, wt, raw, path) for wt, raw in raws]
        elif t.pointer is not None:
            values[f.json] = codec._value_json(t.pointer, *raws[-1], path) if raws else None
        else:
            values[f.json] = (
                codec._scalar_json(t.scalar, *raws[-1], path) if raws else _zero_scalar(t.scalar)
            )
    return values


def _fields_multi(data: bytes, path: str) -> dict[int, list[tuple[int, int | bytes]]]:
    fields: dict[int, list[tuple[int, int | bytes]]] = {}
    try:
        for number, wt, raw in wire.iter_fields(data):
            fields.setdefault(number, []).append((wt, raw))
    except wire.WireError as exc:
        raise ProtobufError(f"{path}: {exc}") from exc
    return fields


def _decode_or_array(codec: Codec, message: Message, data: bytes, path: str) -> tuple[Any, bool]:
    values = _generic(codec, message, data, path)
    if values["JSONSchemas"]:
        return values["JSONSchemas"], False
    return values["Schema"], values["Schema"] is None


def _encode_or_array(codec: Codec, message: Message, value: Any, path: str) -> bytes:
    generic = {"JSONSchemas": value} if isinstance(value, list) else {"Schema": value}
    return _encode_generic(codec, message, generic, path)


def _decode_or_bool(codec: Codec, message: Message, data: bytes, path: str) -> tuple[Any, bool]:
    values = _generic(codec, message, data, path)
    if values["Schema"] is not None:
        return values["Schema"], False
    return bool(values["Allows"]), not values["Allows"]


def _encode_or_bool(codec: Codec, message: Message, value: Any, path: str) -> bytes:
    if isinstance(value, dict):
        generic: dict[str, Any] = {"Allows": True, "Schema": value}
    elif isinstance(value, bool):
        generic = {"Allows": value}
    else:
        raise ProtobufError(f"{path}: expected a boolean or a JSON schema")
    return _encode_generic(codec, message, generic, path)


def _decode_or_string_array(
    codec: Codec, message: Message, data: bytes, path: str
) -> tuple[Any, bool]:
    values = _generic(codec, message, data, path)
    if values["Property"]:
        return values["Property"], False
    return values["Schema"], values["Schema"] is None


def _encode_or_string_array(codec: Codec, message: Message, value: Any, path: str) -> bytes:
    generic = {"Property": value} if isinstance(value, list) else {"Schema": value}
    return _encode_generic(codec, message, generic, path)


def _encode_generic(codec: Codec, message: Message, values: dict[str, Any], path: str) -> bytes:
    out = bytearray()
    for f in message.wire_order:
        out += codec._encode_field(f, values.get(f.json), f"{path}.{f.json}")
    return bytes(out)


_APIEXTENSIONS = "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
_SPECIAL_DECODERS: dict[str, Decoder] = {
    f"{registry.META}.Time": _decode_time(micro=False),
    f"{registry.META}.MicroTime": _decode_time(micro=True),
    f"{registry.META}.Duration": _decode_duration,
    f"{registry.META}.FieldsV1": _decode_raw_json,
    "k8s.io/apimachinery/pkg/api/resource.Quantity": _decode_quantity,
    "k8s.io/apimachinery/pkg/util/intstr.IntOrString": _decode_int_or_string,
    "k8s.io/apimachinery/pkg/runtime.RawExtension": _decode_raw_json,
    f"{_APIEXTENSIONS}.JSON": _decode_raw_json,
    f"{_APIEXTENSIONS}.JSONSchemaPropsOrArray": _decode_or_array,
    f"{_APIEXTENSIONS}.JSONSchemaPropsOrBool": _decode_or_bool,
    f"{_APIEXTENSIONS}.JSONSchemaPropsOrStringArray": _decode_or_string_array,
}
_SPECIAL_ENCODERS: dict[str, Encoder] = {
    f"{registry.META}.Time": _encode_time(micro=False),
    f"{registry.META}.MicroTime": _encode_time(micro=True),
    f"{registry.META}.Duration": _encode_duration,
    f"{registry.META}.FieldsV1": _encode_raw_json,
    "k8s.io/apimachinery/pkg/api/resource.Quantity": _encode_quantity,
    "k8s.io/apimachinery/pkg/util/intstr.IntOrString": _encode_int_or_string,
    "k8s.io/apimachinery/pkg/runtime.RawExtension": _encode_raw_json,
    f"{_APIEXTENSIONS}.JSON": _encode_raw_json,
    f"{_APIEXTENSIONS}.JSONSchemaPropsOrArray": _encode_or_array,
    f"{_APIEXTENSIONS}.JSONSchemaPropsOrBool": _encode_or_bool,
    f"{_APIEXTENSIONS}.JSONSchemaPropsOrStringArray": _encode_or_string_array,
}
SPECIAL_TYPES = frozenset(_SPECIAL_DECODERS)


def _bound_special(codec: Codec, name: str, encoder: Encoder) -> compiled.Special:
    """A hand-written encoder as the compiled code calls it: value in, message bytes out."""

    def encode(value: Any) -> bytes:
        return encoder(codec, codec.schemas.message(name), value, "")

    return encode


_default: Codec | None = None


def default() -> Codec:
    """The codec of the committed schemas."""
    global _default
    if _default is None:
        _default = Codec()
    return _default
