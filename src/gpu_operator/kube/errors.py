"""One-line descriptions of the errors API calls raise, for logs, status messages and Events."""

from __future__ import annotations

from lightkube import ApiError


def describe(err: BaseException) -> str:
    """An exception as one line that always says something (a timeout's own text is empty).

    API errors read as the server wrote them, with the HTTP code; others get their type name,
    which is what tells a client timeout from a refused connection."""
    if isinstance(err, ApiError):
        status = err.status
        message = str(status.message or "").strip() or str(status.reason or "")
        return f"{message} (HTTP {status.code})" if message else f"HTTP {status.code}"
    text = str(err).strip()
    name = type(err).__name__
    if isinstance(err, TimeoutError) and not text:
        return "timed out waiting for the API server"
    return f"{name}: {text}" if text else f"{name} (no message)"
