"""Decoding a request body into a built-in kind the way the real server's JSON decoder does.

The server unmarshals JSON into Go structs, so a value of the wrong type is a 400 whose message is
Go's (`json: cannot unmarshal string into Go struct field DeploymentSpec.spec.replicas of type
int32`: the innermost struct, the field names from the root without list indices, the Go type),
only the first such error is reported, unknown fields are dropped (and reported by
fieldValidation), `null` leaves a field unset, and quantities are re-written canonically.

Schemas are compiled once into `_Plan`s (references resolved, Go type names worked out) because
every write of a built-in kind passes through here; paths are only spelled out when needed.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from typing import Any

from kubesim import builtin_schemas as bs
from kubesim.validation import quantity

TIME_FORMAT = "2006-01-02T15:04:05Z07:00"
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_BASE64_CHARS = re.compile(r"[^A-Za-z0-9+/=]")
_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
# Named Go types of a few common fields, so type errors name them as the server does.
_NAMED_TYPES = {
    ("Container", "imagePullPolicy"): "v1.PullPolicy",
    ("Container", "terminationMessagePolicy"): "v1.TerminationMessagePolicy",
    ("PodSpec", "restartPolicy"): "v1.RestartPolicy",
    ("PodSpec", "dnsPolicy"): "v1.DNSPolicy",
    ("ContainerPort", "protocol"): "v1.Protocol",
    ("ServicePort", "protocol"): "v1.Protocol",
    ("ServiceSpec", "type"): "v1.ServiceType",
    ("Secret", "type"): "v1.SecretType",
    ("ResourceRequirements", "limits"): "v1.ResourceList",
    ("ResourceRequirements", "requests"): "v1.ResourceList",
    ("NodeStatus", "capacity"): "v1.ResourceList",
    ("NodeStatus", "allocatable"): "v1.ResourceList",
}

# Plan kinds.
ANY, STRUCT, MAP, ARRAY, STRING, BYTES, INTEGER, NUMBER, BOOLEAN, TIME, INT_OR_STRING, QUANTITY = (
    range(12)
)


@dataclass
class _Plan:
    """How to decode one schema: its kind, Go type, and the plans of its parts."""

    kind: int
    go_type: str = "interface {}"
    struct: str = ""  # for STRUCT: the Go struct name
    fields: dict[str, _Plan] = field(default_factory=dict)  # STRUCT: per property
    element: _Plan | None = None  # MAP values, ARRAY items
    int_range: tuple[int, int] = _INT_RANGES["int64"]


_PLANS: dict[str, _Plan] = {}


def _plan_for(schema: dict[str, Any]) -> _Plan:
    """The plan of a schema (definitions are compiled once and shared, recursion allowed)."""
    name = bs.ref_name(schema)
    if name is not None:
        cached = _PLANS.get(name)
        if cached is not None:
            return cached
        plan = _Plan(ANY, bs.go_type_name(name))
        _PLANS[name] = plan  # before filling in, so recursive types terminate
        _fill(plan, bs.resolve(schema), name)
        return plan
    plan = _Plan(ANY, go_type_of(schema))
    _fill(plan, schema, None)
    return plan


def _fill(plan: _Plan, schema: dict[str, Any], name: str | None) -> None:
    if name == bs.INT_OR_STRING:
        plan.kind = INT_OR_STRING
        return
    if name == bs.QUANTITY:
        plan.kind = QUANTITY
        return
    kind = schema.get("type")
    fmt = schema.get("format")
    if kind == "string":
        plan.kind = TIME if fmt == "date-time" else BYTES if fmt == "byte" else STRING
    elif kind == "integer":
        plan.kind = INTEGER
        plan.int_range = _INT_RANGES.get(fmt or "int64", _INT_RANGES["int64"])
    elif kind == "number":
        plan.kind = NUMBER
    elif kind == "boolean":
        plan.kind = BOOLEAN
    elif kind == "array":
        items = schema.get("items")
        if isinstance(items, dict):
            plan.kind = ARRAY
            plan.element = _plan_for(items)
    elif kind == "object":
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        if isinstance(properties, dict):
            plan.kind = STRUCT
            plan.struct = name.rsplit(".", 1)[-1] if name else ""
            for key, sub in properties.items():
                child = _plan_for(sub)
                named = _NAMED_TYPES.get((plan.struct, key))
                if named:
                    child = _Plan(
                        child.kind,
                        named,
                        child.struct,
                        child.fields,
                        child.element,
                        child.int_range,
                    )
                plan.fields[key] = child
        elif isinstance(extra, dict):
            plan.kind = MAP
            plan.element = _plan_for(extra)


# Where a value sits: (parent, key, is_struct_field, innermost struct), spelled out only for
# messages. `key` is a field or map key, a list index, or None at the root.
_At = tuple[Any, "str | int | None", bool, str]


def json_path(at: _At | None) -> str:
    """`spec.template.spec.containers[0].foo`."""
    parts: list[str] = []
    while at is not None and at[1] is not None:
        key = at[1]
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
        at = at[0]
    return "".join(reversed(parts)).lstrip(".")


def go_path(at: _At | None) -> str:
    """The struct-field names from the root, as Go's decoder reports them."""
    names: list[str] = []
    while at is not None and at[1] is not None:
        if at[2]:
            names.append(str(at[1]))
        at = at[0]
    return ".".join(reversed(names))


