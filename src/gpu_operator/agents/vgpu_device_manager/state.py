"""The GPUs' vGPU state, read from sysfs: how each GPU offers vGPUs, its types, its vGPUs.

GPU N is the Nth NVIDIA GPU physical function by PCI address (as upstream's nvpci counts them).
The framework shows in the tree: mdev types on the GPU itself (Turing), mdev types on its VFs
(Ampere), or the vendor files `nvidia/creatable_vgpu_types` on its VFs (Ada, Hopper). An mdev
type's `max_instance` comes from its `description`; the vendor framework does not publish one,
and its `creatable_vgpu_types` lists only what can be created now, so the GPU model's type table
completes it (upstream asks NVML for the GPU's supported types).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from gpu_operator.agents.pci import models, sysfs

_MAX_INSTANCE = re.compile(r"max_instance=(\d+)")


@dataclass(frozen=True)
class TypeInfo:
    """A vGPU type a GPU supports: config name (`A100-4C`), sysfs name, driver id, limit."""

    short_name: str
    name: str
    type_id: str
    max_instances: int | None = None


@dataclass(frozen=True)
class Vgpu:
    """An existing vGPU: its id (mdev UUID, or the VF address) and its type."""

    id: str
    parent: str
    short_name: str


@dataclass(frozen=True)
class Gpu:
    index: int
    address: str
    pci_device_id: int  # 0x<device><vendor>
    name: str
    framework: models.Framework | None
    parents: tuple[str, ...]
    types: tuple[TypeInfo, ...] = ()
    vgpus: tuple[Vgpu, ...] = ()
    busy_parents: frozenset[str] = field(default_factory=frozenset)

    def current(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for vgpu in self.vgpus:
            counts[vgpu.short_name] = counts.get(vgpu.short_name, 0) + 1
        return counts

    def type_info(self, short_name: str) -> TypeInfo | None:
        for info in self.types:
            if info.short_name == short_name:
                return info
        return None


def _max_instance(root: Path, parent: str, type_id: str) -> int | None:
    path = sysfs.devices_dir(root) / parent / "mdev_supported_types" / type_id / "description"
    try:
        match = _MAX_INSTANCE.search(path.read_text())
    except OSError:
        return None
    return int(match.group(1)) if match else None


def read(root: Path) -> list[Gpu]:
    """Every NVIDIA GPU of the host with its vGPU state."""
    functions = sysfs.scan(root)
    mdevs = sysfs.mdevs(root)
    out = []
    for index, pf in enumerate(sysfs.nvidia_gpus(functions)):
        name = models.PCI_NAMES.get(pf.device, f"device {pf.device:04x}")
        gpu_id = (pf.device << 16) | pf.vendor
        vfs = pf.virtfns
        framework: models.Framework | None = None
        parents: tuple[str, ...] = ()
        if sysfs.mdev_types(root, pf.address):
            framework, parents = "mdev", (pf.address,)
        elif vfs and sysfs.mdev_types(root, vfs[0]):
            framework, parents = "mdev-sriov", vfs
        elif vfs and sysfs.creatable_vgpu_types(root, vfs[0]) is not None:
            framework, parents = "vendor-vfio", vfs
        types: dict[str, TypeInfo] = {}
        vgpus: list[Vgpu] = []
        busy: set[str] = set()
        if framework in ("mdev", "mdev-sriov"):
            for t in sysfs.mdev_types(root, parents[0]):
                limit = _max_instance(root, parents[0], t.type_id)
                types[t.short_name] = TypeInfo(t.short_name, t.name, t.type_id, limit)
            for mdev in mdevs:
                if mdev.parent in parents:
                    vgpus.append(Vgpu(mdev.uuid, mdev.parent, mdev.short_name))
                    busy.add(mdev.parent)
        elif framework == "vendor-vfio":
            by_id: dict[int, sysfs.VgpuTypeEntry] = {}
            for vf in parents:
                for entry in sysfs.creatable_vgpu_types(root, vf) or []:
                    by_id.setdefault(entry.type_id, entry)
            # The creatable lists shrink as vGPUs are created; upstream completes them from
            # NVML's supported types, the mock's NVML from the model's table.
            model = models.by_device_id(pf.device)
            for vgpu in models.vm_facts(model).vgpu_types if model else ():
                by_id.setdefault(vgpu.type_id, sysfs.VgpuTypeEntry(vgpu.type_id, vgpu.name))
            for entry in sorted(by_id.values(), key=lambda e: e.type_id):
                types.setdefault(
                    entry.short_name, TypeInfo(entry.short_name, entry.name, str(entry.type_id))
                )
            for vf in parents:
                current = sysfs.current_vgpu_type(root, vf)
                if current:
                    known = by_id.get(current)
                    vgpus.append(Vgpu(vf, vf, known.short_name if known else f"type-{current}"))
                    busy.add(vf)
        out.append(
            Gpu(index, pf.address, gpu_id, name, framework, parents, tuple(types.values()),
                tuple(vgpus), frozenset(busy))
        )  # fmt: skip
    return out
