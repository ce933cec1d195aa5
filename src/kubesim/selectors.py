"""Label and field selectors: parsing the query-string forms and matching objects."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubesim import errors

_SET_RE = re.compile(r"^\s*(!?)([A-Za-z0-9_./-]+)\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$")
_EQ_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_./-]*)\s*$")


@dataclass(frozen=True, slots=True)
class Requirement:
    """One clause: key, operator (In, NotIn, Exists, DoesNotExist, Gt, Lt) and values."""

    key: str
    op: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a label map satisfies this clause."""
        if self.op == "Exists":
            return self.key in labels
        if self.op == "DoesNotExist":
            return self.key not in labels
        if self.op == "In":
            return labels.get(self.key) in self.values
        if self.op == "NotIn":
            return labels.get(self.key) not in self.values
        value = labels.get(self.key)
        if value is None:
            return False
        try:
            number = int(value)
            bound = int(next(iter(self.values)))
        except (ValueError, StopIteration):
            return False
        return number > bound if self.op == "Gt" else number < bound


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A conjunction of requirements; the empty selector matches everything."""

    requirements: tuple[Requirement, ...] = ()
    nothing: bool = False

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        """Whether a label map is selected."""
        if self.nothing:
            return False
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        """True when the selector selects everything."""
        return not self.requirements and not self.nothing


EVERYTHING = LabelSelector()
NOTHING = LabelSelector(nothing=True)


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse the `labelSelector` query form, e.g. `a=b,c!=d,e in (x,y),!f`."""
    if not text or not text.strip():
        return EVERYTHING
    requirements: list[Requirement] = []
    for clause in _split_top_level(text):
        eq = _EQ_RE.match(clause)
        if eq:
            key, op, value = eq.groups()
            requirements.append(
                Requirement(key, "NotIn" if op == "!=" else "In", frozenset({value}))
            )
            continue
        match = _SET_RE.match(clause)
        if not match:
            raise errors.bad_request(
                f"unable to parse requirement: invalid label selector {text!r}"
            )
        negate, key, op, values = match.groups()
        if op:
            if negate:
                raise errors.bad_request(f"invalid label selector {text!r}")
            items = frozenset(v.strip() for v in values.split(",") if v.strip())
            requirements.append(Requirement(key, "In" if op == "in" else "NotIn", items))
        else:
            requirements.append(Requirement(key, "DoesNotExist" if negate else "Exists"))
    return LabelSelector(tuple(requirements))


def from_label_selector_object(selector: Mapping[str, Any] | None) -> LabelSelector:
    """Convert a `metav1.LabelSelector` object; a missing selector selects nothing, `{}` all."""
    if selector is None:
        return NOTHING
    requirements = [
        Requirement(k, "In", frozenset({str(v)}))
        for k, v in (selector.get("matchLabels") or {}).items()
    ]
    for expr in selector.get("matchExpressions") or []:
        op = expr.get("operator", "")
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise errors.bad_request(f"invalid label selector operator {op!r}")
        requirements.append(
            Requirement(expr.get("key", ""), op, frozenset(expr.get("values") or []))
        )
    return LabelSelector(tuple(requirements))


def match_node_selector_requirement(
    expr: Mapping[str, Any], labels: Mapping[str, str], fields: Mapping[str, str] | None = None
) -> bool:
    """Match a node-affinity requirement (supports Gt/Lt) against labels or fields."""
    source = fields if fields is not None else labels
    req = Requirement(
        expr.get("key", ""), expr.get("operator", ""), frozenset(expr.get("values") or [])
    )
    return req.matches(source)


@dataclass(frozen=True, slots=True)
class FieldSelector:
    """Equality field requirements such as `spec.nodeName=n1,status.phase!=Failed`."""

    clauses: tuple[tuple[str, bool, str], ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Whether an object is selected."""
        for path, equal, value in self.clauses:
            if (field_value(obj, path) == value) != equal:
                return False
        return True

    @property
    def empty(self) -> bool:
        """True when there are no clauses."""
        return not self.clauses


def parse_field_selector(text: str | None) -> FieldSelector:
    """Parse the `fieldSelector` query form."""
    if not text or not text.strip():
        return FieldSelector()
    clauses: list[tuple[str, bool, str]] = []
    for clause in text.split(","):
        if not clause.strip():
            continue
        match = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$", clause)
        if not match:
            raise errors.bad_request(f"invalid field selector: {text!r}")
        path, op, value = match.groups()
        clauses.append((path, op != "!=", value))
    return FieldSelector(tuple(clauses))


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string form of a dotted field path, as the API server compares it."""
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, Mapping):
            return ""
        current = current.get(part)
    if current is None:
        # spec.unschedulable is a bool defaulting to false; empty strings otherwise.
        return "false" if path == "spec.unschedulable" else ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)
