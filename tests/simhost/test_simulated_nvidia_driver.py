"""The NVIDIA driver on a simulated host's kernel (contract C1): the version file it writes and
removes, module dependencies and users as rmmod sees them, and Secure Boot's signature check."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from gpu_operator.agents.pci import kernel as kernel_mod
from gpu_operator.nvml import mock
from gpudemo import fleet
from simhost import hardware
from simhost import pci as simulated


def host(tmp_path: Path, **pool: object) -> simulated.SimulatedKernel:
    spec = fleet.Pool.model_validate({"name": "p", "machine": "t4x4", **pool})
    hardware.write(tmp_path, spec, mock.MockMachine.from_preset("t4x4"))
    return simulated.SimulatedKernel(tmp_path)


def test_loading_nvidia_writes_its_version_and_binds_the_gpus(tmp_path: Path) -> None:
    kernel = host(tmp_path)
    kernel.load_nvidia(version="580.95.05")
    first = (tmp_path / "proc/driver/nvidia/version").read_text().splitlines()[0]
    assert first.startswith("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  ")
    assert simulated.nvidia_version(tmp_path) == "580.95.05"
    assert (tmp_path / "sys/module/nvidia/version").read_text() == "580.95.05\n"
    assert (tmp_path / "sys/bus/pci/drivers/nvidia").is_dir()
    kernel.unload_nvidia()
    assert simulated.nvidia_version(tmp_path) is None
    assert not (tmp_path / "proc/driver/nvidia/version").exists()


def test_the_drivers_other_modules_count_as_users_and_come_out_first(tmp_path: Path) -> None:
    kernel = host(tmp_path)
    kernel.load("nvidia-uvm", version="580.95.05")  # modprobe loads nvidia first
    kernel.load("nvidia-modeset")
    assert kernel.holders("nvidia") == ["nvidia_modeset", "nvidia_uvm"]
    assert (tmp_path / "sys/module/nvidia/refcnt").read_text() == "2\n"
    assert kernel.refcount("nvidia") == 0
    modules = (tmp_path / "proc/modules").read_text()
    assert "nvidia 16384 2 nvidia_modeset,nvidia_uvm, Live" in modules
    with pytest.raises(kernel_mod.KernelError) as refused:
        kernel.unload("nvidia")
    assert refused.value.errno == errno.EBUSY
    assert (
        str(refused.value) == "rmmod: ERROR: Module nvidia is in use by: nvidia_modeset nvidia_uvm"
    )
    kernel.unload_nvidia()
    assert not any(kernel.loaded(m) for m in ("nvidia", "nvidia_uvm", "nvidia_modeset"))


def test_a_user_holding_the_driver_keeps_it_loaded(tmp_path: Path) -> None:
    kernel = host(tmp_path)
    kernel.load_nvidia()
    kernel.hold("nvidia")  # e.g. nvidia-persistenced
    with pytest.raises(kernel_mod.KernelError, match=r"Module nvidia is in use$"):
        kernel.unload_nvidia()
    kernel.release("nvidia")
    kernel.unload_nvidia()
    assert not kernel.loaded("nvidia")


def test_secure_boot_refuses_unsigned_modules_with_ekeyrejected(tmp_path: Path) -> None:
    kernel = host(tmp_path, secureBoot=True)
    assert kernel.secure_boot()
    with pytest.raises(kernel_mod.KernelError) as refused:
        kernel.load_nvidia(version="580.95.05", signed=False)
    assert refused.value.errno == errno.EKEYREJECTED
    assert str(refused.value) == (
        "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service"
    )
    assert not kernel.loaded("nvidia")
    kernel.load_nvidia(version="580.95.05", signed=True)
    assert kernel.loaded("nvidia")


def test_without_secure_boot_unsigned_modules_load(tmp_path: Path) -> None:
    kernel = host(tmp_path)
    assert not kernel.secure_boot()
    kernel.load_nvidia(signed=False)
    assert simulated.nvidia_version(tmp_path) == simulated.DEFAULT_DRIVER_VERSION


def test_a_preinstalled_driver_is_loaded_at_boot_with_its_files_and_held(tmp_path: Path) -> None:
    kernel = host(tmp_path, driver="preinstalled", driverVersion="550.127.05")
    assert simulated.nvidia_version(tmp_path) == "550.127.05"
    assert kernel.loaded("nvidia_uvm")
    assert kernel.loaded("nvidia_modeset")
    assert kernel.refcount("nvidia") == 1  # nvidia-persistenced
    smi = tmp_path / "usr/bin/nvidia-smi"
    assert smi.is_file()
    assert smi.stat().st_mode & 0o111
    lib = tmp_path / "usr/lib/x86_64-linux-gnu"
    assert (lib / "libcuda.so.550.127.05").is_file()
    assert (lib / "libnvidia-ml.so.1").resolve().name == "libnvidia-ml.so.550.127.05"
