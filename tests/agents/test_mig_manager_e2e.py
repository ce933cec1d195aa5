"""The MIG manager end to end on the demo's `mig` fleet, driven with the real kubectl: the agent
runs in the operator's nvidia-mig-manager pods, the mock GPUs change, GFD and the device plugin
follow, the deploy labels come back, and failures keep the previous layout."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The kubectl helpers shared by the kubesim suites live beside them (no package to import from).
from kubesim_helpers import kubectl, needs_kubectl
from rich.console import Console
from waiting import DEADLINE, eventually, within

import kubesim
from gpu_operator import nvml
from gpu_operator.agents.mig_manager import gpus as gpus_mod
from gpu_operator.agents.mig_manager import host as host_mod
from gpu_operator.agents.mig_manager import protocol as proto
from gpu_operator.api import keys
from gpu_operator.cli import render
from gpu_operator.controller.operator import Operator, Settings
from gpu_operator.kube import client as kube_client
from gpu_operator.nvml import mock
from gpudemo import fleet, programs, session
from kubesim import KubeletConfig

pytestmark = needs_kubectl
NODE = "mig-mixed-1"  # a DGX A100 (8 x A100-SXM4-40GB) partitioned as all-balanced
CLIENT_LABELS = (
    "nvidia.com/gpu.deploy.device-plugin",
    "nvidia.com/gpu.deploy.gpu-feature-discovery",
    "nvidia.com/gpu.deploy.dcgm-exporter",
)


@dataclass
class Cluster:
    sim: kubesim.Cluster
    programs: programs.Programs
    history: list[dict[str, str]] = field(default_factory=list)

    def labels(self, node: str = NODE) -> dict[str, str]:
        return dict((self.sim.store.get("nodes", node) or {})["metadata"].get("labels") or {})

    def layout(self, node: str = NODE) -> list[dict[str, int]]:
        machine = self.programs.nodes[node].machine
        assert machine is not None
        reader = gpus_mod.Gpus(machine.nvml, host_mod.MockHost(machine))
        return [gpu.devices for gpu in reader.read()]

    def summary(self) -> dict[str, str]:
        """What a failed wait shows: the node's MIG and deploy labels."""
        return {k: v for k, v in self.labels().items() if "mig" in k or "deploy" in k}

    async def until(self, predicate: Any, what: str, timeout: float = DEADLINE) -> None:
        await eventually(predicate, what, timeout=timeout, state=self.summary)


def _policy(**spec: Any) -> dict[str, Any]:
    policy = json.loads(json.dumps(session.DEFAULT_POLICY))
    policy["spec"]["mig"] = {"strategy": "mixed"}
    policy["spec"].update(spec)
    return policy


@contextlib.asynccontextmanager
async def mig_fleet(
    policy: dict[str, Any], objects: tuple[dict[str, Any], ...] = ()
) -> AsyncIterator[Cluster]:
    """The demo's mig fleet with the operator running, converged under `policy`."""
    kubelet = KubeletConfig(start_delay=0, init_container_duration=0, lease_interval=None)
    async with kubesim.Cluster(kubelet=kubelet) as sim:
        nodes = programs.Programs(sim, programs.Timing(scale=0.0))
        nodes.register()
        demo = session.Demo(
            session.Options(fleet=fleet.NAMED["mig"], policy=policy),
            Console(file=io.StringIO()),
        )
        demo.populate(sim, nodes)
        cluster = Cluster(sim, nodes)

        def record(event: Any) -> None:
            meta = event.new.obj.get("metadata") or {}
            if meta.get("name") == NODE:
                cluster.history.append(dict(meta.get("labels") or {}))

        unsubscribe = sim.store.subscribe(record, keys=[("", "nodes")])
        client = kube_client.connect(str(sim.kubeconfig_path))
        operator = Operator(
            client,
            Settings(namespace=session.NAMESPACE, operator_env=render.DEFAULT_OPERATOR_ENV),
        )
        task = asyncio.create_task(operator.run())
        try:
            await within(operator.ready.wait(), "the operator to be ready")
            for obj in objects:
                sim.store.create(obj)
            sim.store.create(policy)
            await sim.wait_for(
                lambda: demo.snapshot(sim).converged, timeout=DEADLINE, message="demo convergence"
            )
            yield cluster
        finally:
            unsubscribe()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()


async def _jsonpath(sim: kubesim.Cluster, path: str) -> str:
    return await kubectl(sim, "get", "node", NODE, "-o", f"jsonpath={{{path}}}")


def _events(sim: kubesim.Cluster, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for e in sim.store.list("events", session.NAMESPACE)
        if e.get("reason") == reason and e["involvedObject"].get("name") == NODE
    ]


