"""Who a request is: the user record authenticators produce and authorisers consume."""

from __future__ import annotations

from dataclasses import dataclass, field

# Well-known names the real API server assigns (k8s.io/apiserver/pkg/authentication/user).
ANONYMOUS = "system:anonymous"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
MASTERS = "system:masters"
SERVICE_ACCOUNTS = "system:serviceaccounts"
SA_PREFIX = "system:serviceaccount:"


@dataclass(frozen=True)
class UserInfo:
    """An authenticated identity; hashable so decisions can be cached per user."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())

    def wire(self) -> dict[str, object]:
        """The `UserInfo` object of the authentication.k8s.io API (empty fields left out)."""
        body: dict[str, object] = {"username": self.name}
        if self.uid:
            body["uid"] = self.uid
        if self.groups:
            body["groups"] = list(self.groups)
        if self.extra:
            body["extra"] = {key: list(values) for key, values in self.extra}
        return body

    @property
    def service_account(self) -> tuple[str, str] | None:
        """(namespace, name) when this is a ServiceAccount's username."""
        return split_service_account(self.name)


def service_account_username(namespace: str, name: str) -> str:
    """The username the real server gives a ServiceAccount."""
    return f"{SA_PREFIX}{namespace}:{name}"


def service_account_groups(namespace: str) -> tuple[str, ...]:
    """The groups every ServiceAccount token carries."""
    return (SERVICE_ACCOUNTS, f"{SERVICE_ACCOUNTS}:{namespace}", AUTHENTICATED)


def split_service_account(username: str) -> tuple[str, str] | None:
    """(namespace, name) of a `system:serviceaccount:<ns>:<name>` username, else None."""
    if not username.startswith(SA_PREFIX):
        return None
    namespace, sep, name = username[len(SA_PREFIX) :].partition(":")
    if not sep or not namespace or not name or ":" in name:
        return None
    return namespace, name


def make_user(
    name: str,
    groups: tuple[str, ...] | list[str] = (),
    *,
    uid: str = "",
    extra: dict[str, list[str]] | None = None,
) -> UserInfo:
    """A user with `system:authenticated` added, as every authenticator in the real chain does."""
    all_groups = tuple(
        dict.fromkeys([*groups, AUTHENTICATED if name != ANONYMOUS else UNAUTHENTICATED])
    )
    pairs = tuple(sorted((k, tuple(v)) for k, v in (extra or {}).items()))
    return UserInfo(name, uid, all_groups, pairs)


ANONYMOUS_USER = UserInfo(ANONYMOUS, "", (UNAUTHENTICATED,))
