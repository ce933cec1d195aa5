"""Authentication (bearer tokens, impersonation) and authorisation (open or RBAC) for kubesim.

`Auth.admit(request)` is the one hook the API server calls before routing: it names the user,
applies impersonation, and in RBAC mode decides like kube-apiserver with `--authorization-mode=RBAC`
(system:masters always allowed).
"""

from __future__ import annotations

import contextvars
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from kubesim import errors, private_files
from kubesim.auth import attributes, bootstrap, escalation, loopback, reviews, users
from kubesim.auth.attributes import Attributes, forbidden, resource_attributes
from kubesim.auth.rbac import GROUP as RBAC_GROUP
from kubesim.auth.rbac import RBACAuthorizer
from kubesim.auth.rules import Rule
from kubesim.auth.tokens import DEFAULT_AUDIENCES, InvalidToken, Tokens
from kubesim.auth.users import UserInfo, make_user
from kubesim.resources import ResourceType
from kubesim.store import Store

__all__ = [
    "MODES",
    "REVIEW_GROUPS",
    "Attributes",
    "Auth",
    "UserInfo",
    "make_user",
    "resource_attributes",
]

MODES = ("open", "rbac")
# API groups whose create-only kinds are reviews: answered from the authorisers, never stored.
REVIEW_GROUPS = frozenset({"authorization.k8s.io", "authentication.k8s.io"})
ADMIN_NAME = "kubesim-admin"
# Paths anonymous clients may reach even when anonymous authentication is otherwise off
# (the real server's AuthenticationConfiguration `anonymous.conditions` for health checks).
PUBLIC_PATHS = frozenset({"/healthz", "/livez", "/readyz", "/version", "/version/"})
_APPLY = "application/apply-patch+yaml"
_STREAMING = frozenset({"exec", "attach", "portforward"})
# The user (and in RBAC mode the attributes) of the request being served, for the review
# handlers and the RBAC write admission check; set anew at the start of every request.
_REQUEST: contextvars.ContextVar[tuple[UserInfo, Attributes | None] | None] = (
    contextvars.ContextVar("kubesim_auth_request", default=None)
)


def _unauthorized() -> errors.ApiError:
    return errors.ApiError(401, "Unauthorized", reason="Unauthorized")


