"""Our GPU DRA kubelet plugin on a kubesim node with mock GPUs, driven with the real kubectl:
slices published with NVIDIA's attributes, a one-GPU claim from a template runs with exactly
its GPU visible through CDI and is unprepared when the pod goes, a MIG claim by profile, a
time-sliced claim, an XID drops the device from the slice, and prepared claims survive a
restart of the plugin."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml
from kubesim_helpers import TEST_IMAGES, kubectl, needs_kubectl
from waiting import DEADLINE, eventually, within

import kubesim
from gpu_operator.agents.device_plugin import mps
from gpu_operator.agents.dra_kubelet_plugin import gpuconfig, plugin, prepare
from gpu_operator.kube import client as kube_client
from gpu_operator.kube.resource_slices import SliceApi
from gpu_operator.nvml import mock
from kubesim import KubeletConfig
from kubesim.programs import ProgramRun
from simhost.cdi_registry import Registry

NODE = "node-1"

CLASS = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: gpu.nvidia.com
spec:
  selectors:
  - cel:
      expression: device.driver == "gpu.nvidia.com"
"""


def template(name: str, selector: str = "", config: str = "") -> str:
    text = f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: {name}
  namespace: default
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
"""
    if selector:
        text += f"""          selectors:
          - cel:
              expression: '{selector}'
"""
    if config:
        text += config
    return text


def pod(name: str, claim_template: str) -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
spec:
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: {claim_template}
  containers:
  - name: main
    image: example/app:1
    resources:
      claims:
      - name: gpu
"""


class Node:
    """The plugin for a mock machine on the kubesim node, as its DaemonSet pod would run it."""

    def __init__(self, sim: kubesim.Cluster, machine: mock.MockMachine, gates: str = "") -> None:
        self.sim = sim
        self.machine = machine
        self.gates = gpuconfig.parse_gates(gates)
        self.plugin: plugin.Plugin | None = None
        self.task: asyncio.Task[None] | None = None
        self.stop_event = asyncio.Event()

    def settings(self) -> plugin.Settings:
        root = self.sim.node_root(NODE)
        return plugin.Settings(
            node_name=NODE,
            kubelet_root_view=root / "var/lib/kubelet",
            cdi_root=root / "var/run/cdi",
            driver_root_view=root,
            dev_root_view=root,
            sys_root=root,
            proc_root=root,
            gates=self.gates,
            rescan_interval=0.1,
            recheck_interval=0.1,
        )

    async def start(self) -> plugin.Plugin:
        client = kube_client.connect(str(self.sim.kubeconfig_path))
        api = SliceApi(client, NODE, "gpu.nvidia.com")
        self.stop_event = asyncio.Event()
        self.plugin = plugin.Plugin(self.settings(), self.machine.nvml, api, simulated=True)
        self.task = asyncio.create_task(self.plugin.run(self.stop_event))
        await within(self.plugin.registered.wait(), "the plugin to register", DEADLINE)
        return self.plugin

    async def stop(self) -> None:
        self.stop_event.set()
        if self.task is not None:
            await within(self.task, "the plugin to stop", DEADLINE)


@pytest.fixture
async def sim() -> AsyncIterator[kubesim.Cluster]:
    config = KubeletConfig(
        instant=True, lease_interval=None, dra_plugin_watch_interval=0.02, dra_wiping_delay=60
    )
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=config) as cluster:
        await cluster.start_dra_manager(NODE)

        async def env(run: ProgramRun) -> int:
            resolved = Registry.load(cluster.node_root(NODE)).resolve(run.view.cdi_devices)
            values = {**run.view.env}
            for item in resolved.env:
                key, _, value = item.partition("=")
                values[key] = value
            for key in sorted(values):
                run.stdout.write(f"{key}={values[key]}\n")
            for path in resolved.device_nodes:
                run.stdout.write(f"DEVICE {path}\n")
            return 0

        cluster.register_program("env", env)
        yield cluster


def claims(sim: kubesim.Cluster) -> list[dict[str, Any]]:
    return sim.store.list("resourceclaims", "default")


async def slice_devices(sim: kubesim.Cluster) -> dict[str, dict[str, Any]]:
    out = await kubectl(sim, "get", "resourceslices", "-o", "yaml")
    items = yaml.safe_load(out)["items"]
    return {
        d["name"]: d
        for s in items
        if s["spec"]["driver"] == "gpu.nvidia.com"
        for d in s["spec"]["devices"]
    }


