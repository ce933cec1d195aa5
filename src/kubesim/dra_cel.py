"""CEL device selectors as kube-apiserver compiles them and kube-scheduler evaluates them (DRA).

The expressions run on cel-python (`celpy`), a maintained CEL implementation; this module only
builds the environment the real DRA library declares:

- one variable, `device`, with `driver` (string), `attributes` and `capacity` (maps from a
  qualified-name domain to maps from identifier to value), and `allowMultipleAllocations`
  (bool). An attribute or capacity published without a domain belongs to the driver's domain,
  so `device.attributes["gpu.example.com"].model` finds `model` of driver `gpu.example.com`;
- attribute values are ints, bools, strings or semantic versions; capacity values are
  quantities;
- the Kubernetes CEL libraries the selectors use: `quantity()`/`isQuantity()` with
  `compareTo`, `isLessThan`, `isGreaterThan`, `add`, `sub`, `asInteger`, `isInteger`,
  `asApproximateFloat`, `sign`; `semver()`/`isSemver()` with `major`, `minor`, `patch`,
  `compareTo`, `isLessThan`, `isGreaterThan`.

Compilation is what admission checks: a parse error or a reference to anything but `device`
(and comprehension variables) is an error, an expression over the length limit is too long, and
an estimated cost over the selector cost limit is too complex. The estimate multiplies the
expression's size by the largest list or map a comprehension can walk (a device has at most 32
attributes and capacities), per nesting level, which bounds what the evaluation can do.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import celpy
import lark
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from kubesim import quantity as quantities

# The API's limits for a selector expression (resource.k8s.io/v1 validation).
MAX_EXPRESSION_LENGTH = 10 * 1024
MAX_COST = 1_000_000
# A device carries at most this many attributes plus capacities (the comprehension bound).
MAX_DEVICE_ENTRIES = 32
_COMPREHENSIONS = ("all", "exists", "exists_one", "map", "filter")
_TYPE_NAMES = frozenset(
    {"int", "uint", "double", "bool", "string", "bytes", "list", "map", "type", "null_type"}
)
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


class _Counter:
    """How many selector evaluations ran (benches read it)."""

    count = 0


EVALUATIONS = _Counter()


class CelError(Exception):
    """A compile or evaluation error, worded like the real DRA CEL errors."""


class Quantity:
    """A Kubernetes resource quantity as the CEL quantity library sees it."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.value: Fraction = quantities.parse(text)

    def __repr__(self) -> str:
        return f"quantity({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


@dataclass(frozen=True)
class Semver:
    """A semantic version (precedence ignores build metadata)."""

    major: int
    minor: int
    patch: int
    pre: tuple[str, ...]

    def key(self) -> tuple[Any, ...]:
        # A release sorts after its pre-releases; numeric identifiers sort below alphanumeric.
        pre = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.pre)
        return (self.major, self.minor, self.patch, 0 if self.pre else 1, pre)


def parse_semver(text: str) -> Semver | None:
    """A version string, or None when it is not semver 2.0.0."""
    match = _SEMVER.match(text)
    if not match:
        return None
    pre = tuple(match.group(4).split(".")) if match.group(4) else ()
    return Semver(int(match.group(1)), int(match.group(2)), int(match.group(3)), pre)


def _cmp(a: Any, b: Any) -> int:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        left, right = a.value, b.value
    elif isinstance(a, Semver) and isinstance(b, Semver):
        left, right = a.key(), b.key()  # type: ignore[assignment]
    else:
        raise CelError("no such overload")
    return (left > right) - (left < right)


def _quantity(text: Any) -> Quantity:
    try:
        return Quantity(str(text))
    except ValueError as exc:
        raise CelError(f"quantities must match the regular expression: {text}") from exc


def _semver(text: Any) -> Semver:
    version = parse_semver(str(text))
    if version is None:
        raise CelError(f"could not parse {text} as semver")
    return version


def _is_quantity(text: Any) -> celtypes.BoolType:
    try:
        quantities.parse(str(text))
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _as_integer(q: Quantity) -> celtypes.IntType:
    if q.value.denominator != 1:
        raise CelError("cannot convert value to integer")
    return celtypes.IntType(int(q.value))


def _sign(q: Quantity) -> celtypes.IntType:
    return celtypes.IntType((q.value > 0) - (q.value < 0))


def _arith(sign: int) -> Any:
    def op(a: Quantity, b: Any) -> Quantity:
        other = b.value if isinstance(b, Quantity) else Fraction(int(b))
        result = Quantity("0")
        result.value = a.value + sign * other
        result.text = str(result.value)
        return result

    return op


def _part(index: int) -> Any:
    def get(version: Semver) -> celtypes.IntType:
        return celtypes.IntType((version.major, version.minor, version.patch)[index])

    return get


