"""Bearer tokens: static user tokens and signed, expiring, bound ServiceAccount tokens."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubesim.auth import users
from kubesim.auth.users import UserInfo
from kubesim.store import Store

# The issuer and default audience of a kubeadm cluster's ServiceAccount tokens.
ISSUER = "https://kubernetes.default.svc.cluster.local"
DEFAULT_AUDIENCES = (ISSUER,)
_SA_KEY = ("", "serviceaccounts")
_BOUND_KEYS = {"Pod": ("", "pods"), "Secret": ("", "secrets"), "Node": ("", "nodes")}


class InvalidToken(Exception):
    """A token that names no one, or no longer does (expired, its account or object gone)."""


@dataclass(frozen=True)
class ServiceAccountClaims:
    """What a ServiceAccount token asserts; checked against the store on every use."""

    namespace: str
    name: str
    uid: str
    audiences: tuple[str, ...]
    expires: float
    issued: float
    jti: str
    bound_kind: str = ""
    bound_name: str = ""
    bound_uid: str = ""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Tokens:
    """Issues and checks tokens; ServiceAccount tokens are JWTs signed with a per-cluster key."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self._key = secrets.token_bytes(32)
        self._kid = _b64(hashlib.sha256(self._key).digest()[:12])
        self._static: dict[str, UserInfo] = {}
        self._parsed: dict[str, tuple[ServiceAccountClaims, UserInfo]] = {}

    # ----- issuing ------------------------------------------------------------------------------

    def static(self, user: UserInfo) -> str:
        """A token for a user that lasts as long as the cluster (like a static token file)."""
        token = secrets.token_urlsafe(32)
        self._static[token] = user
        return token

    def service_account(
        self,
        namespace: str,
        name: str,
        sa_uid: str,
        *,
        expiration_seconds: int,
        audiences: tuple[str, ...] = DEFAULT_AUDIENCES,
        bound: dict[str, str] | None = None,
    ) -> tuple[str, float]:
        """A signed token for a ServiceAccount and its expiry (seconds since the epoch)."""
        issued = self.clock()
        expires = issued + expiration_seconds
        payload: dict[str, Any] = {
            "aud": list(audiences),
            "exp": int(expires),
            "iat": int(issued),
            "iss": ISSUER,
            "jti": str(uuid.uuid4()),
            "kubernetes.io": {
                "namespace": namespace,
                "serviceaccount": {"name": name, "uid": sa_uid},
            },
            "nbf": int(issued),
            "sub": users.service_account_username(namespace, name),
        }
        if bound:
            payload["kubernetes.io"][bound["kind"].lower()] = {
                "name": bound["name"],
                "uid": bound["uid"],
            }
        header = {"alg": "HS256", "kid": self._kid}
        signing_input = (
            _b64(json.dumps(header, separators=(",", ":")).encode())
            + "."
            + _b64(json.dumps(payload, separators=(",", ":")).encode())
        )
        signature = hmac.new(self._key, signing_input.encode(), hashlib.sha256).digest()
        return f"{signing_input}.{_b64(signature)}", expires

    # ----- checking -----------------------------------------------------------------------------

    def authenticate(
        self, token: str, audiences: tuple[str, ...] = DEFAULT_AUDIENCES
    ) -> tuple[UserInfo, tuple[str, ...]]:
        """The user a token names and the audiences it was accepted for; raises InvalidToken."""
        user = self._static.get(token)
        if user is not None:
            return user, audiences
        parsed = self._parsed.get(token)
        if parsed is None:
            claims = self._parse(token)
            parsed = (claims, _service_account_user(claims))
            if len(self._parsed) > 10_000:
                self._parsed.clear()
            self._parsed[token] = parsed
        claims, user = parsed
        accepted = tuple(a for a in claims.audiences if a in audiences)
        if not accepted:
            raise InvalidToken("token audiences are not accepted")
        if self.clock() >= claims.expires:
            raise InvalidToken("token has expired")
        # Checked on every use, so a deleted (or re-created) account's tokens stop working.
        account = self.store.peek(_SA_KEY, claims.namespace, claims.name)
        if account is None or account.obj["metadata"].get("uid") != claims.uid:
            raise InvalidToken(f"service account {claims.namespace}/{claims.name} has been deleted")
        if claims.bound_kind:
            key = _BOUND_KEYS[claims.bound_kind]
            namespace = "" if claims.bound_kind == "Node" else claims.namespace
            bound = self.store.peek(key, namespace, claims.bound_name)
            if bound is None or bound.obj["metadata"].get("uid") != claims.bound_uid:
                raise InvalidToken(
                    f"the {claims.bound_kind.lower()} {claims.bound_name} the token is bound to "
                    "has been deleted"
                )
        return user, accepted

    def _parse(self, token: str) -> ServiceAccountClaims:
        pieces = token.split(".")
        if len(pieces) != 3:
            raise InvalidToken("invalid bearer token")
        expected = hmac.new(self._key, f"{pieces[0]}.{pieces[1]}".encode(), hashlib.sha256).digest()
        try:
            valid = hmac.compare_digest(expected, _unb64(pieces[2]))
            payload = json.loads(_unb64(pieces[1])) if valid else None
        except (ValueError, TypeError):
            payload = None
        if not isinstance(payload, dict):
            raise InvalidToken("invalid bearer token")
        info = payload.get("kubernetes.io") or {}
        account = info.get("serviceaccount") or {}
        kind = next((k for k in _BOUND_KEYS if k.lower() in info), "")
        bound: dict[str, Any] = info.get(kind.lower()) or {} if kind else {}
        return ServiceAccountClaims(
            namespace=info.get("namespace", ""),
            name=account.get("name", ""),
            uid=account.get("uid", ""),
            audiences=tuple(payload.get("aud") or ()),
            expires=float(payload.get("exp", 0)),
            issued=float(payload.get("iat", 0)),
            jti=payload.get("jti", ""),
            bound_kind=kind,
            bound_name=bound.get("name", ""),
            bound_uid=bound.get("uid", ""),
        )


def _service_account_user(claims: ServiceAccountClaims) -> UserInfo:
    extra: dict[str, list[str]] = {
        "authentication.kubernetes.io/credential-id": [f"JTI={claims.jti}"]
    }
    if claims.bound_kind == "Pod":
        extra["authentication.kubernetes.io/pod-name"] = [claims.bound_name]
        extra["authentication.kubernetes.io/pod-uid"] = [claims.bound_uid]
    return users.UserInfo(
        users.service_account_username(claims.namespace, claims.name),
        claims.uid,
        users.service_account_groups(claims.namespace),
        tuple(sorted((k, tuple(v)) for k, v in extra.items())),
    )
