"""The MIG manager's API calls about its own node: read and patch the Node, list and delete the
pods on it, record Events, and publish the hardware-generated config as `<node>-mig-config`.

The only MIG-manager code that talks to Kubernetes (import rule: lightkube stays in this package).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.types import PatchType

from gpu_operator.kube import client as kube_client
from gpu_operator.kube import node_watch, resources

log = logging.getLogger(__name__)
COMPONENT = "nvidia-mig-manager"
CONFIG_MAP = resources.resource("v1", "ConfigMap")


def connect(kubeconfig: str | None = None) -> AsyncClient:
    """A client from a kubeconfig file, or the pod's service account / $KUBECONFIG."""
    return kube_client.connect(kubeconfig)


class NodeApi:
    """One node's view of the API, for the MIG manager."""

    def __init__(
        self, api: AsyncClient, node: str, namespace: str, component: str = COMPONENT
    ) -> None:
        self.api = api
        self.node = node
        self.namespace = namespace
        self._events = node_watch.NodeEvents(api, node, namespace, component)

    def label_values(self, label: str) -> AsyncIterator[str | None]:
        """The label's value now, then each time it changes."""
        return node_watch.label_values(self.api, self.node, label)

    async def metadata(self) -> tuple[dict[str, str], dict[str, str]]:
        """The node's labels and annotations."""
        node = await self.api.get(resources.NODE, self.node)
        meta = node.get("metadata") or {}
        return dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})

    async def patch(self, patch: Mapping[str, Any]) -> None:
        """A JSON merge patch of the Node (None values remove keys)."""
        await self.api.patch(resources.NODE, self.node, dict(patch), patch_type=PatchType.MERGE)

    async def pods(self) -> list[dict[str, Any]]:
        """Every pod bound to this node, in all namespaces."""
        return [
            dict(pod)
            async for pod in self.api.list(
                resources.POD, namespace="*", fields={"spec.nodeName": self.node}
            )
        ]

    async def delete_pod(self, namespace: str, name: str) -> None:
        try:
            await self.api.delete(resources.POD, name, namespace=namespace)
        except ApiError as err:
            if err.status.code != 404:
                raise

    async def event(self, type_: str, reason: str, message: str) -> None:
        await self._events.event(type_, reason, message)

    async def publish_config(self, namespace: str, pod_name: str, text: str) -> None:
        """Create or update `<node>-mig-config` with the generated config, owned by our pod."""
        pod = await self.api.get(resources.POD, pod_name, namespace=namespace)
        meta = pod.get("metadata") or {}
        name = f"{self.node}-mig-config"
        metadata: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/component": COMPONENT,
                "nvidia.com/node-name": self.node,
            },
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta.get("name"),
                    "uid": meta.get("uid"),
                }
            ],
        }
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata,
            "data": {"config.yaml": text},
        }
        try:
            await self.api.create(CONFIG_MAP(body))
        except ApiError as err:
            if err.status.code != 409:
                raise
            current = await self.api.get(CONFIG_MAP, name, namespace=namespace)
            metadata["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion")
            await self.api.replace(CONFIG_MAP(body))

    async def close(self) -> None:
        await self.api.close()
