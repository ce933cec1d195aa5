"""Read the ConfigMaps a ClusterPolicy names, for `gpu-operator validate --kubeconfig`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from lightkube import ApiError

from gpu_operator.kube import client as kube_client
from gpu_operator.kube import resources

CONFIG_MAP = resources.resource("v1", "ConfigMap")


async def _read(
    api: kube_client.AsyncClient, namespace: str, names: Iterable[str]
) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for name in sorted(set(names)):
        try:
            obj = await api.get(CONFIG_MAP, name, namespace=namespace)
        except ApiError as err:
            if err.status.code == 404:
                continue  # the caller reports it missing, naming the policy field
            raise
        found[name] = dict(obj)
    return found


def read(kubeconfig: str, namespace: str, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The named ConfigMaps that exist in `namespace`, by name; ConnectError or ApiError else."""

    async def run() -> dict[str, dict[str, Any]]:
        api = kube_client.connect(kubeconfig)
        try:
            return await _read(api, namespace, names)
        finally:
            await api.close()

    return asyncio.run(run())
