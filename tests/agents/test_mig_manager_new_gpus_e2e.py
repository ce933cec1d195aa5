"""Upstream's default MIG configs on a B300 node of the demo, driven with the real kubectl: the
operator's config (copied into a ConfigMap the policy names, as a user swapping operators keeps
upstream's) partitions the mock B300s, the device plugin advertises the new MIG resources, and a
config for other GPUs fails with the reason on the node."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator
from typing import Any

from kubesim_helpers import kubectl, needs_kubectl
from rich.console import Console
from waiting import DEADLINE, eventually, within

import kubesim
from gpu_operator.api import keys
from gpu_operator.cli import render
from gpu_operator.controller.operator import Operator, Settings
from gpu_operator.kube import client as kube_client
from gpu_operator.operands import mig_manager
from gpudemo import fleet, programs, session
from kubesim import KubeletConfig

pytestmark = needs_kubectl
NODE = "b300-1"
CONFIG_MAP = "upstream-mig-configs"
FLEET = fleet.Fleet.model_validate(
    {"name": "new-gpus", "pools": [{"name": "b300", "machine": "hgx-b300", "count": 1}]}
)


def _policy() -> dict[str, Any]:
    policy: dict[str, Any] = json.loads(json.dumps(session.DEFAULT_POLICY))
    policy["spec"]["mig"] = {"strategy": "mixed"}
    policy["spec"]["migManager"] = {"enabled": True, "config": {"name": CONFIG_MAP}}
    return policy


@contextlib.asynccontextmanager
async def b300_node() -> AsyncIterator[tuple[kubesim.Cluster, programs.Programs]]:
    kubelet = KubeletConfig(start_delay=0, init_container_duration=0, lease_interval=None)
    async with kubesim.Cluster(kubelet=kubelet) as sim:
        nodes = programs.Programs(sim, programs.Timing(scale=0.0))
        nodes.register()
        policy = _policy()
        demo = session.Demo(
            session.Options(fleet=FLEET, policy=policy), Console(file=io.StringIO())
        )
        demo.populate(sim, nodes)
        client = kube_client.connect(str(sim.kubeconfig_path))
        operator = Operator(
            client,
            Settings(namespace=session.NAMESPACE, operator_env=render.DEFAULT_OPERATOR_ENV),
        )
        task = asyncio.create_task(operator.run())
        try:
            await within(operator.ready.wait(), "the operator to be ready")
            sim.store.create(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": CONFIG_MAP, "namespace": session.NAMESPACE},
                    "data": {"config.yaml": mig_manager.default_mig_config_yaml()},
                }
            )
            sim.store.create(policy)
            await sim.wait_for(
                lambda: demo.snapshot(sim).converged, timeout=90, message="demo convergence"
            )
            yield sim, nodes
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()


def _labels(sim: kubesim.Cluster) -> dict[str, str]:
    return dict((sim.store.get("nodes", NODE) or {})["metadata"].get("labels") or {})


def _allocatable(sim: kubesim.Cluster, resource: str) -> str | None:
    node = sim.store.get("nodes", NODE) or {}
    found: str | None = node.get("status", {}).get("allocatable", {}).get(resource)
    return found


async def _relabel(sim: kubesim.Cluster, config: str, state: str) -> None:
    await kubectl(sim, "label", "node", NODE, f"nvidia.com/mig.config={config}", "--overwrite")
    await eventually(
        lambda: (
            _labels(sim).get(keys.MIG_CONFIG) == config
            and _labels(sim).get(keys.MIG_CONFIG_STATE) == state
        ),
        f"{config}: {state}",
        state=lambda: {k: v for k, v in _labels(sim).items() if "mig" in k},
    )


async def test_upstreams_b300_configs_partition_the_node_and_others_are_refused() -> None:
    async with b300_node() as (sim, nodes):
        machine = nodes.nodes[NODE].machine
        assert machine is not None
        await _relabel(sim, "all-balanced", "success")
        # Each MIG resource is a plugin registration of its own, so the kubelet updates them one
        # at a time: wait for both before reading the node as a user would.
        await sim.wait_for(
            lambda: (
                _allocatable(sim, "nvidia.com/mig-1g.34gb") == "16"
                and _allocatable(sim, "nvidia.com/mig-3g.135gb") == "8"
            ),
            message="the plugin advertises 2 x 1g.34gb and 1 x 3g.135gb per GPU",
            timeout=DEADLINE,
        )
        got = await kubectl(
            sim,
            "get",
            "node",
            NODE,
            "-o",
            r"jsonpath={.status.allocatable.nvidia\.com/mig-3g\.135gb}",
        )
        assert got == "8"

        await _relabel(sim, "all-1g.24gb.gfx", "failed")
        message = await kubectl(
            sim,
            "get",
            "node",
            NODE,
            "-o",
            r"jsonpath={.metadata.annotations.nvidia\.com/mig\.config\.state\.message}",
        )
        assert "GPU 0 (B300): B300 has no MIG profile '1g.24gb+gfx'" in message
        described = await kubectl(sim, "describe", "node", NODE)
        assert "MigConfigFailed" in described
        # The GPUs kept the balanced layout.
        assert _allocatable(sim, "nvidia.com/mig-1g.34gb") == "16"
