"""RBAC escalation prevention: nobody grants, by a role or a binding, what they do not hold."""

from __future__ import annotations

import copy
from typing import Any, Protocol

from kubesim import errors
from kubesim.auth import users
from kubesim.auth.attributes import Attributes, forbidden_object, resource_attributes
from kubesim.auth.rbac import GROUP, RBACAuthorizer, RoleNotFound
from kubesim.auth.rules import Rule, compact, go_quoted, uncovered
from kubesim.auth.users import UserInfo

# What an aggregated ClusterRole may come to hold, so creating one needs everything.
_FULL_AUTHORITY = [Rule(("*",), ("*",), ("*",)), Rule(("*",), non_resource_urls=("*",))]
_GC_FIELDS = ("ownerReferences", "finalizers", "managedFields", "resourceVersion")


class Decider(Protocol):
    """Anything that can answer an authorisation question (the active authoriser)."""

    def allowed(self, user: UserInfo, attrs: Attributes) -> tuple[bool, str]: ...

    def note_granted(self, user: UserInfo, attrs: Attributes) -> None:
        """Record that a permission was used (for least-privilege checks)."""


def check(
    decider: Decider,
    rbac: RBACAuthorizer,
    user: UserInfo,
    request: Attributes,
    kind: str,
    obj: dict[str, Any],
    old: dict[str, Any] | None,
) -> None:
    """Refuse a Role/ClusterRole/binding write that grants more than `user` holds (403)."""
    if users.MASTERS in user.groups:
        return
    if old is not None and _only_gc_fields(obj, old):
        return
    meta = obj.get("metadata") or {}
    name = meta.get("name", "")
    namespace = meta.get("namespace", "") if kind in ("Role", "RoleBinding") else ""
    resource = kind.lower() + "s"
    if kind in ("Role", "ClusterRole"):
        # `escalate` is asked with the name on the URL, so it never helps a POST create.
        escalate = resource_attributes(
            "escalate",
            group=GROUP,
            version="*",
            resource=request.resource,
            namespace=request.namespace,
            name=request.name,
        )
        if request.resource in ("roles", "clusterroles") and decider.allowed(user, escalate)[0]:
            decider.note_granted(user, escalate)
            return
        wanted = [Rule.parse(r) for r in obj.get("rules") or ()]
        if kind == "ClusterRole" and obj.get("aggregationRule"):
            wanted = list(_FULL_AUTHORITY)
    else:
        role_ref = obj.get("roleRef") or {}
        if old is not None and (old.get("roleRef") or {}) != role_ref:
            raise errors.invalid(
                kind, GROUP, name, [("roleRef", "Invalid value: cannot change roleRef")]
            )
        ref_resource = {"ClusterRole": "clusterroles", "Role": "roles"}.get(
            role_ref.get("kind", "")
        )
        if ref_resource is not None:
            bind = resource_attributes(
                "bind",
                group=role_ref.get("apiGroup", ""),
                resource=ref_resource,
                namespace=namespace,
                name=role_ref.get("name", ""),
            )
            if decider.allowed(user, bind)[0]:
                decider.note_granted(user, bind)
                return
        try:
            wanted = list(rbac.role_rules(role_ref, namespace))
        except RoleNotFound as exc:
            ref_kind = role_ref.get("kind", "")
            plural = {"ClusterRole": "clusterroles", "Role": "roles"}.get(ref_kind, ref_kind)
            raise errors.not_found(plural, GROUP, role_ref.get("name", "")) from exc
    held, problems = rbac.rules_for(user, namespace)
    missing = uncovered(held, wanted)
    if not missing:
        return
    lines = sorted({rule.compact_string() for rule in compact(missing)})
    message = (
        f'user "{user.name}" (groups={go_quoted(user.groups)}) is attempting to grant RBAC '
        "permissions not currently held:\n" + "\n".join(lines)
    )
    if problems:
        message += "; resolution errors: [" + " ".join(problems) + "]"
    raise forbidden_object(GROUP, resource, name, message)


def _only_gc_fields(obj: dict[str, Any], old: dict[str, Any]) -> bool:
    """An update touching only what the garbage collector needs is never an escalation."""
    new_copy = copy.deepcopy(obj)
    old_copy = copy.deepcopy(old)
    for body in (new_copy, old_copy):
        meta = body.get("metadata") or {}
        for field in _GC_FIELDS:
            meta.pop(field, None)
    return bool(new_copy == old_copy)