async def test_relabelling_an_a100_node_repartitions_its_gpus_and_clients_follow() -> None:
    async with mig_fleet(_policy()) as c:
        # Nodes partitioned before the operator came keep their layout (their label names it).
        for node, preset in (("mig-single-1", "dgx-a100-mig-single"), (NODE, "dgx-a100-mig-mixed")):
            fresh = mock.MockMachine.from_preset(preset)
            reader = gpus_mod.Gpus(fresh.nvml, host_mod.MockHost(fresh))
            assert c.layout(node) == [gpu.devices for gpu in reader.read()]
            assert c.labels(node)[keys.MIG_CONFIG_STATE] == "success"
        assert c.labels("dgx-a100-80gb-1")[keys.MIG_CONFIG] == "all-disabled"
        assert c.labels()[keys.MIG_CONFIG] == "all-balanced"
        assert c.labels()[keys.MIG_CONFIG_STATE] == "success"
        # Without a custom config the manager generated one from the GPUs and published it.
        generated = await kubectl(
            c.sim,
            "get",
            "configmap",
            "-n",
            session.NAMESPACE,
            f"{NODE}-mig-config",
            "-o",
            r"jsonpath={.data.config\.yaml}",
        )
        assert "all-1g.5gb:" in generated
        assert await _jsonpath(c.sim, r".status.allocatable.nvidia\.com/mig-3g\.20gb") == "8"
        c.history.clear()

        await kubectl(
            c.sim, "label", "node", NODE, "nvidia.com/mig.config=all-1g.5gb", "--overwrite"
        )

        def done() -> bool:
            labels = c.labels()
            return (
                labels.get(keys.MIG_CONFIG_STATE) == "success"
                and labels.get("nvidia.com/mig-1g.5gb.count") == "56"
                and all(labels.get(k) == "true" for k in CLIENT_LABELS)
            )

        await c.until(done, "MIG change applied and clients back")
        assert c.layout() == [{"1g.5gb": 7}] * 8
        # The protocol ran: pending first, clients paused while the GPUs changed.
        states = [h.get(keys.MIG_CONFIG_STATE) for h in c.history]
        assert "pending" in states
        assert any(all(h.get(k) == proto.PAUSED for k in CLIENT_LABELS) for h in c.history)
        # What a user sees with kubectl.
        assert await _jsonpath(c.sim, r".metadata.labels.nvidia\.com/mig\.config\.state") == (
            "success"
        )
        for key in CLIENT_LABELS:
            escaped = key.replace(".", r"\.")
            assert await _jsonpath(c.sim, f".metadata.labels.{escaped}") == "true"
        await c.until(
            lambda: (
                (c.sim.store.get("nodes", NODE) or {})["status"]["allocatable"].get(
                    "nvidia.com/mig-1g.5gb"
                )
                == "56"
            ),
            "allocatable follows the new layout",
        )
        assert await _jsonpath(c.sim, r".status.allocatable.nvidia\.com/mig-1g\.5gb") == "56"
        # Gone, or zero while the kubelet still lists a resource no plugin serves.
        assert await _jsonpath(c.sim, r".status.allocatable.nvidia\.com/mig-3g\.20gb") in ("", "0")
        gfd = c.labels()
        assert gfd["nvidia.com/mig-1g.5gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
        assert "nvidia.com/mig-3g.20gb.count" not in gfd
        await c.until(lambda: _events(c.sim, "MigConfigApplied"), "a Normal Event")
        (applied,) = _events(c.sim, "MigConfigApplied")
        assert "1g.5gb x7" in applied["message"]
        events = await kubectl(
            c.sim,
            "get",
            "events",
            "-n",
            session.NAMESPACE,
            "--field-selector",
            "reason=MigConfigApplied",
        )
        assert NODE in events
        # The other MIG nodes were left alone.
        assert c.labels("mig-single-1")[keys.MIG_CONFIG_STATE] == "success"


MIG_CONFIG = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-balanced:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
  all-1g.5gb:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
  too-many:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 8}
