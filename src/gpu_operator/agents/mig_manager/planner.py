"""State in, plan out: from the GPUs' MIG mode and instances and a selected config, what to change
on each GPU (mode, instances to destroy, instances to create at which placements), and `assert`.

Better than upstream: a GPU whose mode and devices already match is left alone (its instances and
the pods using them keep running), and only GPUs whose mode changes are reset, one by one, instead
of every GPU of the node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpu_operator.agents.mig_manager import config as cfg
from gpu_operator.agents.mig_manager import layout, profiles
from gpu_operator.agents.mig_manager.layout import Layout
from gpu_operator.agents.mig_manager.profiles import Profile
from gpu_operator.nvml import catalog


class PlanError(ValueError):
    """The selected config cannot be applied to these GPUs; the message names config and entry."""


@dataclass(frozen=True)
class GpuState:
    """One GPU as NVML reports it (mode, and the instances when MIG is on)."""

    index: int
    model: catalog.GpuModel
    mig_enabled: bool = False
    mig_pending: bool = False
    instances: Layout = ()
    pci_device_id: int = 0
    pci_subsystem_id: int = 0

    @property
    def mig_capable(self) -> bool:
        return self.model.mig_capable

    @property
    def devices(self) -> dict[str, int]:
        return layout.counts(self.instances) if self.mig_enabled else {}


@dataclass(frozen=True)
class Desired:
    """What one GPU should look like and which config entry said so."""

    mig_enabled: bool
    devices: Mapping[Profile, int]
    entry: int

    @property
    def device_names(self) -> dict[str, int]:
        return {p.name: n for p, n in self.devices.items() if n > 0}


def desired_state(
    name: str, entries: Sequence[cfg.Entry], gpus: Sequence[GpuState]
) -> dict[int, Desired]:
    """Per GPU index, the last entry of config `name` that covers it (GPUs none covers: absent).

    As in mig-parted, an entry for `devices: all` (or one disabling MIG) skips GPUs that are not
    MIG capable, while naming such a GPU explicitly to enable MIG on it is an error. Unlike
    mig-parted, which skips them silently, an index the node does not have is an error too: the
    config was written for other hardware, and applying the rest would report success for a
    layout the admin did not ask for.
    """
    _check_indices(name, entries, gpus)
    out: dict[int, Desired] = {}
    for entry in entries:
        for gpu in gpus:
            device_id = gpu.pci_device_id or gpu.model.pci_device_id
            if not entry.covers(gpu.index, device_id, gpu.pci_subsystem_id):
                continue
            if not gpu.mig_capable:
                if entry.devices == cfg.ALL or not entry.mig_enabled:
                    continue
                raise PlanError(
                    f"mig-configs.{name}[{entry.index}]: GPU {gpu.index} ({gpu.model.key}) "
                    "is not MIG capable"
                )
            out[gpu.index] = Desired(entry.mig_enabled, entry.wanted, entry.index)
    return out


def _check_indices(name: str, entries: Sequence[cfg.Entry], gpus: Sequence[GpuState]) -> None:
    present = {gpu.index for gpu in gpus}
    for entry in entries:
        if entry.devices == cfg.ALL:
            continue
        missing = sorted({i for i in entry.devices if i not in present})
        if not missing:
            continue
        label = "GPU index" if len(missing) == 1 else "GPU indices"
        verb = "does" if len(missing) == 1 else "do"
        shown = ", ".join(map(str, missing))
        if not gpus:
            has = "this node has no GPUs"
        else:
            count = f"{len(gpus)} GPU" + ("s" if len(gpus) > 1 else "")
            has = f"this node has {count} (indices {_ranges(sorted(present))})"
        raise PlanError(
            f"mig-configs.{name}[{entry.index}].devices: {label} {shown} {verb} not exist: {has}"
        )


@dataclass(frozen=True)
class GpuPlan:
    """What to do on one GPU; `changes` is False when it already matches (then nothing runs)."""

    index: int
    model: str
    current_enabled: bool
    current_pending: bool
    current: Mapping[str, int]
    target_enabled: bool
    target: Layout
    destroy: Layout
    set_mode: bool | None
    changes: bool

    @property
    def needs_reset(self) -> bool:
        """The mode only takes effect after a GPU reset (pending until then)."""
        return self.changes and self.current_enabled != self.target_enabled

    @property
    def target_devices(self) -> dict[str, int]:
        return layout.counts(self.target) if self.target_enabled else {}

    def summary(self) -> str:
        return f"GPU {self.index} {self.change()}"

    def change(self) -> str:
        """`(model): before -> after`, the summary without the GPU index."""

        def state(enabled: bool, devices: Mapping[str, int]) -> str:
            return f"MIG on, {layout.describe(devices)}" if enabled else "MIG off"

        before = state(self.current_enabled, self.current)
        if not self.changes:
            return f"({self.model}): {before}, unchanged"
        after = state(self.target_enabled, self.target_devices)
        reset = " (mode change: GPU reset)" if self.needs_reset else ""
        return f"({self.model}): {before} -> {after}{reset}"


@dataclass(frozen=True)
class NodePlan:
    config: str
    gpus: tuple[GpuPlan, ...]

    @property
    def changed(self) -> tuple[GpuPlan, ...]:
        return tuple(g for g in self.gpus if g.changes)

    @property
    def applied(self) -> bool:
        """mig-parted's `assert`: every GPU the config covers already matches."""
        return not self.changed

    @property
    def mode_change(self) -> bool:
        """mig-parted's `assert --mode-only` failing: some GPU must change MIG mode."""
        return any(g.needs_reset or g.set_mode is not None for g in self.changed)


