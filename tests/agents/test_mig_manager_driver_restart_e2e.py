"""The MIG manager across driver restarts, on the served demo with the real kubectl (issue 30,
item 3): a MIG config asked for while the driver pod is being replaced waits for the driver and
is applied once it is back, with no human action; a driver upgrade under a MIG workload pauses
the MIG manager like the other operands and restores it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from demo_served import serve_demo
from kubesim_helpers import kubectl, needs_kubectl
from waiting import eventually

from gpu_operator.agents.mig_manager import gpus as gpus_mod
from gpu_operator.agents.mig_manager import host as host_mod
from gpu_operator.agents.mig_manager import protocol as proto
from gpu_operator.api import keys
from gpudemo import fleet, programs, session
from simhost import pci as simulated

pytestmark = needs_kubectl
NODE = "mig-mixed-1"  # a DGX A100 (8 x A100-SXM4-40GB) partitioned as all-balanced
MIG_DEPLOY = keys.DEPLOY_PREFIX + "mig-manager"
DRIVER_PAUSED = "paused-for-driver-upgrade"
BALANCED = [{"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}] * 8
SMALL = [{"1g.5gb": 7}] * 8


def _driver(version: str) -> str:
    spec = {"driver": {"repository": "nvcr.io/nvidia", "image": "driver", "version": version}}
    return json.dumps({"spec": spec})


def _burn() -> str:
    """A Deployment whose pod runs on one MIG device (it holds the driver while it runs)."""
    container = {
        "name": "burn",
        "image": "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
        "command": ["dcgmproftester12", "--no-dcgm-validation", "-d", "600"],
        "resources": {"limits": {"nvidia.com/mig-1g.5gb": "1"}},
    }
    return json.dumps(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "burn", "namespace": "default"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "burn"}},
                "template": {
                    "metadata": {"labels": {"app": "burn"}},
                    "spec": {"containers": [container]},
                },
            },
        }
    )


class DriverBuildGate:
    """Holds the next driver container in its build step (the node has no driver meanwhile)
    until `release` is set: the window in which the MIG manager used to read the GPUs."""

    def __init__(self, nodes: programs.Programs, monkeypatch: pytest.MonkeyPatch) -> None:
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        original: Callable[[float, str, str], Awaitable[None]] = nodes._sleep

        async def sleep(base: float, node: str, what: str) -> None:
            if node == NODE and what == "driver/build" and not self.release.is_set():
                self.held.set()
                await self.release.wait()
            await original(base, node, what)

        monkeypatch.setattr(nodes, "_sleep", sleep)


async def test_the_mig_manager_waits_out_driver_restarts_and_is_paused_by_the_driver_manager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = json.loads(json.dumps(session.DEFAULT_POLICY))
    policy["spec"]["mig"] = {"strategy": "mixed"}
    chosen = fleet.parse({"pools": [{"name": "mig-mixed", "machine": "dgx-a100-mig-mixed"}]})
    async with serve_demo(tmp_path, chosen, policy=policy) as (sim, nodes, _):
        machine = nodes.node(NODE).machine
        assert machine is not None
        history: list[dict[str, str]] = []

        def record(event: Any) -> None:
            meta = event.new.obj.get("metadata") or {}
            if meta.get("name") == NODE:
                history.append(dict(meta.get("labels") or {}))

        sim.store.subscribe(record, keys=[("", "nodes")])

        def node() -> dict[str, Any]:
            return sim.store.get("nodes", NODE) or {}

        def labels() -> dict[str, str]:
            return dict(node()["metadata"].get("labels") or {})

        def message() -> str:
            annotations = node()["metadata"].get("annotations") or {}
            return str(annotations.get(proto.STATE_MESSAGE_ANNOTATION, ""))

        def layout() -> list[dict[str, int]]:
            reader = gpus_mod.Gpus(machine.nvml, host_mod.MockHost(machine))
            return [gpu.devices for gpu in reader.read()]

        def loaded() -> str | None:
            return simulated.nvidia_version(sim.node_root(NODE))

        def pods(app: str) -> list[str]:
            return [
                p["metadata"]["name"]
                for p in sim.store.list("pods", session.NAMESPACE)
                if (p["metadata"].get("labels") or {}).get("app", "").startswith(app)
                and (p.get("spec") or {}).get("nodeName") == NODE
                and not p["metadata"].get("deletionTimestamp")
            ]

        def summary() -> dict[str, Any]:
            mig = {k: v for k, v in labels().items() if "mig" in k}
            return {"loaded": loaded(), "labels": mig, "message": message()}

        async def until(predicate: Callable[[], object], what: str) -> None:
            await eventually(predicate, what, state=summary)

        async def replace_driver(version: str) -> str:
            """Move the ClusterPolicy to `version` and delete the driver pod, as a person
            upgrading does (autoUpgrade is off); returns the old pod's name."""
            await kubectl(
                sim, "patch", "clusterpolicy", session.POLICY_NAME, "--type", "merge",
                "-p", _driver(version),
            )  # fmt: skip

            def updated() -> bool:
                for ds in sim.store.list("daemonsets.apps", session.NAMESPACE):
                    spec = ds["spec"]["template"]["spec"]
                    for c in spec.get("containers") or []:
                        if c["name"] == "nvidia-driver-ctr" and version in c.get("image", ""):
                            return True
                return False

            await until(updated, f"the driver DaemonSet on {version}")
            (old,) = pods("nvidia-driver-daemonset")
            await kubectl(sim, "delete", "pod", "-n", session.NAMESPACE, old, "--wait=false")
            return old

        await until(
            lambda: labels().get(keys.MIG_CONFIG_STATE) == "success", "the MIG config applied"
        )
        assert labels()[keys.MIG_CONFIG] == "all-balanced"
        assert layout() == BALANCED

        # 1. The driver pod is replaced with nothing holding the driver: the old container
        # unloads it, and the new one is held while it builds. A new MIG config asked for now
        # used to be read against the missing driver and stay `failed` ("Driver Not Loaded").
        gate = DriverBuildGate(nodes, monkeypatch)
        old = await replace_driver("570.195.03")
        await until(
            lambda: (
                gate.held.is_set() and loaded() is None and pods("nvidia-driver-daemonset") != [old]
            ),
            "the old driver gone and the new one building",
        )
        await kubectl(sim, "label", "node", NODE, f"{keys.MIG_CONFIG}=all-1g.5gb", "--overwrite")
        await until(message, "the MIG manager to say why the config is not applied")
        assert labels()[keys.MIG_CONFIG_STATE] == "pending", message()
        assert message().startswith("waiting for the NVIDIA driver: "), message()
        assert "retrying in" in message(), message()
        # Nothing was touched without a driver (NVML cannot be asked now: its instances).
        assert [len(gpu.gis) for gpu in machine.gpus] == [4] * 8
        assert loaded() is None
        (manager,) = pods("nvidia-mig-manager")

        async def manager_log() -> str:
            return await kubectl(sim, "logs", "-n", session.NAMESPACE, manager)

        async def logged(line: str) -> bool:
            return line in await manager_log()

        await until(
            lambda: logged("the NVIDIA driver is gone"), "the MIG manager to see the driver go"
        )

        gate.release.set()
        await until(lambda: loaded() == "570.195.03", "the new driver loaded")
        await until(
            lambda: labels().get(keys.MIG_CONFIG_STATE) == "success" and layout() == SMALL,
            "the MIG config applied once the driver is back, with no relabelling",
        )
        assert message() == ""
        log = await manager_log()
        assert "checking MIG config 'all-1g.5gb' again now that the driver is back" in log, log
        path = r"jsonpath={.metadata.labels.nvidia\.com/mig\.config\.state}"
        state = await kubectl(sim, "get", "node", NODE, "-o", path)
        assert state == "success"
        assert not any(h.get(keys.MIG_CONFIG_STATE) == "failed" for h in history)

        # 2. A second upgrade with a workload on a MIG device: the driver stays loaded until
        # the new pod's driver manager has paused the GPU operands (the MIG manager among
        # them), evicted the workload and unloaded it; then everything is restored.
        await kubectl(sim, "apply", "-f", "-", stdin=_burn())
        await until(lambda: any(gpu.processes for gpu in machine.gpus), "the workload running")
        (manager_before,) = pods("nvidia-mig-manager")
        history.clear()
        await replace_driver("580.95.05")
        await until(lambda: loaded() == "580.95.05", "the second driver loaded")
        await until(
            lambda: (
                labels().get(MIG_DEPLOY) == "true"
                and labels().get(keys.MIG_CONFIG_STATE) == "success"
                and len(pods("nvidia-mig-manager")) == 1
                and pods("nvidia-mig-manager") != [manager_before]
            ),
            "the MIG manager back (a new pod) and the config still applied",
        )
        seen = [h.get(MIG_DEPLOY) for h in history]
        assert DRIVER_PAUSED in seen, seen
        paused_at = seen.index(DRIVER_PAUSED)
        assert "true" in seen[paused_at:], seen
        assert not any(h.get(keys.MIG_CONFIG_STATE) == "failed" for h in history)
        assert layout() == SMALL
        (driver_pod,) = pods("nvidia-driver-daemonset")
        log = await kubectl(
            sim, "logs", "-n", session.NAMESPACE, driver_pod, "-c", "k8s-driver-manager"
        )
        assert "plan (uninstall)" in log, log
        assert f"mig-manager true -> {DRIVER_PAUSED}" in log, log
        assert f"mig-manager {DRIVER_PAUSED} -> true" in log, log
