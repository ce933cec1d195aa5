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
GI_PROFILE_COUNT = 18

# NVML compute-instance profile ids by compute-slice count.
CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
CI_PROFILE_COUNT = 9
CI_ENGINE_PROFILE_SHARED = 0

MEDIA_EXTENSION_PROFILES = frozenset({GI_PROFILE_1_SLICE_REV1, GI_PROFILE_2_SLICE_REV1})

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
    """A compute-instance profile inside one GPU-instance profile."""

    profile_id: int
    slice_count: int
    instance_count: int
    multiprocessor_count: int
    placements: tuple[Placement, ...]


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

    @property
    def media_extensions(self) -> bool:
        return self.profile_id in MEDIA_EXTENSION_PROFILES

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

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

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


def mig_profile_name(
    gi_slices: int,
    ci_slices: int,
    memory_mb: int,
    total_memory_mib: int,
    media_extensions: bool = False,
) -> str:
    """Name a MIG profile the way NVML tools do: memory rounded up to eighths of the total GiB."""
    eighths = math.ceil(8 * memory_mb / total_memory_mib)
    total_gib = math.ceil(total_memory_mib / 1024)
    # Half-up rounding (Go's math.Round), not Python's banker's rounding: 70.5 GB -> 71gb.
    gb = (2 * eighths * total_gib + 8) // 16
    prefix = f"{ci_slices}c." if ci_slices != gi_slices else ""
    suffix = "+me" if media_extensions else ""
    return f"{prefix}{gi_slices}g.{gb}gb{suffix}"


def _compute_profiles(gi_slices: int, sm_per_slice: int, gi_sms: int) -> tuple[ComputeProfile, ...]:
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


def _profiles(total_mib: int, sm_per_slice: int, rows: list[_Row]) -> tuple[MigProfile, ...]:
    out = []
    for row in rows:
        me = row.profile_id in MEDIA_EXTENSION_PROFILES
        ce, dec, enc, jpg, ofa = row.engines
        out.append(
            MigProfile(
                profile_id=row.profile_id,
                name=mig_profile_name(row.slices, row.slices, row.memory_mb, total_mib, me),
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
                compute_profiles=_compute_profiles(row.slices, sm_per_slice, row.sms),
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
    )


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


def mig_capable_models() -> tuple[GpuModel, ...]:
    return tuple(m for m in _MODELS if m.mig_capable)