@needs_kubectl
async def test_slices_and_a_one_gpu_claim_with_kubectl(sim: kubesim.Cluster) -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    node = Node(sim, machine)
    p = await node.start()
    try:
        devices = await slice_devices(sim)
        assert sorted(devices) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
        gpu0 = devices["gpu-0"]["attributes"]
        assert gpu0["type"] == {"string": "gpu"}
        assert gpu0["uuid"] == {"string": machine.gpus[0].uuid}
        assert gpu0["productName"]["string"].startswith("Tesla T4")
        assert gpu0["architecture"] == {"string": "Turing"}
        assert gpu0["cudaComputeCapability"] == {"version": "7.5.0"}
        assert {"driverVersion", "cudaDriverVersion", "brand"} <= set(gpu0)
        assert gpu0["resource.kubernetes.io/pciBusID"]["string"].startswith("0000:")
        assert devices["gpu-0"]["capacity"]["memory"]["value"].endswith("Gi")

        await kubectl(sim, "apply", "-f", "-", stdin=CLASS + "---" + template("one-gpu"))
        await kubectl(sim, "apply", "-f", "-", stdin=pod("app", "one-gpu"))
        await kubectl(sim, "wait", "--for=condition=Ready", "pod/app", "--timeout=20s")
        (claim,) = claims(sim)
        uid = claim["metadata"]["uid"]
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        gpu = next(g for g in machine.gpus if f"gpu-{g.index}" == result["device"])
        out = await kubectl(sim, "exec", "app", "--", "env")
        assert f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}" in out.splitlines()
        spec = sim.node_root(NODE) / "var/run/cdi" / prepare.spec_file_name(uid)
        assert spec.exists()
        assert uid in p.checkpoint.claims

        await kubectl(sim, "delete", "pod", "app", "--wait=true", "--timeout=20s")
        assert not spec.exists()
        assert uid not in p.checkpoint.claims
    finally:
        await node.stop()


@needs_kubectl
async def test_a_mig_claim_by_profile(sim: kubesim.Cluster) -> None:
    machine = mock.MockMachine.from_preset("dgx-a100-mig-mixed")
    node = Node(sim, machine)
    await node.start()
    try:
        devices = await slice_devices(sim)
        migs = [n for n, d in devices.items() if d["attributes"]["type"]["string"] == "mig"]
        assert len(migs) == 8 * 4  # MIG-enabled GPUs: their MIG devices only
        assert len(devices) == 32
        # NVIDIA's names: parent minor, profile without dots, GI profile id, placement start.
        assert {
            "gpu-0-mig-2g10gb-14-0",
            "gpu-0-mig-3g20gb-9-4",
            "gpu-0-mig-1g5gb-19-2",
            "gpu-0-mig-1g5gb-19-3",
        } <= set(devices)
        sample = devices["gpu-0-mig-1g5gb-19-3"]
        assert sample["attributes"]["profile"] == {"string": "1g.5gb"}
        assert sample["capacity"]["memorySlice3"] == {"value": "1"}
        assert sample["attributes"]["parentUUID"]["string"].startswith("GPU-")
        assert {"multiprocessors", "copyEngines", "memory"} <= set(sample["capacity"])
        await kubectl(
            sim,
            "apply",
            "-f",
            "-",
            stdin=CLASS
            + "---"
            + template("mig", 'device.attributes["gpu.nvidia.com"].profile == "2g.10gb"'),
        )
        await kubectl(sim, "apply", "-f", "-", stdin=pod("mig-app", "mig"))
        await kubectl(sim, "wait", "--for=condition=Ready", "pod/mig-app", "--timeout=20s")
        (claim,) = claims(sim)
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert "-mig-2g10gb-" in result["device"]
        out = await kubectl(sim, "exec", "mig-app", "--", "env")
        mig_uuid = devices[result["device"]]["attributes"]["uuid"]["string"]
        assert f"NVIDIA_VISIBLE_DEVICES={mig_uuid}" in out.splitlines()
        assert any(line.startswith("DEVICE /dev/nvidia-caps/") for line in out.splitlines())
    finally:
        await node.stop()


TIME_SLICED = """      config:
      - opaque:
          driver: gpu.nvidia.com
          parameters:
            apiVersion: resource.nvidia.com/v1beta1
            kind: GpuConfig
            sharing:
              strategy: TimeSlicing
              timeSlicingConfig:
                interval: Long
"""


