"""MIG profile strings as mig-parted spells them (`1g.5gb`, `1c.7g.40gb`, `1g.5gb+me`), and their
meaning on one GPU model (its GPU-instance and compute-instance profiles from the catalog)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpu_operator.nvml import catalog

# [<C>c.]<G>g.<GB>gb, then optionally +attr[,attr...] or -me (mig-parted's grammar).
_PROFILE = re.compile(
    r"^(?:(?P<c>[1-9][0-9]*)c\.)?(?P<g>[1-9][0-9]*)g\.(?P<gb>[1-9][0-9]*)gb"
    r"(?P<suffix>(?:\+[a-z][a-z.]*(?:,[a-z][a-z.]*)*)|-me)?$"
)
_KNOWN_ATTRIBUTES = frozenset({"me", "me.all", "gfx"})


class ProfileError(ValueError):
    """A profile string that does not parse, or that a GPU model does not have."""


@dataclass(frozen=True, order=True)
class Profile:
    """A parsed MIG device profile: C compute slices in a G-slice GPU instance of GB gigabytes."""

    gpu_slices: int
    compute_slices: int
    memory_gb: int
    suffix: str = ""

    @property
    def gpu_instance_name(self) -> str:
        """The GPU-instance part, e.g. `7g.40gb` for `1c.7g.40gb`."""
        return f"{self.gpu_slices}g.{self.memory_gb}gb{self.suffix}"

    @property
    def name(self) -> str:
        prefix = f"{self.compute_slices}c." if self.compute_slices != self.gpu_slices else ""
        return prefix + self.gpu_instance_name

    @property
    def whole_instance(self) -> bool:
        """One compute instance spanning its GPU instance (the only kind exported as resources)."""
        return self.compute_slices == self.gpu_slices

    def __str__(self) -> str:
        return self.name


def parse(text: str) -> Profile:
    """Parse a profile string; `7c.7g.40gb` normalises to `7g.40gb`."""
    match = _PROFILE.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ProfileError(
            f"{text!r} is not a MIG profile (expected [<C>c.]<G>g.<GB>gb with an optional "
            "+me, +me.all, +gfx or -me, e.g. 1g.5gb, 1c.7g.40gb, 1g.5gb+me)"
        )
    g = int(match["g"])
    c = int(match["c"]) if match["c"] else g
    if c > g:
        raise ProfileError(
            f"{text!r}: a compute instance cannot have more slices ({c}c) than its GPU "
            f"instance ({g}g)"
        )
    suffix = match["suffix"] or ""
    if suffix.startswith("+"):
        attributes = suffix[1:].split(",")
        unknown = [a for a in attributes if a not in _KNOWN_ATTRIBUTES]
        if unknown:
            raise ProfileError(
                f"{text!r}: unknown attribute {unknown[0]!r} (known: "
                f"{', '.join(sorted(_KNOWN_ATTRIBUTES))})"
            )
        suffix = "+" + ",".join(sorted(set(attributes)))
    return Profile(g, c, int(match["gb"]), suffix)


@dataclass(frozen=True)
class Resolved:
    """A profile as one GPU model implements it: its GPU- and compute-instance profiles."""

    profile: Profile
    gpu_instance: catalog.MigProfile
    compute_instance: catalog.ComputeProfile


def known_names(model: catalog.GpuModel) -> list[str]:
    """The profile strings a model accepts, whole instances first (for error messages)."""
    whole = [p.name for p in model.mig_profiles]
    split = [
        f"{ci.slice_count}c.{p.name}"
        for p in model.mig_profiles
        for ci in p.compute_profiles
        if ci.slice_count != p.slice_count
    ]
    return whole + split


def resolve(profile: Profile, model: catalog.GpuModel) -> Resolved:
    """The model's profiles behind `profile`; ProfileError lists what the model has instead."""
    gi = next((p for p in model.mig_profiles if p.name == profile.gpu_instance_name), None)
    ci_id = catalog.CI_PROFILE_BY_SLICES.get(profile.compute_slices)
    ci = gi.compute_profile(ci_id) if gi is not None and ci_id is not None else None
    if gi is None or ci is None:
        if not model.mig_capable:
            raise ProfileError(f"{model.key} is not MIG capable")
        whole = ", ".join(p.name for p in model.mig_profiles)
        raise ProfileError(
            f"{model.key} has no MIG profile {profile.name!r}; its profiles are {whole} "
            "(compute-instance forms such as 1c.<profile> split a GPU instance)"
        )
    return Resolved(profile, gi, ci)


def name_of(gi: catalog.MigProfile, ci_slices: int) -> str:
    """The profile string of a compute instance with `ci_slices` slices inside a `gi` instance."""
    prefix = f"{ci_slices}c." if ci_slices != gi.slice_count else ""
    return prefix + gi.name
