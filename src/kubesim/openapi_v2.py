"""The OpenAPI v2 document in the protobuf form kubectl asks for (gnostic's `openapi.v2.Document`).

kubectl fetches `/openapi/v2` with `Accept: application/com.github.proto-openapi.spec.v2@v1.0+
protobuf` and decodes gnostic's OpenAPIv2.proto messages. Field numbers are facts of that schema
(its FileDescriptorProto is embedded in the kubectl binary; the tests read it from there):
Document{swagger 1, info 2, paths 8, definitions 9}, Info{title 1, version 2},
Definitions{additional_properties 1}, NamedSchema{name 1, value 2}, Schema{_ref 1, format 2,
title 3, description 4, default 5, multiple_of 6, maximum 7, exclusive_maximum 8, minimum 9,
exclusive_minimum 10, max_length 11, min_length 12, pattern 13, max_items 14, min_items 15,
unique_items 16, max_properties 17, min_properties 18, required 19, enum 20,
additional_properties 21, type 22, items 23, all_of 24, properties 25, discriminator 26,
read_only 27, example 30, vendor_extension 31}, AdditionalPropertiesItem{schema 1, boolean 2},
TypeItem{value 1}, ItemsItem{schema 1}, Properties{additional_properties 1},
NamedAny{name 1, value 2}, Any{yaml 2}. Vendor extensions and enum values travel as YAML text
(JSON is valid YAML, so they are written as JSON).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubesim.protobuf import wire

# What kubectl accepts, and what the server labels the response (Go's mime parser rejects "@").
MEDIA_TYPE = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
RESPONSE_TYPE = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"

_STRINGS = {
    "$ref": 1,
    "format": 2,
    "title": 3,
    "description": 4,
    "pattern": 13,
    "discriminator": 26,
}
_DOUBLES = {"multipleOf": 6, "maximum": 7, "minimum": 9}
_BOOLS = {"exclusiveMaximum": 8, "exclusiveMinimum": 10, "uniqueItems": 16, "readOnly": 27}
_INTS = {
    "maxLength": 11,
    "minLength": 12,
    "maxItems": 14,
    "minItems": 15,
    "maxProperties": 17,
    "minProperties": 18,
}


def _any(value: Any) -> bytes:
    """A gnostic Any carrying its value as YAML text."""
    return wire.string_field(2, json.dumps(value, sort_keys=True))


def _named_any(name: str, value: Any) -> bytes:
    return wire.string_field(1, name) + wire.bytes_field(2, _any(value))


def _named_schema(name: str, schema: Mapping[str, Any]) -> bytes:
    return wire.string_field(1, name) + wire.bytes_field(2, encode_schema(schema))


def encode_schema(schema: Mapping[str, Any]) -> bytes:
    """One Schema message; keywords OpenAPI v2 does not have are left out, as the server does."""
    out = bytearray()
    for key, number in _STRINGS.items():
        if isinstance(schema.get(key), str):
            out += wire.string_field(number, schema[key])
    if "default" in schema:
        out += wire.bytes_field(5, _any(schema["default"]))
    for key, number in _DOUBLES.items():
        value = schema.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out += wire.double_field(number, float(value))
    for key, number in _BOOLS.items():
        if schema.get(key) is True:
            out += wire.varint_field(number, 1)
    for key, number in _INTS.items():
        value = schema.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out += wire.varint_field(number, value)
    for name in schema.get("required") or ():
        out += wire.string_field(19, name)
    for value in schema.get("enum") or ():
        out += wire.bytes_field(20, _any(value))
    extra = schema.get("additionalProperties")
    if isinstance(extra, Mapping):
        out += wire.bytes_field(21, wire.bytes_field(1, encode_schema(extra)))
    elif isinstance(extra, bool):
        out += wire.bytes_field(21, wire.varint_field(2, int(extra)))
    kind = schema.get("type")
    if kind:
        kinds = [kind] if isinstance(kind, str) else list(kind)
        out += wire.bytes_field(22, b"".join(wire.string_field(1, k) for k in kinds))
    items = schema.get("items")
    if isinstance(items, Mapping):
        out += wire.bytes_field(23, wire.bytes_field(1, encode_schema(items)))
    elif isinstance(items, list):
        out += wire.bytes_field(23, b"".join(wire.bytes_field(1, encode_schema(i)) for i in items))
    for part in schema.get("allOf") or ():
        out += wire.bytes_field(24, encode_schema(part))
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        body = b"".join(
            wire.bytes_field(1, _named_schema(name, properties[name])) for name in properties
        )
        out += wire.bytes_field(25, body)
    if "example" in schema:
        out += wire.bytes_field(30, _any(schema["example"]))
    for key in sorted(schema):
        if key.startswith("x-"):
            out += wire.bytes_field(31, _named_any(key, schema[key]))
    return bytes(out)


def encode_document(document: Mapping[str, Any]) -> bytes:
    """A whole swagger 2.0 document (swagger, info, definitions; paths are sent empty)."""
    info = document.get("info") or {}
    info_body = wire.string_field(1, str(info.get("title", ""))) + wire.string_field(
        2, str(info.get("version", ""))
    )
    definitions = document.get("definitions") or {}
    definitions_body = b"".join(
        wire.bytes_field(1, _named_schema(name, definitions[name])) for name in definitions
    )
    return (
        wire.string_field(1, str(document.get("swagger", "2.0")))
        + wire.bytes_field(2, info_body)
        + wire.bytes_field(8, b"")
        + wire.bytes_field(9, definitions_body)
    )
