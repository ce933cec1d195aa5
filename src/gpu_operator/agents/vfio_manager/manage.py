"""Binding and unbinding through sysfs, as `vfio-manage` does: the writes, in order.

Bind (per device): load the driver's module; write the driver to `driver_override` (so that no
other driver takes the device back); unbind it from its current driver; write its address to
`/sys/bus/pci/drivers/<driver>/bind`. Unbind: unbind from the vfio driver, clear
`driver_override`, and write the address to `drivers_probe` so that the device returns to its
default driver when that is loaded (the NVIDIA driver on a container node).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path

from gpu_operator.agents.pci import kernel as kernel_mod
from gpu_operator.agents.pci import sysfs
from gpu_operator.agents.vfio_manager import aliases as alias_mod
from gpu_operator.agents.vfio_manager import plan as plan_mod

log = logging.getLogger("gpu_operator.agents.vfio_manager")


class VfioError(RuntimeError):
    """A device could not be moved; the message names it and the kernel's reason."""


def _device(root: Path, address: str, attribute: str) -> Path:
    return sysfs.devices_dir(root) / address / attribute


def _driver(root: Path, driver: str, attribute: str) -> Path:
    return sysfs.drivers_dir(root) / driver / attribute


def bind(kernel: kernel_mod.Kernel, targets: Sequence[plan_mod.Target]) -> list[str]:
    """Bind each target to its driver; returns what changed (VfioError on the first failure,
    after clearing that device's driver_override so that it is not left half-claimed)."""
    root = kernel.root
    for module in sorted({alias_mod.module_of(t.driver) for t in targets if t.driver}):
        try:
            kernel.modprobe(module)
        except kernel_mod.KernelError as err:
            raise VfioError(f"cannot load module {module}: {err}") from None
    changed = []
    for target in targets:
        assert target.driver is not None
        current = sysfs.read_function(root, target.address)
        if current is None:
            raise VfioError(f"{target.address}: the device is gone")
        if current.driver == target.driver:
            log.info("%s (%s) is already bound to %s", target.address, target.role, target.driver)
            continue
        try:
            kernel.write(_device(root, target.address, "driver_override"), target.driver)
            if current.driver is not None:
                log.info("unbinding %s from %s", target.address, current.driver)
                kernel.write(_driver(root, current.driver, "unbind"), target.address)
            kernel.write(_driver(root, target.driver, "bind"), target.address)
        except kernel_mod.KernelError as err:
            # The first error is the one to report.
            with contextlib.suppress(kernel_mod.KernelError):
                kernel.write(_device(root, target.address, "driver_override"), "\n")
            raise VfioError(
                f"binding {target.address} ({target.role}) to {target.driver}: {err}"
            ) from None
        log.info(
            "bound %s (%s, IOMMU group %s) to %s",
            target.address, target.role, target.iommu_group, target.driver,
        )  # fmt: skip
        changed.append(f"{target.address} -> {target.driver}")
    return changed


def unbind(kernel: kernel_mod.Kernel, targets: Sequence[plan_mod.Target]) -> list[str]:
    """Release each target from its vfio driver (VfioError on the first failure)."""
    root = kernel.root
    changed = []
    for target in targets:
        current = sysfs.read_function(root, target.address)
        if current is None or not sysfs.is_vfio_driver(current.driver):
            continue
        assert current.driver is not None
        try:
            kernel.write(_driver(root, current.driver, "unbind"), target.address)
            kernel.write(_device(root, target.address, "driver_override"), "\n")
            kernel.write(sysfs.drivers_dir(root).parent / "drivers_probe", target.address)
        except kernel_mod.KernelError as err:
            raise VfioError(f"unbinding {target.address} from {current.driver}: {err}") from None
        after = sysfs.read_function(root, target.address)
        now = after.driver if after is not None else None
        log.info("unbound %s from %s (now: %s)", target.address, current.driver, now or "no driver")
        changed.append(f"{target.address} -> {now or 'none'}")
    return changed


def vgpu_parents(root: Path) -> frozenset[str]:
    """GPUs (physical functions) that carry vGPUs now."""
    out = set()
    for mdev in sysfs.mdevs(root):
        parent = sysfs.read_function(root, mdev.parent)
        out.add(parent.physfn if parent is not None and parent.physfn else mdev.parent)
    return frozenset(out)


def bind_all(
    kernel: kernel_mod.Kernel, *, device: str | None = None, nvswitches: bool = False
) -> list[str]:
    """Plan and bind (PlanError or VfioError when something is in the way)."""
    root = kernel.root
    targets = plan_mod.plan_bind(
        sysfs.scan(root),
        alias_mod.load(root),
        device=device,
        nvswitches=nvswitches,
        vgpus_on=vgpu_parents(root),
    )
    if not targets:
        log.info("no NVIDIA GPUs on this host")
    return bind(kernel, targets)


def unbind_all(
    kernel: kernel_mod.Kernel, *, device: str | None = None, keep: frozenset[str] = frozenset()
) -> list[str]:
    """Release the vfio-bound devices, except those in `keep` (and their IOMMU groups)."""
    targets = plan_mod.plan_unbind(sysfs.scan(kernel.root), device=device)
    kept_groups = {t.iommu_group for t in targets if t.address in keep}
    return unbind(kernel, [t for t in targets if t.iommu_group not in kept_groups])
