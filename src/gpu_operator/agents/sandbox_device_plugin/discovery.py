"""The sandbox plugin's resources, discovered from sysfs as upstream does.

Passthrough: every NVIDIA PCI function bound to a vfio driver, grouped by device id; the resource
is named from the device's pci.ids name: uppercased, `/` and `.` to `_`, runs of whitespace to
`_`, anything else that is not a letter, digit or `_` dropped (`GA100 [A100 SXM4 40GB]` ->
`GA100_A100_SXM4_40GB`; a device with no name is named by its id). Device IDs are PCI addresses.
vGPUs: each mediated device by its type's `name` with whitespace runs as `_` (`NVIDIA A100-4C` ->
`NVIDIA_A100-4C`, device IDs are mdev UUIDs), and each VF configured through the vendor-specific
framework by its type's name the same way (device IDs are VF addresses, allocated like
passthrough).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpu_operator.agents.pci import models, sysfs

PREFIX = "nvidia.com/"
Kind = Literal["passthrough", "mdev"]
_SPACES = re.compile(r"\s+")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_]+")


@dataclass(frozen=True)
class Device:
    """One advertised device: its ID (address or UUID) and the VFIO group node it needs."""

    id: str
    iommu_group: int | None
    health_path: str  # relative to the host root; the device is healthy while it exists


@dataclass(frozen=True)
class Resource:
    name: str  # without the nvidia.com/ prefix
    kind: Kind
    devices: tuple[Device, ...]

    @property
    def resource_name(self) -> str:
        return PREFIX + self.name

    @property
    def socket_name(self) -> str:
        return f"kubevirt-{self.name}.sock"

    def by_id(self) -> dict[str, Device]:
        return {d.id: d for d in self.devices}


def device_name(pci_name: str) -> str:
    """Upstream's resource name for a pci.ids device name."""
    name = pci_name.strip().upper().replace("/", "_").replace(".", "_")
    return _NOT_NAME.sub("", _SPACES.sub("_", name))


def vgpu_name(type_name: str) -> str:
    """Upstream's resource name for a vGPU type name (whitespace runs to `_`)."""
    return _SPACES.sub("_", type_name.strip())


def read_pci_ids(path: Path | None) -> dict[int, str]:
    """NVIDIA's device names from a pci.ids file (empty when there is none)."""
    if path is None:
        return {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    names: dict[int, str] = {}
    inside = False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if not line.startswith("\t"):
            inside = line.lower().startswith("10de ")
            continue
        if inside and not line.startswith("\t\t"):
            ident, _, name = line.strip().partition(" ")
            try:
                names[int(ident, 16)] = name.strip()
            except ValueError:
                continue
    return names


def _name(device: int, pci_ids: dict[int, str]) -> str:
    pci_name = pci_ids.get(device) or models.PCI_NAMES.get(device)
    return device_name(pci_name) if pci_name else f"{device:04x}"


def discover(root: Path, pci_ids: dict[int, str] | None = None) -> list[Resource]:
    """The node's passthrough and vGPU resources, by name."""
    names = pci_ids or {}
    passthrough: dict[str, list[Device]] = {}
    vgpus: dict[tuple[str, Kind], list[Device]] = {}
    functions = sysfs.scan(root)
    for f in functions:
        if not f.nvidia:
            continue
        group_dev = f"dev/vfio/{f.iommu_group}"
        if sysfs.is_vfio_driver(f.driver) and f.iommu_group is not None:
            passthrough.setdefault(_name(f.device, names), []).append(
                Device(f.address, f.iommu_group, group_dev)
            )
            continue
        current = sysfs.current_vgpu_type(root, f.address) if f.vf else None
        if current and f.iommu_group is not None:
            entries = sysfs.creatable_vgpu_types(root, f.address) or []
            type_name = next((e.name for e in entries if e.type_id == current), f"{current}")
            vgpus.setdefault((vgpu_name(type_name), "passthrough"), []).append(
                Device(f.address, f.iommu_group, group_dev)
            )
    for mdev in sysfs.mdevs(root):
        vgpus.setdefault((vgpu_name(mdev.type_name or mdev.type_id), "mdev"), []).append(
            Device(mdev.uuid, mdev.iommu_group, f"sys/bus/mdev/devices/{mdev.uuid}")
        )
    out = [Resource(n, "passthrough", tuple(d)) for n, d in sorted(passthrough.items())]
    out += [Resource(n, kind, tuple(d)) for (n, kind), d in sorted(vgpus.items())]
    return out
