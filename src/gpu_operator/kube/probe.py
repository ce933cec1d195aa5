"""Whether an optional API is there: one cheap list that tells "not served" or "not allowed" from
a transient failure (which raises, so the caller retries)."""

from __future__ import annotations

from typing import Any

from lightkube import ApiError, AsyncClient

# HTTP codes that mean the API will not answer this client, as opposed to "try again".
NOT_SERVED = 404
FORBIDDEN = 403


async def unavailable(client: AsyncClient, resource: Any) -> str | None:
    """None when `resource` is served and this client may list it; else why not, in words.
    Other API errors and connection failures raise."""
    try:
        async for _ in client.list(resource, chunk_size=1):
            break
    except ApiError as err:
        info = resource._api_info.resource
        where = f"{info.group}/{info.version}" if info.group else info.version
        what = f"{info.kind}s ({where})"
        if err.status.code == NOT_SERVED:
            return f"the API server does not serve {what}"
        if err.status.code == FORBIDDEN:
            return f"the operator may not list {what}: {err.status.message or 'forbidden'}"
        raise
    return None