def summarize(plans: Sequence[GpuPlan]) -> str:
    """GPUs with the same change on one line: `GPUs 0-3, 6 (A100-SXM4-40GB): MIG off -> ...`."""
    groups: dict[str, list[int]] = {}
    for p in plans:
        groups.setdefault(p.change(), []).append(p.index)
    parts = []
    for change, indices in groups.items():
        label = "GPU" if len(indices) == 1 else "GPUs"
        parts.append(f"{label} {_ranges(indices)} {change}")
    return "; ".join(parts)


def _ranges(indices: Sequence[int]) -> str:
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def plan_gpu(gpu: GpuState, enabled: bool, target: Layout) -> GpuPlan:
    """The steps from `gpu` to MIG `enabled` with `target` instances (ignored when disabled)."""
    target = target if enabled else ()
    mode_ok = gpu.mig_enabled == enabled and gpu.mig_pending == enabled
    devices_ok = not enabled or layout.counts(target) == gpu.devices
    changes = not (mode_ok and devices_ok)
    return GpuPlan(
        index=gpu.index,
        model=gpu.model.key,
        current_enabled=gpu.mig_enabled,
        current_pending=gpu.mig_pending,
        current=gpu.devices,
        target_enabled=enabled,
        target=target,
        destroy=gpu.instances if changes and gpu.mig_enabled else (),
        set_mode=enabled if changes and gpu.mig_pending != enabled else None,
        changes=changes,
    )


def plan_node(name: str, entries: Sequence[cfg.Entry], gpus: Sequence[GpuState]) -> NodePlan:
    """The plan for config `name`; PlanError names the entry and GPU that cannot be satisfied."""
    desired = desired_state(name, entries, gpus)
    plans = []
    for gpu in gpus:
        want = desired.get(gpu.index)
        if want is None:
            continue
        target: Layout = ()
        if want.mig_enabled:
            try:
                target = layout.place(gpu.model, want.devices)
            except (profiles.ProfileError, layout.PlacementError) as err:
                raise PlanError(
                    f"mig-configs.{name}[{want.entry}]: GPU {gpu.index} ({gpu.model.key}): {err}"
                ) from None
        plans.append(plan_gpu(gpu, want.mig_enabled, target))
    return NodePlan(name, tuple(plans))


def plan_restore(previous: Sequence[GpuState], now: Sequence[GpuState]) -> NodePlan:
    """The plan that puts every GPU that differs back to its `previous` mode and instances."""
    before = {g.index: g for g in previous}
    plans = []
    for gpu in now:
        old = before.get(gpu.index)
        if old is None or not old.mig_capable:
            continue
        plans.append(plan_gpu(gpu, old.mig_enabled, old.instances))
    return NodePlan("previous layout", tuple(plans))


def verify(plan: NodePlan, gpus: Sequence[GpuState]) -> list[str]:
    """What still differs from the plan's targets after applying it (empty: all as planned)."""
    found = {g.index: g for g in gpus}
    problems = []
    for p in plan.gpus:
        gpu = found.get(p.index)
        if gpu is None:
            problems.append(f"GPU {p.index} is gone")
            continue
        if gpu.mig_enabled != p.target_enabled:
            want = "enabled" if p.target_enabled else "disabled"
            problems.append(f"GPU {p.index}: MIG mode is not {want}")
        elif gpu.devices != p.target_devices:
            problems.append(
                f"GPU {p.index}: has {layout.describe(gpu.devices)}, expected "
                f"{layout.describe(p.target_devices)}"
            )
    return problems
