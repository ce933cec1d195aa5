"""The profile name of a MIG device (`1g.10gb`, `1c.3g.20gb`, `1g.10gb+me`), read as go-nvlib
reads it.

NVML reports a GPU instance's profile by its *internal* id (`nvidia-smi mig -lgip`'s ID column:
19 for 1g, 20 for 1g+me, 15 for the double-memory 1g on an H100), not by the
nvmlGpuInstanceProfile* enum the attribute suffixes belong to. The enum is found by asking NVML
for every enum's profile info and matching its `id`; the slices and memory come from the MIG
device's attributes, as go-nvlib's `MigProfile` takes them.
"""

from __future__ import annotations

from gpu_operator.nvml import catalog, errors
from gpu_operator.nvml import protocol as p


def profile_enums(parent: p.Device) -> dict[int, int]:
    """NVML's internal GPU-instance profile id -> the enum, for the profiles `parent` offers."""
    found: dict[int, int] = {}
    for enum in range(catalog.GI_PROFILE_COUNT):
        try:
            info = parent.gpu_instance_profile_info(enum)
        except (errors.NotSupported, errors.InvalidArgument):
            continue  # a profile this GPU or driver does not have
        found.setdefault(info.id, enum)
    return found


class UnknownProfile(errors.NvmlError):
    """A GPU instance whose profile id matches none of the profiles NVML lists for the GPU."""


def device_profile(
    parent: p.Device,
    mig: p.Device,
    total_mib: int,
    enums: dict[int, int] | None = None,
    attributes: p.MigDeviceAttributes | None = None,
) -> str:
    """The MIG device's profile name; `enums` (from `profile_enums`) saves the per-GPU lookup.

    Raises NoPermission where NVML keeps GPU instances from unprivileged callers.
    """
    attrs = attributes or mig.mig_attributes()
    internal = parent.gpu_instance_by_id(mig.gpu_instance_id()).info().profile_id
    table = enums if enums is not None else profile_enums(parent)
    enum = table.get(internal)
    if enum is None:
        raise UnknownProfile(
            f"GPU instance profile id {internal} is none of the profiles NVML lists for this GPU "
            f"(ids {sorted(table)})"
        )
    return catalog.mig_profile_name(
        attrs.gpu_instance_slice_count,
        attrs.compute_instance_slice_count,
        attrs.memory_size_mb,
        total_mib,
        suffix=catalog.profile_suffix(enum),
    )
