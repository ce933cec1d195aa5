"""MIG layouts of one GPU (GPU instances at placements, compute instances inside them) and the
placement search that turns wanted profile counts into a layout the GPU can hold.

The search follows NVML's rules as the catalog records them: a GPU instance occupies memory slices
`[start, start + size)` at one of its profile's placements and may not overlap another; each
profile has an instance cap; only one `+me` instance owns the media engines; the compute slices
of all instances fit the GPU. mig-parted tries orderings of the wanted profiles and lets NVML pick
the first free placement; this search tries, largest first, every placement of every instance
(so it finds a layout whenever one exists, and the one mig-parted's first ordering would find
when that ordering works), then hands NVML explicit placements.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpu_operator.agents.mig_manager import profiles
from gpu_operator.agents.mig_manager.profiles import Profile
from gpu_operator.nvml import catalog
from gpu_operator.nvml.catalog import Placement


class PlacementError(ValueError):
    """Wanted profiles that cannot be placed together on a GPU; the message says why."""


@dataclass(frozen=True)
class ComputeInstance:
    slices: int
    placement: Placement
    id: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class GpuInstance:
    """A GPU instance of `profile` at `placement`, with its compute instances."""

    profile: catalog.MigProfile
    placement: Placement
    compute: tuple[ComputeInstance, ...]
    id: int | None = field(default=None, compare=False)

    def device_names(self) -> list[str]:
        """The MIG device profile of each compute instance (`3g.20gb`, `1c.3g.20gb`, ...)."""
        return [profiles.name_of(self.profile, ci.slices) for ci in self.compute]


Layout = tuple[GpuInstance, ...]


def counts(layout: Iterable[GpuInstance]) -> dict[str, int]:
    """Profile string -> number of MIG devices, as mig-parted's export and assert see a GPU."""
    found: Counter[str] = Counter()
    for gi in layout:
        found.update(gi.device_names())
    return dict(found)


def describe(wanted: Mapping[str, int]) -> str:
    """`3g.20gb x2, 1g.5gb x1` (largest first), or `no MIG devices`."""
    if not wanted:
        return "no MIG devices"
    ordered = sorted(wanted.items(), key=lambda kv: (-_slices(kv[0]), kv[0]))
    return ", ".join(f"{name} x{n}" for name, n in ordered)


def _slices(name: str) -> int:
    try:
        return profiles.parse(name).gpu_slices
    except profiles.ProfileError:
        return 0


@dataclass
class _PendingGi:
    resolved: profiles.Resolved
    compute: list[ComputeInstance]


# No GPU holds more MIG devices than it has compute slices (7); counts far beyond are refused
# before one instance per device is laid out (a typo of 70000 must not stall the manager).
_MAX_DEVICES = 64


def place(model: catalog.GpuModel, wanted: Mapping[Profile, int]) -> Layout:
    """A layout holding exactly `wanted` on a GPU of `model`; PlacementError says why not."""
    wanted = {p: n for p, n in wanted.items() if n > 0}
    resolved = {p: profiles.resolve(p, model) for p in wanted}
    total = sum(wanted.values())
    if total > _MAX_DEVICES:
        raise PlacementError(
            f"{total} MIG devices asked for; {model.key} holds at most {model.mig_compute_slices}"
        )
    pending = _group(resolved, wanted)
    _check_totals(model, pending, wanted)
    ordered = sorted(
        pending, key=lambda g: (-g.resolved.gpu_instance.slice_count, g.resolved.gpu_instance.name)
    )
    chosen: list[Placement] = []
    if not _search(ordered, 0, chosen, []):
        raise PlacementError(
            f"{describe({p.name: n for p, n in wanted.items()})} cannot be placed together on "
            f"{model.key}: every arrangement of their GPU instances overlaps in memory slices"
        )
    return tuple(
        GpuInstance(g.resolved.gpu_instance, pl, tuple(g.compute))
        for g, pl in zip(ordered, chosen, strict=True)
    )


