"""The device plugin on a real GPU (read-only): it lists the node's devices and serves Allocate
over a real socket without registering. Skipped where NVML has no GPU."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import grpc
import pytest
from waiting import within

from gpu_operator import nvml
from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.device_plugin import devices, facts, manager
from gpu_operator.agents.device_plugin import settings as dp_settings
from gpu_operator.nvml import real
from kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb
from kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

pytestmark = pytest.mark.gpu


def _real_or_skip() -> real.RealNvml:
    try:
        lib = real.RealNvml()
        lib.init()
    except nvml.NvmlError as err:
        pytest.skip(f"no usable NVIDIA GPU: {err}")
    return lib


def test_real_gpus_become_devices_with_paths_and_a_recovery_action() -> None:
    lib = _real_or_skip()
    try:
        node = facts.collect(lib, driver_root=Path("/"), sys_root=Path("/"))
        assert len(node.gpus) == lib.device_count() >= 1
        resources = devices.build_resources(node, pc.PluginConfig())
        gpu0 = resources[0].devices[0]
        assert gpu0.uuid.startswith("GPU-")
        assert Path(gpu0.paths[0]).exists(), gpu0.paths
        # R1: each MIG device's profile (and so its mixed-strategy resource) is the one NVML
        # names the device with.
        mixed = devices.build_resources(node, pc.parse({"flags": {"migStrategy": "mixed"}}))
        for gpu in node.gpus:
            for mig in gpu.migs:
                nvml_name = lib.device_by_uuid(mig.uuid).name()
                assert nvml_name.rsplit(" MIG ", 1)[-1] == mig.profile, (nvml_name, mig)
                resource = "nvidia.com/mig-" + mig.profile.replace("+", ".")
                assert any(r.name == resource for r in mixed), resource
        try:
            action = lib.device_by_index(0).gpu_recovery_action()
        except nvml.NotSupported:
            return  # drivers before the recovery-action field
        assert isinstance(action, nvml.protocol.RecoveryAction)
    finally:
        lib.shutdown()


async def test_real_plugin_serves_list_and_watch_and_allocate_without_registering() -> None:
    _real_or_skip().shutdown()
    root = Path(tempfile.mkdtemp(prefix="dp-gpu-", dir="/tmp"))
    try:
        s = dp_settings.build(
            None,
            {},
            kubelet_socket=None,
            plugin_dir=root,
            cdi_root=root / "cdi",
            driver_root_view=Path("/"),
            dev_root_view=Path("/"),
            sys_root=Path("/"),
        )
        stop = asyncio.Event()
        m = manager.Manager(s, real.RealNvml)
        task = asyncio.create_task(m.run(stop=stop, install_signals=False))
        try:
            await within(m.state.serving.wait(), "the plugin to serve")
            async with grpc.aio.insecure_channel(f"unix://{root / 'nvidia-gpu.sock'}") as channel:
                stub = pb_grpc.DevicePluginStub(channel)
                listing = await stub.ListAndWatch(pb.Empty()).read()
                ids = [d.ID for d in listing.devices]
                assert ids
                assert {d.health for d in listing.devices} == {"Healthy"}
                response = await stub.Allocate(
                    pb.AllocateRequest(
                        container_requests=[pb.ContainerAllocateRequest(devices_ids=ids[:1])]
                    )
                )
                envs = dict(response.container_responses[0].envs)
                assert envs == {"NVIDIA_VISIBLE_DEVICES": ids[0]}
        finally:
            stop.set()
            await within(task, "the plugin to stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_real_management_cdi_spec_mounts_what_the_driver_installed(tmp_path: Path) -> None:
    """R2 and R8 on hardware: the toolkit's management spec, generated here with NVML loaded
    from the driver root `/`, mounts the driver's compute libraries (libnvidia-gpucomp where
    the driver has it) and only paths that exist on the host."""
    from gpu_operator.agents import cdi
    from gpu_operator.agents.container_toolkit import cdi_spec

    _real_or_skip().shutdown()
    target, spec = cdi_spec.generate(
        real.opener("/"),
        tmp_path,
        kind=cdi_spec.MANAGEMENT_KIND,
        driver_root="/",
        driver_root_view=Path("/"),
        dev_root="/",
        dev_root_view=Path("/"),
        hook_path="/usr/bin/nvidia-cdi-hook",
    )
    assert target.exists()
    mounts = spec["containerEdits"].get("mounts", [])
    names = {Path(m["containerPath"]).name for m in mounts}
    assert any(n.startswith("libnvidia-ml.so.") for n in names), names
    assert any(n.startswith("libcuda.so.") for n in names), names
    for mount in mounts:
        assert Path(mount["hostPath"]).exists(), mount
    on_host = cdi.find_driver_files(Path("/"))
    if any(Path(f).name.startswith("libnvidia-gpucomp.so.") for f in on_host):
        assert any(n.startswith("libnvidia-gpucomp.so.") for n in names)
    for device in spec["devices"]:
        for node in device["containerEdits"]["deviceNodes"]:
            assert Path(node["hostPath"]).exists(), node
