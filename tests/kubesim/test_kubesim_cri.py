"""The container runtime hook (kubesim.cri) and RuntimeClass handling: the API server's admission,
the kubelet's handler lookup, and how sandbox and container refusals show in `kubectl describe`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubesim_helpers import TEST_IMAGES, kubectl, needs_kubectl
from test_kubesim_device_manager import RESOURCE, healthy, plugin
from waiting import DEADLINE

import kubesim
from kubesim import KubeletConfig, cri

NODE = "node-1"
NO_RUNTIME = 'failed to get sandbox runtime: no runtime for "nvidia" is configured'


class FakeRuntime:
    """A runtime serving some handlers; refusals are switched on and off by the tests."""

    def __init__(self, *handlers: str, default: str = "runc") -> None:
        self.handlers = set(handlers or ("runc",))
        self.default = default
        self.sandboxes: list[kubesim.PodSandbox] = []
        self.views: list[kubesim.ContainerView] = []
        self.create_error: str | None = None
        self.start_error: str | None = None

    def run_sandbox(self, sandbox: kubesim.PodSandbox) -> None:
        self.sandboxes.append(sandbox)
        handler = sandbox.handler or self.default
        if handler not in self.handlers:
            raise kubesim.CriError(
                f'failed to get sandbox runtime: no runtime for "{handler}" is configured'
            )

    def create_container(self, view: kubesim.ContainerView) -> None:
        self.views.append(view)
        if self.start_error is not None:
            raise kubesim.StartContainerError(self.start_error)
        if self.create_error is not None:
            raise kubesim.CriError(self.create_error)


@pytest.fixture
async def sim() -> AsyncIterator[kubesim.Cluster]:
    config = KubeletConfig(instant=True, lease_interval=None)
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=config) as cluster:
        yield cluster


def runtime_class(name: str, handler: str, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": name},
        "handler": handler,
        **extra,
    }


def pod(name: str, runtime_class_name: str | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "containers": [{"name": "work", "image": "busybox", "command": ["sleep", "1d"]}],
        "nodeName": NODE,
        **spec,
    }
    if runtime_class_name is not None:
        body["runtimeClassName"] = runtime_class_name
    meta = {"name": name, "namespace": "default"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


def status(sim: kubesim.Cluster, name: str) -> dict[str, Any]:
    return dict((sim.store.get("pods", name, "default") or {}).get("status") or {})


def container_state(sim: kubesim.Cluster, name: str) -> dict[str, Any]:
    statuses = status(sim, name).get("containerStatuses") or [{}]
    return dict(statuses[0].get("state") or {})


def condition(sim: kubesim.Cluster, name: str, kind: str) -> str | None:
    for item in status(sim, name).get("conditions") or []:
        if item.get("type") == kind:
            return str(item.get("status"))
    return None


def running(sim: kubesim.Cluster, name: str) -> bool:
    return "running" in container_state(sim, name)


# ----- RuntimeClass admission and lookup --------------------------------------------------------


@needs_kubectl
async def test_a_pod_naming_a_missing_runtime_class_is_refused_at_creation(
    sim: kubesim.Cluster,
) -> None:
    out = await kubectl(
        sim, "apply", "-f", "-", stdin=json.dumps(pod("gpu", "nvidia")), check=False
    )
    assert 'pods "gpu" is forbidden: pod rejected: RuntimeClass "nvidia" not found' in out
    assert sim.store.get("pods", "gpu", "default") is None


async def test_runtime_class_overhead_and_scheduling_are_applied_to_new_pods(
    sim: kubesim.Cluster,
) -> None:
    sim.store.create(
        runtime_class(
            "kata",
            "kata-qemu",
            overhead={"podFixed": {"cpu": "250m", "memory": "120Mi"}},
            scheduling={
                "nodeSelector": {"runtime": "kata"},
                "tolerations": [{"key": "kata", "operator": "Exists", "effect": "NoSchedule"}],
            },
        )
    )
    created = sim.store.create(pod("vm", "kata", nodeSelector={"zone": "a"}))
    spec = created["spec"]
    assert spec["overhead"] == {"cpu": "250m", "memory": "120Mi"}
    assert spec["nodeSelector"] == {"zone": "a", "runtime": "kata"}
    assert {"key": "kata", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    with pytest.raises(kubesim.ApiError) as conflict:
        sim.store.create(pod("other", "kata", nodeSelector={"runtime": "runc"}))
    assert conflict.value.code == 403
    assert (
        "conflict: runtimeClass.scheduling.nodeSelector[runtime] = kata; "
        "pod.spec.nodeSelector[runtime] = runc" in conflict.value.message
    )
    with pytest.raises(kubesim.ApiError) as overhead:
        sim.store.create(pod("free", overhead={"cpu": "1"}))
    assert "Pod Overhead set without corresponding RuntimeClass defined Overhead" in (
        overhead.value.message
    )


@needs_kubectl
async def test_the_kubelet_reports_a_runtime_class_deleted_after_admission(
    sim: kubesim.Cluster,
) -> None:
    sim.store.create(runtime_class("nvidia", "nvidia"))
    sim.set_node_ready(NODE, False)  # the kubelet does not start the pod yet
    sim.store.create(pod("gpu", "nvidia"))
    sim.store.delete("runtimeclasses.node.k8s.io", "nvidia")
    sim.set_node_ready(NODE, True)
    message = 'Failed to create pod sandbox: runtimeclass.node.k8s.io "nvidia" not found'
    await sim.wait_for(
        lambda: condition(sim, "gpu", "PodReadyToStartContainers") == "False", DEADLINE
    )
    described = await kubectl(sim, "describe", "pod", "gpu")
    assert "FailedCreatePodSandBox" in described
    assert message in described
    assert container_state(sim, "gpu")["waiting"]["reason"] == "ContainerCreating"
    sim.store.create(runtime_class("nvidia", "nvidia"))
    await sim.wait_for(
        lambda: running(sim, "gpu"), DEADLINE, "the pod running once the class is back"
    )


# ----- the runtime hook ---------------------------------------------------------------------------


@needs_kubectl
async def test_an_unknown_handler_fails_the_sandbox_with_the_runtime_message_until_served(
    sim: kubesim.Cluster,
) -> None:
    runtime = FakeRuntime("runc")
    sim.register_container_runtime(runtime)
    sim.store.create(runtime_class("nvidia", "nvidia"))
    sim.store.create(pod("gpu", "nvidia"))
    await sim.wait_for(lambda: len(runtime.sandboxes) >= 3, DEADLINE, "three sandbox attempts")
    assert [s.handler for s in runtime.sandboxes[:3]] == ["nvidia"] * 3
    # Each retry is a new sandbox (a new ID), as after the kubelet's back-off.
    assert len({s.id for s in runtime.sandboxes}) == len(runtime.sandboxes)
    assert all(len(s.id) == 64 and s.node == NODE for s in runtime.sandboxes)
    assert container_state(sim, "gpu") == {"waiting": {"reason": "ContainerCreating"}}
    assert condition(sim, "gpu", "PodReadyToStartContainers") == "False"
    assert "podIP" not in status(sim, "gpu")
    described = await kubectl(sim, "describe", "pod", "gpu")
    assert (
        f"Failed to create pod sandbox: rpc error: code = Unknown desc = {NO_RUNTIME}" in described
    )
    assert runtime.views == []  # no container is created without a sandbox
    runtime.handlers.add("nvidia")
    await sim.wait_for(
        lambda: running(sim, "gpu"), DEADLINE, "the pod running once nvidia is served"
    )
    assert runtime.views[-1].runtime_handler == "nvidia"


async def test_a_pod_without_runtime_class_runs_under_the_default_handler(
    sim: kubesim.Cluster,
) -> None:
    runtime = FakeRuntime("runc")
    sim.register_container_runtime(runtime)
    sim.store.create(pod("plain"))
    await sim.wait_for(lambda: running(sim, "plain"), DEADLINE, "plain pod running")
    assert runtime.sandboxes[0].handler == ""
    assert runtime.views[0].runtime_handler == ""
    assert runtime.views[0].container_name == "work"


@needs_kubectl
async def test_a_refused_container_waits_in_create_container_error_and_is_retried(
    sim: kubesim.Cluster,
) -> None:
    runtime = FakeRuntime("runc")
    reason = "failed to create containerd container: CDI device injection failed: boom"
    runtime.create_error = reason
    sim.register_container_runtime(runtime)
    sim.store.create(pod("app"))
    await sim.wait_for(
        lambda: (
            container_state(sim, "app").get("waiting", {}).get("reason") == "CreateContainerError"
        ),
        DEADLINE,
        "CreateContainerError",
    )
    assert container_state(sim, "app")["waiting"]["message"] == reason
    await sim.wait_for(lambda: len(runtime.views) >= 2, DEADLINE, "a retry")
    described = await kubectl(sim, "describe", "pod", "app")
    assert "CreateContainerError" in described
    assert f"Error: {reason}" in described
    runtime.create_error = None
    await sim.wait_for(lambda: running(sim, "app"), DEADLINE, "running after the runtime accepts")


@needs_kubectl
async def test_a_process_the_runtime_cannot_start_terminates_with_start_error(
    sim: kubesim.Cluster,
) -> None:
    runtime = FakeRuntime("runc")
    message = (
        "failed to create containerd task: failed to create shim task: OCI runtime create "
        "failed: runc create failed: unable to start container process: error during container "
        "init: error running hook #0: error running hook: exit status 1, stdout: , stderr: "
        "nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown"
    )
    runtime.start_error = message
    sim.register_container_runtime(runtime)
    sim.store.create(pod("once", restartPolicy="Never"))
    await sim.wait_for(lambda: status(sim, "once").get("phase") == "Failed", DEADLINE, "pod Failed")
    terminated = container_state(sim, "once")["terminated"]
    assert terminated["reason"] == "StartError"
    assert terminated["exitCode"] == 128
    assert terminated["message"] == message
    described = await kubectl(sim, "describe", "pod", "once")
    assert "StartError" in described
    assert "driver not loaded" in described
    assert "Started" not in [
        line.split()[1] for line in described.split("Events:")[1].splitlines()[3:] if line.split()
    ]


async def test_a_start_error_restarts_under_restart_policy_always(sim: kubesim.Cluster) -> None:
    runtime = FakeRuntime("runc")
    runtime.start_error = "failed to create containerd task: exec failed: unknown"
    sim.register_container_runtime(runtime)
    sim.store.create(pod("loop"))

    def restarted() -> bool:
        statuses = status(sim, "loop").get("containerStatuses") or [{}]
        last = (statuses[0].get("lastState") or {}).get("terminated") or {}
        return statuses[0].get("restartCount", 0) >= 1 and last.get("reason") == "StartError"

    await sim.wait_for(restarted, DEADLINE, "a restart after StartError")
    runtime.start_error = None
    await sim.wait_for(lambda: running(sim, "loop"), DEADLINE, "running once it can start")


async def test_without_a_runtime_sandboxes_and_containers_are_created_as_before(
    sim: kubesim.Cluster,
) -> None:
    sim.store.create(runtime_class("nvidia", "nvidia"))
    sim.store.create(pod("gpu", "nvidia"))
    await sim.wait_for(lambda: running(sim, "gpu"), DEADLINE, "pod running without a runtime hook")
    runtime = FakeRuntime("runc")
    sim.register_container_runtime(runtime)
    sim.register_container_runtime(None)
    sim.store.create(pod("later", "nvidia"))
    await sim.wait_for(lambda: running(sim, "later"), DEADLINE, "pod running after unregistering")
    assert runtime.sandboxes == []


async def test_the_container_view_carries_the_plugins_cdi_devices(sim: kubesim.Cluster) -> None:
    runtime = FakeRuntime("runc")
    sim.register_container_runtime(runtime)
    async with plugin(sim, healthy("w0", "w1")):
        await sim.wait_for(
            lambda: (
                (sim.store.get("nodes", NODE) or {})["status"]["allocatable"].get(RESOURCE) == "2"
            ),
            DEADLINE,
            "widgets allocatable",
        )
        body = pod("widgets")
        body["spec"]["containers"][0]["resources"] = {"limits": {RESOURCE: "2"}}
        sim.store.create(body)
        await sim.wait_for(lambda: running(sim, "widgets"), DEADLINE, "widget pod running")
    view = runtime.views[-1]
    assert sorted(view.cdi_devices) == ["example.com/widget=w0", "example.com/widget=w1"]
    assert view.allocation is not None


def test_cdi_devices_come_from_the_cri_field_and_cdi_annotations() -> None:
    names = cri.cdi_devices(
        ["nvidia.com/gpu=0"],
        {
            "cdi.k8s.io/nvidia-device-plugin_abc": "nvidia.com/gpu=0, nvidia.com/gpu=1",
            "example.com/other": "vendor.com/x=1",
        },
    )
    assert names == ("nvidia.com/gpu=0", "nvidia.com/gpu=1")
    assert cri.CriError("no runtime").rpc_message == "rpc error: code = Unknown desc = no runtime"
    assert cri.sandbox_id("uid", 0) != cri.sandbox_id("uid", 1)