class Auth:
    """Who may do what on one simulated cluster."""

    def __init__(
        self,
        store: Store,
        *,
        authorization: str = "open",
        authentication: bool | None = None,
        anonymous: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if authorization not in MODES:
            raise ValueError(f"unknown authorization mode {authorization!r}; choose from {MODES}")
        self.store = store
        self.mode = authorization
        # Authentication follows RBAC unless asked otherwise: RBAC without it would be moot.
        self.authentication = authorization == "rbac" if authentication is None else authentication
        self.anonymous = anonymous
        self.tokens = Tokens(store, clock)
        self.admin = make_user(ADMIN_NAME, [users.MASTERS])
        self.admin_token = self.tokens.static(self.admin)
        self.rbac = RBACAuthorizer(store) if authorization == "rbac" else None
        self.url = ""
        # Host values the loopback check accepted (it runs on every request).
        self._hosts_ok: set[str] = set()
        self.ca_data: str | None = None
        # Requests refused with 403 (latest last), so tests can assert a client never was.
        self.denials: deque[tuple[UserInfo, Attributes]] = deque(maxlen=1000)
        # When a set, every request RBAC allowed is added (user name, attributes), so a test can
        # tell which granted permissions a client never used.
        self.granted: set[tuple[str, Attributes]] | None = None
        if self.rbac is not None:
            store.admission.append(self._admit_write)

    @property
    def clock(self) -> Callable[[], float]:
        """The time source token expiry is judged by (tests replace it to expire tokens)."""
        return self.tokens.clock

    @clock.setter
    def clock(self, value: Callable[[], float]) -> None:
        self.tokens.clock = value

    # ----- set-up -----------------------------------------------------------------------------

    def install_bootstrap_policy(self) -> None:
        """Create the default ClusterRoles and bindings that are missing (RBAC mode)."""
        for kind, docs in (
            ("clusterroles", bootstrap.cluster_roles()),
            ("clusterrolebindings", bootstrap.cluster_role_bindings()),
        ):
            rt = self.store.registry.resolve(f"{kind}.{RBAC_GROUP}")
            for doc in docs:
                if self.store.peek(rt.key, "", doc["metadata"]["name"]) is None:
                    self.store.insert(rt, doc)

    def token_for(
        self,
        user: str,
        groups: Iterable[str] = (),
        *,
        uid: str = "",
        extra: dict[str, list[str]] | None = None,
    ) -> str:
        """A bearer token for a user (system:authenticated added, as real authenticators do)."""
        return self.tokens.static(make_user(user, list(groups), uid=uid, extra=extra))

    def token_for_service_account(
        self,
        namespace: str,
        name: str,
        *,
        expiration_seconds: int = 3600,
        audiences: Iterable[str] = DEFAULT_AUDIENCES,
    ) -> str:
        """A token for an existing ServiceAccount, as `kubectl create token` would get one."""
        account = self.store.peek(("", "serviceaccounts"), namespace, name)
        if account is None:
            raise errors.not_found("serviceaccounts", "", name)
        token, _expires = self.tokens.service_account(
            namespace,
            name,
            account.obj["metadata"]["uid"],
            expiration_seconds=expiration_seconds,
            audiences=tuple(audiences),
        )
        return token

    def token_for_pod(self, pod: dict[str, Any], *, expiration_seconds: int = 3607) -> str:
        """The token the kubelet projects into a pod (its ServiceAccount, bound to the pod so it
        dies with it; 3607 s is the kubelet's default for the kube-api-access volume)."""
        meta = pod["metadata"]
        namespace = meta.get("namespace", "")
        name = (pod.get("spec") or {}).get("serviceAccountName") or "default"
        account = self.store.peek(("", "serviceaccounts"), namespace, name)
        if account is None:
            raise errors.not_found("serviceaccounts", "", name)
        token, _expires = self.tokens.service_account(
            namespace,
            name,
            account.obj["metadata"]["uid"],
            expiration_seconds=expiration_seconds,
            bound={"kind": "Pod", "name": meta.get("name", ""), "uid": meta.get("uid", "")},
        )
        return token

    def kubeconfig(
        self, token: str, name: str = "kubesim", namespace: str = "default"
    ) -> dict[str, Any]:
        """A kubeconfig document for this server carrying `token` (and the CA when on HTTPS)."""
        cluster: dict[str, Any] = {"server": self.url}
        if self.ca_data:
            cluster["certificate-authority-data"] = self.ca_data
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": cluster}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [
                {"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}
            ],
            "current-context": name,
            "preferences": {},
        }

    def write_kubeconfig(self, token: str, path: Path | str, namespace: str = "default") -> Path:
        """Write a kubeconfig carrying `token` to `path` (for kubectl, helm or lightkube),
        readable by its owner only (0600, as kubectl writes its own)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        return private_files.write(
            target, yaml.safe_dump(self.kubeconfig(token, namespace=namespace))
        )

    # ----- the request hook -------------------------------------------------------------------

    def admit(self, request: web.Request) -> None:
        """Authenticate, impersonate and authorise one request; raise the 401/403 Status."""
        if not self.authentication:
            self._check_host(request.headers.get("Host"))
        header = request.headers.get("Authorization")
        user = self._no_credentials(request.path) if header is None else self._bearer(header)
        headers = request.headers
        if (
            "Impersonate-User" in headers
            or "Impersonate-Group" in headers
            or ("Impersonate-Uid" in headers)
        ):
            user = self._impersonate(user, request)
        if self.rbac is None or users.MASTERS in user.groups:
            # Always allowed, and exempt from the escalation checks that need attributes.
            _REQUEST.set((user, None))
            return
        attrs = attributes.from_request(request.method, request.path, lambda: request.query)
        _REQUEST.set((user, attrs))
        allowed, reason = self.allowed(user, attrs)
        if not allowed:
            raise self._deny(user, attrs, forbidden(attrs, user, reason))
        self.note_granted(user, attrs)
        if not attrs.resource_request:
            return
        if attrs.verb == "get" and attrs.resource == "pods" and attrs.subresource in _STREAMING:
            # Since 1.35 a WebSocket (GET) upgrade to exec/attach/portforward also needs create.
            create = attrs.with_verb("create")
            allowed, reason = self.allowed(user, create)
            if not allowed:
                raise self._deny(user, create, forbidden(create, user, reason))
            self.note_granted(user, create)
        elif attrs.verb == "patch" and attrs.name and request.content_type == _APPLY:
            self._apply_may_create(user, attrs)

    def _check_host(self, host: str | None) -> None:
        """Without authentication every request acts as the admin: answer clients on this
        machine only, by a loopback `Host:` (DNS rebinding; docs/security.md)."""
        if host in self._hosts_ok:
            return
        why = loopback.refusal(host, self.url)
        if why is not None:
            raise loopback.RefusedHost(f"forbidden: {why}")
        if host is not None and len(self._hosts_ok) < 64:  # a handful: name x port
            self._hosts_ok.add(host)

    def _no_credentials(self, path: str) -> UserInfo:
        if not self.authentication:
            return self.admin
        if self.anonymous or path in PUBLIC_PATHS:
            return users.ANONYMOUS_USER
        raise _unauthorized()

    def _bearer(self, header: str) -> UserInfo:
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and token:
            try:
                return self.tokens.authenticate(token)[0]
            except InvalidToken:
                pass
        if self.authentication:
            raise _unauthorized()
        return self.admin

    def _impersonate(self, user: UserInfo, request: web.Request) -> UserInfo:
        headers = request.headers
        name = headers.get("Impersonate-User", "")
        groups = list(headers.getall("Impersonate-Group", []))
        uid = headers.get("Impersonate-Uid", "")
        extra: dict[str, list[str]] = {}
        for key in headers:
            if key.lower().startswith("impersonate-extra-"):
                extra.setdefault(key[len("impersonate-extra-") :].lower(), []).extend(
                    headers.getall(key)
                )
        if not name:
            raise errors.ApiError(
                500, "requested impersonation of groups, uid or extra without impersonating a user"
            )
        checks: list[Attributes] = []
        account = users.split_service_account(name)
        if account is not None:
            checks.append(
                resource_attributes(
                    "impersonate", resource="serviceaccounts", namespace=account[0], name=account[1]
                )
            )
        else:
            checks.append(resource_attributes("impersonate", resource="users", name=name))
        checks += [resource_attributes("impersonate", resource="groups", name=g) for g in groups]
        checks += [
            resource_attributes(
                "impersonate",
                group="authentication.k8s.io",
                resource="userextras",
                subresource=key,
                name=value,
            )
            for key, values in extra.items()
            for value in values
        ]
        if uid:
            checks.append(
                resource_attributes(
                    "impersonate", group="authentication.k8s.io", resource="uids", name=uid
                )
            )
        for check in checks:
            allowed, reason = self.allowed(user, check)
            if not allowed:
                raise self._deny(user, check, forbidden(check, user, reason))
        if account is not None and not groups:
            groups = list(users.service_account_groups(account[0])[:2])
        if name != users.ANONYMOUS:
            if users.AUTHENTICATED not in groups and users.UNAUTHENTICATED not in groups:
                groups.append(users.AUTHENTICATED)
        elif users.UNAUTHENTICATED not in groups:
            groups.append(users.UNAUTHENTICATED)
        pairs = tuple(sorted((k, tuple(v)) for k, v in extra.items()))
        return UserInfo(name, uid, tuple(groups), pairs)

    def _apply_may_create(self, user: UserInfo, attrs: Attributes) -> None:
        """Server-side apply that creates is also authorised as `create` of that name."""
        cluster_scoped_namespace = attrs.api_group == "" and attrs.resource == "namespaces"
        namespace = "" if cluster_scoped_namespace else attrs.namespace
        if (
            attrs.subresource
            or self.store.peek((attrs.api_group, attrs.resource), namespace, attrs.name) is not None
        ):
            return
        create = attrs.with_verb("create")
        allowed, reason = self.allowed(user, create)
        if not allowed:
            # The real patch handler words this denial with the authoriser's reason alone.
            denial = attributes.forbidden_object(
                attrs.api_group, attrs.resource, attrs.name, reason
            )
            raise self._deny(user, create, denial)
        self.note_granted(user, create)

    # ----- decisions --------------------------------------------------------------------------

    def note_granted(self, user: UserInfo, attrs: Attributes) -> None:
        """Record an allowed request when `granted` is collecting."""
        if self.granted is not None:
            self.granted.add((user.name, attrs))

    def _deny(self, user: UserInfo, attrs: Attributes, error: errors.ApiError) -> errors.ApiError:
        self.denials.append((user, attrs))
        return error

    def allowed(self, user: UserInfo, attrs: Attributes) -> tuple[bool, str]:
        """(allowed, reason) from the active authoriser; system:masters is always allowed."""
        if self.rbac is None or users.MASTERS in user.groups:
            return True, ""
        return self.rbac.authorize(user, attrs)

    def rules(self, user: UserInfo, namespace: str) -> tuple[list[Rule], list[str]]:
        """The rules a user holds in a namespace, as SelfSubjectRulesReview reports them."""
        if self.rbac is None:
            return reviews.open_rules(), []
        return self.rbac.rules_for(user, namespace)

    def _admit_write(
        self, store: Store, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        """Escalation prevention for Role/ClusterRole/binding writes made through the API."""
        if rt.group != RBAC_GROUP or self.rbac is None:
            return
        current = _REQUEST.get()
        if current is None:
            return  # in-process writes (tests, controllers) are trusted like the loopback client
        user, attrs = current
        if (
            attrs is None
            or attrs.resource != rt.plural
            or attrs.verb not in ("create", "update", "patch")
        ):
            return
        try:
            escalation.check(self, self.rbac, user, attrs, rt.kind, obj, old)
        except errors.ApiError as exc:
            if exc.code == 403:
                self.denials.append((user, attrs))
            raise

    # ----- handlers ---------------------------------------------------------------------------

    def review(self, rt: ResourceType, body: Any, namespace: str) -> dict[str, Any]:
        """Answer a POSTed review kind for the requesting user."""
        current = _REQUEST.get()
        user = current[0] if current is not None else self.admin
        return reviews.answer(self, rt.kind, rt.api_version, body, user, namespace)

    def token_request(self, namespace: str, name: str, body: Any) -> dict[str, Any]:
        """Answer POST serviceaccounts/{name}/token."""
        return reviews.token_request(self, namespace, name, body)

    def close(self) -> None:
        """Detach from the store."""
        if self.rbac is not None:
            self.rbac.close()
            if self._admit_write in self.store.admission:
                self.store.admission.remove(self._admit_write)
