"""Breaking one link of the node readiness chain on the demo, as a user sees it through the real
kubectl: the ClusterPolicy status names the node and the failing link, and `kubectl describe` /
`kubectl logs` show the evidence. Covered here: the management CDI spec missing, and the device
plugin not registered (the other links are in test_driver_host, test_toolkit_demo and
test_validator_demo)."""

from __future__ import annotations

import copy
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from demo_served import run_kubectl, serve_demo
from kubesim_helpers import needs_kubectl
from waiting import DEADLINE, eventually

import kubesim
from gpu_operator import nvml
from gpudemo import fleet, programs, session

pytestmark = needs_kubectl

NS = session.NAMESPACE
NODE = "a100-1"
VALIDATOR_APP = "nvidia-operator-validator"
TOOLKIT_APP = "nvidia-container-toolkit-daemonset"
PLUGIN_APP = "nvidia-device-plugin-daemonset"
CDI_SPEC = "var/run/cdi/management.nvidia.com-gpu.yaml"
NVML_FAULT = "unknown NVML error"


@dataclass
class Demo:
    sim: kubesim.Cluster
    nodes: programs.Programs
    kubeconfig: Path

    async def kubectl(self, *args: str) -> str:
        code, out = await run_kubectl(self.kubeconfig, *args)
        assert code == 0, out
        return out

    def pods(self, app: str) -> list[dict[str, Any]]:
        return [
            p for p in self.sim.store.list("pods", NS)
            if (p["metadata"].get("labels") or {}).get("app") == app
            and p["spec"].get("nodeName") == NODE and not p["metadata"].get("deletionTimestamp")
        ]  # fmt: skip

    def pod_name(self, app: str) -> str:
        [pod] = self.pods(app)
        return str(pod["metadata"]["name"])

    def state(self, name: str) -> str:
        policy = self.sim.store.get("clusterpolicies.nvidia.com", session.POLICY_NAME) or {}
        for state in (policy.get("status") or {}).get("states") or []:
            if state.get("name") == name:
                return f"{state.get('state')}: {state.get('message', '')}"
        return ""

    def states(self) -> list[Any]:
        policy = self.sim.store.get("clusterpolicies.nvidia.com", session.POLICY_NAME) or {}
        return list((policy.get("status") or {}).get("states") or [])

    def break_nvml_for_one_gpu(self) -> None:
        """NVML cannot describe GPU 0 any more (`minor_number` fails): what the CDI spec
        generation and the device plugin's discovery read, and nothing else does."""
        machine = self.nodes.node(NODE).machine
        assert machine is not None
        machine.fail_next("minor_number", nvml.Unknown, gpu=0, times=None)

    async def restart(self, app: str) -> None:
        old = self.pod_name(app)
        await self.kubectl("-n", NS, "delete", "pod", old, "--wait=false")
        await eventually(
            lambda: [p["metadata"]["name"] for p in self.pods(app)] not in ([], [old]),
            f"a new {app} pod",
            state=lambda: [p["metadata"]["name"] for p in self.pods(app)],
        )

    async def status_names(self, state: str, *words: str) -> str:
        def named() -> bool:
            status = self.state(state)
            return status.startswith("notReady") and all(w in status for w in words)

        await eventually(named, f"{state} to name {words}", state=self.states)
        jsonpath = f'{{.status.states[?(@.name=="{state}")].message}}'
        return await self.kubectl(
            "get", "clusterpolicy", session.POLICY_NAME, "-o", f"jsonpath={jsonpath}"
        )


