"""The GPU model catalog: static facts per model, including MIG profiles and their placements.

Pure data (standard library only) so that planners such as the MIG manager operand can read it
without pulling in NVML. Memory values are MiB; profile names follow the NVML/mig-parted naming rule
implemented by `mig_profile_name`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# NVML GPU-instance profile ids (nvmlGpuInstanceProfile*).
GI_PROFILE_1_SLICE = 0
GI_PROFILE_2_SLICE = 1
GI_PROFILE_3_SLICE = 2
GI_PROFILE_4_SLICE = 3
GI_PROFILE_7_SLICE = 4
GI_PROFILE_8_SLICE = 5
GI_PROFILE_6_SLICE = 6
GI_PROFILE_1_SLICE_REV1 = 7  # 1g with all media engines (+me)
GI_PROFILE_2_SLICE_REV1 = 8  # 2g with all media engines (+me)
GI_PROFILE_1_SLICE_REV2 = 9  # 1g with double memory
GI_PROFILE_1_SLICE_GFX = 10  # graphics-capable instances (RTX PRO 6000 Blackwell): +gfx
GI_PROFILE_2_SLICE_GFX = 11
GI_PROFILE_4_SLICE_GFX = 12
GI_PROFILE_1_SLICE_NO_ME = 13  # instances without media engines: -me
GI_PROFILE_2_SLICE_NO_ME = 14
GI_PROFILE_1_SLICE_ALL_ME = 15  # instances owning every media engine: +me.all
GI_PROFILE_2_SLICE_ALL_ME = 16
GI_PROFILE_3_SLICE_GFX = 17
GI_PROFILE_COUNT = 18

# NVML compute-instance profile ids by compute-slice count.
CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
CI_PROFILE_COUNT = 9
CI_ENGINE_PROFILE_SHARED = 0

# NVML addresses profiles by an *internal* id, the ID column of `nvidia-smi mig -lgip`, which
# `nvmlGpuInstanceGetInfo().profileId` returns and which `nvmlDeviceGetGpuInstanceProfileInfo(enum)`
# reports as `.id`; it is not the enum above. 7-slice GPUs (published lgip of H100 NVL, H200,
# GH200, B200, GB200; A100 alike): 1g 19, 1g+me 20, 1g double memory 15, 2g 14, 3g 9, 4g 5, 7g 0.
SEVEN_SLICE_NVML_IDS = {
    GI_PROFILE_1_SLICE: 19,
    GI_PROFILE_1_SLICE_REV1: 20,
    GI_PROFILE_1_SLICE_REV2: 15,
    GI_PROFILE_2_SLICE: 14,
    GI_PROFILE_3_SLICE: 9,
    GI_PROFILE_4_SLICE: 5,
    GI_PROFILE_7_SLICE: 0,
}
# 4-slice GPUs (A30; RTX PRO 6000's published 1g 14 and 1g+me 21 follow the same table).
FOUR_SLICE_NVML_IDS = {
    GI_PROFILE_1_SLICE: 14,
    GI_PROFILE_1_SLICE_REV1: 21,
    GI_PROFILE_2_SLICE: 5,
    GI_PROFILE_2_SLICE_REV1: 6,
    GI_PROFILE_4_SLICE: 0,
}
# RTX PRO 6000 Blackwell: 1g+gfx 47 and 1g+me.all 65 are published (lgip in cubecos#312 and
# GoogleCloudPlatform/container-engine-accelerators#564); the other attribute variants' ids are
# unpublished, chosen here only to be distinct (nothing may depend on their exact values).
RTX_PRO_NVML_IDS = {
    **FOUR_SLICE_NVML_IDS,
    GI_PROFILE_1_SLICE_GFX: 47,
    GI_PROFILE_1_SLICE_ALL_ME: 65,
    GI_PROFILE_1_SLICE_NO_ME: 66,
    GI_PROFILE_2_SLICE_GFX: 35,
    GI_PROFILE_2_SLICE_NO_ME: 67,
    GI_PROFILE_2_SLICE_ALL_ME: 68,
    GI_PROFILE_4_SLICE_GFX: 32,
}
# The first driver branch that offers a profile, where it came later than the GPU (NVML change
# log: +me in R470, graphics profiles in R570, -me/+me.all in R575; MIG user guide: A30's
# 2g.12gb+me from R525). Older drivers answer NOT_SUPPORTED for the profile.
PROFILE_MIN_BRANCH = {
    GI_PROFILE_1_SLICE_REV1: 470,
    GI_PROFILE_1_SLICE_GFX: 570,
    GI_PROFILE_2_SLICE_GFX: 570,
    GI_PROFILE_4_SLICE_GFX: 570,
    GI_PROFILE_3_SLICE_GFX: 595,
    GI_PROFILE_1_SLICE_NO_ME: 575,
    GI_PROFILE_2_SLICE_NO_ME: 575,
    GI_PROFILE_1_SLICE_ALL_ME: 575,
    GI_PROFILE_2_SLICE_ALL_ME: 575,
}

MEDIA_EXTENSION_PROFILES = frozenset({GI_PROFILE_1_SLICE_REV1, GI_PROFILE_2_SLICE_REV1})
# Profiles that take the GPU's shared media engines for themselves: at most one per GPU.
MEDIA_OWNER_PROFILES = MEDIA_EXTENSION_PROFILES | {
    GI_PROFILE_1_SLICE_ALL_ME,
    GI_PROFILE_2_SLICE_ALL_ME,
}
# The attribute suffix NVML tools append to a GPU-instance profile's name, by profile id.
PROFILE_SUFFIX = {
    GI_PROFILE_1_SLICE_REV1: "+me",
    GI_PROFILE_2_SLICE_REV1: "+me",
    GI_PROFILE_1_SLICE_GFX: "+gfx",
    GI_PROFILE_2_SLICE_GFX: "+gfx",
    GI_PROFILE_3_SLICE_GFX: "+gfx",
    GI_PROFILE_4_SLICE_GFX: "+gfx",
    GI_PROFILE_1_SLICE_NO_ME: "-me",
    GI_PROFILE_2_SLICE_NO_ME: "-me",
    GI_PROFILE_1_SLICE_ALL_ME: "+me.all",
    GI_PROFILE_2_SLICE_ALL_ME: "+me.all",
}

PCI_CLASS_VGA = 0x0300
PCI_CLASS_3D = 0x0302
NVIDIA_VENDOR_ID = 0x10DE


@dataclass(frozen=True)
class Placement:
    """A contiguous range of slices: `[start, start + size)`."""

    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size

    def overlaps(self, other: Placement) -> bool:
        return self.start < other.end and other.start < self.end


@dataclass(frozen=True)
class ComputeProfile:
    """A compute-instance profile inside one GPU-instance profile.

    `nvml_id` is the profile's internal id (`nvidia-smi mig -lcip`); published lcip listings show
    the enum values 0..4 there, so it equals `profile_id` for every catalogued GPU.
    """

    profile_id: int
    slice_count: int
    instance_count: int
    multiprocessor_count: int
    placements: tuple[Placement, ...]

    @property
    def nvml_id(self) -> int:
        return self.profile_id


@dataclass(frozen=True)
class MigProfile:
    """A GPU-instance profile: slices, memory, SMs, engines, instance cap and valid placements."""

    profile_id: int
    name: str
    slice_count: int
    memory_mb: int
    multiprocessor_count: int
    instance_count: int
    placements: tuple[Placement, ...]
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int
    compute_profiles: tuple[ComputeProfile, ...]
    p2p_supported: bool = False
    # NVML's internal id of the profile (see SEVEN_SLICE_NVML_IDS); -1 where unknown.
    nvml_id: int = -1
    # The first driver branch that offers the profile (0: every driver that knows the GPU).
    min_driver_branch: int = 0

    @property
    def media_extensions(self) -> bool:
        """The instance owns the shared media engines (`+me`, `+me.all`): one such per GPU."""
        return self.profile_id in MEDIA_OWNER_PROFILES

    @property
    def suffix(self) -> str:
        """The attribute part of the name: `+me`, `+me.all`, `+gfx`, `-me` or nothing."""
        return profile_suffix(self.profile_id)

    @property
    def resource_name(self) -> str:
        """The profile as it appears in resource and label names (`+` becomes `.`)."""
        return self.name.replace("+", ".")

    def compute_profile(self, profile_id: int) -> ComputeProfile | None:
        for profile in self.compute_profiles:
            if profile.profile_id == profile_id:
                return profile
        return None


@dataclass(frozen=True)
class GpuModel:
    """Static facts about one GPU model, as NVML reports them."""

    key: str
    nvml_name: str
    memory_mib: int
    compute_capability: tuple[int, int]
    architecture: str
    brand: str
    pci_device_id: int
    multiprocessor_count: int
    tdp_watts: int
    idle_watts: int
    max_sm_clock_mhz: int
    memory_clock_mhz: int
    nvlink_count: int = 0
    pci_class: int = PCI_CLASS_3D
    mig_compute_slices: int = 0
    mig_memory_slices: int = 0
    mig_profiles: tuple[MigProfile, ...] = field(default=())
    # PCI ids of other SKUs with this model's MIG profile names and placements (PCIe/NVL/OEM
    # variants that the default mig-parted config lists in one device filter).
    pci_aliases: tuple[int, ...] = ()
    # Framebuffer the driver and firmware keep for themselves (NVML memory v2 `reserved`); 0:
    # about 0.6% of the board, the order `nvidia-smi -q` shows on data-center GPUs.
    reserved_mib: int = 0
    # The oldest driver branch that runs the GPU, where that matters to the mock (0: older than
    # any driver it emulates).
    min_driver_branch: int = 0

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    @property
    def system_reserved_mib(self) -> int:
        return self.reserved_mib or self.memory_mib * 3 // 500

    def mig_profiles_for_branch(self, branch: int) -> tuple[MigProfile, ...]:
        """The profiles a driver of `branch` offers (every one for branch 0)."""
        if branch <= 0:
            return self.mig_profiles
        return tuple(p for p in self.mig_profiles if p.min_driver_branch <= branch)

    def mig_profile_by_nvml_id(self, nvml_id: int) -> MigProfile | None:
        for profile in self.mig_profiles:
            if profile.nvml_id == nvml_id:
                return profile
        return None

    @property
    def pci_device_id_hex(self) -> str:
        """The id as mig-parted device filters spell it, e.g. `0x20B010DE`."""
        return f"0x{self.pci_device_id:08X}"

    def mig_profile(self, name: str) -> MigProfile:
        """The GPU-instance profile called `name` (`1g.5gb`, `1g.5gb+me`, `1g.5gb.me`)."""
        for profile in self.mig_profiles:
            if name in (profile.name, profile.resource_name):
                return profile
        known = ", ".join(p.name for p in self.mig_profiles) or "none (not MIG capable)"
        raise KeyError(f"{self.key} has no MIG profile {name!r}; known profiles: {known}")

    def mig_profile_by_id(self, profile_id: int) -> MigProfile | None:
        for profile in self.mig_profiles:
            if profile.profile_id == profile_id:
                return profile
        return None


def profile_suffix(profile_id: int) -> str:
    """The name suffix of GPU-instance profile `profile_id` (`+me`, `+gfx`, ...; '' for plain)."""
    return PROFILE_SUFFIX.get(profile_id, "")


def mig_profile_name(
    gi_slices: int,
    ci_slices: int,
    memory_mb: int,
    total_memory_mib: int,
    media_extensions: bool = False,
    *,
    suffix: str | None = None,
) -> str:
    """Name a MIG profile the way NVML tools do: memory rounded up to eighths of the total GiB.

    `suffix` (from `profile_suffix`) wins over `media_extensions`, which only spells `+me`.
    """
    eighths = math.ceil(8 * memory_mb / total_memory_mib)
    total_gib = math.ceil(total_memory_mib / 1024)
    # Half-up rounding (Go's math.Round), not Python's banker's rounding: 70.5 GB -> 71gb.
    gb = (2 * eighths * total_gib + 8) // 16
    prefix = f"{ci_slices}c." if ci_slices != gi_slices else ""
    if suffix is None:
        suffix = "+me" if media_extensions else ""
    return f"{prefix}{gi_slices}g.{gb}gb{suffix}"


def compute_profiles(gi_slices: int, sm_per_slice: int, gi_sms: int) -> tuple[ComputeProfile, ...]:
    """The compute-instance profiles of a GPU instance of `gi_slices` compute slices."""
    # CIs tile the GI's compute slices on a grid of their own size; a 3-slice CI only fits the
    # 3- and 7-slice GIs, which is what NVML reports for A100-class parts.
    profiles = []
    for ci_slices in (1, 2, 3, 4, 7):
        if ci_slices > gi_slices or (ci_slices == 3 and gi_slices not in (3, 7)):
            continue
        starts = range(0, gi_slices - ci_slices + 1, ci_slices)
        placements = tuple(Placement(s, ci_slices) for s in starts)
        sms = gi_sms if ci_slices == gi_slices else sm_per_slice * ci_slices
        profiles.append(
            ComputeProfile(
                profile_id=CI_PROFILE_BY_SLICES[ci_slices],
                slice_count=ci_slices,
                instance_count=len(placements),
                multiprocessor_count=sms,
                placements=placements,
            )
        )
    return tuple(profiles)


@dataclass(frozen=True)
class _Row:
    profile_id: int
    slices: int
    memory_mb: int
    sms: int
    count: int
    starts: tuple[int, ...]
    size: int
    engines: tuple[int, int, int, int, int]  # copy, decoder, encoder, jpeg, ofa


def _profiles(
    total_mib: int,
    sm_per_slice: int,
    rows: list[_Row],
    nvml_ids: dict[int, int],
    min_branch: dict[int, int] | None = None,
) -> tuple[MigProfile, ...]:
    branches = PROFILE_MIN_BRANCH if min_branch is None else min_branch
    out = []
    for row in rows:
        suffix = profile_suffix(row.profile_id)
        ce, dec, enc, jpg, ofa = row.engines
        out.append(
            MigProfile(
                profile_id=row.profile_id,
                name=mig_profile_name(
                    row.slices, row.slices, row.memory_mb, total_mib, suffix=suffix
                ),
                slice_count=row.slices,
                memory_mb=row.memory_mb,
                multiprocessor_count=row.sms,
                instance_count=row.count,
                placements=tuple(Placement(s, row.size) for s in row.starts),
                copy_engines=ce,
                decoders=dec,
                encoders=enc,
                jpegs=jpg,
                ofas=ofa,
                compute_profiles=compute_profiles(row.slices, sm_per_slice, row.sms),
                nvml_id=nvml_ids.get(row.profile_id, -1),
                min_driver_branch=branches.get(row.profile_id, 0),
            )
        )
    return tuple(out)


def _seven_slice(
    total_mib: int,
    mem: tuple[int, int, int, int, int],
    sms: tuple[int, int, int, int, int, int],
    engines: dict[int, tuple[int, int, int, int, int]],
) -> tuple[MigProfile, ...]:
    """Profiles of a 7-compute/8-memory-slice GPU; mem = 1g, 1g double, 2g, 3g, 7g memory."""
    m1, m1d, m2, m3, m7 = mem
    s1, s1d, s2, s3, s4, s7 = sms
    return _profiles(
        total_mib,
        s1,
        [
            _Row(GI_PROFILE_1_SLICE, 1, m1, s1, 7, (0, 1, 2, 3, 4, 5, 6), 1, engines[0]),
            _Row(GI_PROFILE_1_SLICE_REV1, 1, m1, s1, 1, (0, 1, 2, 3, 4, 5, 6), 1, engines[7]),
            _Row(GI_PROFILE_1_SLICE_REV2, 1, m1d, s1d, 4, (0, 2, 4, 6), 2, engines[9]),
            _Row(GI_PROFILE_2_SLICE, 2, m2, s2, 3, (0, 2, 4), 2, engines[1]),
            _Row(GI_PROFILE_3_SLICE, 3, m3, s3, 2, (0, 4), 4, engines[2]),
            _Row(GI_PROFILE_4_SLICE, 4, m3, s4, 1, (0,), 4, engines[3]),
            _Row(GI_PROFILE_7_SLICE, 7, m7, s7, 1, (0,), 8, engines[4]),
        ],
        SEVEN_SLICE_NVML_IDS,
    )


_AMPERE_ENGINES = {
    0: (1, 0, 0, 0, 0),
    7: (1, 1, 0, 1, 1),
    9: (1, 1, 0, 0, 0),
    1: (2, 1, 0, 0, 0),
    2: (3, 2, 0, 0, 0),
    3: (4, 2, 0, 0, 0),
    4: (7, 5, 0, 1, 1),
}
_HOPPER_ENGINES = {
    0: (1, 1, 0, 1, 0),
    7: (1, 1, 0, 1, 1),
    9: (1, 1, 0, 1, 0),
    1: (2, 2, 0, 2, 0),
    2: (3, 3, 0, 3, 0),
    3: (4, 4, 0, 4, 0),
    4: (8, 7, 0, 7, 1),
}


def _a30_profiles() -> tuple[MigProfile, ...]:
    total = 24576
    return _profiles(
        total,
        14,
        [
            _Row(GI_PROFILE_1_SLICE, 1, 5836, 14, 4, (0, 1, 2, 3), 1, (1, 0, 0, 0, 0)),
            _Row(GI_PROFILE_1_SLICE_REV1, 1, 5836, 14, 1, (0, 1, 2, 3), 1, (1, 1, 0, 1, 1)),
            _Row(GI_PROFILE_2_SLICE, 2, 11672, 28, 2, (0, 2), 2, (2, 2, 0, 0, 0)),
            _Row(GI_PROFILE_2_SLICE_REV1, 2, 11672, 28, 1, (0, 2), 2, (2, 2, 0, 1, 1)),
            _Row(GI_PROFILE_4_SLICE, 4, 23344, 56, 1, (0,), 4, (4, 4, 0, 1, 1)),
        ],
        FOUR_SLICE_NVML_IDS,
        {**PROFILE_MIN_BRANCH, GI_PROFILE_2_SLICE_REV1: 525},
    )


def _rtx_pro_6000_profiles() -> tuple[MigProfile, ...]:
    """RTX PRO 6000 Blackwell: 4 slices, each size also as +gfx (graphics), -me (no media
    engines) and +me.all (every media engine); 1g also as +me. Memory per NVML (23.62 GiB per
    slice); engine counts are approximations (copy, decoder, encoder, jpeg, ofa)."""
    total = 97887
    m1, m2, m4 = 24187, 48640, 97536
    one, two, four = (0, 1, 2, 3), (0, 2), (0,)
    plain1, owner1, none1 = (1, 1, 1, 1, 0), (1, 1, 1, 1, 1), (1, 0, 0, 0, 0)
    all1, plain2, none2, all2 = (1, 4, 4, 4, 1), (2, 2, 2, 2, 0), (2, 0, 0, 0, 0), (2, 4, 4, 4, 1)
    full = (4, 4, 4, 4, 1)
    return _profiles(
        total,
        46,
        [
            _Row(GI_PROFILE_1_SLICE, 1, m1, 46, 4, one, 1, plain1),
            _Row(GI_PROFILE_1_SLICE_REV1, 1, m1, 46, 1, one, 1, owner1),
            _Row(GI_PROFILE_1_SLICE_GFX, 1, m1, 46, 4, one, 1, plain1),
            _Row(GI_PROFILE_1_SLICE_NO_ME, 1, m1, 46, 4, one, 1, none1),
            _Row(GI_PROFILE_1_SLICE_ALL_ME, 1, m1, 46, 1, one, 1, all1),
            _Row(GI_PROFILE_2_SLICE, 2, m2, 94, 2, two, 2, plain2),
            _Row(GI_PROFILE_2_SLICE_GFX, 2, m2, 94, 2, two, 2, plain2),
            _Row(GI_PROFILE_2_SLICE_NO_ME, 2, m2, 94, 2, two, 2, none2),
            _Row(GI_PROFILE_2_SLICE_ALL_ME, 2, m2, 94, 1, two, 2, all2),
            _Row(GI_PROFILE_4_SLICE, 4, m4, 188, 1, four, 4, full),
            _Row(GI_PROFILE_4_SLICE_GFX, 4, m4, 188, 1, four, 4, full),
        ],
        RTX_PRO_NVML_IDS,
    )


_BLACKWELL_ENGINES = {
    0: (2, 1, 0, 1, 0),
    7: (2, 1, 0, 1, 1),
    9: (2, 1, 0, 1, 0),
    1: (4, 2, 0, 2, 0),
    2: (6, 3, 0, 3, 0),
    3: (8, 4, 0, 4, 0),
    4: (16, 7, 0, 7, 1),
}

_MODELS: tuple[GpuModel, ...] = (
    GpuModel(
        key="A100-SXM4-40GB",
        nvml_name="NVIDIA A100-SXM4-40GB",
        memory_mib=40960,
        compute_capability=(8, 0),
        architecture="Ampere",
        brand="Nvidia",
        pci_device_id=0x20B010DE,
        multiprocessor_count=108,
        tdp_watts=400,
        idle_watts=55,
        max_sm_clock_mhz=1410,
        memory_clock_mhz=1215,
        pci_aliases=(0x20B110DE, 0x20F110DE, 0x20F610DE),
        nvlink_count=12,
        mig_compute_slices=7,
        mig_memory_slices=8,
        mig_profiles=_seven_slice(
            40960, (4864, 9856, 9856, 19968, 40192), (14, 14, 28, 42, 56, 98), _AMPERE_ENGINES
        ),
    ),
    GpuModel(
        key="A100-SXM4-80GB",
        nvml_name="NVIDIA A100-SXM4-80GB",
        memory_mib=81920,
        compute_capability=(8, 0),
        architecture="Ampere",
        brand="Nvidia",
        pci_device_id=0x20B210DE,
        multiprocessor_count=108,
        tdp_watts=400,
        idle_watts=60,
        max_sm_clock_mhz=1410,
        memory_clock_mhz=1593,
        pci_aliases=(0x20B510DE, 0x20F310DE, 0x20F510DE),
        nvlink_count=12,
        mig_compute_slices=7,
        mig_memory_slices=8,
        mig_profiles=_seven_slice(
            81920, (9856, 19968, 19968, 40192, 80384), (14, 14, 28, 42, 56, 98), _AMPERE_ENGINES
        ),
    ),
    GpuModel(
        key="H100-SXM5-80GB",
        nvml_name="NVIDIA H100 80GB HBM3",
        memory_mib=81559,
        compute_capability=(9, 0),
        architecture="Hopper",
        brand="Nvidia",
        pci_device_id=0x233010DE,
        multiprocessor_count=132,
        tdp_watts=700,
        idle_watts=70,
        max_sm_clock_mhz=1980,
        memory_clock_mhz=2619,
        pci_aliases=(0x233110DE, 0x232210DE, 0x232410DE),
        nvlink_count=18,
        mig_compute_slices=7,
        mig_memory_slices=8,
        mig_profiles=_seven_slice(
            81559, (9856, 19968, 19968, 40192, 80384), (16, 26, 32, 60, 64, 132), _HOPPER_ENGINES
        ),
    ),
    GpuModel(
        key="H200-141GB",
        nvml_name="NVIDIA H200",
        memory_mib=143771,
        compute_capability=(9, 0),
        architecture="Hopper",
        brand="Nvidia",
        pci_device_id=0x233510DE,
        multiprocessor_count=132,
        tdp_watts=700,
        idle_watts=75,
        max_sm_clock_mhz=1980,
        memory_clock_mhz=3201,
        pci_aliases=(0x233B10DE,),
        nvlink_count=18,
        mig_compute_slices=7,
        mig_memory_slices=8,
        mig_profiles=_seven_slice(
            143771,
            (16640, 33280, 33280, 66816, 135424),
            (16, 26, 32, 60, 64, 132),
            _HOPPER_ENGINES,
        ),
    ),
    GpuModel(
        key="B200",
        nvml_name="NVIDIA B200",
        memory_mib=183359,
        compute_capability=(10, 0),
        architecture="Blackwell",
        brand="Nvidia",
        pci_device_id=0x290110DE,
        multiprocessor_count=148,
        tdp_watts=1000,
        idle_watts=120,
        max_sm_clock_mhz=1965,
        memory_clock_mhz=3996,
        nvlink_count=18,
        mig_compute_slices=7,
        mig_memory_slices=8,
        mig_profiles=_seven_slice(
            183359,
            (22784, 45056, 45056, 90112, 180480),
            (18, 18, 36, 70, 72, 148),
            _HOPPER_ENGINES,
        ),
    ),
    # The GPUs below complete the default mig-parted config's targets. MIG memory sizes are
    # NVML's where published (`nvidia-smi mig -lgip` in NVIDIA's issue threads), otherwise
    # just under the eighth of the board the profile name states; each name follows from them.
    GpuModel(
        key="H100-NVL",
        nvml_name="NVIDIA H100 NVL",
        memory_mib=95830,
        compute_capability=(9, 0),
        architecture="Hopper",
        brand="Nvidia",
        pci_device_id=0x232110DE,
        pci_aliases=(0x233A10DE,),  # H800 NVL
        multiprocessor_count=132,
        tdp_watts=400,
        idle_watts=60,
        max_sm_clock_mhz=1785,
        memory_clock_mhz=2619,
        nvlink_count=6,
        mig_compute_slices=7,
        mig_memory_slices=8,
        mig_profiles=_seven_slice(
            95830, (11008, 22272, 22272, 47488, 95360), (16, 26, 32, 60, 64, 132), _HOPPER_ENGINES
        ),
    ),
    GpuModel(
        key="GH200-96GB",
        nvml_name="NVIDIA GH200 480GB",
        memory_mib=97871,
        compute_capability=(9, 0),
        architecture="Hopper",
        brand="Nvidia",
        pci_device_id=0x234210DE,
        # H100 96GB, PG506-96GB and H20 share the profile names and placements (the default
        # config filters them together); H20's SM counts are lower than modelled here.
        pci_aliases=(0x233D10DE, 0x20B610DE, 0x232910DE),
        multiprocessor_count=132,
        tdp_watts=900,
        idle_watts=90,
        max_sm_clock_mhz=1980,
        memory_clock_mhz=2619,
        nvlink_count=18,
        mig_compute_slices=7,
        mig_memory_slices=8,
        mig_profiles=_seven_slice(
            97871, (11776, 23808, 23808, 47872, 96256), (16, 26, 32, 60, 64, 132), _HOPPER_ENGINES
        ),
    ),
    GpuModel(
        key="GH200-144GB",
        nvml_name="NVIDIA GH200 144G HBM3e",
        memory_mib=146944,
        compute_capability=(9, 0),
        architecture="Hopper",
        brand="Nvidia",
        pci_device_id=0x234810DE,
        multiprocessor_count=132,
        tdp_watts=900,
        idle_watts=90,
        max_sm_clock_mhz=1980,
        memory_clock_mhz=2619,
        nvlink_count=18,
        mig_compute_slices=7,
        mig_memory_slices=8,
        # lgip: 1g.18gb 17.50 GiB (16 SMs), 1g.36gb and 2g.36gb 35.25 GiB (26 and 32 SMs).
        mig_profiles=_seven_slice(
            146944,
            (17920, 36096, 36096, 72192, 144384),
            (16, 26, 32, 60, 64, 132),
            _HOPPER_ENGINES,
        ),
    ),
    GpuModel(
        key="GB200-186GB",
        nvml_name="NVIDIA GB200",
        memory_mib=189471,
        compute_capability=(10, 0),
        architecture="Blackwell",
        brand="Nvidia",
        pci_device_id=0x294110DE,
        multiprocessor_count=152,
        tdp_watts=1200,
        idle_watts=150,
        max_sm_clock_mhz=2062,
        memory_clock_mhz=3996,
        nvlink_count=18,
        mig_compute_slices=7,
        mig_memory_slices=8,
        # lgip (mig-parted#227): 1g.23gb 22.00 GiB (18 SMs), 1g.47gb and 2g.47gb 45.50 GiB.
        mig_profiles=_seven_slice(
            189471,
            (22528, 46592, 46592, 93184, 186368),
            (18, 32, 38, 72, 76, 152),
            _BLACKWELL_ENGINES,
        ),
    ),
    GpuModel(
        # The same board as earlier drivers sized it (gpu-operator#1303: 1g.24gb 20.00 GiB,
        # 1g.47gb 45.50 GiB); the default config keeps its 3g.95gb, 4g.95gb and 7g.189gb.
        key="GB200-189GB",
        nvml_name="NVIDIA GB200",
        memory_mib=193024,
        compute_capability=(10, 0),
        architecture="Blackwell",
        brand="Nvidia",
        pci_device_id=0x294110DE,
        multiprocessor_count=152,
        tdp_watts=1200,
        idle_watts=150,
        max_sm_clock_mhz=2062,
        memory_clock_mhz=3996,
        nvlink_count=18,
        mig_compute_slices=7,
        mig_memory_slices=8,
        mig_profiles=_seven_slice(
            193024,
            (20480, 46592, 46592, 93184, 186368),
            (18, 32, 38, 72, 76, 152),
            _BLACKWELL_ENGINES,
        ),
    ),
    GpuModel(
        # MIG names 1g.34gb x7, 1g.67gb x4, 2g.67gb x3, 3g.135gb x2, 4g.135gb, 7g.269gb
        # (269 GiB usable of 288 GB HBM3e), PCI id 0x3182 as cloud providers' MIG configs list.
        key="B300",
        min_driver_branch=580,
        nvml_name="NVIDIA B300 SXM6 AC",
        memory_mib=275040,
        compute_capability=(10, 3),
        architecture="Blackwell",
        brand="Nvidia",
        pci_device_id=0x318210DE,
        multiprocessor_count=148,
        tdp_watts=1100,
        idle_watts=140,
        max_sm_clock_mhz=2032,
        memory_clock_mhz=3996,
        nvlink_count=18,
        mig_compute_slices=7,
        mig_memory_slices=8,
        mig_profiles=_seven_slice(
            275040,
            (33280, 66816, 66816, 134144, 268800),
            (18, 18, 36, 70, 72, 148),
            _BLACKWELL_ENGINES,
        ),
    ),
    GpuModel(
        # NVIDIA's nvml-mock (k8s-test-infra) GB300 table: 278 GiB, 1g.35gb x7 (18 SMs),
        # 1g.70gb x4, 2g.70gb x3 (36), 3g.139gb x2 (54), 4g.139gb (72), 7g.278gb (126).
        key="GB300",
        min_driver_branch=580,
        nvml_name="NVIDIA GB300",
        memory_mib=284672,
        compute_capability=(10, 3),
        architecture="Blackwell",
        brand="Nvidia",
        pci_device_id=0x31C210DE,
        multiprocessor_count=152,
        tdp_watts=1400,
        idle_watts=175,
        max_sm_clock_mhz=2070,
        memory_clock_mhz=2625,
        nvlink_count=18,
        mig_compute_slices=7,
        mig_memory_slices=8,
        mig_profiles=_seven_slice(
            284672,
            (35584, 71168, 71168, 142336, 284672),
            (18, 18, 36, 54, 72, 126),
            _BLACKWELL_ENGINES,
        ),
    ),
    GpuModel(
        key="RTX-PRO-6000",
        min_driver_branch=575,
        nvml_name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
        memory_mib=97887,
        compute_capability=(12, 0),
        architecture="Blackwell",
        brand="Nvidia",
        pci_device_id=0x2BB510DE,
        multiprocessor_count=188,
        tdp_watts=600,
        idle_watts=35,
        max_sm_clock_mhz=2617,
        memory_clock_mhz=14001,
        mig_compute_slices=4,
        mig_memory_slices=4,
        mig_profiles=_rtx_pro_6000_profiles(),
    ),
    GpuModel(
        key="A30-24GB",
        nvml_name="NVIDIA A30",
        memory_mib=24576,
        compute_capability=(8, 0),
        architecture="Ampere",
        brand="Nvidia",
        pci_device_id=0x20B710DE,
        multiprocessor_count=56,
        tdp_watts=165,
        idle_watts=30,
        max_sm_clock_mhz=1440,
        memory_clock_mhz=1215,
        mig_compute_slices=4,
        mig_memory_slices=4,
        mig_profiles=_a30_profiles(),
    ),
    GpuModel(
        key="T4",
        nvml_name="Tesla T4",
        memory_mib=15360,
        compute_capability=(7, 5),
        architecture="Turing",
        brand="Nvidia",
        pci_device_id=0x1EB810DE,
        multiprocessor_count=40,
        tdp_watts=70,
        idle_watts=10,
        max_sm_clock_mhz=1590,
        memory_clock_mhz=5001,
    ),
    GpuModel(
        key="L4",
        nvml_name="NVIDIA L4",
        memory_mib=23034,
        compute_capability=(8, 9),
        architecture="Ada Lovelace",
        brand="Nvidia",
        pci_device_id=0x27B810DE,
        multiprocessor_count=58,
        tdp_watts=72,
        idle_watts=12,
        max_sm_clock_mhz=2040,
        memory_clock_mhz=6251,
    ),
    GpuModel(
        key="L40S",
        nvml_name="NVIDIA L40S",
        memory_mib=46068,
        compute_capability=(8, 9),
        architecture="Ada Lovelace",
        brand="Nvidia",
        pci_device_id=0x26B910DE,
        multiprocessor_count=142,
        tdp_watts=350,
        idle_watts=35,
        max_sm_clock_mhz=2520,
        memory_clock_mhz=9001,
    ),
)

_BY_KEY = {m.key: m for m in _MODELS}


def models() -> tuple[GpuModel, ...]:
    """Every model in the catalog."""
    return _MODELS


def model(key: str) -> GpuModel:
    """The model with catalog key `key` (e.g. `A100-SXM4-40GB`); KeyError names the known keys."""
    try:
        return _BY_KEY[key]
    except KeyError:
        known = ", ".join(_BY_KEY)
        raise KeyError(f"unknown GPU model {key!r}; known models: {known}") from None


def by_nvml_name(name: str) -> GpuModel | None:
    """The model NVML reports as `name`, if catalogued."""
    for m in _MODELS:
        if m.nvml_name == name:
            return m
    return None


def by_pci_device_id(device_id: int) -> GpuModel | None:
    """The model with PCI id `(device << 16) | vendor`, e.g. 0x20B010DE."""
    for m in _MODELS:
        if m.pci_device_id == device_id:
            return m
    return None


def for_pci_device_id(device_id: int, memory_mib: int | None = None) -> GpuModel | None:
    """The model with PCI id `device_id`, else the one whose `pci_aliases` list it.

    Where several models share the id (GB200 as different drivers size it), the one whose
    memory is closest to `memory_mib` wins; without it, the first catalogued.
    """
    found = [m for m in _MODELS if m.pci_device_id == device_id] or [
        m for m in _MODELS if device_id in m.pci_aliases
    ]
    if not found:
        return None
    if memory_mib is None:
        return found[0]
    return min(found, key=lambda m: abs(m.memory_mib - memory_mib))


def mig_capable_models() -> tuple[GpuModel, ...]:
    return tuple(m for m in _MODELS if m.mig_capable)
