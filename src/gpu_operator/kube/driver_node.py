"""The driver manager's API calls about its own node: read and merge-patch the Node (guarded by
its resourceVersion), list the pods on it, evict them through the Eviction API (which honours
PodDisruptionBudgets), and record Events about the node.

The only driver-manager code that talks to Kubernetes (import rule: lightkube stays in this
package).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import PodEviction
from lightkube.types import PatchType

from gpu_operator.kube import client as kube_client
from gpu_operator.kube import node_watch, resources

COMPONENT = "k8s-driver-manager"


class Conflict(Exception):
    """The node changed since it was read (409): read it again and recompute the patch."""


class ApiFailure(Exception):
    """The API server refused a request; str() says which and why."""


def connect(kubeconfig: str | None = None) -> AsyncClient:
    """A client from a kubeconfig file, or the pod's service account / $KUBECONFIG."""
    return kube_client.connect(kubeconfig)


def _failure(what: str, err: ApiError) -> ApiFailure:
    return ApiFailure(f"{what}: {err.status.message or err}")


def refusal_text(err: ApiError) -> str:
    """An eviction refusal with its causes (the PodDisruptionBudget it would violate)."""
    status = err.status
    text = str(status.message or "eviction refused")
    causes = (status.details.causes if status.details is not None else None) or []
    reasons = [str(c.message) for c in causes if c.message]
    return f"{text} ({'; '.join(reasons)})" if reasons else text


class DriverNodeApi:
    """One node's view of the API, for the driver manager."""

    def __init__(
        self, api: AsyncClient, node: str, namespace: str, component: str = COMPONENT
    ) -> None:
        self.api = api
        self.node_name = node
        self.namespace = namespace
        self._events = node_watch.NodeEvents(api, node, namespace, component)

    async def node(self) -> dict[str, Any]:
        """The Node object as the server has it now."""
        try:
            return dict(await self.api.get(resources.NODE, self.node_name))
        except ApiError as err:
            raise _failure(f"get node {self.node_name}", err) from None

    async def patch(
        self, patch: Mapping[str, Any], *, resource_version: str | None = None
    ) -> dict[str, Any]:
        """A JSON merge patch of the Node (None values remove keys); with `resource_version`
        the server refuses it (Conflict) if the node changed meanwhile."""
        body: dict[str, Any] = {k: v for k, v in patch.items() if k != "metadata"}
        metadata = dict(patch.get("metadata") or {})
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        if metadata:
            body["metadata"] = metadata
        try:
            result = await self.api.patch(
                resources.NODE, self.node_name, body, patch_type=PatchType.MERGE
            )
        except ApiError as err:
            if err.status.code == 409:
                raise Conflict(str(err.status.message)) from None
            raise _failure(f"patch node {self.node_name}", err) from None
        return dict(result)

    async def pods(
        self, *, namespace: str | None = None, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """The pods bound to this node (in `namespace`, or all), matching `labels`."""
        try:
            return [
                dict(pod)
                async for pod in self.api.list(
                    resources.POD,
                    namespace=namespace or resources.ALL_NAMESPACES,
                    fields={"spec.nodeName": self.node_name},
                    labels=dict(labels) if labels else None,
                )
            ]
        except ApiError as err:
            raise _failure(f"list pods on node {self.node_name}", err) from None

    async def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A pod, or None when it is gone."""
        try:
            return dict(await self.api.get(resources.POD, name, namespace=namespace))
        except ApiError as err:
            if err.status.code == 404:
                return None
            raise _failure(f"get pod {namespace}/{name}", err) from None

    async def evict(self, namespace: str, name: str) -> str | None:
        """Evict a pod. None: accepted (or the pod is gone); otherwise why the server refused
        (429: a PodDisruptionBudget does not allow it now)."""
        body = PodEviction(metadata=ObjectMeta(name=name, namespace=namespace))
        try:
            await self.api.create(body, name=name, namespace=namespace)
        except ApiError as err:
            if err.status.code == 404:
                return None
            if err.status.code == 429:
                return refusal_text(err)
            raise _failure(f"evict pod {namespace}/{name}", err) from None
        return None

    async def event(self, type_: str, reason: str, message: str) -> None:
        """An Event about the node (best effort)."""
        await self._events.event(type_, reason, message)

    async def close(self) -> None:
        await self.api.close()
