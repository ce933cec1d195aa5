"""What each sandbox validation looks at on the host.

* workload type: the node's `nvidia.com/gpu.workload.config` label, else
  `DEFAULT_GPU_WORKLOAD_CONFIG`, else `vm-passthrough`.
* vfio-pci (vm-passthrough only): every NVIDIA GPU is bound to vfio-pci or a vfio variant.
* vgpu-manager (vm-vgpu only): the NVIDIA host driver is loaded (upstream runs `nvidia-smi`;
  here `/sys/module/nvidia`), by a driver container when `.driver-ctr-ready` is there, else on
  the host; and its vGPU parents are there: mdev parents, or every SR-IOV GPU's VFs.
* vgpu-devices (vm-vgpu only): at least one vGPU (an mdev, or a VF with a vGPU type).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gpu_operator.agents.pci import sysfs

WORKLOAD_LABEL = "nvidia.com/gpu.workload.config"
VM_PASSTHROUGH = "vm-passthrough"
VM_VGPU = "vm-vgpu"
WORKLOADS = ("container", VM_PASSTHROUGH, VM_VGPU)


def workload_type(labels: Mapping[str, str], default: str | None) -> str:
    value = labels.get(WORKLOAD_LABEL, "")
    if value in WORKLOADS:
        return value
    return default if default in WORKLOADS else VM_PASSTHROUGH


def vfio_pci(root: Path) -> tuple[bool, str]:
    """Whether every NVIDIA GPU is on a vfio driver, and what is not."""
    gpus = sysfs.nvidia_gpus(sysfs.scan(root))
    if not gpus:
        return False, "no NVIDIA GPUs found"
    waiting = [f"{g.address} ({g.driver or 'no driver'})" for g in gpus
               if not sysfs.is_vfio_driver(g.driver)]  # fmt: skip
    if waiting:
        return False, "not bound to vfio-pci yet: " + ", ".join(waiting)
    return True, f"{len(gpus)} GPU(s) bound to vfio"


def vgpu_manager(root: Path) -> tuple[bool, str]:
    """Whether the vGPU host driver is up with its vGPU parents."""
    if not sysfs.module_loaded(root, "nvidia"):
        return False, "the NVIDIA vGPU host driver is not loaded"
    gpus = sysfs.nvidia_gpus(sysfs.scan(root))
    parents = root / "sys" / "class" / "mdev_bus"
    if parents.is_dir() and any(parents.iterdir()):
        return True, "mdev parent devices present"
    sriov = [g for g in gpus if g.sriov_total_vfs]
    if sriov and all(g.sriov_num_vfs == g.sriov_total_vfs for g in sriov):
        return True, f"SR-IOV VFs enabled on {len(sriov)} GPU(s)"
    return False, "no mdev parent devices and no SR-IOV VFs yet"


def vgpu_devices(root: Path) -> tuple[bool, str]:
    mdevs = sysfs.mdevs(root)
    vfs = [f for f in sysfs.scan(root) if f.vf and sysfs.current_vgpu_type(root, f.address)]
    count = len(mdevs) + len(vfs)
    if count:
        return True, f"{count} vGPU device(s)"
    return False, "no vGPU devices yet"
