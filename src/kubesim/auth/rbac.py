"""The RBAC authoriser: bindings select subjects, their roles' rules grant requests."""

from __future__ import annotations

from typing import Any

from kubesim.auth import users
from kubesim.auth.attributes import Attributes
from kubesim.auth.rules import Rule
from kubesim.auth.users import UserInfo
from kubesim.store import Event, Store

GROUP = "rbac.authorization.k8s.io"
ROLES = (GROUP, "roles")
CLUSTER_ROLES = (GROUP, "clusterroles")
ROLE_BINDINGS = (GROUP, "rolebindings")
CLUSTER_ROLE_BINDINGS = (GROUP, "clusterrolebindings")
_CACHE_LIMIT = 50_000


class RoleNotFound(Exception):
    """A binding or review names a role that does not exist (the lister's singular message)."""


def applies_to(subject: dict[str, Any], user: UserInfo, binding_namespace: str) -> bool:
    """Whether a binding subject names this user (the real appliesToUser)."""
    kind = subject.get("kind")
    name = subject.get("name", "")
    if kind == "User":
        return bool(user.name == name)
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        # A ServiceAccount subject without a namespace means the binding's own namespace.
        namespace = subject.get("namespace") or binding_namespace
        return bool(namespace) and user.name == users.service_account_username(namespace, name)
    return False


def describe_subject(subject: dict[str, Any], binding_namespace: str) -> str:
    """How the real authoriser names a subject in its reasons."""
    kind = subject.get("kind", "")
    name = subject.get("name", "")
    if kind == "ServiceAccount":
        return f'{kind} "{name}/{subject.get("namespace") or binding_namespace}"'
    return f'{kind} "{name}"'


class RBACAuthorizer:
    """Decides requests from the stored RBAC objects; decisions are cached until those change."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._decisions: dict[tuple[UserInfo, Attributes], tuple[bool, str]] = {}
        self._compiled: dict[tuple[tuple[str, str], str, str, str], tuple[Rule, ...]] = {}
        self._unsubscribe = store.subscribe(
            self._on_event, (ROLES, CLUSTER_ROLES, ROLE_BINDINGS, CLUSTER_ROLE_BINDINGS)
        )

    def close(self) -> None:
        """Stop following store changes."""
        self._unsubscribe()

    def _on_event(self, event: Event) -> None:
        self._decisions.clear()  # an RBAC object changed (the only kinds it subscribes to)

    def clear(self) -> None:
        """Forget every cached decision."""
        self._decisions.clear()

    # ----- roles ------------------------------------------------------------------------------

    def role_rules(self, role_ref: dict[str, Any], namespace: str) -> tuple[Rule, ...]:
        """The rules of the role a binding references; raises RoleNotFound."""
        kind = role_ref.get("kind")
        name = role_ref.get("name", "")
        if kind == "ClusterRole":
            key, ns, label = CLUSTER_ROLES, "", "clusterrole"
        elif kind == "Role":
            key, ns, label = ROLES, namespace, "role"
        else:
            raise RoleNotFound(f'unsupported role reference kind: "{kind}"')
        stored = self.store.peek(key, ns, name)
        if stored is None:
            raise RoleNotFound(f'{label}.{GROUP} "{name}" not found')
        cache_key = (key, ns, name, stored.obj["metadata"].get("resourceVersion", ""))
        compiled = self._compiled.get(cache_key)
        if compiled is None:
            if len(self._compiled) > _CACHE_LIMIT:
                self._compiled.clear()
            compiled = tuple(Rule.parse(r) for r in stored.obj.get("rules") or ())
            self._compiled[cache_key] = compiled
        return compiled

    def _bindings(self, namespace: str) -> list[tuple[str, dict[str, Any]]]:
        found = [("ClusterRoleBinding", s.obj) for s in self.store.scan(CLUSTER_ROLE_BINDINGS)]
        if namespace:
            found += [("RoleBinding", s.obj) for s in self.store.scan(ROLE_BINDINGS, namespace)]
        return found

    # ----- decisions --------------------------------------------------------------------------

    def authorize(self, user: UserInfo, attrs: Attributes) -> tuple[bool, str]:
        """(allowed, reason) as the real authoriser reports them; RBAC never denies outright."""
        key = (user, attrs)
        decision = self._decisions.get(key)
        if decision is None:
            decision = self._evaluate(user, attrs)
            if len(self._decisions) > _CACHE_LIMIT:
                self._decisions.clear()
            self._decisions[key] = decision
        return decision

    def _evaluate(self, user: UserInfo, attrs: Attributes) -> tuple[bool, str]:
        problems: list[str] = []
        for kind, binding in self._bindings(attrs.namespace):
            meta = binding["metadata"]
            namespace = meta.get("namespace", "")
            subject = next(
                (s for s in binding.get("subjects") or () if applies_to(s, user, namespace)),
                None,
            )
            if subject is None:
                continue
            role_ref = binding.get("roleRef") or {}
            try:
                rules = self.role_rules(role_ref, namespace)
            except RoleNotFound as exc:
                problems.append(str(exc))
                continue
            if any(rule.allows(attrs) for rule in rules):
                label = f"{meta['name']}/{namespace}" if namespace else meta["name"]
                return True, (
                    f'RBAC: allowed by {kind} "{label}" of {role_ref.get("kind")} '
                    f'"{role_ref.get("name")}" to {describe_subject(subject, namespace)}'
                )
        return False, _aggregate(problems)

    def rules_for(self, user: UserInfo, namespace: str) -> tuple[list[Rule], list[str]]:
        """Every rule the user holds in a namespace ("" for cluster-wide) and resolution errors."""
        rules: list[Rule] = []
        problems: list[str] = []
        for _kind, binding in self._bindings(namespace):
            binding_ns = binding["metadata"].get("namespace", "")
            if not any(applies_to(s, user, binding_ns) for s in binding.get("subjects") or ()):
                continue
            try:
                rules.extend(self.role_rules(binding.get("roleRef") or {}, binding_ns))
            except RoleNotFound as exc:
                problems.append(str(exc))
        return rules, problems


def _aggregate(problems: list[str]) -> str:
    """`RBAC: <error>` or `RBAC: [<e1>, <e2>]`, as Go's aggregate error prints."""
    if not problems:
        return ""
    if len(problems) == 1:
        return f"RBAC: {problems[0]}"
    return "RBAC: [" + ", ".join(problems) + "]"
