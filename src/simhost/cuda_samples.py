"""`vectorAdd` from NVIDIA's CUDA samples (the validator image's workload), on a container's
mock GPUs.

The sample adds two vectors of 50,000 floats on the first CUDA device it sees and checks the
result; it prints its steps on stdout and a failing CUDA call on stderr
(`Failed to <step> (error code <cudaGetErrorString>)!`) and exits 1. Here the first device is the
container's first visible GPU (its first MIG device when the GPU is in MIG mode), and the CUDA
errors follow the mock GPU's state: no driver or no device, a GPU fallen off the bus, a pending
uncorrectable ECC error or another fault waiting for a reset.
"""

from __future__ import annotations

import contextlib
import datetime as dt

from gpu_operator import nvml
from gpu_operator.nvml import protocol
from simhost import nvidia_smi

ELEMENTS = 50_000
THREADS = 256
EXIT_FAILURE = 1
NO_DEVICE = "no CUDA-capable device is detected"
UNKNOWN = "unknown error"
ECC = "uncorrectable ECC error encountered"
LAUNCH = "unspecified launch failure"


def _failed(step: str, error: str) -> str:
    return f"Failed to {step} (error code {error})!\n"


def _header() -> str:
    return f"[Vector addition of {ELEMENTS} elements]\n"


def _steps() -> str:
    blocks = (ELEMENTS + THREADS - 1) // THREADS
    return (
        "Copy input data from the host memory to the CUDA device\n"
        f"CUDA kernel launch with {blocks} blocks of {THREADS} threads\n"
        "Copy output data from the CUDA device to the host memory\n"
    )


def run(lib: nvml.Nvml, visible: nvidia_smi.Visible, now: dt.datetime) -> tuple[int, str, str]:
    """One `vectorAdd` run: (exit code, stdout, stderr)."""
    out = _header()
    if visible.none:
        return EXIT_FAILURE, out, _failed("allocate device vector A", NO_DEVICE)
    try:
        lib.init()
    except nvml.NvmlError:
        return EXIT_FAILURE, out, _failed("allocate device vector A", NO_DEVICE)
    try:
        view = nvidia_smi.collect(lib, visible, now)
        recovery = _first_device_recovery(lib, visible)
    except nvidia_smi.GpuLostError:
        return EXIT_FAILURE, out, _failed("allocate device vector A", UNKNOWN)
    finally:
        with contextlib.suppress(nvml.NvmlError):
            lib.shutdown()
    usable = [g for g in view.gpus if not g.mig_mode or any(m.gpu == g.index for m in view.migs)]
    if not usable:
        return EXIT_FAILURE, out, _failed("allocate device vector A", NO_DEVICE)
    first = usable[0]
    out += _steps()
    if first.ecc_uncorrected:
        return EXIT_FAILURE, out, _failed("launch vectorAdd kernel", ECC)
    if recovery:
        return EXIT_FAILURE, out, _failed("launch vectorAdd kernel", LAUNCH)
    return 0, out + "Test PASSED\nDone\n", ""


def _first_device_recovery(lib: nvml.Nvml, visible: nvidia_smi.Visible) -> bool:
    """Whether the first visible GPU waits for a reset (an XID that needs one)."""
    for host_index in range(lib.device_count()):
        gpu = lib.device_by_index(host_index)
        if visible.all or str(host_index) in visible.ids or gpu.uuid() in visible.ids:
            try:
                return gpu.gpu_recovery_action() != protocol.RecoveryAction.NONE
            except nvml.NotSupported:
                return False
    return False
