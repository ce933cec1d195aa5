"""lightkube client set-up: a kubeconfig file, or the in-cluster service account."""

from __future__ import annotations

import httpx2
from lightkube import AsyncClient
from lightkube.config.kubeconfig import KubeConfig

from gpu_operator.kube import lean_http

FIELD_MANAGER = "gpu-operator"

__all__ = ["FIELD_MANAGER", "AsyncClient", "ConnectError", "connect"]


class Client(AsyncClient):
    """lightkube's client; closing it also closes the writers' lean connections
    (kube/lean_http.py)."""

    async def close(self) -> None:
        lean_http.close(self)
        await super().close()


class ConnectError(Exception):
    """No usable cluster configuration (bad kubeconfig path, not in a cluster)."""


def connect(kubeconfig: str | None = None, *, timeout: float = 15.0) -> AsyncClient:
    """An async client for the kubeconfig file, or in-cluster config / $KUBECONFIG when None."""
    try:
        config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    except Exception as err:  # lightkube raises several types for unusable configs
        where = kubeconfig or "in-cluster service account or $KUBECONFIG"
        raise ConnectError(f"cannot load cluster configuration from {where}: {err}") from None
    return Client(
        config=config,
        field_manager=FIELD_MANAGER,
        timeout=httpx2.Timeout(timeout),
        trust_env=False,
    )
