"""RBAC policy rules: matching a request, covering another rule, and the compact text of both."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kubesim.auth.attributes import Attributes


@dataclass(frozen=True, slots=True)
class Rule:
    """One PolicyRule with its lists as tuples."""

    verbs: tuple[str, ...] = ()
    api_groups: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    resource_names: tuple[str, ...] = ()
    non_resource_urls: tuple[str, ...] = ()

    @classmethod
    def parse(cls, rule: dict[str, Any]) -> Rule:
        """From a PolicyRule object (missing lists are empty)."""
        return cls(
            tuple(rule.get("verbs") or ()),
            tuple(rule.get("apiGroups") or ()),
            tuple(rule.get("resources") or ()),
            tuple(rule.get("resourceNames") or ()),
            tuple(rule.get("nonResourceURLs") or ()),
        )

    def wire(self) -> dict[str, list[str]]:
        """Back to a PolicyRule object (empty lists left out, as the real server serialises)."""
        body: dict[str, list[str]] = {"verbs": list(self.verbs)}
        if self.api_groups:
            body["apiGroups"] = list(self.api_groups)
        if self.resources:
            body["resources"] = list(self.resources)
        if self.resource_names:
            body["resourceNames"] = list(self.resource_names)
        if self.non_resource_urls:
            body["nonResourceURLs"] = list(self.non_resource_urls)
        return body

    def allows(self, attrs: Attributes) -> bool:
        """Whether this rule grants the request (the real RuleAllows)."""
        if "*" not in self.verbs and attrs.verb not in self.verbs:
            return False
        if not attrs.resource_request:
            return any(_url_matches(url, attrs.path) for url in self.non_resource_urls)
        if "*" not in self.api_groups and attrs.api_group not in self.api_groups:
            return False
        if not _resource_matches(self.resources, attrs.combined_resource, attrs.subresource):
            return False
        # A rule limited to names never grants a request without one (list, watch, create).
        return not self.resource_names or attrs.name in self.resource_names

    def breakdown(self) -> list[Rule]:
        """One rule per (group, resource, verb[, name]) and per (url, verb)."""
        atoms: list[Rule] = []
        for group in self.api_groups:
            for resource in self.resources:
                for verb in self.verbs:
                    if self.resource_names:
                        atoms.extend(
                            Rule((verb,), (group,), (resource,), (name,))
                            for name in self.resource_names
                        )
                    else:
                        atoms.append(Rule((verb,), (group,), (resource,)))
        for url in self.non_resource_urls:
            atoms.extend(Rule((verb,), non_resource_urls=(url,)) for verb in self.verbs)
        return atoms

    def covers(self, other: Rule) -> bool:
        """Whether holding this rule means holding all of `other` (the real ruleCovers)."""
        if "*" not in self.verbs and not set(other.verbs) <= set(self.verbs):
            return False
        if "*" not in self.api_groups and not set(other.api_groups) <= set(self.api_groups):
            return False
        if not _resources_cover(self.resources, other.resources):
            return False
        if not all(
            any(_url_matches(owner, url) for owner in self.non_resource_urls)
            for url in other.non_resource_urls
        ):
            return False
        if not other.resource_names:
            return not self.resource_names
        return not self.resource_names or set(other.resource_names) <= set(self.resource_names)

    def compact_string(self) -> str:
        """The Go-formatted text escalation errors list (`{APIGroups:[""], Verbs:["get"]}`)."""
        parts = []
        for label, values in (
            ("APIGroups", self.api_groups),
            ("Resources", self.resources),
            ("NonResourceURLs", self.non_resource_urls),
            ("ResourceNames", self.resource_names),
            ("Verbs", self.verbs),
        ):
            if values:
                parts.append(f"{label}:{go_quoted(values)}")
        return "{" + ", ".join(parts) + "}"


def go_quoted(values: Iterable[str]) -> str:
    """A string list as Go's %q prints it: `["a" "b"]`."""
    return (
        "["
        + " ".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)
        + "]"
    )


def _url_matches(rule_url: str, path: str) -> bool:
    if rule_url in ("*", path):
        return True
    return rule_url.endswith("*") and path.startswith(rule_url.rstrip("*"))


def _resource_matches(rule_resources: tuple[str, ...], combined: str, subresource: str) -> bool:
    for resource in rule_resources:
        if resource in ("*", combined):
            return True
        # `*/scale` grants the scale subresource of every resource.
        if subresource and resource == "*/" + subresource:
            return True
    return False


def _resources_cover(owned: tuple[str, ...], wanted: tuple[str, ...]) -> bool:
    if "*" in owned:
        return True
    for resource in wanted:
        if resource in owned:
            continue
        if "/" not in resource:
            return False
        if "*/" + resource.split("/", 1)[1] not in owned:
            return False
    return True


def uncovered(owned: list[Rule], wanted: list[Rule]) -> list[Rule]:
    """The atoms of `wanted` that no rule in `owned` covers (the real Covers)."""
    return [
        atom
        for rule in wanted
        for atom in rule.breakdown()
        if not any(owner.covers(atom) for owner in owned)
    ]


def compact(rules: list[Rule]) -> list[Rule]:
    """Merge the verbs of single-group, single-resource rules (the real CompactRules)."""
    merged: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
    result: list[Rule] = []
    for rule in rules:
        simple = (
            len(rule.api_groups) == 1
            and len(rule.resources) == 1
            and len(rule.resource_names) <= 1
            and not rule.non_resource_urls
        )
        if not simple:
            result.append(rule)
            continue
        key = (rule.api_groups[0], rule.resources[0], rule.resource_names)
        verbs = merged.setdefault(key, [])
        verbs.extend(v for v in rule.verbs if v not in verbs)
    result.extend(
        Rule(tuple(verbs), (group,), (resource,), names)
        for (group, resource, names), verbs in merged.items()
    )
    return result
