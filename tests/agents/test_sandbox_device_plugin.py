"""The sandbox (KubeVirt) device plugin: resource naming, discovery on the simulated host,
Allocate, and health from the VFIO group files, over the device-plugin gRPC API."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from vm_hosts import PRESETS, gpus, host
from waiting import within

import kubeletapi
from gpu_operator.agents.pci import models, sysfs
from gpu_operator.agents.sandbox_device_plugin import allocate, discovery, manager, server
from gpu_operator.agents.vfio_manager import manage
from gpu_operator.agents.vgpu_device_manager import apply, config, planner, state
from kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb
from kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc


@pytest.mark.parametrize(
    ("pci_name", "resource"),
    [
        ("GA100 [A100 PCIe 40GB]", "GA100_A100_PCIE_40GB"),
        ("GA100 [A100 SXM4 40GB]", "GA100_A100_SXM4_40GB"),
        ("TU104GL [Tesla T4]", "TU104GL_TESLA_T4"),
        ("GH100[H100 SXM5 80GB]", "GH100H100_SXM5_80GB"),  # pci.ids of 2023 had no space
        ("GV100GL [Tesla V100 SXM2 16GB]", "GV100GL_TESLA_V100_SXM2_16GB"),
        ("GK210GL [Tesla K80]", "GK210GL_TESLA_K80"),
        ("GA102GL [A10/A10G]", "GA102GL_A10_A10G"),
        ("AD102 High Definition Audio Controller", "AD102_HIGH_DEFINITION_AUDIO_CONTROLLER"),
    ],
)
def test_passthrough_resources_are_named_from_pci_ids_as_upstream(
    pci_name: str, resource: str
) -> None:
    assert discovery.device_name(pci_name) == resource


def test_vgpu_resources_keep_the_type_name_with_underscores() -> None:
    assert discovery.vgpu_name("GRID T4-1Q") == "GRID_T4-1Q"
    assert discovery.vgpu_name("NVIDIA  A100-4C\n") == "NVIDIA_A100-4C"


def test_a_pci_ids_file_names_the_devices(tmp_path: Path) -> None:
    ids = tmp_path / "pci.ids"
    ids.write_text(
        "# comment\n1000  Other\n\t20b0  Not NVIDIA\n10de  NVIDIA Corporation\n"
        "\t20b0  GA100 [A100 SXM4 40GB]\n\t\t10de 134f  A100 board\n\t1eb8  TU104GL [Tesla T4]\n"
        "10df  Next vendor\n\t20b1  Else\n"
    )
    assert discovery.read_pci_ids(ids) == {0x20B0: "GA100 [A100 SXM4 40GB]",
                                           0x1EB8: "TU104GL [Tesla T4]"}  # fmt: skip
    assert discovery.read_pci_ids(tmp_path / "missing") == {}


@pytest.mark.parametrize("preset", PRESETS)
def test_every_model_bound_to_vfio_is_one_resource_of_its_addresses(
    tmp_path: Path, preset: str
) -> None:
    kernel = host(tmp_path, preset)
    assert discovery.discover(tmp_path) == []
    manage.bind_all(kernel)
    resources = {r.name: r for r in discovery.discover(tmp_path)}
    first = gpus(kernel)[0]
    pci_name = models.PCI_NAMES.get(first.device)  # pci.ids has no name yet for GB200/GB300
    name = discovery.device_name(pci_name) if pci_name else f"{first.device:04x}"
    assert [d.id for d in resources[name].devices] == [g.address for g in gpus(kernel)]
    assert resources[name].kind == "passthrough"
    audio = [f for f in sysfs.scan(tmp_path) if f.audio and f.nvidia]
    assert (len(resources) == 2) == bool(audio)  # an audio function is its own resource


@pytest.mark.parametrize(("preset", "resource"), [("gb200-nvl72", "2941"), ("gb300-nvl72", "31c2")])
def test_grace_blackwell_gpus_on_the_grace_vfio_driver_are_named_by_device_id(
    tmp_path: Path, preset: str, resource: str
) -> None:
    # lspci shows these as `NVIDIA Corporation Device [10de:2941]`: with no pci.ids name the
    # resource is the device id, as upstream names it; nvgrace_gpu_vfio_pci counts as vfio.
    kernel = host(tmp_path, preset)
    manage.bind_all(kernel)
    assert {f.driver for f in gpus(kernel)} == {"nvgrace_gpu_vfio_pci"}
    (found,) = discovery.discover(tmp_path)
    assert found.resource_name == f"nvidia.com/{resource}"
    assert [d.id for d in found.devices] == [g.address for g in gpus(kernel)]


def test_vgpus_of_each_framework_are_resources(tmp_path: Path) -> None:
    for preset, wanted in (("t4x4", "T4-2Q"), ("a30x4", "A30-6C"), ("l40sx4", "L40S-8Q")):
        root = tmp_path / preset
        kernel = host(root, preset)
        kernel.load_nvidia(vgpu=True, enable_vfs=True)
        entries = config.loads(
            f"version: v1\nvgpu-configs: {{x: [{{devices: all, vgpu-devices: {{{wanted}: 2}}}}]}}"
        ).select("x")
        apply.apply(kernel, planner.plan(state.read(root), entries))
        (resource,) = discovery.discover(root)
        assert resource.name.endswith(wanted)
        assert len(resource.devices) == 8
        kind = "passthrough" if preset == "l40sx4" else "mdev"  # vendor-VFIO vGPUs are VFs
        assert resource.kind == kind


def test_allocate_gives_the_group_nodes_and_the_variable_kubevirt_reads(tmp_path: Path) -> None:
    kernel = host(tmp_path, "dgx-a100")
    manage.bind_all(kernel)
    (resource,) = discovery.discover(tmp_path)
    a, b = resource.devices[:2]
    (result,) = allocate.allocate(resource, [[b.id, a.id]])
    assert result.envs == {"PCI_RESOURCE_NVIDIA_COM_GA100_A100_SXM4_40GB": f"{b.id},{a.id}"}
    assert [d.host_path for d in result.devices] == [
        "/dev/vfio/vfio", f"/dev/vfio/{b.iommu_group}", f"/dev/vfio/{a.iommu_group}"
    ]  # fmt: skip
    assert {d.permissions for d in result.devices} == {"mrw"}
    with pytest.raises(allocate.AllocateError, match=r"unknown device: 0000:99:00\.0"):
        allocate.allocate(resource, [["0000:99:00.0"]])
    moved = {a.id: 99}
    with pytest.raises(allocate.AllocateError, match=f"unknown device: {a.id}"):
        allocate.allocate(resource, [[a.id]], moved)


def test_mdev_allocations_list_uuids_and_give_the_vfio_directory() -> None:
    resource = discovery.Resource(
        "GRID_T4-1Q", "mdev",
        (discovery.Device("u-1", 30, "x"), discovery.Device("u-2", 31, "y")),
    )  # fmt: skip
    (result,) = allocate.allocate(resource, [["u-2", "u-1"]])
    assert result.envs == {"MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1Q": "u-2,u-1"}
    assert [(d.container_path, d.host_path) for d in result.devices] == [("/dev/vfio", "/dev/vfio")]


def test_long_socket_paths_are_shortened_to_fit() -> None:
    deep = Path("/var/lib/kubesim") / ("d" * 50)
    name = "kubevirt-AD102_HIGH_DEFINITION_AUDIO_CONTROLLER.sock"
    path = server.socket_path(deep, name)
    assert len(str(path)) <= server.MAX_SOCKET_PATH
    assert path.name.startswith("kubevirt-AD102")
    assert path.name.endswith(".sock")
    assert server.socket_path(Path("/var/lib/kubelet/device-plugins"), name).name == name


async def test_the_plugin_serves_allocate_and_follows_the_group_files(tmp_path: Path) -> None:
    root = tmp_path / "h"
    kernel = host(root, "t4x4")
    manage.bind_all(kernel)
    settings = manager.Settings(
        root=root, plugin_dir=tmp_path / "dp", kubelet_socket=None, pci_ids={},
        poll_interval=0.01,
    )  # fmt: skip
    plugin = manager.Manager(settings)
    stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(stop))
    await within(plugin.serving.wait(), "the plugin to serve")
    (endpoint,) = plugin.endpoints
    assert endpoint.resource_name == "nvidia.com/TU104GL_TESLA_T4"
    first = gpus(kernel)[0]
    async with grpc.aio.insecure_channel(f"unix://{endpoint.socket}") as channel:
        stub = pb_grpc.DevicePluginStub(channel)
        options = await stub.GetDevicePluginOptions(pb.Empty())
        assert options.get_preferred_allocation_available
        stream = stub.ListAndWatch(pb.Empty())
        listed = await stream.read()
        assert {d.health for d in listed.devices} == {kubeletapi.HEALTHY}
        answer = await stub.Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(
                devices_ids=[first.address])])
        )  # fmt: skip
        (container,) = answer.container_responses
        assert dict(container.envs) == {"PCI_RESOURCE_NVIDIA_COM_TU104GL_TESLA_T4": first.address}
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=["0000:99:00.0"])]))  # fmt: skip
        assert err.value.code() == grpc.StatusCode.UNKNOWN
        assert "unknown device: 0000:99:00.0" in (err.value.details() or "")
        # The GPU's VFIO group node goes away: the device turns unhealthy, and back.
        group_node = root / f"dev/vfio/{first.iommu_group}"
        group_node.unlink()
        changed = await within(stream.read(), "the Unhealthy update")
        health = {d.ID: d.health for d in changed.devices}
        assert health[first.address] == kubeletapi.UNHEALTHY
        group_node.write_text("")
        changed = await within(stream.read(), "the Healthy update")
        assert {d.health for d in changed.devices} == {kubeletapi.HEALTHY}
        preferred = await stub.GetPreferredAllocation(
            pb.PreferredAllocationRequest(container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=["a", "b", "c"], must_include_deviceIDs=["c"],
                    allocation_size=2)]))  # fmt: skip
        assert list(preferred.container_responses[0].deviceIDs) == ["c", "a"]
    stop.set()
    await within(task, "the plugin to stop")
    assert not endpoint.socket.exists()