FUNCTIONS: dict[str, Any] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "semver": _semver,
    "isSemver": lambda text: celtypes.BoolType(parse_semver(str(text)) is not None),
    "compareTo": lambda a, b: celtypes.IntType(_cmp(a, b)),
    "isLessThan": lambda a, b: celtypes.BoolType(_cmp(a, b) < 0),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_cmp(a, b) > 0),
    "add": _arith(1),
    "sub": _arith(-1),
    "asInteger": _as_integer,
    "isInteger": lambda q: celtypes.BoolType(q.value.denominator == 1),
    "asApproximateFloat": lambda q: celtypes.DoubleType(float(q.value)),
    "sign": _sign,
    "major": _part(0),
    "minor": _part(1),
    "patch": _part(2),
}
_KNOWN_CALLS = frozenset(FUNCTIONS) | {
    "size",
    "has",
    "matches",
    "startsWith",
    "endsWith",
    "contains",
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "type",
    "lowerAscii",
    "upperAscii",
    "trim",
    "split",
    "join",
    "replace",
    "indexOf",
    "lastIndexOf",
    "substring",
    *_COMPREHENSIONS,
}
_ENV = celpy.Environment()


# What a selector reads of a device: ("driver", "", ""), ("allowMultipleAllocations", "", ""),
# ("attributes", domain, name) or ("capacity", domain, name).
Reference = tuple[str, str, str]


@dataclass(frozen=True)
class Program:
    """A compiled selector, its estimated cost and what it reads of a device.

    `references` lists every device field the expression reads when it reads them only as
    `device.driver`, `device.allowMultipleAllocations`, `device.attributes["domain"].name` or
    `device.capacity["domain"].name` (`["name"]` works too): two devices that agree on those
    fields get the same verdict. It is None when the expression reads a device map as a whole
    (a comprehension over `device.attributes[...]`, an index that is not a string literal):
    then only devices with identical attributes and capacity share verdicts.
    """

    expression: str
    runner: Any
    cost: int
    references: tuple[Reference, ...] | None = None

    def matches(self, device: Mapping[str, Any]) -> bool:
        """Evaluate against one device's activation (from `activation`); raises CelError."""
        EVALUATIONS.count += 1
        try:
            result = self.runner.evaluate({"device": device})
        except CELEvalError as exc:
            raise CelError(_eval_message(exc)) from exc
        except CelError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise CelError(str(exc)) from exc
        if isinstance(result, CELEvalError):
            raise CelError(_eval_message(result))
        if not isinstance(result, bool | celtypes.BoolType):
            raise CelError(f"expression must evaluate to bool, got {type(result).__name__}")
        return bool(result)


def _eval_message(exc: Exception) -> str:
    args = exc.args
    if args and isinstance(args[0], str):
        if args[0] == "no such key" and len(args) > 2 and args[2]:
            return f"no such key: {args[2][0]}"
        missing = re.match(r"no such member in mapping: '(.*)'", args[0])
        return f"no such key: {missing.group(1)}" if missing else args[0]
    return str(exc)


def _walk(tree: lark.Tree[Any], depth: int, bound: set[str]) -> tuple[int, int, list[str]]:
    """(nodes, deepest comprehension nesting, unknown names) of a parse tree."""
    nodes, deepest, unknown = 1, depth, []
    if tree.data == "member_dot_arg" and len(tree.children) >= 2:
        method = str(tree.children[1])
        if method in _COMPREHENSIONS:
            depth += 1
            deepest = depth
            args = tree.children[2] if len(tree.children) > 2 else None
            if isinstance(args, lark.Tree) and args.children:
                first = args.children[0]
                name = _sole_ident(first)
                if name:
                    bound = bound | {name}
        elif method not in _KNOWN_CALLS:
            unknown.append(f"found no matching overload for '{method}'")
    if tree.data == "ident_arg" and tree.children:
        name = str(tree.children[0])
        if name not in _KNOWN_CALLS:
            unknown.append(f"undeclared reference to '{name}' (in container '')")
    if tree.data == "ident" and tree.children:
        name = str(tree.children[0])
        if name not in bound and name != "device" and name not in _TYPE_NAMES:
            unknown.append(f"undeclared reference to '{name}' (in container '')")
    for child in tree.children:
        if isinstance(child, lark.Tree):
            n, d, u = _walk(child, depth, bound)
            nodes += n
            deepest = max(deepest, d)
            unknown.extend(u)
    return nodes, deepest, unknown


def _sole_ident(tree: Any) -> str:
    while isinstance(tree, lark.Tree):
        if tree.data == "ident" and tree.children:
            return str(tree.children[0])
        if len(tree.children) != 1:
            return ""
        tree = tree.children[0]
    return ""


@functools.lru_cache(maxsize=4096)
def compile_selector(expression: str) -> Program:
    """Compile a selector (cached by text); raises CelError with the server's wording."""
    if not expression.strip():
        raise CelError("compilation failed: ERROR: <input>:1:1: Syntax error: mismatched input")
    try:
        ast = _ENV.compile(expression)
    except CELParseError as exc:
        line, column = getattr(exc, "line", None), getattr(exc, "column", None)
        where = f"{line or 1}:{column or 1}"
        first = str(exc.args[0]).splitlines()[0] if exc.args else "syntax error"
        raise CelError(
            f"compilation failed: ERROR: <input>:{where}: Syntax error: {first}"
        ) from exc
    nodes, nesting, unknown = _walk(ast, 0, set())
    if unknown:
        raise CelError(f"compilation failed: ERROR: <input>:1:1: {unknown[0]}")
    cost = nodes * MAX_DEVICE_ENTRIES**nesting
    runner = _ENV.program(ast, functions=FUNCTIONS)
    found: set[Reference] = set()
    references = tuple(sorted(found)) if _references(ast, found) else None
    return Program(expression, runner, cost, references)