def _group(
    resolved: Mapping[Profile, profiles.Resolved], wanted: Mapping[Profile, int]
) -> list[_PendingGi]:
    """One GPU instance per whole-instance device; split devices share instances of their size.

    Split devices are packed first-fit, largest compute instance first, into instances of their
    GPU-instance profile (mig-parted fills the last instance of the same profile the same way).
    """
    out: list[_PendingGi] = []
    split: dict[str, list[_PendingGi]] = {}
    order = sorted(wanted, key=lambda p: (-p.gpu_slices, -p.compute_slices, p.name))
    for profile in order:
        r = resolved[profile]
        for _ in range(wanted[profile]):
            if profile.whole_instance:
                ci = r.compute_instance
                out.append(_PendingGi(r, [ComputeInstance(ci.slice_count, ci.placements[0])]))
                continue
            bins = split.setdefault(r.gpu_instance.name, [])
            for gi in bins:
                spot = _ci_spot(gi, r.compute_instance)
                if spot is not None:
                    gi.compute.append(ComputeInstance(r.compute_instance.slice_count, spot))
                    break
            else:
                fresh = _PendingGi(r, [])
                spot = _ci_spot(fresh, r.compute_instance)
                if spot is None:  # cannot happen for a catalogued profile; keep the error clear
                    raise PlacementError(
                        f"{profile} does not fit in an empty {r.gpu_instance.name}"
                    )
                fresh.compute.append(ComputeInstance(r.compute_instance.slice_count, spot))
                bins.append(fresh)
                out.append(fresh)
    return out


def _ci_spot(gi: _PendingGi, ci: catalog.ComputeProfile) -> Placement | None:
    same = sum(1 for c in gi.compute if c.slices == ci.slice_count)
    used = sum(c.slices for c in gi.compute)
    if same >= ci.instance_count or used + ci.slice_count > gi.resolved.gpu_instance.slice_count:
        return None
    taken = [c.placement for c in gi.compute]
    return next((pl for pl in ci.placements if not any(pl.overlaps(t) for t in taken)), None)


def _check_totals(
    model: catalog.GpuModel, pending: Sequence[_PendingGi], wanted: Mapping[Profile, int]
) -> None:
    """The limits NVML reports with specific errors, checked first for specific messages."""
    per_profile = Counter(g.resolved.gpu_instance.name for g in pending)
    for name, n in per_profile.items():
        gi = model.mig_profile(name)
        if n > gi.instance_count:
            raise PlacementError(
                f"{model.key} holds at most {gi.instance_count} {name} GPU instance(s); "
                f"{describe({p.name: c for p, c in wanted.items()})} needs {n}"
            )
    media = sum(1 for g in pending if g.resolved.gpu_instance.media_extensions)
    if media > 1:
        raise PlacementError(
            f"{model.key}: only one +me GPU instance can own the media engines; {media} wanted"
        )
    slices = sum(g.resolved.gpu_instance.slice_count for g in pending)
    if slices > model.mig_compute_slices:
        raise PlacementError(
            f"{describe({p.name: c for p, c in wanted.items()})} needs {slices} compute slices; "
            f"{model.key} has {model.mig_compute_slices}"
        )


def _search(
    ordered: Sequence[_PendingGi], i: int, chosen: list[Placement], taken: list[Placement]
) -> bool:
    if i == len(ordered):
        return True
    gi = ordered[i].resolved.gpu_instance
    # Identical instances are interchangeable: place them in increasing order only.
    floor = -1
    previous = ordered[i - 1] if i > 0 else None
    if (
        previous is not None
        and previous.resolved.gpu_instance is gi
        and previous.compute == ordered[i].compute
    ):
        floor = chosen[i - 1].start
    for candidate in gi.placements:
        if candidate.start <= floor or any(candidate.overlaps(t) for t in taken):
            continue
        chosen.append(candidate)
        taken.append(candidate)
        if _search(ordered, i + 1, chosen, taken):
            return True
        chosen.pop()
        taken.pop()
    return False
