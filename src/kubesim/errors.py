"""Kubernetes `Status` errors raised by the store and rendered by the server."""

from __future__ import annotations

from typing import Any

_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """An API failure carrying the HTTP code and the `Status` body the real server would send."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or _REASONS.get(code, "Unknown")
        self.details = details

    def status(self) -> dict[str, Any]:
        """Return the `Status` object for this error."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(kind: str, name: str, group: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": kind}
    if group:
        details["group"] = group
    return details


def not_found(plural: str, group: str, name: str) -> ApiError:
    """An object (or namespace) is absent."""
    qualified = f"{plural}.{group}" if group else plural
    return ApiError(404, f'{qualified} "{name}" not found', details=_details(plural, name, group))


def already_exists(plural: str, group: str, name: str) -> ApiError:
    """Create of a name that is taken."""
    qualified = f"{plural}.{group}" if group else plural
    return ApiError(
        409,
        f'{qualified} "{name}" already exists',
        reason="AlreadyExists",
        details=_details(plural, name, group),
    )


def conflict(plural: str, group: str, name: str, why: str) -> ApiError:
    """Optimistic-concurrency or apply conflict."""
    qualified = f"{plural}.{group}" if group else plural
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {qualified} "{name}": {why}',
        reason="Conflict",
        details=_details(plural, name, group),
    )


def invalid(kind: str, group: str, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """Semantic validation failure; causes are (field, message) pairs."""
    text = ", ".join(f"{field}: {msg}" for field, msg in causes)
    details = _details(kind, name, group)
    details["causes"] = [
        {"reason": "FieldValueInvalid", "message": msg, "field": field} for field, msg in causes
    ]
    # The real message names the group-qualified kind, which for the core group is the bare kind.
    qualified = f"{kind}.{group}" if group else kind
    return ApiError(422, f'{qualified} "{name}" is invalid: {text}', details=details)


def bad_request(message: str) -> ApiError:
    """Malformed request (body, parameters, selectors)."""
    return ApiError(400, message)


def gone(message: str) -> ApiError:
    """A resourceVersion or continue token older than the retained history."""
    return ApiError(410, message, reason="Expired")
