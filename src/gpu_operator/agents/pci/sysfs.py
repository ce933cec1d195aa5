"""Reading the host's PCI devices, IOMMU groups, mediated devices and vGPU state from sysfs.

Every function takes the host root (`/` on a host, the host mount in a container, a node's root
directory in the simulation) and reads the standard layout: `/sys/bus/pci/devices/<address>/`
with `vendor`, `device`, `class`, `modalias`, `driver_override` and the links `driver`,
`iommu_group`, `physfn`, `virtfn<N>`; `/sys/bus/mdev/devices/<uuid>` with its `mdev_type` link;
and the vendor-specific vGPU files `nvidia/creatable_vgpu_types` and `nvidia/current_vgpu_type`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

NVIDIA = 0x10DE
CLASS_NVSWITCH = 0x068000
# The vfio drivers a device is "passed through" with: vfio-pci and its vendor variants.
VFIO_PCI = "vfio-pci"
NO_OVERRIDE = "(null)"
_VIRTFN = re.compile(r"^virtfn(\d+)$")


def devices_dir(root: Path) -> Path:
    return root / "sys" / "bus" / "pci" / "devices"


def drivers_dir(root: Path) -> Path:
    return root / "sys" / "bus" / "pci" / "drivers"


def mdev_devices_dir(root: Path) -> Path:
    return root / "sys" / "bus" / "mdev" / "devices"


def is_vfio_driver(driver: str | None) -> bool:
    """vfio-pci or a vfio variant driver (`nvgrace_gpu_vfio_pci`, `mlx5_vfio_pci`, ...)."""
    return driver is not None and (driver == VFIO_PCI or driver.endswith("vfio_pci"))


@dataclass(frozen=True)
class Function:
    """One PCI function as sysfs shows it."""

    address: str
    vendor: int
    device: int
    pci_class: int
    subsystem_vendor: int
    subsystem_device: int
    modalias: str
    driver: str | None
    driver_override: str | None
    iommu_group: int | None
    physfn: str | None = None
    virtfns: tuple[str, ...] = ()
    sriov_total_vfs: int = 0
    sriov_num_vfs: int = 0

    @property
    def nvidia(self) -> bool:
        return self.vendor == NVIDIA

    @property
    def gpu(self) -> bool:
        """A display or 3D controller (class 03xxxx)."""
        return self.pci_class >> 16 == 0x03

    @property
    def audio(self) -> bool:
        return self.pci_class >> 8 == 0x0403

    @property
    def nvswitch(self) -> bool:
        return self.nvidia and self.pci_class == CLASS_NVSWITCH

    @property
    def vf(self) -> bool:
        return self.physfn is not None

    @property
    def slot(self) -> str:
        """`domain:bus:device` (the address without its function)."""
        return self.address.rsplit(".", 1)[0]

    @property
    def function_number(self) -> int:
        return int(self.address.rsplit(".", 1)[1], 16)

    @property
    def device_id(self) -> str:
        """Vendor and device as vGPU and MIG configs spell them: `0x20B010DE`."""
        return f"0x{self.device:04X}{self.vendor:04X}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _hex(path: Path) -> int:
    text = _read(path)
    try:
        return int(text, 16) if text else 0
    except ValueError:
        return 0


def _int(path: Path) -> int:
    text = _read(path)
    try:
        return int(text) if text else 0
    except ValueError:
        return 0


def link_name(path: Path) -> str | None:
    """The last component of a symlink's target (None if it is not a link)."""
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def read_function(root: Path, address: str) -> Function | None:
    """The function at `address`, or None if the host has no such device."""
    base = devices_dir(root) / address
    if not base.exists():
        return None
    group = link_name(base / "iommu_group")
    override = _read(base / "driver_override")
    virtfns = []
    try:
        entries = os.listdir(base)
    except OSError:
        entries = []
    for entry in entries:
        match = _VIRTFN.match(entry)
        if match:
            target = link_name(base / entry)
            if target:
                virtfns.append((int(match.group(1)), target))
    return Function(
        address=address,
        vendor=_hex(base / "vendor"),
        device=_hex(base / "device"),
        pci_class=_hex(base / "class"),
        subsystem_vendor=_hex(base / "subsystem_vendor"),
        subsystem_device=_hex(base / "subsystem_device"),
        modalias=_read(base / "modalias") or "",
        driver=link_name(base / "driver"),
        driver_override=None if override in (None, "", NO_OVERRIDE) else override,
        iommu_group=int(group) if group and group.isdigit() else None,
        physfn=link_name(base / "physfn"),
        virtfns=tuple(name for _, name in sorted(virtfns)),
        sriov_total_vfs=_int(base / "sriov_totalvfs"),
        sriov_num_vfs=_int(base / "sriov_numvfs"),
    )


