"""A node agent's view of its own Node: the values of one label as they change, and Events
about the node. Used by the config manager (lightkube stays inside `gpu_operator.kube`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node

from gpu_operator.kube import writer

log = logging.getLogger(__name__)
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_UNSET = object()


def _label(node: Node | None, label: str) -> str | None:
    labels = (node.metadata.labels if node is not None and node.metadata else None) or {}
    return labels.get(label) or None


async def label_values(
    api: AsyncClient, node: str, label: str, *, watch_timeout: int = 300
) -> AsyncIterator[str | None]:
    """The label's value now, then each time it changes (None: not set, or the node is gone).
    Reconnects on errors and relists on 410, like an informer restricted to one object."""
    last: object = _UNSET
    delay = 0.2
    while True:
        try:
            try:
                current: Node | None = await api.get(Node, node)
            except ApiError as err:
                if err.status.code != 404:
                    raise
                current = None
            value = _label(current, label)
            if value != last:
                last = value
                yield value
            version = current.metadata.resourceVersion if current and current.metadata else None
            async for event, obj in api.watch(
                Node,
                fields={"metadata.name": node},
                resource_version=version,
                server_timeout=watch_timeout,
            ):
                value = None if event == "DELETED" else _label(obj, label)
                if value != last:
                    last = value
                    yield value
                delay = 0.2
        except asyncio.CancelledError:
            raise
        except ApiError as err:
            if err.status.code != 410:
                log.warning("watching node %s failed: %s; retrying in %.1fs", node, err, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        except Exception as err:
            log.warning("watching node %s interrupted: %s; retrying in %.1fs", node, err, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


def own_namespace(default: str = "default") -> str:
    """The pod's namespace from its service account mount (where its Events go)."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or default
    except OSError:
        return default


class NodeEvents:
    """Records core/v1 Events about one node (best effort, like every Event)."""

    def __init__(self, api: AsyncClient, node: str, namespace: str, component: str) -> None:
        self.node = node
        # Node Events stay in the agent's namespace, where its Role grants `events create`.
        self._writer = writer.Writer(
            api, namespace=namespace, component=component, cluster_events_namespace=namespace
        )
        self._uid: str | None = None
        self._api = api

    async def event(self, type_: str, reason: str, message: str) -> None:
        if self._uid is None:
            try:
                obj = await self._api.get(Node, self.node)
                self._uid = obj.metadata.uid if obj.metadata else None
            except Exception as err:
                log.warning("could not read node %s for an event: %s", self.node, err)
        involved = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node, "uid": self._uid},
        }
        await self._writer.event(involved, reason=reason, message=message, type_=type_)
