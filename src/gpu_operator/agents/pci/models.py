"""Per-model facts the VM agents need and NVML does not give: the PCI device name (pci.ids), the
graphics audio function, SR-IOV and the vGPU types with their per-GPU limits.

Pure data. The vGPU framework follows the architecture, as with the NVIDIA vGPU host driver:
Turing GPUs carry mediated devices (mdev) on the physical function, Ampere GPUs on SR-IOV virtual
functions (one vGPU per VF), and Ada, Hopper and later GPUs use the vendor-specific VFIO framework
(a vGPU type written to a VF's `nvidia/current_vgpu_type`, no mdev). Type ids are simulated:
the real ones depend on the host driver branch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpu_operator.nvml import catalog

Framework = Literal["mdev", "mdev-sriov", "vendor-vfio"]

# pci.ids names of the NVIDIA devices the mock machines have (vendor 10de).
PCI_NAMES: dict[int, str] = {
    0x20B0: "GA100 [A100 SXM4 40GB]",
    0x20B2: "GA100 [A100 SXM4 80GB]",
    0x20B7: "GA100GL [A30 PCIe]",
    0x1EB8: "TU104GL [Tesla T4]",
    0x27B8: "AD104GL [L4]",
    0x26B9: "AD102GL [L40S]",
    0x2330: "GH100 [H100 SXM5 80GB]",
    0x2335: "GH100 [H200 SXM 141GB]",
    0x2901: "GB100 [B200]",
    0x3182: "GB110 [B300 SXM6 AC]",
    0x2BB5: "GB202GL [RTX PRO 6000 Blackwell Server Edition]",
    0x1AF1: "GA100 [A100 NVSwitch]",
    0x22A3: "GH100 [H100 NVSwitch]",
    0x22BA: "AD102 High Definition Audio Controller",
}
# The graphics audio function (function 1 of the GPU's slot) of models with display outputs.
AUDIO_FUNCTIONS: dict[str, int] = {"L40S": 0x22BA}
CLASS_AUDIO = 0x040300


@dataclass(frozen=True)
class VgpuType:
    """One vGPU type: the driver's id, the name sysfs shows (`NVIDIA A100-4C`), its frame
    buffer and how many fit on one GPU."""

    type_id: int
    name: str
    framebuffer_mib: int
    max_instances: int

    @property
    def short_name(self) -> str:
        """The name without its `NVIDIA`/`GRID` prefix, as vGPU configs spell it (`A100-4C`)."""
        return self.name.split()[-1]


@dataclass(frozen=True)
class VmFacts:
    """What a model offers VMs: its name, audio function, SR-IOV and vGPU types."""

    pci_name: str
    audio_device: int | None
    framework: Framework | None
    sriov_total_vfs: int
    vgpu_types: tuple[VgpuType, ...]

    def vgpu_type(self, short_name: str) -> VgpuType | None:
        for vgpu in self.vgpu_types:
            if vgpu.short_name == short_name:
                return vgpu
        return None

    def vgpu_type_by_id(self, type_id: int) -> VgpuType | None:
        for vgpu in self.vgpu_types:
            if vgpu.type_id == type_id:
                return vgpu
        return None


def _types(
    prefix: str, gpu: str, first_id: int, total_gib: int, series: dict[str, tuple[int, ...]],
    cap: int,
) -> tuple[VgpuType, ...]:  # fmt: skip
    out = []
    type_id = first_id
    for letter, sizes in series.items():
        for gib in sizes:
            count = min(total_gib // gib, cap)
            out.append(VgpuType(type_id, f"{prefix} {gpu}-{gib}{letter}", gib * 1024, count))
            type_id += 1
    return tuple(out)


# Per model: (pci name key, framework, VFs, vGPU name prefix, vGPU GPU name, first type id,
# usable frame buffer in GiB, series -> sizes). B200 has no vGPU types here (not modelled).
_VGPU: dict[str, tuple[Framework, int, str, str, int, int, dict[str, tuple[int, ...]]]] = {
    "T4": ("mdev", 0, "GRID", "T4", 222, 16,
           {"Q": (1, 2, 4, 8, 16), "C": (4, 8, 16)}),
    "A100-SXM4-40GB": ("mdev-sriov", 16, "NVIDIA", "A100", 471, 40,
                       {"C": (4, 5, 8, 10, 20, 40)}),
    "A100-SXM4-80GB": ("mdev-sriov", 20, "NVIDIA", "A100D", 699, 80,
                       {"C": (4, 8, 10, 16, 20, 40, 80)}),
    "A30-24GB": ("mdev-sriov", 16, "NVIDIA", "A30", 685, 24, {"C": (4, 6, 8, 12, 24)}),
    "L4": ("vendor-vfio", 32, "NVIDIA", "L4", 903, 24,
           {"Q": (1, 2, 3, 4, 6, 8, 12, 24), "C": (4, 6, 8, 12, 24)}),
    "L40S": ("vendor-vfio", 32, "NVIDIA", "L40S", 925, 48,
             {"Q": (1, 2, 3, 4, 6, 8, 12, 16, 24, 48), "C": (4, 6, 8, 12, 16, 24, 48)}),
    "H100-SXM5-80GB": ("vendor-vfio", 32, "NVIDIA", "H100XM", 1076, 80,
                       {"C": (4, 5, 8, 10, 16, 20, 40, 80)}),
    "H200-141GB": ("vendor-vfio", 32, "NVIDIA", "H200X", 1414, 141,
                   {"C": (4, 8, 17, 35, 70, 141)}),
}  # fmt: skip


def vm_facts(model: catalog.GpuModel) -> VmFacts:
    """The VM facts of a catalog model (no framework and no types where vGPU is not modelled)."""
    name = PCI_NAMES.get(model.pci_device_id >> 16, f"Device {model.pci_device_id >> 16:04x}")
    audio = AUDIO_FUNCTIONS.get(model.key)
    row = _VGPU.get(model.key)
    if row is None:
        return VmFacts(name, audio, None, 0, ())
    framework, vfs, prefix, gpu, first, total, series = row
    cap = vfs if framework != "mdev" else 64
    return VmFacts(name, audio, framework, vfs, _types(prefix, gpu, first, total, series, cap))


def by_device_id(device: int) -> catalog.GpuModel | None:
    """The catalog model with this PCI device id (the low 16 bits are not the vendor here)."""
    for model in catalog.models():
        if model.pci_device_id >> 16 == device:
            return model
    return None