def scan(root: Path) -> list[Function]:
    """Every PCI function of the host, in address order."""
    try:
        names = sorted(os.listdir(devices_dir(root)))
    except OSError:
        return []
    return [f for f in (read_function(root, name) for name in names) if f is not None]


def nvidia_gpus(functions: list[Function]) -> list[Function]:
    """The NVIDIA GPUs (physical functions), in address order: index N is GPU N."""
    return [f for f in functions if f.nvidia and f.gpu and not f.vf]


def iommu_enabled(root: Path) -> bool:
    """Whether the kernel runs with an IOMMU (it then lists groups under /sys/kernel)."""
    groups = root / "sys" / "kernel" / "iommu_groups"
    try:
        return any(True for _ in os.scandir(groups))
    except OSError:
        return False


def module_loaded(root: Path, module: str) -> bool:
    """A kernel module is loaded (sysfs has `/sys/module/<name>` with a `refcnt`)."""
    return (root / "sys" / "module" / module.replace("-", "_") / "refcnt").exists()


def kernel_release(root: Path) -> str:
    return _read(root / "proc" / "sys" / "kernel" / "osrelease") or ""


# ----- mediated devices (mdev vGPUs) --------------------------------------------------------


@dataclass(frozen=True)
class MdevType:
    """An mdev type a parent device offers: `nvidia-471` named `NVIDIA A100-4C`."""

    parent: str
    type_id: str
    name: str
    available: int

    @property
    def short_name(self) -> str:
        return self.name.split()[-1] if self.name else self.type_id


@dataclass(frozen=True)
class Mdev:
    """A mediated device (a vGPU): its UUID, parent function, type and IOMMU group."""

    uuid: str
    parent: str
    type_id: str
    type_name: str
    iommu_group: int | None

    @property
    def short_name(self) -> str:
        return self.type_name.split()[-1] if self.type_name else self.type_id


def mdev_types(root: Path, address: str) -> list[MdevType]:
    """The mdev types of one parent device, by type id."""
    base = devices_dir(root) / address / "mdev_supported_types"
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    return [
        MdevType(address, name, _read(base / name / "name") or "", _int(base / name /
                 "available_instances"))
        for name in names
    ]  # fmt: skip


def mdevs(root: Path) -> list[Mdev]:
    """Every mediated device of the host, by UUID."""
    base = mdev_devices_dir(root)
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    out = []
    for uuid in names:
        try:
            target = os.readlink(base / uuid)
        except OSError:
            continue
        parent = os.path.basename(os.path.dirname(target))
        device = devices_dir(root) / parent / uuid
        type_id = link_name(device / "mdev_type") or ""
        type_dir = devices_dir(root) / parent / "mdev_supported_types" / type_id
        group = link_name(device / "iommu_group")
        out.append(
            Mdev(uuid, parent, type_id, _read(type_dir / "name") or "",
                 int(group) if group and group.isdigit() else None)
        )  # fmt: skip
    return out


# ----- the vendor-specific VFIO vGPU framework (Ada, Hopper and later) ----------------------


@dataclass(frozen=True)
class VgpuTypeEntry:
    """One line of `creatable_vgpu_types`: `1414 : NVIDIA H200X-4C`."""

    type_id: int
    name: str

    @property
    def short_name(self) -> str:
        return self.name.split()[-1]


def vendor_vgpu_dir(root: Path, address: str) -> Path:
    return devices_dir(root) / address / "nvidia"


def creatable_vgpu_types(root: Path, address: str) -> list[VgpuTypeEntry] | None:
    """The types a VF can take now (None: the function has no vendor vGPU interface)."""
    text = _read(vendor_vgpu_dir(root, address) / "creatable_vgpu_types")
    if text is None:
        return None
    out = []
    for line in text.splitlines():
        ident, sep, name = line.partition(":")
        ident = ident.strip()
        if not sep or not ident.isdigit() or not name.strip():
            continue  # the header line, or anything else that is not "<id> : <name>"
        out.append(VgpuTypeEntry(int(ident), name.strip()))
    return out


def current_vgpu_type(root: Path, address: str) -> int | None:
    """The vGPU type configured on a VF (0: none; None: no vendor vGPU interface)."""
    text = _read(vendor_vgpu_dir(root, address) / "current_vgpu_type")
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None