@needs_kubectl
async def test_time_slicing_needs_its_gate(sim: kubesim.Cluster) -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    node = Node(sim, machine)
    await node.start()
    try:
        await kubectl(
            sim, "apply", "-f", "-", stdin=CLASS + "---" + template("ts", config=TIME_SLICED)
        )
        await kubectl(sim, "apply", "-f", "-", stdin=pod("ts-app", "ts"))
        await eventually(
            lambda: any(
                e.get("reason") == "FailedPrepareDynamicResources"
                and "TimeSlicingSettings" in e.get("message", "")
                for e in sim.store.list("events", "default")
            ),
            "the gate error as an Event",
        )
    finally:
        await node.stop()


@needs_kubectl
async def test_a_time_sliced_claim(sim: kubesim.Cluster) -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    node = Node(sim, machine, gates="TimeSlicingSettings=true")
    p = await node.start()
    try:
        await kubectl(
            sim, "apply", "-f", "-", stdin=CLASS + "---" + template("ts", config=TIME_SLICED)
        )
        await kubectl(sim, "apply", "-f", "-", stdin=pod("ts-app", "ts"))
        await kubectl(sim, "wait", "--for=condition=Ready", "pod/ts-app", "--timeout=20s")
        (claim,) = claims(sim)
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        gpu = machine.gpus[int(result["device"].split("-")[1])]
        assert p.time_slicer.current[gpu.uuid] == "Long"
        await kubectl(sim, "delete", "pod", "ts-app", "--wait=true", "--timeout=20s")
        assert p.time_slicer.current[gpu.uuid] == "Default"
    finally:
        await node.stop()


@needs_kubectl
async def test_an_xid_drops_the_device_and_a_restart_keeps_prepared_claims(
    sim: kubesim.Cluster,
) -> None:
    machine = mock.MockMachine.from_preset("t4x4", driver="570.195.03")
    node = Node(sim, machine)
    p = await node.start()
    try:
        await kubectl(sim, "apply", "-f", "-", stdin=CLASS + "---" + template("one-gpu"))
        await kubectl(sim, "apply", "-f", "-", stdin=pod("app", "one-gpu"))
        await kubectl(sim, "wait", "--for=condition=Ready", "pod/app", "--timeout=20s")
        (claim,) = claims(sim)
        uid = claim["metadata"]["uid"]

        # The plugin restarts: the checkpoint keeps the prepared claim.
        await node.stop()
        p = await node.start()
        assert uid in p.checkpoint.claims

        machine.inject_xid(3, 48)
        await eventually(lambda: "gpu-3" not in _names(sim), "gpu-3 left out of the slice")
        machine.reset(3)
        await eventually(lambda: "gpu-3" in _names(sim), "gpu-3 back in the slice")

        await kubectl(sim, "delete", "pod", "app", "--wait=true", "--timeout=20s")
        assert uid not in p.checkpoint.claims
    finally:
        await node.stop()


def _names(sim: kubesim.Cluster) -> set[str]:
    return {
        d["name"]
        for s in sim.store.list("resourceslices")
        if s["spec"]["driver"] == "gpu.nvidia.com"
        for d in s["spec"]["devices"]
    }


MPS_SHARED = """      config:
      - opaque:
          driver: gpu.nvidia.com
          parameters:
            apiVersion: resource.nvidia.com/v1beta1
            kind: GpuConfig
            sharing:
              strategy: MPS
              mpsConfig:
                defaultActiveThreadPercentage: 40
"""


@needs_kubectl
async def test_an_mps_claim_runs_its_control_daemon(sim: kubesim.Cluster) -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    node = Node(sim, machine, gates="MPSSupport=true")
    p = await node.start()
    try:
        await kubectl(
            sim, "apply", "-f", "-", stdin=CLASS + "---" + template("mps", config=MPS_SHARED)
        )
        await kubectl(sim, "apply", "-f", "-", stdin=pod("mps-app", "mps"))
        await kubectl(sim, "wait", "--for=condition=Ready", "pod/mps-app", "--timeout=20s")
        (claim,) = claims(sim)
        uid = claim["metadata"]["uid"]
        out = await kubectl(sim, "exec", "mps-app", "--", "env")
        assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in out.splitlines()
        root = p.s.mps_root_view
        assert await mps.ask(root, uid, "get_default_active_thread_percentage") == "40"

        # The plugin restarts: the checkpoint brings the claim's daemon back.
        await node.stop()
        p = await node.start()
        assert await mps.ask(root, uid, "get_default_active_thread_percentage") == "40"

        await kubectl(sim, "delete", "pod", "mps-app", "--wait=true", "--timeout=20s")
        assert uid not in p.mps_daemons
        with pytest.raises(mps.ControlError):
            await mps.ask(root, uid, "get_default_active_thread_percentage")
        assert not (root / uid).exists()
    finally:
        await node.stop()
