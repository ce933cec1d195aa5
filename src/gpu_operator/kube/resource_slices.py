"""resource.k8s.io/v1 for the DRA kubelet plugin: its node's ResourceSlices and the claims it
prepares (the only code of the plugin that talks to the API server)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.resources.core_v1 import Node

FIELD_MANAGER = "gpu-kubelet-plugin"

ResourceSlice = create_global_resource("resource.k8s.io", "v1", "ResourceSlice", "resourceslices")
ResourceClaim = create_namespaced_resource(
    "resource.k8s.io", "v1", "ResourceClaim", "resourceclaims"
)


@dataclass
class SliceApi:
    """Reads and writes one driver's slices of one node."""

    api: AsyncClient
    node: str
    driver: str

    async def published(self) -> list[dict[str, Any]]:
        items = self.api.list(
            ResourceSlice, fields={"spec.nodeName": self.node, "spec.driver": self.driver}
        )
        return [_plain(obj) async for obj in items]

    async def sync(self, wanted: Sequence[dict[str, Any]]) -> None:
        """Create or replace the wanted slices and delete this node's others of the driver."""
        current = {str(s["metadata"]["name"]): s for s in await self.published()}
        for obj in wanted:
            name = str(obj["metadata"]["name"])
            existing = current.pop(name, None)
            if existing is None:
                await self.api.create(ResourceSlice.from_dict(obj))
                continue
            if existing.get("spec") == obj["spec"]:
                continue
            body = {**obj, "metadata": {**obj["metadata"], **_version(existing)}}
            await self.api.replace(ResourceSlice.from_dict(body))
        for name in current:
            await self.delete(name)

    async def delete(self, name: str) -> None:
        try:
            await self.api.delete(ResourceSlice, name)
        except ApiError as err:
            if err.status.code != 404:
                raise

    async def claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj = await self.api.get(ResourceClaim, name, namespace=namespace)
        except ApiError as err:
            if err.status.code == 404:
                return None
            raise
        return _plain(obj)

    async def node_allocatable(self) -> dict[str, str]:
        """The node's `status.allocatable` (what the kubelet offers through device plugins)."""
        node = await self.api.get(Node, self.node)
        return {k: str(v) for k, v in ((node.status and node.status.allocatable) or {}).items()}


def _plain(obj: Any) -> dict[str, Any]:
    return dict(obj.to_dict())


def _version(obj: dict[str, Any]) -> dict[str, Any]:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return {"resourceVersion": rv} if rv else {}
