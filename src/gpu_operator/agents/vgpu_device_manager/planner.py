"""vGPU planning: the GPUs' state and a selected config in, the changes (or every problem) out.

Pure. A GPU covered by an entry of the config gets exactly that entry's vGPUs; GPUs no entry
covers are left alone; a config is applied when every covered GPU already has its vGPUs. Refused
before anything is touched, each with the GPU named: a GPU covered by two entries, a GPU without
vGPU support (no vGPU host driver, or a model without vGPU types), a type the GPU does not offer,
two types on one GPU (time-sliced vGPUs of one GPU are all of one type), and more vGPUs than fit
(the type's `max_instance`, and one vGPU per VF on SR-IOV GPUs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpu_operator.agents.vgpu_device_manager import config as cfg
from gpu_operator.agents.vgpu_device_manager.state import Gpu


class PlanError(ValueError):
    """The config cannot be applied to these GPUs; nothing was changed."""


@dataclass(frozen=True)
class Change:
    """One GPU to reconfigure: delete its vGPUs, then create `create` (type, count)."""

    gpu: Gpu
    wanted: dict[str, int]
    create: tuple[tuple[str, int], ...]

    @property
    def delete(self) -> int:
        return len(self.gpu.vgpus)


@dataclass(frozen=True)
class Plan:
    changes: tuple[Change, ...] = ()
    covered: tuple[int, ...] = field(default=())

    @property
    def applied(self) -> bool:
        return not self.changes


def _label(gpu: Gpu) -> str:
    return f"GPU {gpu.index} ({gpu.address}, {gpu.name})"


def wanted_per_gpu(
    gpus: Sequence[Gpu], entries: Sequence[cfg.Entry]
) -> tuple[dict[int, dict[str, int]], list[str]]:
    """The vGPUs each covered GPU should have (zero counts dropped), and coverage problems."""
    wanted: dict[int, dict[str, int]] = {}
    source: dict[int, int] = {}
    problems = []
    for number, entry in enumerate(entries):
        for gpu in gpus:
            if not entry.covers(gpu.index, gpu.pci_device_id):
                continue
            if gpu.index in source:
                problems.append(
                    f"{_label(gpu)} is covered by entries {source[gpu.index]} and {number}; "
                    "give each GPU one entry"
                )
                continue
            source[gpu.index] = number
            wanted[gpu.index] = {t: n for t, n in entry.vgpu_devices.items() if n > 0}
    return wanted, problems


def capacity(gpu: Gpu, short_name: str) -> int | None:
    """How many vGPUs of a type fit on an otherwise empty GPU (None: not known in advance)."""
    info = gpu.type_info(short_name)
    limits = [] if info is None or info.max_instances is None else [info.max_instances]
    if gpu.framework in ("mdev-sriov", "vendor-vfio"):
        limits.append(len(gpu.parents))
    return min(limits) if limits else None


def plan(gpus: Sequence[Gpu], entries: Sequence[cfg.Entry]) -> Plan:
    """What to change so that the covered GPUs have the config's vGPUs (PlanError otherwise)."""
    wanted, problems = wanted_per_gpu(gpus, entries)
    changes = []
    for gpu in gpus:
        if gpu.index not in wanted:
            continue
        want = wanted[gpu.index]
        if want and gpu.framework is None:
            problems.append(
                f"{_label(gpu)} offers no vGPU types: the vGPU host driver is not loaded, or "
                "the GPU does not support vGPU"
            )
            continue
        unsupported = sorted(t for t in want if gpu.type_info(t) is None)
        if unsupported:
            offered = ", ".join(t.short_name for t in gpu.types) or "none"
            for name in unsupported:
                extra = " (MIG-backed vGPU types are not simulated)" if cfg.mig_backed(name) else ""
                problems.append(
                    f"vGPU type {name} is not supported on {_label(gpu)}{extra}; "
                    f"supported: {offered}"
                )
            continue
        if len(want) > 1:
            problems.append(
                f"{_label(gpu)}: {' and '.join(sorted(want))} requested; the time-sliced "
                "vGPUs of one GPU must all be of one type"
            )
            continue
        short_of = [
            f"{_label(gpu)}: {count} x {name} requested, at most {limit} fit"
            for name, count in want.items()
            if (limit := capacity(gpu, name)) is not None and count > limit
        ]
        if short_of:
            problems += short_of
            continue
        if gpu.current() != want:
            changes.append(Change(gpu, want, tuple(sorted(want.items()))))
    if problems:
        raise PlanError("; ".join(problems))
    return Plan(tuple(changes), tuple(sorted(wanted)))


def describe(plan_: Plan) -> list[str]:
    """One line per changed GPU, for logs and Events."""
    lines = []
    for change in plan_.changes:
        target = ", ".join(f"{n} x {t}" for t, n in change.create) or "no vGPUs"
        lines.append(f"GPU {change.gpu.index} ({change.gpu.address}): {target}")
    return lines
