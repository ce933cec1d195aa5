"""`demo-gpu-fault`: a demo-only program in the driver container that injects faults into the
node's mock GPUs, so the device plugin's health checks can be watched from kubectl.

No such tool exists on a real node (XIDs come from the hardware); the reset that clears a fault
is the real command, `nvidia-smi -r -i N`, also in the driver container.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpu_operator.nvml import mock

USAGE = """usage: demo-gpu-fault xid GPU XID [GI CI]   raise an XID critical error (e.g. 48; 79 is
                                               the GPU falling off the bus)
       demo-gpu-fault ecc GPU                  raise a double-bit (uncorrectable) ECC error
       demo-gpu-fault fall-off-bus GPU         lose the GPU (XID 79, every call fails)
Clear a fault with: nvidia-smi -r -i GPU
"""
EXIT_OK = 0
EXIT_USAGE = 2


def run(machine: mock.MockMachine, args: Sequence[str]) -> tuple[int, str]:
    """Apply one fault; (exit code, what it prints)."""
    words = list(args)
    if not words or not all(w.isdigit() for w in words[1:]):
        return EXIT_USAGE, USAGE
    action, numbers = words[0], [int(w) for w in words[1:]]
    if not numbers or not 0 <= numbers[0] < len(machine.gpus):
        return EXIT_USAGE, f"demo-gpu-fault: no GPU {numbers[0] if numbers else '?'}\n" + USAGE
    gpu = numbers[0]
    if action == "xid" and len(numbers) in (2, 4):
        gi, ci = (numbers[2], numbers[3]) if len(numbers) == 4 else (None, None)
        machine.inject_xid(gpu, numbers[1], gpu_instance_id=gi, compute_instance_id=ci)
        # XID 79 is the driver reporting a GPU that fell off the bus: NVML loses it (mock).
        lost = ": it has fallen off the bus" if numbers[1] == mock.XID_FALLEN_OFF_BUS else ""
        return EXIT_OK, f"XID {numbers[1]} raised on GPU {gpu}{lost}\n"
    if action == "ecc" and len(numbers) == 1:
        machine.inject_ecc_error(gpu, uncorrected=True)
        return EXIT_OK, f"double-bit ECC error raised on GPU {gpu}\n"
    if action == "fall-off-bus" and len(numbers) == 1:
        machine.fall_off_bus(gpu)
        return EXIT_OK, f"GPU {gpu} has fallen off the bus\n"
    return EXIT_USAGE, USAGE
