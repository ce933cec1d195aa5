"""The mock NVML follows the host's driver (contract C1): no driver loaded, no NVML; the driver
and CUDA versions are the loaded driver's, the CUDA version derived from its branch."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from gpu_operator import nvml
from gpu_operator.nvml import driver_branches, errors, mock
from simhost import driver as driver_demo
from simhost import nvidia_smi
from simhost import pci as simulated


def machine_on(root: Path) -> mock.MockMachine:
    machine = mock.MockMachine.from_preset("t4x4")
    machine.driver_probe = driver_demo.probe(root)
    return machine


def test_without_a_probe_the_specs_driver_is_always_loaded() -> None:
    lib = mock.MockMachine.from_preset("t4x4").nvml()
    lib.init()
    assert lib.driver_version() == "550.54.15"
    assert lib.cuda_driver_version() == 12040
    assert lib.nvml_version() == "12.550.54.15"


def test_init_fails_with_nvmls_driver_not_loaded_while_the_host_has_no_driver(
    tmp_path: Path,
) -> None:
    lib = machine_on(tmp_path).nvml()
    with pytest.raises(nvml.DriverNotLoaded) as raised:
        lib.init()
    assert raised.value.code == errors.ERROR_DRIVER_NOT_LOADED == 9
    assert str(raised.value) == "Driver Not Loaded"


def test_nvml_answers_with_the_loaded_drivers_version_and_its_cuda_version(
    tmp_path: Path,
) -> None:
    machine = machine_on(tmp_path)
    simulated.SimulatedKernel(tmp_path).load_nvidia(version="580.95.05")
    lib = machine.nvml()
    lib.init()
    assert lib.driver_version() == "580.95.05"
    assert lib.cuda_driver_version() == 13000
    assert lib.nvml_version() == "13.580.95.05"
    assert lib.device_count() == 4


def test_a_driver_unloaded_after_init_makes_version_queries_fail(tmp_path: Path) -> None:
    kernel = simulated.SimulatedKernel(tmp_path)
    kernel.load_nvidia(version="570.195.03")
    lib = machine_on(tmp_path).nvml()
    lib.init()
    assert lib.cuda_driver_version() == 12080
    kernel.unload_nvidia()
    with pytest.raises(nvml.DriverNotLoaded):
        lib.driver_version()


@pytest.mark.parametrize(
    ("version", "cuda"),
    [("580.95.05", 13000), ("575.57.08", 12090), ("570.195.03", 12080), ("550.54.15", 12040),
     ("535.183.01", 12020), ("525.147.05", 12000), ("470.256.02", 11040),
     ("552.1.1", 12040)],  # a branch between two listed ones reports the older one's
)  # fmt: skip
def test_the_cuda_version_follows_the_driver_branch(version: str, cuda: int) -> None:
    assert driver_branches.cuda_driver_version(version) == cuda


@pytest.mark.parametrize(
    ("version", "message"),
    [("abc", "not an NVIDIA driver version"), ("390.157", "older than CUDA 11"),
     ("580", "not an NVIDIA driver version")],
)  # fmt: skip
def test_a_version_that_names_no_known_driver_is_refused(version: str, message: str) -> None:
    with pytest.raises(driver_branches.DriverVersionError, match=message):
        driver_branches.cuda_driver_version(version)


def test_nvidia_smi_on_a_host_without_a_driver_prints_nvidias_error_and_exits_9(
    tmp_path: Path,
) -> None:
    lib = machine_on(tmp_path).nvml()
    code, text = nvidia_smi.run(lib, nvidia_smi.Visible(all=True), [], dt.datetime(2025, 1, 1))
    assert code == 9
    assert text == (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\n"
    )


def test_nvidia_smi_shows_the_loaded_drivers_versions(tmp_path: Path) -> None:
    simulated.SimulatedKernel(tmp_path).load_nvidia(version="570.195.03")
    lib = machine_on(tmp_path).nvml()
    code, text = nvidia_smi.run(lib, nvidia_smi.Visible(all=True), [], dt.datetime(2025, 1, 1))
    assert code == 0
    assert "Driver Version: 570.195.03" in text
    assert "CUDA Version: 12.8" in text
