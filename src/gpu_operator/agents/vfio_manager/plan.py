"""What binding or unbinding means on a host: the devices, and the driver each goes to. Pure.

Bind: every NVIDIA GPU (physical functions; VFs belong to vGPU hosts), each with the NVIDIA audio
functions of its slot (they share its IOMMU group, so a VM can only have both), and with
`nvswitches` the NVSwitches too. A GPU goes to its vfio variant driver or vfio-pci; audio
functions to vfio-pci. Refused, changing nothing: a device without an IOMMU group (the IOMMU is
off), a GPU whose vGPU host driver made VFs or vGPUs, a `device` that is not an NVIDIA GPU.
Unbind: the NVIDIA functions on a vfio driver (all of them, or `device` and its audio).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gpu_operator.agents.pci import sysfs
from gpu_operator.agents.vfio_manager import aliases as alias_mod

Role = Literal["gpu", "audio", "nvswitch"]
IOMMU_HELP = (
    "the IOMMU is off: enable VT-d (Intel) or AMD-Vi in the firmware and boot with "
    "intel_iommu=on or amd_iommu=on"
)


class PlanError(ValueError):
    """The devices cannot be (un)bound as asked; nothing was changed."""


@dataclass(frozen=True)
class Target:
    """One device to move: where it is now and the driver it goes to (None: no driver)."""

    address: str
    role: Role
    current: str | None
    driver: str | None
    iommu_group: int | None

    @property
    def done(self) -> bool:
        return self.current == self.driver


def _audio_of(gpu: sysfs.Function, functions: Sequence[sysfs.Function]) -> list[sysfs.Function]:
    return [
        f
        for f in functions
        if f.nvidia and f.audio and f.slot == gpu.slot and f.address != gpu.address
    ]


def _selected(
    functions: Sequence[sysfs.Function], device: str | None, nvswitches: bool
) -> list[tuple[sysfs.Function, Role]]:
    chosen: list[tuple[sysfs.Function, Role]] = []
    for f in functions:
        if not f.nvidia or f.vf:
            continue
        if f.gpu:
            chosen.append((f, "gpu"))
        elif f.nvswitch and (nvswitches or device == f.address):
            chosen.append((f, "nvswitch"))
    if device is None:
        return chosen
    picked = [(f, role) for f, role in chosen if f.address == device]
    if not picked:
        known = {f.address: f for f in functions}
        what = "no such PCI device" if device not in known else "not an NVIDIA GPU or NVSwitch"
        raise PlanError(f"device {device}: {what}")
    return picked


def plan_bind(
    functions: Sequence[sysfs.Function],
    aliases: Sequence[alias_mod.Alias],
    *,
    device: str | None = None,
    nvswitches: bool = False,
    vgpus_on: frozenset[str] = frozenset(),
) -> list[Target]:
    """The devices to bind to vfio drivers (PlanError when any of them cannot be)."""
    targets: list[Target] = []
    problems: list[str] = []
    for function, role in _selected(functions, device, nvswitches):
        members = [(function, role)]
        if role == "gpu":
            members += [(a, "audio") for a in _audio_of(function, functions)]
            if function.sriov_num_vfs or function.address in vgpus_on:
                problems.append(
                    f"{function.address}: the vGPU host driver has VFs or vGPUs on this GPU "
                    "(a vm-vgpu node); remove them before passing the GPU through"
                )
                continue
        for member, member_role in members:
            if member.iommu_group is None:
                problems.append(f"{member.address}: no IOMMU group ({IOMMU_HELP})")
                continue
            driver = (
                sysfs.VFIO_PCI
                if member_role == "audio"
                else alias_mod.driver_for(member.modalias, list(aliases))
            )
            targets.append(
                Target(member.address, member_role, member.driver, driver, member.iommu_group)
            )
    if problems:
        raise PlanError("cannot bind to vfio: " + "; ".join(problems))
    return targets


def plan_unbind(functions: Sequence[sysfs.Function], *, device: str | None = None) -> list[Target]:
    """The NVIDIA functions to release from vfio drivers."""
    wanted: set[str] | None = None
    if device is not None:
        picked = _selected(functions, device, nvswitches=True)
        wanted = {device} | {a.address for f, _ in picked for a in _audio_of(f, functions)}
    out = []
    for f in functions:
        if not f.nvidia or not sysfs.is_vfio_driver(f.driver):
            continue
        if wanted is not None and f.address not in wanted:
            continue
        role: Role = "audio" if f.audio else "nvswitch" if f.nvswitch else "gpu"
        out.append(Target(f.address, role, f.driver, None, f.iommu_group))
    return out
