"""The API server's version (`GET /version`), for requirements such as the DRA driver's."""

from __future__ import annotations

from typing import Any

from gpu_operator.kube.client import AsyncClient


async def git_version(client: AsyncClient) -> str | None:
    """The server's gitVersion (`v1.35.0`); None when it does not say."""
    # lightkube has no call for /version: its HTTP client, configured for the server, does it.
    http: Any = client._client._client
    response = await http.get("/version")
    response.raise_for_status()
    found = response.json().get("gitVersion")
    return str(found) if found else None


__all__ = ["git_version"]
