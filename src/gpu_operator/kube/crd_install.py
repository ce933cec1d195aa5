"""Installing and removing the operator's CRDs with server-side apply (the chart's hook Jobs)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError

from gpu_operator.kube import resources
from gpu_operator.kube.client import FIELD_MANAGER


class CRDInstallError(Exception):
    """The API server refused a CRD, or it did not become established in time."""


def _established(crd: Mapping[str, Any]) -> bool:
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


async def apply(
    client: AsyncClient,
    crds: Iterable[dict[str, Any]],
    *,
    wait_timeout: float = 60.0,
    poll_interval: float = 0.2,
) -> list[str]:
    """Server-side apply every CRD as `gpu-operator` (taking over fields other managers set, so
    an upgrade is never blocked by a conflict) and wait until each is established."""
    names: list[str] = []
    for crd in crds:
        name = str(crd["metadata"]["name"])
        try:
            await client.apply(resources.CRD(crd), field_manager=FIELD_MANAGER, force=True)
        except ApiError as err:
            raise CRDInstallError(f"applying CRD {name}: {err.status.message}") from None
        names.append(name)
    try:
        async with asyncio.timeout(wait_timeout):
            for name in names:
                while not _established(await client.get(resources.CRD, name)):
                    await asyncio.sleep(poll_interval)
    except TimeoutError:
        raise CRDInstallError(
            f"CRDs {', '.join(names)} not established after {wait_timeout:.0f}s"
        ) from None
    return names


async def delete(client: AsyncClient, names: Iterable[str]) -> list[str]:
    """Delete the named CRDs (and with them every object of their kinds); absent ones are fine."""
    deleted: list[str] = []
    for name in names:
        try:
            await client.delete(resources.CRD, name)
        except ApiError as err:
            if err.status.code == 404:
                continue
            raise CRDInstallError(f"deleting CRD {name}: {err.status.message}") from None
        deleted.append(name)
    return deleted
