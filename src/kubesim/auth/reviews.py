"""The review APIs (access, rules, self, token) and TokenRequest: answered, never stored."""

from __future__ import annotations

import datetime as dt
from typing import Any, Protocol

from kubesim import errors
from kubesim.auth import tokens
from kubesim.auth.attributes import Attributes, resource_attributes
from kubesim.auth.rules import Rule
from kubesim.auth.tokens import Tokens
from kubesim.auth.users import UserInfo
from kubesim.store import Store, now


class Auth(Protocol):
    """What the reviews ask of the cluster's authentication and authorisation (kubesim.auth.Auth,
    which answers the review requests through this module)."""

    @property
    def store(self) -> Store: ...

    @property
    def tokens(self) -> Tokens: ...

    def allowed(self, user: UserInfo, attrs: Attributes) -> tuple[bool, str]: ...

    def rules(self, user: UserInfo, namespace: str) -> tuple[list[Rule], list[str]]: ...


_MIN_EXPIRATION = 600
_MAX_EXPIRATION = 2**32
_BINDABLE = {
    "Pod": ("", "pods", True),
    "Secret": ("", "secrets", True),
    "Node": ("", "nodes", False),
}


def answer(
    auth: Auth, kind: str, api_version: str, body: Any, user: UserInfo, namespace: str
) -> dict[str, Any]:
    """The response object for a POSTed review of `kind`, evaluated for the requesting `user`."""
    if not isinstance(body, dict):
        raise errors.bad_request(f"a {kind} must be an object")
    spec = body.get("spec") or {}
    if not isinstance(spec, dict):
        raise errors.bad_request("spec must be an object")
    group = api_version.split("/", 1)[0]
    result: dict[str, Any] = {
        "kind": kind,
        "apiVersion": api_version,
        "metadata": {**(body.get("metadata") or {}), "creationTimestamp": None},
    }
    if kind == "SelfSubjectReview":
        result["status"] = {"userInfo": user.wire()}
        return result
    result["spec"] = spec
    if kind == "TokenReview":
        result["status"] = _token_review(auth, spec)
        return result
    if kind == "SelfSubjectRulesReview":
        result["status"] = _rules_review(auth, user, spec)
        return result
    subject = user
    if kind in ("SubjectAccessReview", "LocalSubjectAccessReview"):
        subject = _subject(kind, group, spec)
    if kind == "LocalSubjectAccessReview":
        if spec.get("nonResourceAttributes") is not None:
            raise errors.invalid(
                kind,
                group,
                "",
                [
                    (
                        "spec.nonResourceAttributes",
                        "Invalid value: disallowed on this kind of request",
                    )
                ],
            )
        attributes = spec.get("resourceAttributes") or {}
        if attributes.get("namespace", namespace) not in ("", namespace):
            raise errors.bad_request(
                f"spec.resourceAttributes.namespace must match namespace: {namespace}"
            )
        spec["resourceAttributes"] = {**attributes, "namespace": namespace}
    attrs = _access_attributes(kind, group, spec)
    allowed, reason = auth.allowed(subject, attrs)
    status: dict[str, Any] = {"allowed": allowed}
    if reason:
        status["reason"] = reason
    result["status"] = status
    return result


def _subject(kind: str, group: str, spec: dict[str, Any]) -> UserInfo:
    name = spec.get("user") or ""
    groups = tuple(spec.get("groups") or ())
    if not name and not groups:
        raise errors.invalid(
            kind,
            group,
            "",
            [("spec.user", 'Invalid value: "": at least one of user or group must be specified')],
        )
    extra = spec.get("extra") or {}
    pairs = tuple(sorted((str(k), tuple(v or ())) for k, v in extra.items()))
    # The groups are taken as given: a SubjectAccessReview adds no system:authenticated.
    return UserInfo(name, str(spec.get("uid") or ""), groups, pairs)


def _access_attributes(kind: str, group: str, spec: dict[str, Any]) -> Attributes:
    resource = spec.get("resourceAttributes")
    non_resource = spec.get("nonResourceAttributes")
    if resource is not None and non_resource is not None:
        raise errors.invalid(
            kind,
            group,
            "",
            [
                (
                    "spec.nonResourceAttributes",
                    "Invalid value: cannot be specified in combination with resourceAttributes",
                )
            ],
        )
    if isinstance(non_resource, dict):
        return Attributes(
            str(non_resource.get("verb", "")), False, str(non_resource.get("path", ""))
        )
    if not isinstance(resource, dict):
        raise errors.invalid(
            kind,
            group,
            "",
            [
                (
                    "spec.resourceAttributes",
                    "Invalid value: exactly one of nonResourceAttributes or resourceAttributes "
                    "must be specified",
                )
            ],
        )
    return resource_attributes(
        str(resource.get("verb", "")),
        group=str(resource.get("group", "")),
        version=str(resource.get("version", "")),
        resource=str(resource.get("resource", "")),
        subresource=str(resource.get("subresource", "")),
        namespace=str(resource.get("namespace", "")),
        name=str(resource.get("name", "")),
    )


