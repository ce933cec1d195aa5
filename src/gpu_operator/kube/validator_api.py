"""The validator's API calls (`gpu_operator.agents.validator.protocols.Cluster`): read its node
and DaemonSets, replace and watch its workload pods, read their Events and logs.

The only validator code that talks to Kubernetes (import rule: lightkube stays in this package).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.types import CascadeType

from gpu_operator.kube import resources

log = logging.getLogger(__name__)
Obj = dict[str, Any]
NOT_FOUND = 404
FORBIDDEN = 403


class ValidatorApi:
    """The Kubernetes API as the validator uses it."""

    def __init__(self, api: AsyncClient) -> None:
        self.api = api

    async def close(self) -> None:
        await self.api.close()

    async def _get(self, resource: Any, name: str, namespace: str | None = None) -> Obj | None:
        try:
            return dict(await self.api.get(resource, name, namespace=namespace))
        except ApiError as err:
            if err.status.code == NOT_FOUND:
                return None
            raise

    async def node(self, name: str) -> Obj | None:
        return await self._get(resources.NODE, name)

    async def daemonset(self, namespace: str, name: str) -> Obj | None:
        return await self._get(resources.DAEMONSET, name, namespace)

    async def daemonsets(self, namespace: str, labels: Mapping[str, str]) -> list[Obj]:
        return [
            dict(ds)
            async for ds in self.api.list(
                resources.DAEMONSET, namespace=namespace, labels=dict(labels)
            )
        ]

    async def pods(
        self, namespace: str, labels: Mapping[str, str], node: str | None = None
    ) -> list[Obj]:
        listing = (
            self.api.list(
                resources.POD, namespace=namespace, labels=dict(labels),
                fields={"spec.nodeName": node},
            )
            if node
            else self.api.list(resources.POD, namespace=namespace, labels=dict(labels))
        )  # fmt: skip
        return [dict(pod) async for pod in listing]

    async def pod(self, namespace: str, name: str) -> Obj | None:
        return await self._get(resources.POD, name, namespace)

    async def create_pod(self, pod: Obj) -> Obj:
        return dict(await self.api.create(resources.POD(pod)))

    async def delete_pod(self, namespace: str, name: str) -> None:
        try:
            await self.api.delete(
                resources.POD,
                name,
                namespace=namespace,
                grace_period=0,
                cascade=CascadeType.BACKGROUND,
            )
        except ApiError as err:
            if err.status.code != NOT_FOUND:
                raise

    async def events(self, namespace: str, name: str) -> list[Obj]:
        try:
            return [
                dict(event)
                async for event in self.api.list(
                    resources.EVENT, namespace=namespace, fields={"involvedObject.name": name}
                )
            ]
        except ApiError as err:
            # The evidence is optional: a Role without `events` still validates.
            if err.status.code in (FORBIDDEN, NOT_FOUND):
                log.debug("events of %s/%s: %s", namespace, name, err)
                return []
            raise

    async def pod_log(self, namespace: str, name: str, container: str) -> str:
        try:
            return "".join(
                [
                    line
                    async for line in self.api.log(name, namespace=namespace, container=container)
                ]
            )
        except ApiError as err:
            log.debug("log of %s/%s %s: %s", namespace, name, container, err)
            return ""
