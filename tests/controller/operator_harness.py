"""Helpers for operator tests: the cluster layout, a policy builder and an `Env` handle."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from waiting import DEADLINE, eventually

import kubesim
from gpu_operator.api import keys
from gpu_operator.api.images import IMAGE_ENV
from gpu_operator.controller.operator import Operator, Settings
from gpu_operator.kube import client as kube_client

NAMESPACE = "gpu-operator"
TEST_STATUS_WINDOW = 0.2
OPERATOR_ENV = {
    name: f"registry.local/{name.lower().replace('_image', '')}:v1"
    for name in set(IMAGE_ENV.values())
}
GPU_LABELS = {
    "feature.node.kubernetes.io/pci-10de.present": "true",
    keys.NFD_OS_ID: "ubuntu",
    keys.NFD_OS_VERSION_ID: "22.04",
    keys.NFD_KERNEL_FULL: "6.8.0-52-generic",
}
CPU_LABELS = {keys.NFD_OS_ID: "ubuntu", keys.NFD_OS_VERSION_ID: "22.04"}
POLICY: dict[str, Any] = {
    "apiVersion": "nvidia.com/v1",
    "kind": "ClusterPolicy",
    "metadata": {"name": "cluster-policy"},
    "spec": {
        "operator": {},
        "daemonsets": {},
        "driver": {"repository": "nvcr.io/nvidia", "image": "driver", "version": "580.95.05"},
        "toolkit": {},
        "devicePlugin": {},
        "dcgmExporter": {},
        "dcgm": {"enabled": False},
        "nodeStatusExporter": {},
        "gfd": {},
    },
}


@dataclass
class Env:
    sim: kubesim.Cluster
    operators: list[Operator]
    tasks: list[asyncio.Task[None]]
    # The operator's credentials: the chart's ServiceAccount under RBAC, else the admin's.
    kubeconfig: Path | None = None

    @property
    def operator(self) -> Operator:
        return self.operators[0]

    def policy(self, name: str = "cluster-policy") -> dict[str, Any]:
        found = self.sim.store.get("clusterpolicies.nvidia.com", name)
        assert found is not None
        return found

    def node_labels(self, name: str) -> dict[str, str]:
        node = self.sim.store.get("nodes", name)
        assert node is not None
        return dict(node["metadata"].get("labels") or {})

    def daemonsets(self) -> dict[str, dict[str, Any]]:
        return {
            d["metadata"]["name"]: d for d in self.sim.store.list("daemonsets", namespace=NAMESPACE)
        }

    def summary(self) -> dict[str, Any]:
        """What a failed wait shows: each ClusterPolicy's state and its states not ready, and
        the DaemonSets not rolled out (generation, observed, desired/updated/available)."""
        shown: dict[str, Any] = {}
        for name, ds in self.daemonsets().items():
            status = ds.get("status") or {}
            counts = [
                status.get(k) or 0
                for k in ("desiredNumberScheduled", "updatedNumberScheduled", "numberAvailable")
            ]
            generations = [ds["metadata"].get("generation"), status.get("observedGeneration")]
            if len(set(counts)) > 1 or generations[0] != generations[1]:
                shown[f"daemonset {name}"] = {"generation": generations, "counts": counts}
        for found in self.sim.store.list("clusterpolicies.nvidia.com"):
            status = found.get("status") or {}
            shown[found["metadata"]["name"]] = {
                "state": status.get("state"),
                "notReady": {
                    s.get("name"): f"{s.get('state')}: {s.get('message', '')}"
                    for s in status.get("states") or []
                    if s.get("state") not in ("ready", "disabled")
                },
            }
        return shown

    async def wait(
        self,
        predicate: Callable[[], bool],
        message: str,
        timeout: float = DEADLINE,
        state: Callable[[], Any] | None = None,
    ) -> None:
        await eventually(predicate, message, timeout=timeout, state=state or self.summary)

    async def wait_ready(self, name: str = "cluster-policy", timeout: float = DEADLINE) -> None:
        def ready() -> bool:
            status = self.policy(name).get("status") or {}
            return bool(status.get("state") == "ready")

        await self.wait(ready, f"ClusterPolicy {name} ready", timeout)

    def start_operator(self, **settings: Any) -> Operator:
        # A shorter status window than the default 1 s keeps these step-by-step scenarios quick;
        # tests/controller/test_status_coalescing.py runs the default window.
        settings.setdefault("status_write_interval", TEST_STATUS_WINDOW)
        client = kube_client.connect(str(self.kubeconfig or self.sim.kubeconfig_path))
        operator = Operator(
            client,
            Settings(namespace=NAMESPACE, operator_env=OPERATOR_ENV, **settings),
        )
        self.operators.append(operator)
        self.tasks.append(asyncio.create_task(operator.run()))
        return operator

    async def stop_operator(self, operator: Operator) -> None:
        index = self.operators.index(operator)
        task = self.tasks[index]
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await operator.client.close()


def gpu_node(sim: kubesim.Cluster, name: str, **extra: str) -> None:
    sim.add_node(name, labels={**GPU_LABELS, **extra})


def policy(**spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(POLICY)
    body["spec"].update(spec)
    return body
