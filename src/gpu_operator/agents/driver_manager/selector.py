"""Label selectors as `kubectl drain --pod-selector` takes them (`DRAIN_POD_SELECTOR_LABEL`). Pure.

Equality (`k=v`, `k==v`, `k!=v`), existence (`k`, `!k`) and set (`k in (a,b)`, `k notin (a)`)
requirements, comma-separated, all of which must hold. An empty selector matches every pod.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Operator = Literal["=", "!=", "exists", "!exists", "in", "notin"]
_SET = re.compile(r"^([^\s!=()]+)\s+(in|notin)\s+\(([^()]*)\)$")
_EQUALITY = re.compile(r"^([^\s!=()]+)\s*(==|=|!=)\s*([^\s!=(),]*)$")
_KEY = re.compile(r"^(!?)\s*([^\s!=(),]+)$")


class SelectorError(ValueError):
    """The text is not a label selector."""


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator == "exists":
            return value is not None
        if self.operator == "!exists":
            return value is None
        if self.operator in ("=", "in"):
            return value is not None and value in self.values
        return value is None or value not in self.values


@dataclass(frozen=True)
class Selector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        found = labels or {}
        return all(r.matches(found) for r in self.requirements)


def _split(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"{text!r}: unbalanced parentheses")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += char
    if depth:
        raise SelectorError(f"{text!r}: unbalanced parentheses")
    parts.append(current)
    return parts


def parse(text: str) -> Selector:
    """A selector from its text form (SelectorError naming the bad requirement)."""
    if not text.strip():
        return Selector()
    requirements: list[Requirement] = []
    for raw in _split(text):
        part = raw.strip()
        if not part:
            raise SelectorError(f"{text!r}: empty requirement")
        if match := _SET.match(part):
            key, op, values = match.groups()
            items = frozenset(v.strip() for v in values.split(",") if v.strip())
            if not items:
                raise SelectorError(f"{part!r}: a set needs at least one value")
            requirements.append(Requirement(key, "in" if op == "in" else "notin", items))
        elif match := _EQUALITY.match(part):
            key, op, value = match.groups()
            requirements.append(Requirement(key, "!=" if op == "!=" else "=", frozenset({value})))
        elif match := _KEY.match(part):
            negated, key = match.groups()
            requirements.append(Requirement(key, "!exists" if negated else "exists"))
        else:
            raise SelectorError(f"{part!r} is not a label requirement (key=value, key in (a,b))")
    return Selector(tuple(requirements))