def policy(section: str, **env: str) -> dict[str, Any]:
    """The demo's ClusterPolicy with env for one section (`toolkit`, `validator.plugin`)."""
    out = copy.deepcopy(session.DEFAULT_POLICY)
    where = out["spec"]
    for key in section.split("."):
        where = where.setdefault(key, {})
    where["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return out


@asynccontextmanager
async def served(tmp_path: Path, policy: dict[str, Any]) -> AsyncIterator[Demo]:
    async with serve_demo(
        tmp_path,
        fleet.parse({"pools": [{"name": "a100", "machine": "dgx-a100"}]}, "v.yaml"),
        policy=policy,
    ) as (sim, nodes, kubeconfig):
        yield Demo(sim, nodes, kubeconfig)


async def test_a_missing_cdi_spec_fails_toolkit_validation_and_the_policy_names_it(
    tmp_path: Path,
) -> None:
    async with served(tmp_path, policy("toolkit", CDI_SPEC_TIMEOUT="1")) as demo:
        spec = demo.sim.node_root(NODE) / CDI_SPEC
        assert spec.is_file()
        demo.break_nvml_for_one_gpu()
        # A toolkit upgrade: the old pod removes its spec on the way out, the new one cannot
        # write another.
        await demo.restart(TOOLKIT_APP)
        await demo.restart(VALIDATOR_APP)

        # The validator's containers run under the NVIDIA runtime in CDI mode: the first one that
        # asks for every GPU (toolkit-validation; NVIDIA's distroless image declares
        # NVIDIA_VISIBLE_DEVICES=void, so driver-validation asks for none) cannot start.
        shown = await demo.status_names(
            "state-operator-validation",
            NODE,
            "unresolvable CDI devices management.nvidia.com/gpu=all",
        )
        assert f"{NODE}: init container toolkit-validation in CrashLoopBackOff" in shown
        toolkit = await demo.status_names(
            "state-container-toolkit", NODE, "could not be generated", NVML_FAULT
        )
        assert "management CDI spec /var/run/cdi/management.nvidia.com-gpu.yaml" in toolkit
        assert not spec.exists()

        validator = await demo.kubectl("-n", NS, "describe", "pod", demo.pod_name(VALIDATOR_APP))
        assert "unresolvable CDI devices management.nvidia.com/gpu=all" in validator
        toolkit_pod = demo.pod_name(TOOLKIT_APP)
        await demo.sim.wait_for(
            lambda: _restarted(demo.pods(TOOLKIT_APP)[0]),
            DEADLINE,
            "the toolkit container restarted",
        )
        log = await demo.kubectl(
            "-n", NS, "logs", toolkit_pod, "-c", "nvidia-container-toolkit-ctr", "--previous"
        )
        assert (
            f"cannot generate the management CDI spec: reading the GPUs from NVML: {NVML_FAULT}"
            in log
        )
        described = await demo.kubectl("-n", NS, "describe", "pod", toolkit_pod)
        assert "could not be generated for 1 s" in described  # the termination message
        events = await demo.kubectl(
            "-n", NS, "get", "events", "--field-selector", "reason=CDISpecGenerationFailed"
        )
        assert NVML_FAULT in events


def _restarted(pod: dict[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any(int(s.get("restartCount") or 0) >= 1 for s in statuses)


async def test_an_unregistered_device_plugin_fails_plugin_validation_and_the_policy_names_it(
    tmp_path: Path,
) -> None:
    # 10 polls instead of 30 (each 5 s, on the demo's 0.1 s clock).
    bounded = policy("validator.plugin", GPU_RESOURCE_DISCOVERY_WAIT_RETRIES="10")
    async with served(tmp_path, bounded) as demo:
        demo.break_nvml_for_one_gpu()
        # A kubelet restart: every plugin must register again, and this one cannot start.
        await demo.sim.restart_kubelet(NODE)
        await demo.restart(VALIDATOR_APP)

        shown = await demo.status_names(
            "state-operator-validation", NODE, "plugin-validation", "has no nvidia.com/gpu"
        )
        assert "the device plugin has not registered" in shown
        plugin = await demo.status_names(
            "state-device-plugin", NODE, "failed to read the GPUs from NVML", NVML_FAULT
        )
        assert "nvidia-device-plugin" in plugin

        validator = demo.pod_name(VALIDATOR_APP)
        described = await demo.kubectl("-n", NS, "describe", "pod", validator)
        assert re.search(
            r"has no nvidia.com/gpu or nvidia.com/mig-\* capacity after \d+ s", described
        )
        plugin_pod = demo.pod_name(PLUGIN_APP)
        described = await demo.kubectl("-n", NS, "describe", "pod", plugin_pod)
        assert f"failed to read the GPUs from NVML: {NVML_FAULT}" in described
        log = await demo.kubectl(
            "-n", NS, "logs", plugin_pod, "-c", "nvidia-device-plugin", "--previous"
        )
        assert f"nvidia-device-plugin: failed to read the GPUs from NVML: {NVML_FAULT}" in log
