"""The validator on the demo, through the real kubectl: each init container's log tells its
check, the markers land on the node, the cuda workload runs vectorAdd; a GPU with an
uncorrectable ECC error makes `cuda-validation` fail with the CUDA error, and the ClusterPolicy
status names the node and the reason; a GPU reset brings the node back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from demo_served import run_kubectl, serve_demo
from kubesim_helpers import needs_kubectl
from waiting import DEADLINE

import kubesim
from gpudemo import fleet, session
from gpudemo import validator as validator_demo

pytestmark = needs_kubectl

NS = session.NAMESPACE
NODE = "a100-1"
VALIDATOR_APP = "nvidia-operator-validator"
VALIDATION_STATE = "state-operator-validation"
ECC_ERROR = "Failed to launch vectorAdd kernel (error code uncorrectable ECC error encountered)!"


@dataclass
class Demo:
    sim: kubesim.Cluster
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

    def restarts(self, init: str) -> int:
        [pod] = self.pods(VALIDATOR_APP)
        for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
            if status.get("name") == init:
                return int(status.get("restartCount") or 0)
        return 0

    def validation_status(self) -> str:
        policy = self.sim.store.get("clusterpolicies.nvidia.com", session.POLICY_NAME) or {}
        for state in (policy.get("status") or {}).get("states") or []:
            if state.get("name") == VALIDATION_STATE:
                return f"{state.get('state')}: {state.get('message', '')}"
        return ""


def test_the_demo_runs_the_validator_where_a_container_runs_nvidia_validator() -> None:
    assert validator_demo.runs_validator({"command": ["sh", "-c"], "args": ["nvidia-validator"]})
    assert validator_demo.runs_validator({"command": ["/usr/bin/nvidia-validator"]})
    assert not validator_demo.runs_validator({"command": ["sh", "-c"], "args": ["sleep 5"]})


def test_a_shell_wait_loop_is_read_for_its_files_and_words() -> None:
    loop = (
        "until [ -f /run/nvidia/validations/a-ready ] || [ -f /run/nvidia/validations/b-ready ]; "
        "do echo waiting for the a b; sleep 5; done; echo the a b is ready"
    )
    assert validator_demo.wait_script({"command": ["sh", "-c"], "args": [loop]}) == (
        ["/run/nvidia/validations/a-ready", "/run/nvidia/validations/b-ready"],
        "the a b",
    )
    assert validator_demo.wait_script({"command": ["sh", "-c"], "args": ["sleep 5"]}) is None


@asynccontextmanager
async def served(tmp_path: Path) -> AsyncIterator[Demo]:
    async with serve_demo(
        tmp_path, fleet.parse({"pools": [{"name": "a100", "machine": "dgx-a100"}]}, "v.yaml")
    ) as (sim, _nodes, kubeconfig):
        yield Demo(sim, kubeconfig)


async def test_each_validation_init_container_tells_its_check_and_writes_its_marker(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as demo:
        pod = demo.pod_name(VALIDATOR_APP)
        driver = await demo.kubectl("-n", NS, "logs", pod, "-c", "driver-validation")
        assert "driver: the driver container is ready" in driver
        assert "driver: validating the driver installed in /run/nvidia/driver" in driver
        assert "Driver Version: " in driver  # the driver root's nvidia-smi table
        assert "driver: wrote /run/nvidia/validations/driver-ready" in driver
        toolkit = await demo.kubectl("-n", NS, "logs", pod, "-c", "toolkit-validation")
        assert "toolkit: running nvidia-smi in this container" in toolkit
        assert "NVIDIA A100-SXM4-40GB" in toolkit
        assert "toolkit: validation successful" in toolkit
        cuda = await demo.kubectl("-n", NS, "logs", pod, "-c", "cuda-validation")
        workload = demo.pod_name("nvidia-cuda-validator")
        assert f"cuda: created workload pod {workload} on node {NODE}" in cuda
        assert f"cuda: pod {workload} succeeded (cuda-validation: Test PASSED)" in cuda
        plugin = await demo.kubectl("-n", NS, "logs", pod, "-c", "plugin-validation")
        assert f"plugin: node {NODE} advertises 8 GPU devices" in plugin
        main = await demo.kubectl("-n", NS, "logs", pod, "-c", VALIDATOR_APP)
        assert main == "all validations are successful\n"
        vector_add = await demo.kubectl("-n", NS, "logs", workload, "-c", "cuda-validation")
        assert vector_add.startswith("[Vector addition of 50000 elements]\n")
        assert vector_add.endswith("Test PASSED\nDone\n")

        markers = demo.sim.node_root(NODE) / "run" / "nvidia" / "validations"
        ready = {p.name for p in markers.glob("[!.]*-ready")}
        assert ready == {"driver-ready", "toolkit-ready", "cuda-ready", "plugin-ready"}
        assert (markers / "driver-ready").read_text().splitlines()[:2] == [
            "IS_HOST_DRIVER=false",
            "NVIDIA_DRIVER_ROOT=/run/nvidia/driver",
        ]
        # The operands waited on the markers, in their own init containers' words.
        plugin_pod = demo.pod_name("nvidia-device-plugin-daemonset")
        waited = await demo.kubectl("-n", NS, "logs", plugin_pod, "-c", "toolkit-validation")
        assert waited.endswith("nvidia container stack is ready\n")


async def test_a_failing_cuda_workload_fails_cuda_validation_and_the_policy_names_it(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as demo:
        driver_pod = demo.pod_name("nvidia-driver-daemonset")
        await demo.kubectl(
            "-n", NS, "exec", driver_pod, "-c", "nvidia-driver-ctr", "--",
            "demo-gpu-fault", "ecc", "0",
        )  # fmt: skip
        await demo.kubectl("-n", NS, "delete", "pod", demo.pod_name(VALIDATOR_APP), "--wait=false")

        def named() -> bool:
            status = demo.validation_status()
            return status.startswith("notReady") and ECC_ERROR in status

        await demo.sim.wait_for(named, DEADLINE, "the ClusterPolicy status names the CUDA error")
        await demo.sim.wait_for(
            lambda: demo.restarts("cuda-validation") >= 1, DEADLINE, "cuda-validation retried"
        )
        status = demo.validation_status()
        assert f"{NODE}: init container cuda-validation" in status
        assert "cuda: pod nvidia-cuda-validator-" in status
        assert f"failed: container cuda-validation (exit code 1): {ECC_ERROR}" in status
        jsonpath = '{.status.states[?(@.name=="state-operator-validation")].message}'
        shown = await demo.kubectl(
            "get", "clusterpolicy", session.POLICY_NAME, "-o", f"jsonpath={jsonpath}"
        )
        assert NODE in shown
        assert ECC_ERROR in shown

        pod = demo.pod_name(VALIDATOR_APP)
        # The failed run's log (`--previous` while the container is retrying).
        log = await demo.kubectl("-n", NS, "logs", pod, "-c", "cuda-validation", "--previous")
        last = log.rstrip("\n").splitlines()[-1]
        assert "ERROR gpu_operator.agents.validator: cuda: pod nvidia-cuda-validator-" in last
        assert last.endswith(ECC_ERROR)
        described = await demo.kubectl("-n", NS, "describe", "pod", pod)
        assert ECC_ERROR in described  # the termination message under Last State

        # The GPU reset clears the error; the validator's next attempt passes.
        await demo.kubectl(
            "-n", NS, "exec", driver_pod, "-c", "nvidia-driver-ctr", "--",
            "nvidia-smi", "-r", "-i", "0",
        )  # fmt: skip
        await demo.sim.wait_for(
            lambda: demo.validation_status().startswith("ready"), DEADLINE, "validation ready again"
        )
