"""Applying a vGPU plan through sysfs, as upstream's `nvidia-vgpu-dm apply` does.

Per changed GPU: delete its vGPUs (write `1` to each mdev's `remove`, or `0` to each VF's
`nvidia/current_vgpu_type`), then create the wanted ones parent by parent: on mdev parents as many
as `available_instances` allows (writing fresh UUIDs to the type's `create`), on vendor-VFIO VFs
one per free VF that lists the type in `creatable_vgpu_types`. If the GPU runs out before the
count is reached, the vGPUs just created are deleted again (the GPU is left without vGPUs, never
half-configured) and ApplyError says how many fitted.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from gpu_operator.agents.pci import kernel as kernel_mod
from gpu_operator.agents.pci import sysfs
from gpu_operator.agents.vgpu_device_manager import planner
from gpu_operator.agents.vgpu_device_manager.state import Gpu, TypeInfo, Vgpu

log = logging.getLogger("gpu_operator.agents.vgpu_device_manager")


class ApplyError(RuntimeError):
    """A change failed part way; the message names the GPU and the cause."""


def delete(kernel: kernel_mod.Kernel, gpu: Gpu, vgpu: Vgpu) -> None:
    """Delete one vGPU (KernelError if the kernel refuses)."""
    root = kernel.root
    if gpu.framework == "vendor-vfio":
        path = sysfs.vendor_vgpu_dir(root, vgpu.parent) / "current_vgpu_type"
        kernel.write(path, "0")
    else:
        kernel.write(sysfs.mdev_devices_dir(root) / vgpu.id / "remove", "1")


def _available(kernel: kernel_mod.Kernel, parent: str, info: TypeInfo) -> int:
    path = (
        sysfs.devices_dir(kernel.root)
        / parent
        / "mdev_supported_types"
        / info.type_id
        / "available_instances"
    )
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def _create(
    kernel: kernel_mod.Kernel,
    gpu: Gpu,
    info: TypeInfo,
    count: int,
    new_id: Callable[[], str],
) -> list[Vgpu]:
    """Create up to `count` vGPUs of a type on the GPU's parents; returns those created."""
    root = kernel.root
    made: list[Vgpu] = []
    for parent in gpu.parents:
        if len(made) == count:
            break
        if gpu.framework == "vendor-vfio":
            if sysfs.current_vgpu_type(root, parent):
                continue
            creatable = sysfs.creatable_vgpu_types(root, parent) or []
            if int(info.type_id) not in {t.type_id for t in creatable}:
                continue
            kernel.write(sysfs.vendor_vgpu_dir(root, parent) / "current_vgpu_type", info.type_id)
            made.append(Vgpu(parent, parent, info.short_name))
            continue
        available = _available(kernel, parent, info)
        base = sysfs.devices_dir(root) / parent / "mdev_supported_types" / info.type_id
        for _ in range(min(available, count - len(made))):
            ident = new_id()
            kernel.write(base / "create", ident)
            made.append(Vgpu(ident, parent, info.short_name))
    return made


def apply(
    kernel: kernel_mod.Kernel,
    plan: planner.Plan,
    new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
) -> list[str]:
    """Carry out a plan; returns one line per changed GPU (ApplyError on failure)."""
    done = []
    for change in plan.changes:
        gpu = change.gpu
        try:
            for vgpu in gpu.vgpus:
                delete(kernel, gpu, vgpu)
            for name, count in change.create:
                info = gpu.type_info(name)
                assert info is not None  # the planner checked
                made = _create(kernel, gpu, info, count, new_id)
                if len(made) < count:
                    for vgpu in made:
                        delete(kernel, gpu, vgpu)
                    raise ApplyError(
                        f"failed to create {count} {name} vGPU devices on GPU {gpu.index} "
                        f"({gpu.address}): only {len(made)} fitted (ensure '{count}' does not "
                        f"exceed the maximum supported instances for '{name}'); the GPU is "
                        "left without vGPUs"
                    )
        except kernel_mod.KernelError as err:
            raise ApplyError(f"GPU {gpu.index} ({gpu.address}): {err}") from None
        line = ", ".join(f"{n} x {t}" for t, n in change.create) or "no vGPUs"
        log.info("GPU %d (%s): %s", gpu.index, gpu.address, line)
        done.append(f"GPU {gpu.index}: {line}")
    return done