def _path(tree: Any) -> list[str] | None:
    """The field path a `member` node names from `device` (["device", "attributes", "d", "x"]),
    or None when it is not such a path."""
    if not isinstance(tree, lark.Tree) or tree.data != "member" or len(tree.children) != 1:
        return None
    inner = tree.children[0]
    if not isinstance(inner, lark.Tree):
        return None
    if inner.data == "primary":
        return ["device"] if _sole_ident(inner) == "device" and _is_ident(inner) else None
    if inner.data == "member_dot" and len(inner.children) == 2:
        base = _path(inner.children[0])
        return None if base is None else [*base, str(inner.children[1])]
    if inner.data == "member_index" and len(inner.children) == 2:
        base = _path(inner.children[0])
        key = _string_literal(inner.children[1])
        return None if base is None or key is None else [*base, key]
    return None


def _is_ident(primary: lark.Tree[Any]) -> bool:
    return (
        len(primary.children) == 1
        and isinstance(primary.children[0], lark.Tree)
        and primary.children[0].data == "ident"
    )


def _string_literal(tree: Any) -> str | None:
    while isinstance(tree, lark.Tree):
        if tree.data == "literal" and tree.children:
            text = str(tree.children[0])
            if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'" and "\\" not in text:
                return text[1:-1]
            return None
        if len(tree.children) != 1:
            return None
        tree = tree.children[0]
    return None


def _references(tree: Any, found: set[Reference]) -> bool:
    """Collect the device fields an expression reads; False when it reads a map as a whole."""
    if not isinstance(tree, lark.Tree):
        return True
    path = _path(tree)
    if path is not None:
        if path in (["device", "driver"], ["device", "allowMultipleAllocations"]):
            found.add((path[1], "", ""))
            return True
        if len(path) == 4 and path[1] in ("attributes", "capacity"):
            found.add((path[1], path[2], path[3]))
            return True
        if path[0] == "device" and len(path) < 4:
            return False  # `device`, `device.attributes` or one domain's map as a value
    if tree.data in ("ident", "ident_arg") and _sole_ident(tree) == "device":
        return False
    return all(_references(child, found) for child in tree.children)


def compile_problem(expression: str) -> tuple[str, str] | None:
    """("invalid"|"too_long"|"too_complex", detail) for an expression admission rejects."""
    if len(expression) > MAX_EXPRESSION_LENGTH:
        return ("too_long", "")
    try:
        program = compile_selector(expression)
    except CelError as exc:
        return ("invalid", str(exc))
    if program.cost > MAX_COST:
        return ("too_complex", "too complex, exceeds cost limit")
    return None


def _value(attribute: Mapping[str, Any]) -> Any:
    if "int" in attribute:
        return celtypes.IntType(int(attribute["int"]))
    if "bool" in attribute:
        return celtypes.BoolType(bool(attribute["bool"]))
    if "string" in attribute:
        return celtypes.StringType(str(attribute["string"]))
    if "version" in attribute:
        return parse_semver(str(attribute["version"])) or celtypes.StringType(
            str(attribute["version"])
        )
    for key, kind in (("ints", "int"), ("bools", "bool"), ("strings", "string")):
        if key in attribute:
            return celtypes.ListType(_value({kind: v}) for v in attribute[key] or [])
    return None


def _by_domain(driver: str, entries: Mapping[str, Any], convert: Any) -> celtypes.MapType:
    domains: dict[str, dict[str, Any]] = {}
    for name, raw in (entries or {}).items():
        domain, _, ident = str(name).rpartition("/")
        value = convert(raw if isinstance(raw, Mapping) else {})
        if value is None:
            continue
        domains.setdefault(domain or driver, {})[ident] = value
    return celtypes.MapType(
        {
            celtypes.StringType(d): celtypes.MapType(
                {celtypes.StringType(k): v for k, v in values.items()}
            )
            for d, values in domains.items()
        }
    )


def _capacity(entry: Mapping[str, Any]) -> Any:
    value = entry.get("value")
    if value is None:
        return None
    try:
        return Quantity(str(value))
    except ValueError:
        return None


def activation(driver: str, device: Mapping[str, Any]) -> celtypes.MapType:
    """The `device` variable for one published device."""
    return celtypes.MapType(
        {
            celtypes.StringType("driver"): celtypes.StringType(driver),
            celtypes.StringType("attributes"): _by_domain(
                driver, device.get("attributes") or {}, _value
            ),
            celtypes.StringType("capacity"): _by_domain(
                driver, device.get("capacity") or {}, _capacity
            ),
            celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(
                bool(device.get("allowMultipleAllocations"))
            ),
        }
    )
