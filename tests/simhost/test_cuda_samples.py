"""`vectorAdd` on a container's mock GPUs: Test PASSED, or CUDA's error for the GPU's state."""

from __future__ import annotations

import datetime as dt

from gpu_operator.nvml import mock
from simhost import cuda_samples
from simhost.nvidia_smi import Visible

NOW = dt.datetime(2026, 1, 1)
ALL = Visible(all=True)


def _machine() -> mock.MockMachine:
    # An R565+ driver: the simulated launch reads the recovery-action field, which older
    # drivers do not have.
    return mock.MockMachine.from_preset("dgx-a100", seed=1, driver="570.195.03")


def test_vector_add_passes_on_a_healthy_gpu() -> None:
    code, out, err = cuda_samples.run(_machine().nvml(), ALL, NOW)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "[Vector addition of 50000 elements]",
        "Copy input data from the host memory to the CUDA device",
        "CUDA kernel launch with 196 blocks of 256 threads",
        "Copy output data from the CUDA device to the host memory",
        "Test PASSED",
        "Done",
    ]


def test_without_a_loaded_driver_there_is_no_cuda_device() -> None:
    machine = _machine()
    machine.driver_probe = lambda: None
    code, _out, err = cuda_samples.run(machine.nvml(), ALL, NOW)
    assert code == 1
    assert err == (
        "Failed to allocate device vector A (error code no CUDA-capable device is detected)!\n"
    )


def test_a_pending_uncorrectable_ecc_error_fails_the_kernel_until_a_reset() -> None:
    machine = _machine()
    machine.inject_ecc_error(0, uncorrected=True)
    code, out, err = cuda_samples.run(machine.nvml(), ALL, NOW)
    assert code == 1
    assert "CUDA kernel launch" in out
    assert err.endswith("(error code uncorrectable ECC error encountered)!\n")
    machine.reset(0)
    assert cuda_samples.run(machine.nvml(), ALL, NOW)[0] == 0


def test_only_the_first_visible_gpu_matters() -> None:
    machine = _machine()
    machine.inject_ecc_error(0, uncorrected=True)
    assert cuda_samples.run(machine.nvml(), Visible(ids=("1",)), NOW)[0] == 0


def test_a_gpu_fallen_off_the_bus_fails_the_allocation() -> None:
    machine = _machine()
    machine.fall_off_bus(0)
    code, _out, err = cuda_samples.run(machine.nvml(), ALL, NOW)
    assert code == 1
    assert err == "Failed to allocate device vector A (error code unknown error)!\n"


def test_an_xid_that_needs_a_reset_fails_the_launch() -> None:
    machine = _machine()
    machine.inject_xid(0, 62)  # a micro-controller halt: the GPU wants a reset
    code, _out, err = cuda_samples.run(machine.nvml(), ALL, NOW)
    assert code == 1
    assert err.endswith("(error code unspecified launch failure)!\n")


def test_no_visible_gpu_is_no_cuda_device() -> None:
    code, _out, err = cuda_samples.run(_machine().nvml(), Visible(), NOW)
    assert code == 1
    assert "no CUDA-capable device is detected" in err