def _rules_review(auth: Auth, user: UserInfo, spec: dict[str, Any]) -> dict[str, Any]:
    namespace = spec.get("namespace")
    if not namespace:
        raise errors.bad_request("no namespace on request")
    rules, problems = auth.rules(user, str(namespace))
    status: dict[str, Any] = {
        "resourceRules": [
            {k: v for k, v in r.wire().items() if k != "nonResourceURLs"}
            for r in rules
            if not r.non_resource_urls
        ],
        "nonResourceRules": [
            {"verbs": list(r.verbs), "nonResourceURLs": list(r.non_resource_urls)}
            for r in rules
            if r.non_resource_urls
        ],
        "incomplete": False,
    }
    if problems:
        status["evaluationError"] = (
            problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]"
        )
    return status


def open_rules() -> list[Rule]:
    """What an AlwaysAllow authoriser reports a user may do: everything."""
    return [Rule(("*",), ("*",), ("*",)), Rule(("*",), non_resource_urls=("*",))]


def _token_review(auth: Auth, spec: dict[str, Any]) -> dict[str, Any]:
    token = spec.get("token")
    if not token:
        raise errors.bad_request("token is required for TokenReview in authentication")
    wanted = tuple(spec.get("audiences") or tokens.DEFAULT_AUDIENCES)
    try:
        user, accepted = auth.tokens.authenticate(str(token), wanted)
    except tokens.InvalidToken as exc:
        return {"user": {}, "error": f"[invalid bearer token, {exc}]"}
    if not accepted:
        return {"user": {}, "error": "token audiences are not accepted"}
    return {"authenticated": True, "user": user.wire(), "audiences": list(accepted)}


def token_request(auth: Auth, namespace: str, name: str, body: Any) -> dict[str, Any]:
    """Issue a ServiceAccount token (POST serviceaccounts/{name}/token)."""
    account = auth.store.peek(("", "serviceaccounts"), namespace, name)
    if account is None:
        raise errors.not_found("serviceaccounts", "", name)
    if not isinstance(body, dict):
        raise errors.bad_request("a TokenRequest must be an object")
    spec = dict(body.get("spec") or {})
    seconds = spec.get("expirationSeconds")
    if seconds is None:
        seconds = 3600
    if not isinstance(seconds, int) or isinstance(seconds, bool):
        raise errors.bad_request("spec.expirationSeconds must be an integer")
    if seconds < _MIN_EXPIRATION:
        raise _invalid_request(
            name, f"Invalid value: {seconds}: may not specify a duration less than 10 minutes"
        )
    if seconds > _MAX_EXPIRATION:
        raise _invalid_request(
            name, f"Invalid value: {seconds}: may not specify a duration larger than 2^32 seconds"
        )
    audiences = tuple(spec.get("audiences") or tokens.DEFAULT_AUDIENCES)
    bound = _bound_object(auth, namespace, spec.get("boundObjectRef"))
    token, expires = auth.tokens.service_account(
        namespace,
        name,
        account.obj["metadata"]["uid"],
        expiration_seconds=seconds,
        audiences=audiences,
        bound=bound,
    )
    spec.update({"audiences": list(audiences), "expirationSeconds": seconds})
    spec.setdefault("boundObjectRef", None)
    stamp = dt.datetime.fromtimestamp(expires, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": now()},
        "spec": spec,
        "status": {"token": token, "expirationTimestamp": stamp},
    }


def _invalid_request(name: str, message: str) -> errors.ApiError:
    return errors.invalid(
        "TokenRequest", "authentication.k8s.io", name, [("spec.expirationSeconds", message)]
    )


def _bound_object(auth: Auth, namespace: str, ref: Any) -> dict[str, str] | None:
    if not ref:
        return None
    if not isinstance(ref, dict):
        raise errors.bad_request("spec.boundObjectRef must be an object")
    kind = str(ref.get("kind", ""))
    target = _BINDABLE.get(kind)
    if target is None:
        raise errors.bad_request(f"cannot bind token to object of type {kind or '<empty>'}")
    group, plural, namespaced = target
    name = str(ref.get("name", ""))
    stored = auth.store.peek((group, plural), namespace if namespaced else "", name)
    if stored is None:
        raise errors.not_found(plural, group, name)
    uid = stored.obj["metadata"]["uid"]
    if ref.get("uid") and ref["uid"] != uid:
        raise errors.conflict(
            kind,
            "",
            name,
            f"the UID in the bound object reference ({ref['uid']}) does not match the UID in "
            "record. The object might have been deleted and then recreated",
        )
    return {"kind": kind, "name": name, "uid": uid}
