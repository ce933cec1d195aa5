"""The protobuf wire format: varints, field keys and length-delimited values, nothing schema-aware.

Wire types used by Kubernetes: 0 varint (ints, bools, enums), 1 fixed64 (doubles), 2
length-delimited (strings, bytes, messages, packed repeated scalars), 5 fixed32 (floats).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

VARINT = 0
FIXED64 = 1
LENGTH_DELIMITED = 2
FIXED32 = 5


class WireError(ValueError):
    """Bytes that are not a valid protobuf encoding."""


def encode_varint(value: int) -> bytes:
    """A base-128 varint; negative numbers take ten bytes (two's complement), as protobuf does."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def decode_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """(value, next position) of the varint at `pos`; values are unsigned."""
    result = 0
    shift = 0
    end = len(data)
    while True:
        if pos >= end:
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than ten bytes")


def signed64(value: int) -> int:
    """An unsigned 64-bit varint value read as int64 (how int32/int64 fields carry negatives)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def key(number: int, wire_type: int) -> bytes:
    """The key that starts a field."""
    return encode_varint(number << 3 | wire_type)


def varint_field(number: int, value: int) -> bytes:
    """A varint field (int, bool)."""
    return key(number, VARINT) + encode_varint(int(value))


def bytes_field(number: int, value: bytes) -> bytes:
    """A length-delimited field (string bytes, raw bytes, an encoded message)."""
    return key(number, LENGTH_DELIMITED) + encode_varint(len(value)) + value


def string_field(number: int, value: str) -> bytes:
    """A string field."""
    return bytes_field(number, value.encode())


def double_field(number: int, value: float) -> bytes:
    """A double field."""
    return key(number, FIXED64) + struct.pack("<d", value)


def iter_fields(data: bytes | memoryview) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) for each field: ints for varint/fixed, bytes otherwise."""
    view = memoryview(data)
    pos = 0
    end = len(view)
    while pos < end:
        tag, pos = decode_varint(view, pos)
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise WireError("field number 0")
        if wire_type == VARINT:
            value, pos = decode_varint(view, pos)
            yield number, wire_type, value
        elif wire_type == LENGTH_DELIMITED:
            length, pos = decode_varint(view, pos)
            if pos + length > end:
                raise WireError(f"field {number}: length {length} runs past the end")
            yield number, wire_type, bytes(view[pos : pos + length])
            pos += length
        elif wire_type == FIXED64:
            if pos + 8 > end:
                raise WireError(f"field {number}: truncated fixed64")
            yield number, wire_type, int.from_bytes(view[pos : pos + 8], "little")
            pos += 8
        elif wire_type == FIXED32:
            if pos + 4 > end:
                raise WireError(f"field {number}: truncated fixed32")
            yield number, wire_type, int.from_bytes(view[pos : pos + 4], "little")
            pos += 4
        else:
            raise WireError(f"field {number}: unsupported wire type {wire_type}")
