"""Helpers shared by the kubesim tests."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from waiting import DEADLINE, within

import kubesim
from kubesim import KubeletConfig

KUBECTL = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "kubectl"
needs_kubectl = pytest.mark.skipif(
    not KUBECTL.exists(),
    reason="kubectl not installed (run scripts/setup, which runs scripts/install_tools.py)",
)


async def kubectl(
    sim: kubesim.Cluster, *args: str, stdin: str | None = None, check: bool = True
) -> str:
    """Run the real kubectl against the cluster; stdout and stderr together (and, with `check`,
    a failed command fails the test with its output)."""
    env = {**os.environ, "KUBECONFIG": str(sim.kubeconfig_path)}
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL),
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    try:
        # Longer than DEADLINE: `kubectl wait --timeout` within it says what it waited for.
        out, _ = await within(
            proc.communicate(stdin.encode() if stdin else None),
            f"kubectl {' '.join(args)}",
            2 * DEADLINE,
        )
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = out.decode()
    if check:
        assert proc.returncode == 0, text
    return text


class Api:
    """Raw HTTP access returning (status, decoded body)."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def req(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        ctype: str = "application/json",
        params: dict[str, str] | None = None,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        all_headers = {"Content-Type": ctype, **(headers or {})}
        async with self.session.request(
            method, path, data=data, params=params, headers=all_headers
        ) as resp:
            text = await resp.read()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text.decode()

    async def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        status, result = await self.req(method, path, body, **kw)
        assert status < 300, (status, result)
        return result


# The tests' made-up images (docker.io/example/... and a private registry.local): test clusters
# whose pods run them register them, since kubesim's nodes pull only images its catalog knows
# (kubesim.images).
TEST_IMAGES = ("example/*", "registry.local/*")


def instant() -> KubeletConfig:
    """A kubelet without delays or heartbeats."""
    return KubeletConfig(instant=True, lease_interval=None)


def configmap(name: str, namespace: str = "default", **labels: str) -> dict[str, Any]:
    """A ConfigMap manifest."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "data": {"k": "v"},
    }


def daemonset(name: str, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    """A DaemonSet manifest with one container; extra pod spec fields via keywords."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": f"example/{name}:1"}], **spec},
            },
        },
    }


CM = "/api/v1/namespaces/default/configmaps"