"""


# mig-parted skips a `devices` index the node lacks and reports success for the rest.
WITH_A_MISSING_GPU = (
    MIG_CONFIG
    + """\
  gpu-99:
    - devices: [0, 99]
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
"""
)


async def test_a_config_naming_a_gpu_the_node_lacks_fails_naming_it() -> None:
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "custom-mig-config", "namespace": session.NAMESPACE},
        "data": {"config.yaml": WITH_A_MISSING_GPU},
    }
    policy = _policy(migManager={"enabled": True, "config": {"name": "custom-mig-config"}})
    async with mig_fleet(policy, (configmap,)) as c:
        before = c.layout()
        await kubectl(c.sim, "label", "node", NODE, "nvidia.com/mig.config=gpu-99", "--overwrite")
        await c.until(lambda: c.labels().get(keys.MIG_CONFIG_STATE) == "failed", "failed")
        message = await _jsonpath(
            c.sim, r".metadata.annotations.nvidia\.com/mig\.config\.state\.message"
        )
        assert (
            "mig-configs.gpu-99[0].devices: GPU index 99 does not exist: this node has 8 GPUs "
            "(indices 0-7)"
        ) in message
        # Nothing was applied, not even to GPU 0, and the clients keep running.
        assert c.layout() == before
        assert all(c.labels()[k] == "true" for k in CLIENT_LABELS)


async def test_a_failed_change_keeps_the_previous_layout_and_says_why() -> None:
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "custom-mig-config", "namespace": session.NAMESPACE},
        "data": {"config.yaml": MIG_CONFIG},
    }
    policy = _policy(migManager={"enabled": True, "config": {"name": "custom-mig-config"}})
    async with mig_fleet(policy, (configmap,)) as c:
        before = c.layout()
        assert before == [{"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}] * 8

        # A config the GPUs cannot hold fails before anything is paused.
        await kubectl(c.sim, "label", "node", NODE, "nvidia.com/mig.config=too-many", "--overwrite")
        await c.until(lambda: c.labels().get(keys.MIG_CONFIG_STATE) == "failed", "failed")
        message = await _jsonpath(
            c.sim, r".metadata.annotations.nvidia\.com/mig\.config\.state\.message"
        )
        assert "mig-configs.too-many[0]: GPU 0 (A100-SXM4-40GB)" in message
        assert "at most 7 1g.5gb" in message
        assert c.layout() == before
        assert all(c.labels()[k] == "true" for k in CLIENT_LABELS)
        await c.until(lambda: _events(c.sim, "MigConfigFailed"), "a Warning Event")
        (event,) = _events(c.sim, "MigConfigFailed")
        assert event["type"] == "Warning"

        # An apply that fails half-way on one GPU puts every GPU back as it was.
        machine = c.programs.nodes[NODE].machine
        assert machine is not None
        machine.fail_next("create_gpu_instance", nvml.InsufficientResources, gpu=5)
        await kubectl(
            c.sim, "label", "node", NODE, "nvidia.com/mig.config=all-1g.5gb", "--overwrite"
        )

        def restored() -> bool:
            annotations = (c.sim.store.get("nodes", NODE) or {})["metadata"].get("annotations")
            text = (annotations or {}).get(proto.STATE_MESSAGE_ANNOTATION, "")
            return "previous layout was restored" in text

        await c.until(restored, "rollback reported")
        assert c.labels()[keys.MIG_CONFIG_STATE] == "failed"
        assert c.layout() == before
        await c.until(
            lambda: all(c.labels().get(k) == "true" for k in CLIENT_LABELS), "clients restored"
        )
        await c.until(lambda: len(_events(c.sim, "MigConfigFailed")) == 2, "second Event")

        # Relabelling retries: the same config now applies, and the message goes away.
        await kubectl(
            c.sim, "label", "node", NODE, "nvidia.com/mig.config=all-balanced", "--overwrite"
        )
        await c.until(lambda: c.labels().get(keys.MIG_CONFIG_STATE) == "success", "success")
        await kubectl(
            c.sim, "label", "node", NODE, "nvidia.com/mig.config=all-1g.5gb", "--overwrite"
        )
        await c.until(
            lambda: (
                c.labels().get(keys.MIG_CONFIG_STATE) == "success"
                and c.layout() == [{"1g.5gb": 7}] * 8
            ),
            "retry applied",
        )
        annotations = (c.sim.store.get("nodes", NODE) or {})["metadata"].get("annotations") or {}
        assert proto.STATE_MESSAGE_ANNOTATION not in annotations


async def test_the_command_as_a_user_runs_it_follows_the_label_and_stops_on_sigterm() -> None:
    kubelet = KubeletConfig(instant=True, lease_interval=None)
    async with kubesim.Cluster(kubelet=kubelet) as sim:
        sim.add_node("gpu-1", labels={keys.MIG_CONFIG: "all-disabled"})
        env = {
            **os.environ,
            "KUBECONFIG": str(sim.kubeconfig_path),
            "NODE_NAME": "gpu-1",
            "DEFAULT_GPU_CLIENTS_NAMESPACE": "default",
            "POD_NAMESPACE": "default",
        }
        proc = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).with_name("gpu-operator")),
            "agent",
            "mig-manager",
            "--backend",
            "mock",
            "--machine",
            "dgx-h100",
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:

            def state() -> str | None:
                node = sim.store.get("nodes", "gpu-1") or {}
                return (node["metadata"].get("labels") or {}).get(keys.MIG_CONFIG_STATE)

            await sim.wait_for(
                lambda: state() == "success", timeout=DEADLINE, message="initial state"
            )
            await kubectl(
                sim, "label", "node", "gpu-1", "nvidia.com/mig.config=all-3g.40gb", "--overwrite"
            )
            await sim.wait_for(
                lambda: any(
                    e.get("reason") == "MigConfigApplied" for e in sim.store.list("events")
                ),
                timeout=DEADLINE,
                message="MigConfigApplied",
            )
            assert state() == "success"
            (event,) = [e for e in sim.store.list("events") if e["reason"] == "MigConfigApplied"]
            assert event["message"] == (
                "MIG config 'all-3g.40gb': GPUs 0-7 (H100-SXM5-80GB): MIG off -> MIG on, "
                "3g.40gb x2 (mode change: GPU reset)"
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            output, _ = await within(proc.communicate(), "the agent to exit on SIGTERM")
        assert proc.returncode == 0, output.decode()
        assert b"MIG config 'all-3g.40gb': success" in output
