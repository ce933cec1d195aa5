"""Simulated hosts for the VM-workload agent tests: a mock machine's PCI tree in a directory."""

from __future__ import annotations

from pathlib import Path

from gpu_operator.agents.pci import sysfs
from gpu_operator.nvml import machines, mock
from gpudemo import fleet
from simhost import hardware
from simhost import pci as simulated

PRESETS = sorted(machines.PRESETS)


def host(root: Path, preset: str, *, iommu: bool = True) -> simulated.SimulatedKernel:
    """A host with the preset's GPUs, its drivers as at boot (NVIDIA driver not loaded)."""
    machine = mock.MockMachine.from_preset(preset)
    hardware.write(root, fleet.Pool(name="p", machine=preset), machine, iommu=iommu)
    return simulated.SimulatedKernel(root)


def gpus(kernel: simulated.SimulatedKernel) -> list[sysfs.Function]:
    return sysfs.nvidia_gpus(sysfs.scan(kernel.root))


def nvidia(kernel: simulated.SimulatedKernel) -> list[sysfs.Function]:
    """Every NVIDIA physical function (GPUs, audio functions, NVSwitches)."""
    return [f for f in sysfs.scan(kernel.root) if f.nvidia and not f.vf]
