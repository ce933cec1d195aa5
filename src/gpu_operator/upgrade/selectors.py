"""Label selectors, as strings (`app=x,tier in (a,b),!gpu`) or LabelSelector objects, matched
against pod labels. Pure: the upgrade policy's podSelectors and PDBs need them offline too."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_SET = re.compile(r"^\s*([^\s!=()]+)\s+(in|notin)\s*\(([^()]*)\)\s*$")
# A value holds no `=`, `!`, comma or parenthesis (`a=b=c` is not a requirement).
_EQ = re.compile(r"^\s*([^\s!=()]+)\s*(==|=|!=)\s*([^\s!=(),]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([^\s!=(),]+)\s*$")


class SelectorError(ValueError):
    """A selector that cannot be parsed; the message quotes the bad part."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # In, NotIn, Exists, DoesNotExist
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == "Exists":
            return self.key in labels
        if self.op == "DoesNotExist":
            return self.key not in labels
        if self.op == "In":
            return self.key in labels and labels[self.key] in self.values
        return self.key not in labels or labels[self.key] not in self.values


@dataclass(frozen=True)
class Selector:
    """All requirements must hold; no requirements match everything."""

    requirements: tuple[Requirement, ...] = ()
    text: str = ""

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        found = labels or {}
        return all(r.matches(found) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements

    def __str__(self) -> str:
        return self.text


def _split(text: str) -> list[str]:
    """Split at commas outside parentheses."""
    parts: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unbalanced parentheses in selector {text!r}")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise SelectorError(f"unbalanced parentheses in selector {text!r}")
    parts.append(current)
    return parts


def parse(text: str | None) -> Selector:
    """Parse a selector string as kubectl's `-l` takes it; an empty string selects everything."""
    if not text or not text.strip():
        return Selector()
    requirements: list[Requirement] = []
    for part in _split(text):
        if not part.strip():
            raise SelectorError(f"empty requirement in selector {text!r}")
        if match := _SET.match(part):
            values = frozenset(v.strip() for v in match.group(3).split(",") if v.strip())
            if not values:
                raise SelectorError(f"{part.strip()!r} in selector {text!r}: a set needs a value")
            op = "In" if match.group(2) == "in" else "NotIn"
            requirements.append(Requirement(match.group(1), op, values))
        elif match := _EQ.match(part):
            op = "NotIn" if match.group(2) == "!=" else "In"
            requirements.append(Requirement(match.group(1), op, frozenset({match.group(3)})))
        elif match := _EXISTS.match(part):
            op = "DoesNotExist" if match.group(1) else "Exists"
            requirements.append(Requirement(match.group(2), op))
        else:
            raise SelectorError(f"cannot parse {part.strip()!r} in selector {text!r}")
    return Selector(tuple(requirements), text.strip())


def from_object(obj: Mapping[str, Any] | None) -> Selector:
    """A LabelSelector object (matchLabels and matchExpressions); None selects nothing."""
    if obj is None:
        return Selector((Requirement("", "In", frozenset()),), "<none>")
    requirements = [
        Requirement(str(k), "In", frozenset({str(v)}))
        for k, v in (obj.get("matchLabels") or {}).items()
    ]
    for expression in obj.get("matchExpressions") or []:
        op = str(expression.get("operator"))
        values = frozenset(str(v) for v in expression.get("values") or [])
        requirements.append(Requirement(str(expression.get("key")), op, values))
    text = ",".join(_describe(r) for r in requirements)
    return Selector(tuple(requirements), text)


def _describe(req: Requirement) -> str:
    values = ",".join(sorted(req.values))
    if req.op == "Exists":
        return req.key
    if req.op == "DoesNotExist":
        return f"!{req.key}"
    if req.op == "In" and len(req.values) == 1:
        return f"{req.key}={values}"
    return f"{req.key} {req.op.lower()} ({values})"
