"""A driver upgrade on the demo cluster, seen as a user sees it with the real kubectl: the
ClusterPolicy's driver version changes, the driver pod is replaced (autoUpgrade is off, so a person
deletes it), and the new pod's `k8s-driver-manager` init container pauses the GPU operands, waits
for their pods, evicts the GPU workload that holds the old driver, unloads it, and restores
everything; its log tells that story."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from demo_served import serve_demo
from kubesim_helpers import KUBECTL, needs_kubectl
from waiting import DEADLINE, eventually

import kubesim
from gpu_operator.api import keys
from gpudemo import fleet, programs, session
from simhost import pci as simulated

pytestmark = needs_kubectl
NODE = "t4-1"
NEW_VERSION = "570.195.03"
# A version needs its repository and image too (the operator says so otherwise).
DRIVER = {"repository": "nvcr.io/nvidia", "image": "driver", "version": NEW_VERSION}
BURN = json.dumps(
    {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "burn", "namespace": "default"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "burn"}},
            "template": {
                "metadata": {"labels": {"app": "burn"}},
                "spec": {
                    "containers": [
                        {
                            "name": "burn",
                            "image": "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
                            "command": ["dcgmproftester12", "--no-dcgm-validation", "-d", "600"],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ]
                },
            },
        },
    }
)


@dataclass
class Demo:
    sim: kubesim.Cluster
    nodes: programs.Programs
    kubeconfig: Path

    async def kubectl(self, *args: str, stdin: str | None = None) -> str:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        proc = await asyncio.create_subprocess_exec(
            str(KUBECTL), *args, env=env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), 60)
        text = out.decode()
        assert proc.returncode == 0, text
        return text

    def node(self) -> dict[str, Any]:
        return self.sim.store.get("nodes", NODE) or {}

    def pods(self, namespace: str, container: str | None = None) -> list[dict[str, Any]]:
        """Pods on the node (with a container or init container of that name)."""
        found = []
        for pod in self.sim.store.list("pods", namespace):
            spec = pod.get("spec") or {}
            names = {
                c["name"]
                for c in (spec.get("containers") or []) + (spec.get("initContainers") or [])
            }
            if spec.get("nodeName") == NODE and (container is None or container in names):
                found.append(pod)
        return found

    def driver_pod(self) -> dict[str, Any] | None:
        pods = self.pods(session.NAMESPACE, "k8s-driver-manager")
        return pods[0] if pods else None

    def driver_template_updated(self) -> bool:
        for ds in self.sim.store.list("daemonsets.apps", session.NAMESPACE):
            containers = ds["spec"]["template"]["spec"].get("containers") or []
            if any(c["name"] == "nvidia-driver-ctr" for c in containers):
                return any(NEW_VERSION in c.get("image", "") for c in containers)
        return False

    def burning(self) -> bool:
        machine = self.nodes.node(NODE).machine
        return machine is not None and any(gpu.processes for gpu in machine.gpus)

    def loaded_version(self) -> str | None:
        return simulated.nvidia_version(self.sim.node_root(NODE))

    def summary(self) -> dict[str, Any]:
        """What a failed wait shows: the loaded driver and the node's pods with their phases."""
        return {
            "loaded": self.loaded_version(),
            "pods": {
                p["metadata"]["name"]: (p.get("status") or {}).get("phase")
                for namespace in ("default", session.NAMESPACE)
                for p in self.pods(namespace)
            },
        }

    async def until(self, predicate: Any, what: str, timeout: float = DEADLINE) -> None:
        await eventually(predicate, what, timeout=timeout, state=self.summary)


@asynccontextmanager
async def demo(tmp_path: Path) -> AsyncIterator[Demo]:
    t4 = fleet.parse({"pools": [{"name": "t4", "machine": "t4x4"}]}, "upgrade.yaml")
    async with serve_demo(tmp_path, t4) as (sim, nodes, kubeconfig):
        yield Demo(sim, nodes, kubeconfig)


async def test_a_driver_upgrade_is_told_by_the_driver_managers_log(tmp_path: Path) -> None:
    async with demo(tmp_path) as d:
        old_version = d.loaded_version()
        assert old_version is not None
        assert old_version != NEW_VERSION
        labels_before = dict(d.node()["metadata"]["labels"])
        await d.kubectl("apply", "-f", "-", stdin=BURN)
        await d.until(d.burning, "the workload running on a GPU")
        (burner,) = d.pods("default")

        await d.kubectl(
            "patch", "clusterpolicy", session.POLICY_NAME, "--type", "merge",
            "-p", json.dumps({"spec": {"driver": DRIVER}}),
        )  # fmt: skip
        await d.until(d.driver_template_updated, "the driver DaemonSet on the new version")
        old = d.driver_pod()
        assert old is not None
        old_name = old["metadata"]["name"]
        # OnDelete and autoUpgrade off: the person upgrading deletes the driver pod.
        await d.kubectl("delete", "pod", "-n", session.NAMESPACE, old_name, "--wait=false")
        await d.until(
            lambda: (p := d.driver_pod()) is not None and p["metadata"]["name"] != old_name,
            "a new driver pod",
        )
        await d.until(lambda: d.loaded_version() == NEW_VERSION, "the new driver loaded")
        new = d.driver_pod()
        assert new is not None
        log = await d.kubectl(
            "logs", "-n", session.NAMESPACE, new["metadata"]["name"], "-c", "k8s-driver-manager"
        )
        burner_name = burner["metadata"]["name"]
        for line in (
            "NVIDIA driver loaded (modules",
            "plan (uninstall): pause",
            "pausing GPU operands: ",
            "device-plugin true -> paused-for-driver-upgrade",
            "the paused operands' pods are gone",
            f"cordoned node {NODE}",
            f"GPU pods on the node: default/{burner_name}",
            f"evicted default/{burner_name}",
            "rmmod nvidia_uvm: done",
            "rmmod nvidia: done",
            f"uncordoned node {NODE}",
            "restoring GPU operands: ",
            "device-plugin paused-for-driver-upgrade -> true",
            "done in",
        ):
            assert line in log, f"{line!r} not in:\n{log}"
        # Restored exactly, schedulable again, and the workload back on the new driver.
        labels = d.node()["metadata"]["labels"]
        for key, value in labels_before.items():
            if key.startswith(keys.DEPLOY_PREFIX):
                assert labels.get(key) == value, key
        assert not d.node()["spec"].get("unschedulable")
        await d.until(d.burning, "the workload running again")
        events = await d.kubectl(
            "get", "events", "-n", session.NAMESPACE,
            "--field-selector", f"involvedObject.name={NODE},reason=GPUPodEvicted",
        )  # fmt: skip
        assert f"evicted default/{burner_name}" in events
        described = await d.kubectl("describe", "node", NODE)
        for reason in ("OperandsPaused", "Cordoned", "GPUPodEvicted", "DriverUnloaded",
                       "Uncordoned", "OperandsRestored"):  # fmt: skip
            assert reason in described, reason
