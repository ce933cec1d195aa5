"""The simulated host's kernel: sysfs writes take effect, and are refused, as on Linux."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from vm_hosts import PRESETS, gpus, host

from gpu_operator.agents.pci import kernel as kernel_mod
from gpu_operator.agents.pci import models, sysfs
from simhost import pci as simulated


def _refused(kernel: simulated.SimulatedKernel, path: str, value: str) -> int:
    with pytest.raises(kernel_mod.KernelError) as err:
        kernel.write(kernel.root / path, value)
    return err.value.errno or 0


@pytest.mark.parametrize("preset", PRESETS)
def test_every_function_has_its_iommu_group_modalias_and_boot_driver(
    tmp_path: Path, preset: str
) -> None:
    kernel = host(tmp_path, preset)
    functions = sysfs.scan(tmp_path)
    for f in functions:
        assert f.iommu_group is not None
        members = os.listdir(tmp_path / f"sys/kernel/iommu_groups/{f.iommu_group}/devices")
        assert f.address in members
        assert f.modalias.startswith(f"pci:v{f.vendor:08X}d{f.device:08X}")
    assert {f.driver for f in gpus(kernel)} == {None}  # no NVIDIA driver at boot
    assert sysfs.iommu_enabled(tmp_path)
    model = models.by_device_id(gpus(kernel)[0].device)
    assert model is not None
    facts = models.vm_facts(model)
    assert {g.sriov_total_vfs for g in gpus(kernel)} == {facts.sriov_total_vfs}


def test_without_an_iommu_there_are_no_groups(tmp_path: Path) -> None:
    host(tmp_path, "t4x4", iommu=False)
    assert not sysfs.iommu_enabled(tmp_path)
    assert {f.iommu_group for f in sysfs.scan(tmp_path)} == {None}


def test_bind_and_unbind_are_refused_like_the_kernel_refuses_them(tmp_path: Path) -> None:
    kernel = host(tmp_path, "t4x4")
    gpu = gpus(kernel)[0].address
    kernel.modprobe("vfio-pci")
    bind = "sys/bus/pci/drivers/vfio-pci/bind"
    # vfio-pci matches no device until driver_override names it.
    assert _refused(kernel, bind, gpu) == errno.ENODEV
    assert _refused(kernel, bind, "0000:99:00.0") == errno.ENODEV
    kernel.write(tmp_path / f"sys/bus/pci/devices/{gpu}/driver_override", "vfio-pci\n")
    assert (tmp_path / f"sys/bus/pci/devices/{gpu}/driver_override").read_text() == "vfio-pci\n"
    kernel.write(tmp_path / bind, gpu)
    assert sysfs.read_function(tmp_path, gpu).driver == "vfio-pci"  # type: ignore[union-attr]
    assert _refused(kernel, bind, gpu) == errno.EBUSY
    assert _refused(kernel, "sys/bus/pci/drivers/nvidia/unbind", gpu) == errno.ENOENT
    kernel.load_nvidia()
    assert _refused(kernel, "sys/bus/pci/drivers/nvidia/unbind", gpu) == errno.ENODEV
    kernel.write(tmp_path / "sys/bus/pci/drivers/vfio-pci/unbind", gpu)
    kernel.write(tmp_path / f"sys/bus/pci/devices/{gpu}/driver_override", "\n")
    assert (tmp_path / f"sys/bus/pci/devices/{gpu}/driver_override").read_text() == "(null)\n"
    kernel.write(tmp_path / "sys/bus/pci/drivers_probe", gpu)
    assert sysfs.read_function(tmp_path, gpu).driver == "nvidia"  # type: ignore[union-attr]


def test_a_vfio_driver_cannot_take_a_device_without_an_iommu_group(tmp_path: Path) -> None:
    kernel = host(tmp_path, "t4x4", iommu=False)
    gpu = gpus(kernel)[0].address
    kernel.modprobe("vfio_pci")
    kernel.write(tmp_path / f"sys/bus/pci/devices/{gpu}/driver_override", "vfio-pci")
    assert _refused(kernel, "sys/bus/pci/drivers/vfio-pci/bind", gpu) == errno.EINVAL


def test_loading_the_nvidia_driver_skips_devices_held_for_another_driver(tmp_path: Path) -> None:
    kernel = host(tmp_path, "t4x4")
    first, *others = gpus(kernel)
    kernel.write(tmp_path / f"sys/bus/pci/devices/{first.address}/driver_override", "vfio-pci")
    kernel.load_nvidia()
    assert sysfs.read_function(tmp_path, first.address).driver is None  # type: ignore[union-attr]
    assert {g.driver for g in others} | {f.driver for f in gpus(kernel)[1:]} == {None, "nvidia"}
    assert sysfs.module_loaded(tmp_path, "nvidia")
    assert "nvidia 16384" in (tmp_path / "proc/modules").read_text()
    kernel.unload_nvidia()
    assert {f.driver for f in gpus(kernel)} == {None}
    assert "nvidia 16384" not in (tmp_path / "proc/modules").read_text()


def test_sriov_vfs_need_the_vgpu_host_driver_and_respect_their_limits(tmp_path: Path) -> None:
    kernel = host(tmp_path, "a30x4")
    pf = gpus(kernel)[0].address
    numvfs = f"sys/bus/pci/devices/{pf}/sriov_numvfs"
    assert _refused(kernel, numvfs, "4") == errno.ENOENT  # no driver with sriov_configure
    kernel.load_nvidia(vgpu=True)
    assert _refused(kernel, numvfs, "17") == errno.ERANGE
    kernel.write(tmp_path / numvfs, "4")
    function = sysfs.read_function(tmp_path, pf)
    assert function is not None
    assert function.sriov_num_vfs == 4
    assert function.virtfns == ("0000:10:00.4", "0000:10:00.5", "0000:10:00.6", "0000:10:00.7")
    vf = sysfs.read_function(tmp_path, function.virtfns[0])
    assert vf is not None
    assert (vf.physfn, vf.driver) == (pf, "nvidia")
    assert vf.iommu_group not in (None, function.iommu_group)
    assert _refused(kernel, numvfs, "8") == errno.EBUSY
    kernel.write(tmp_path / numvfs, "0")
    assert sysfs.read_function(tmp_path, pf).virtfns == ()  # type: ignore[union-attr]
    assert not (tmp_path / "sys/bus/pci/devices/0000:10:00.4").exists()


def test_mdevs_are_created_until_the_gpu_is_full_and_one_type_per_gpu(tmp_path: Path) -> None:
    kernel = host(tmp_path, "t4x4")
    kernel.load_nvidia(vgpu=True)
    pf = gpus(kernel)[0].address
    types = {t.short_name: t for t in sysfs.mdev_types(tmp_path, pf)}
    assert types["T4-4Q"].available == 4
    assert types["T4-4Q"].name == "GRID T4-4Q"
    create = f"sys/bus/pci/devices/{pf}/mdev_supported_types/{types['T4-4Q'].type_id}/create"
    ids = [f"00000000-0000-0000-0000-00000000000{i}" for i in range(5)]
    assert _refused(kernel, create, "not-a-uuid") == errno.EINVAL
    for ident in ids[:4]:
        kernel.write(tmp_path / create, ident)
    assert _refused(kernel, create, ids[4]) == errno.EUSERS
    assert _refused(kernel, create, ids[0]) == errno.EEXIST
    after = {t.short_name: t.available for t in sysfs.mdev_types(tmp_path, pf)}
    assert after["T4-4Q"] == 0
    assert after["T4-1Q"] == 0  # another type cannot join a GPU with vGPUs
    mdevs = sysfs.mdevs(tmp_path)
    assert [(m.uuid, m.short_name, m.parent) for m in mdevs] == [(i, "T4-4Q", pf) for i in ids[:4]]
    for m in mdevs:
        assert (tmp_path / f"dev/vfio/{m.iommu_group}").exists()
    with pytest.raises(kernel_mod.KernelError, match="in use"):
        kernel.unload_nvidia()
    kernel.write(tmp_path / f"sys/bus/mdev/devices/{ids[0]}/remove", "1")
    assert {t.short_name: t.available for t in sysfs.mdev_types(tmp_path, pf)}["T4-4Q"] == 1
    assert _refused(kernel, f"sys/bus/mdev/devices/{ids[0]}/remove", "1") == errno.ENOENT


def test_vendor_vgpu_types_are_set_per_vf(tmp_path: Path) -> None:
    kernel = host(tmp_path, "l4x8")
    kernel.load_nvidia(vgpu=True, enable_vfs=True)
    pf = sysfs.read_function(tmp_path, gpus(kernel)[0].address)
    assert pf is not None
    first, second = pf.virtfns[:2]
    creatable = {t.short_name: t.type_id for t in sysfs.creatable_vgpu_types(tmp_path, first) or []}
    current = f"sys/bus/pci/devices/{first}/nvidia/current_vgpu_type"
    kernel.write(tmp_path / current, str(creatable["L4-24Q"]))
    assert sysfs.current_vgpu_type(tmp_path, first) == creatable["L4-24Q"]
    # The GPU is full with one 24Q: the sibling VF can create nothing now.
    assert sysfs.creatable_vgpu_types(tmp_path, second) == []
    assert _refused(kernel, f"sys/bus/pci/devices/{second}/nvidia/current_vgpu_type",
                    str(creatable["L4-24Q"])) == errno.EINVAL  # fmt: skip
    assert _refused(kernel, current, str(creatable["L4-1Q"])) == errno.EBUSY
    kernel.write(tmp_path / current, "0")
    assert len(sysfs.creatable_vgpu_types(tmp_path, second) or []) == len(creatable)
