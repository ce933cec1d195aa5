"""Request attributes as the real server's RequestInfoFactory derives them from a URL and method."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from kubesim import errors
from kubesim.auth.users import UserInfo

_METHOD_VERBS = {
    "POST": "create",
    "GET": "get",
    "HEAD": "get",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}
# `/namespaces/{ns}/status` and `/finalize` are subresources of the namespace, not resources in it.
_NAMESPACE_SUBRESOURCES = ("status", "finalize")


class Attributes(NamedTuple):
    """What an authoriser decides on: the verb and either a resource or a non-resource path.

    A tuple, so building and hashing one per request (the decision cache key) stays cheap.
    """

    verb: str
    resource_request: bool
    path: str = ""
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def combined_resource(self) -> str:
        """`resource/subresource` as RBAC rules name it."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    def with_verb(self, verb: str) -> Attributes:
        """The same request asked with another verb (the second checks some handlers make)."""
        return self._replace(verb=verb)


def resource_attributes(
    verb: str,
    *,
    group: str = "",
    version: str = "",
    resource: str = "",
    subresource: str = "",
    namespace: str = "",
    name: str = "",
) -> Attributes:
    """Attributes for a resource request built by hand (reviews, escalation checks)."""
    return Attributes(verb, True, "", group, version, resource, subresource, namespace, name)


def from_request(method: str, path: str, query: Callable[[], Mapping[str, str]]) -> Attributes:
    """Parse like the real RequestInfoFactory: prefix, group, version, namespace, resource, name
    (`query` is called only when a collection GET needs its parameters)."""
    parts = path.strip("/").split("/")
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return Attributes(method.lower(), False, path)
    if "" in parts:
        parts = [p for p in parts if p]
        if len(parts) < 3:
            return Attributes(method.lower(), False, path)
    group = ""
    rest = parts[1:]
    if parts[0] == "apis":
        if len(rest) < 3:
            return Attributes(method.lower(), False, path)
        group, rest = rest[0], rest[1:]
    version, rest = rest[0], rest[1:]
    verb = ""
    if rest[0] in ("watch", "proxy"):
        # The legacy `/watch/` and `/proxy/` path prefixes name the verb themselves.
        if len(rest) < 2:
            raise errors.bad_request(f"unable to determine kind and namespace from url {path}")
        verb, rest = rest[0], rest[1:]
    else:
        verb = _METHOD_VERBS.get(method, "")
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 and verb != "proxy" else ""
    if not name and verb == "get":
        params = query()
        watch = params.get("watch", "")
        verb = "watch" if watch and watch.lower() not in ("false", "0") else "list"
        selector = params.get("fieldSelector", "")
        # An exact metadata.name field selector authorises list/watch as that one name.
        if selector:
            name = _exact_name(selector)
    if not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(verb, True, path, group, version, resource, subresource, namespace, name)


def _exact_name(selector: str) -> str:
    for term in selector.split(","):
        key, op, value = _split_term(term.strip())
        valid = value not in ("", ".", "..") and "/" not in value and "%" not in value
        if key == "metadata.name" and op in ("=", "==") and valid:
            return value
    return ""


def _split_term(term: str) -> tuple[str, str, str]:
    for op in ("!=", "==", "="):
        key, sep, value = term.partition(op)
        if sep:
            return key.strip(), op, value.strip()
    return term, "", ""


def forbidden(attrs: Attributes, user: UserInfo, reason: str = "") -> errors.ApiError:
    """The 403 the real server sends: the message names user, verb, resource and scope."""
    if not attrs.resource_request:
        message = f'User "{user.name}" cannot {attrs.verb} path "{attrs.path}"'
        if reason:
            message += f": {reason}"
        return errors.ApiError(403, f"forbidden: {message}", reason="Forbidden", details={})
    scope = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
    message = (
        f'User "{user.name}" cannot {attrs.verb} resource "{attrs.combined_resource}" '
        f'in API group "{attrs.api_group}" {scope}'
    )
    if reason:
        message += f": {reason}"
    return forbidden_object(attrs.api_group, attrs.resource, attrs.name, message)


def forbidden_object(group: str, resource: str, name: str, why: str) -> errors.ApiError:
    """`<resource>[.group] ["name"] is forbidden: <why>` with the real details."""
    qualified = f"{resource}.{group}" if group else resource
    details: dict[str, str] = {}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    details["kind"] = resource
    head = f'{qualified} "{name}"' if name else qualified
    return errors.ApiError(403, f"{head} is forbidden: {why}", reason="Forbidden", details=details)