@dataclass
class Decoder:
    """Walks a value against a plan, fixing it up in place and collecting unknown fields.

    `old`, when given, is the stored (already decoded) version at the same place: parts equal to
    it are skipped, which keeps updates that change little cheap.
    """

    unknown: list[str] = field(default_factory=list)
    error: str | None = None

    def fail(self, message: str) -> None:
        """Keep the first error, like Go's decoder."""
        if self.error is None:
            self.error = message

    def type_error(self, found: str, plan: _Plan, at: _At) -> None:
        """Record a Go UnmarshalTypeError for a field."""
        where = f"Go struct field {at[3]}.{go_path(at)}" if at[3] else "Go value"
        self.fail(f"json: cannot unmarshal {found} into {where} of type {plan.go_type}")

    def decode(self, value: Any, plan: _Plan, at: _At, old: Any = None) -> Any:
        """The decoded value (may be the same object, fixed up in place)."""
        kind = plan.kind
        if kind == STRUCT:
            if not isinstance(value, dict):
                self.type_error(json_kind(value), plan, at)
                return value
            fields = plan.fields
            olds = old if isinstance(old, dict) else None
            for key in list(value):
                child = fields.get(key)
                if child is None:
                    self.unknown.append(json_path((at, key, True, plan.struct)))
                    del value[key]
                    continue
                item = value[key]
                if item is None:
                    del value[key]
                    continue
                before = olds.get(key) if olds is not None else None
                if item is before or (before is not None and item == before):
                    continue  # shared with or equal to the stored version: decoded already
                if _plain_ok(item, child):
                    continue
                value[key] = self.decode(item, child, (at, key, True, plan.struct), before)
            return value
        if kind == ARRAY:
            if not isinstance(value, list):
                self.type_error(json_kind(value), plan, at)
                return value
            element = plan.element
            assert element is not None
            olds_list = old if isinstance(old, list) else ()
            for index, item in enumerate(value):
                before = olds_list[index] if index < len(olds_list) else None
                if item is None:
                    value[index] = zero_value(element)
                elif not ((before is not None and item == before) or _plain_ok(item, element)):
                    value[index] = self.decode(item, element, (at, index, False, at[3]), before)
            return value
        if kind == MAP:
            if not isinstance(value, dict):
                self.type_error(json_kind(value), plan, at)
                return value
            element = plan.element
            assert element is not None
            olds = old if isinstance(old, dict) else None
            for key, item in value.items():
                before = olds.get(key) if olds is not None else None
                if item is None:
                    value[key] = zero_value(element)
                elif not ((before is not None and item == before) or _plain_ok(item, element)):
                    value[key] = self.decode(item, element, (at, key, False, at[3]), before)
            return value
        if kind in (STRING, BOOLEAN, NUMBER):
            if not _plain_ok(value, plan) and not (kind == NUMBER and isinstance(value, float)):
                self.type_error(json_kind(value), plan, at)
            return value
        if kind == INTEGER:
            if isinstance(value, bool) or not isinstance(value, int | float):
                self.type_error(json_kind(value), plan, at)
            elif isinstance(value, float) or not plan.int_range[0] <= value <= plan.int_range[1]:
                self.type_error(f"number {number_text(value)}", plan, at)
            return value
        if kind == TIME:
            return self._time(value)
        if kind == BYTES:
            if not isinstance(value, str):
                self.type_error(json_kind(value), plan, at)
            else:
                self._base64(value)
            return value
        if kind == INT_OR_STRING:
            return self._int_or_string(value)
        if kind == QUANTITY:
            return self._quantity(value)
        return value  # ANY: free-form (RawExtension, FieldsV1, JSON)

    def _int_or_string(self, value: Any) -> Any:
        if isinstance(value, str):
            return value
        low, high = _INT_RANGES["int32"]
        if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
            return value
        found = json_kind(value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            found = f"number {number_text(value)}"
        self.fail(f"json: cannot unmarshal {found} into Go value of type int32")
        return value

    def _quantity(self, value: Any) -> Any:
        try:
            if isinstance(value, str):
                return quantity.canonical(value)
            if isinstance(value, int | float) and not isinstance(value, bool):
                return quantity.from_number(value)
        except quantity.QuantityError as exc:
            self.fail(str(exc))
            return value
        self.fail(quantity.FORMAT_ERROR)
        return value

    def _time(self, value: Any) -> Any:
        if not isinstance(value, str):
            self.fail(f"json: cannot unmarshal {json_kind(value)} into Go value of type string")
        elif not _RFC3339.match(value):
            self.fail(
                f'parsing time "{value}" as "{TIME_FORMAT}": cannot parse "{value}" as "2006"'
            )
        return value

    def _base64(self, text: str) -> None:
        bad = _BASE64_CHARS.search(text)
        if bad:
            self.fail(f"illegal base64 data at input byte {bad.start()}")
            return
        try:
            base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            self.fail(f"illegal base64 data at input byte {max(0, len(text) - len(text) % 4)}")


def _plain_ok(value: Any, plan: _Plan) -> bool:
    """A fast path: scalars that already have the right type (and form) need no work."""
    kind = plan.kind
    if kind == STRING:
        return isinstance(value, str)
    if kind == BOOLEAN:
        return isinstance(value, bool)
    if kind == NUMBER:
        return type(value) is int
    if kind == TIME:
        return isinstance(value, str) and _RFC3339.match(value) is not None
    if kind == QUANTITY:
        return isinstance(value, str) and _canonical_already(value)
    if kind == INTEGER:
        return type(value) is int and plan.int_range[0] <= value <= plan.int_range[1]
    if kind == INT_OR_STRING:
        return isinstance(value, str) or (type(value) is int and -(2**31) <= value < 2**31)
    return False


def json_kind(value: Any) -> str:
    """The JSON type word Go's errors use."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def number_text(value: int | float) -> str:
    """A JSON number as it appeared in the body (as near as a parsed value allows)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return f"{value:.1f}"
    return repr(value)


def go_type_of(schema: dict[str, Any]) -> str:
    """The Go type of a field as reflect prints it (`int32`, `[]v1.Container`, ...)."""
    name = bs.ref_name(schema)
    if name is not None:
        return bs.go_type_name(name)
    kind = schema.get("type")
    fmt = schema.get("format")
    if kind == "string":
        return "[]uint8" if fmt == "byte" else "string"
    if kind == "integer":
        return fmt if fmt in _INT_RANGES else "int64"
    if kind == "number":
        return "float64"
    if kind == "boolean":
        return "bool"
    if kind == "array":
        items = schema.get("items")
        return "[]" + (go_type_of(items) if isinstance(items, dict) else "interface {}")
    if kind == "object":
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            return "map[string]" + go_type_of(extra)
        return "map[string]interface {}"
    return "interface {}"


def zero_value(plan: _Plan) -> Any:
    """What Go leaves in a list or map slot that held `null`."""
    return {
        STRUCT: {},
        STRING: "",
        TIME: None,
        BYTES: "",
        INTEGER: 0,
        NUMBER: 0,
        BOOLEAN: False,
        INT_OR_STRING: 0,
        QUANTITY: "0",
    }.get(plan.kind)


def _canonical_already(text: str) -> bool:
    try:
        return quantity.canonical(text) == text
    except quantity.QuantityError:
        return False


def decode_object(
    obj: dict[str, Any], definition: str, old: dict[str, Any] | None = None
) -> Decoder:
    """Decode a whole object in place against its kind's definition (by name)."""
    decoder = Decoder()
    plan = _PLANS.get(definition) or _plan_for({"$ref": bs.REF_PREFIX + definition})
    decoder.decode(obj, plan, (None, None, False, plan.struct), old)
    return decoder


def decode_metadata(obj: dict[str, Any], old: dict[str, Any] | None = None) -> Decoder:
    """Decode only `metadata` (custom resources: the rest is the CRD schema's business)."""
    decoder = Decoder()
    if obj.get("metadata") is not None:
        plan = _plan_for({"$ref": bs.REF_PREFIX + bs.OBJECT_META})
        before = (old or {}).get("metadata")
        obj["metadata"] = decoder.decode(
            obj["metadata"], plan, (None, "metadata", True, ""), before
        )
    else:
        obj.pop("metadata", None)
    return decoder
