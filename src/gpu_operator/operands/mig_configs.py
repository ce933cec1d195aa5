"""The configs of NVIDIA's `default-mig-parted-config` ConfigMap, recorded as facts.

Upstream ships a hand-written mig-parted file (gpu-operator `assets/state-mig-manager/`,
`0400_configmap.yaml`); it is not derivable from the GPUs' profile tables (some configs carry no
device filter and apply to whichever GPU has the profile, others split one profile name between
GPUs by filter, and a few name profiles only older drivers report). So each config is written
down here: its name, its entries (device filter, MIG on/off, devices per profile) and, ours,
the catalog models it is meant for, which the tests check against the GPU catalog.

Sources: the file at gpu-operator 0b0b6b15 (68 configs), and for B300 (PCI id 0x3182) and GB300
(0x31C2), which reached upstream after that revision, their MIG profile tables (NVIDIA's
nvml-mock GB300 table, which quotes upstream's GB300 `all-balanced` entry; cloud providers'
B300 configs naming upstream's filter). That makes upstream's 81 configs at a22dbf6 (v26.7.0 plus
one commit), which the ConfigMap NVIDIA's operator 26.7 writes confirms config for config, entry
order and device filters included (tests/operands/test_mig_configs.py compares them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True)
class Entry:
    """One element of a config's list: MIG on with these devices, or off (`devices` None)."""

    devices: Mapping[str, int] | None
    device_filter: tuple[str, ...] = ()
    # Upstream writes one filter as a plain string instead of a list (the same to mig-parted).
    filter_as_string: bool = False

    def as_dict(self) -> dict[str, object]:
        """The entry as mig-parted spells it (key order as upstream writes it)."""
        out: dict[str, object] = {}
        if self.device_filter:
            single = self.filter_as_string and len(self.device_filter) == 1
            out["device-filter"] = self.device_filter[0] if single else list(self.device_filter)
        out["devices"] = "all"
        out["mig-enabled"] = self.devices is not None
        if self.devices is not None:
            out["mig-devices"] = dict(self.devices)
        return out


@dataclass(frozen=True)
class Config:
    """A named config: its entries in order, and the catalog models it applies to."""

    name: str
    entries: tuple[Entry, ...]
    targets: frozenset[str] = field(default_factory=frozenset)


# PCI ids ((device << 16) | vendor) of the GPU families the file filters on, in upstream's order.
A100_40GB = ("0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE")  # A100 / A800 40GB
GPU_80GB = (  # H100, H800, A100 and A800 80GB
    "0x233010DE",
    "0x233110DE",
    "0x232210DE",
    "0x20B210DE",
    "0x20B510DE",
    "0x20F310DE",
    "0x20F510DE",
    "0x232410DE",
)
A30 = ("0x20B710DE",)
H100_NVL = ("0x232110DE", "0x233A10DE")  # H100 NVL, H800 NVL
H100_96GB = ("0x234210DE", "0x233D10DE", "0x20B610DE", "0x232910DE")  # GH200, H100, PG506, H20
GH200_144GB = ("0x234810DE",)
H200 = ("0x233510DE", "0x233B10DE")  # H200 141GB, H200 NVL
H200_SXM = ("0x233510DE",)  # upstream's all-1g.35gb names the 141GB part only
B200 = ("0x290110DE",)
GB200 = ("0x294110DE",)
B300 = ("0x318210DE",)
GB300 = ("0x31C210DE",)
RTX_PRO_6000 = ("0x2BB510DE",)

# Catalog model keys, grouped as upstream's comments group the configs.
_A100_40 = "A100-SXM4-40GB"
_80GB = ("A100-SXM4-80GB", "H100-SXM5-80GB")
_A30 = "A30-24GB"
_NVL = "H100-NVL"
_H100_96 = "GH200-96GB"
_GH200_144 = "GH200-144GB"
_H200 = "H200-141GB"
_B200 = "B200"
_GB200 = "GB200-186GB"
_GB200_EARLY = "GB200-189GB"
_B300 = "B300"
_GB300 = "GB300"
_RTX = "RTX-PRO-6000"

# Unfiltered single-profile configs `all-<profile>` (a `+` written `.`): profile, count, and
# the models whose profile table accepts that many. On any other GPU the MIG manager refuses
# them, naming the profile the GPU lacks (or its instance cap).
_SINGLE: tuple[tuple[str, int, tuple[str, ...]], ...] = (
    ("1g.5gb", 7, (_A100_40,)),
    ("1g.5gb+me", 1, (_A100_40,)),
    ("2g.10gb", 3, (_A100_40,)),
    ("3g.20gb", 2, (_A100_40,)),
    ("4g.20gb", 1, (_A100_40,)),
    ("7g.40gb", 1, (_A100_40,)),
    ("1g.10gb+me", 1, _80GB),
    ("1g.20gb", 4, _80GB),
    ("2g.20gb", 3, _80GB),
    ("3g.40gb", 2, _80GB),
    ("4g.40gb", 1, _80GB),
    ("7g.80gb", 1, _80GB),
    ("1g.6gb", 4, (_A30,)),
    ("1g.6gb+me", 1, (_A30,)),
    ("2g.12gb", 2, (_A30,)),
    ("2g.12gb+me", 1, (_A30,)),
    ("4g.24gb", 1, (_A30,)),
    ("1g.12gb", 7, (_NVL, _H100_96)),
    ("1g.12gb+me", 1, (_NVL, _H100_96)),
    # The double-memory 1g of H100 NVL and GH200, the whole-slice 1g of RTX PRO 6000, and
    # (4 of 7) the 1g of GB200 as earlier drivers sized it.
    ("1g.24gb", 4, (_NVL, _H100_96, _RTX, _GB200_EARLY)),
    ("2g.24gb", 3, (_NVL, _H100_96)),
    ("3g.47gb", 2, (_NVL,)),
    ("4g.47gb", 1, (_NVL,)),
    ("7g.94gb", 1, (_NVL,)),
    ("3g.48gb", 2, (_H100_96,)),
    ("4g.48gb", 1, (_H100_96,)),
    ("7g.96gb", 1, (_H100_96,)),
    ("1g.18gb", 7, (_H200, _GH200_144)),
    ("1g.18gb+me", 1, (_H200, _GH200_144)),
    ("2g.35gb", 3, (_H200,)),
    ("3g.71gb", 2, (_H200,)),
    ("4g.71gb", 1, (_H200,)),
    ("7g.141gb", 1, (_H200,)),
    ("1g.36gb", 4, (_GH200_144,)),
    ("2g.36gb", 3, (_GH200_144,)),
    ("3g.72gb", 2, (_GH200_144,)),
    ("4g.72gb", 1, (_GH200_144,)),
    ("7g.144gb", 1, (_GH200_144,)),
    ("1g.23gb", 7, (_B200, _GB200)),
    ("1g.23gb+me", 1, (_B200, _GB200)),
    ("1g.45gb", 4, (_B200,)),
    ("2g.45gb", 3, (_B200,)),
    ("3g.90gb", 2, (_B200,)),
    ("4g.90gb", 1, (_B200,)),
    ("7g.180gb", 1, (_B200,)),
    ("1g.47gb", 4, (_GB200, _GB200_EARLY)),
    ("2g.47gb", 3, (_GB200, _GB200_EARLY)),
    ("3g.93gb", 2, (_GB200,)),
    ("4g.93gb", 1, (_GB200,)),
    ("7g.186gb", 1, (_GB200,)),
    # Kept upstream from GB200's first profile table.
    ("1g.24gb+me", 1, (_RTX, _GB200_EARLY)),
    ("3g.95gb", 2, (_GB200_EARLY,)),
    ("4g.95gb", 1, (_GB200_EARLY,)),
    ("7g.189gb", 1, (_GB200_EARLY,)),
    ("1g.24gb+gfx", 4, (_RTX,)),
    ("1g.24gb+me.all", 1, (_RTX,)),
    ("1g.24gb-me", 4, (_RTX,)),
    ("2g.48gb", 2, (_RTX,)),
    ("2g.48gb+gfx", 2, (_RTX,)),
    ("2g.48gb+me.all", 1, (_RTX,)),
    ("2g.48gb-me", 2, (_RTX,)),
    ("4g.96gb", 1, (_RTX,)),
    ("4g.96gb+gfx", 1, (_RTX,)),
    ("1g.34gb", 7, (_B300,)),
    ("1g.34gb+me", 1, (_B300,)),
    ("1g.67gb", 4, (_B300,)),
    ("2g.67gb", 3, (_B300,)),
    ("3g.135gb", 2, (_B300,)),
    ("4g.135gb", 1, (_B300,)),
    ("7g.269gb", 1, (_B300,)),
    ("1g.35gb+me", 1, (_GB300,)),
    ("1g.70gb", 4, (_GB300,)),
    ("2g.70gb", 3, (_GB300,)),
    ("3g.139gb", 2, (_GB300,)),
    ("4g.139gb", 1, (_GB300,)),
    ("7g.278gb", 1, (_GB300,)),
)

# Configs whose profile means a different instance on different GPUs: one filtered entry each.
_SPLIT: tuple[tuple[str, tuple[tuple[tuple[str, ...], int], ...], tuple[str, ...]], ...] = (
    # The whole-slice 1g of 80 GB parts; the double-memory 1g of 40 GB A100s.
    ("1g.10gb", ((GPU_80GB, 7), (A100_40GB, 4)), (*_80GB, _A100_40)),
    # The double-memory 1g of H200; the whole-slice 1g of GB300.
    ("1g.35gb", ((H200_SXM, 4), (GB300, 7)), (_H200, _GB300)),
)

# all-balanced: per GPU family, 2 x 1g + 1 x 2g (+ 1 x 3g on 7-slice GPUs), in upstream's order.
_BALANCED: tuple[tuple[tuple[str, ...], tuple[str, ...], str], ...] = (
    (GB200, ("1g.23gb", "2g.47gb", "3g.93gb"), _GB200),
    (RTX_PRO_6000, ("1g.24gb", "2g.48gb"), _RTX),
    (B200, ("1g.23gb", "2g.45gb", "3g.90gb"), _B200),
    (GH200_144GB, ("1g.18gb", "2g.36gb", "3g.72gb"), _GH200_144),
    (H200, ("1g.18gb", "2g.35gb", "3g.71gb"), _H200),
    (H100_NVL, ("1g.12gb", "2g.24gb", "3g.47gb"), _NVL),
    (GPU_80GB, ("1g.10gb", "2g.20gb", "3g.40gb"), _80GB[0]),
    (A100_40GB, ("1g.5gb", "2g.10gb", "3g.20gb"), _A100_40),
    (A30, ("1g.6gb", "2g.12gb"), _A30),
    (H100_96GB, ("1g.12gb", "2g.24gb", "3g.48gb"), _H100_96),
    (B300, ("1g.34gb", "2g.67gb", "3g.135gb"), _B300),
    (GB300, ("1g.35gb", "2g.70gb", "3g.139gb"), _GB300),
)

EVERY_MIG_MODEL = frozenset(
    {_A100_40, *_80GB, _A30, _NVL, _H100_96, _GH200_144, _H200, _B200, _GB200, _GB200_EARLY}
    | {_B300, _GB300, _RTX}
)


def config_name(profile: str) -> str:
    """`all-1g.5gb.me` for `1g.5gb+me`: config names spell `+` as `.`, as upstream's do."""
    return "all-" + profile.replace("+", ".")


def _devices(values: Mapping[str, int]) -> Mapping[str, int]:
    return MappingProxyType(dict(values))


def _build() -> tuple[Config, ...]:
    configs = [
        Config("all-disabled", (Entry(None),), EVERY_MIG_MODEL),
        Config("all-enabled", (Entry(_devices({})),), EVERY_MIG_MODEL),
    ]
    for profile, count, targets in _SINGLE:
        entry = Entry(_devices({profile: count}))
        configs.append(Config(config_name(profile), (entry,), frozenset(targets)))
    for profile, split, targets in _SPLIT:
        entries = tuple(Entry(_devices({profile: n}), ids) for ids, n in split)
        configs.append(Config(config_name(profile), entries, frozenset(targets)))
    balanced = []
    balanced_targets = {_80GB[1]}  # both 80 GB models share the GPU_80GB entry
    for ids, (one, two, *three), model in _BALANCED:
        devices = {one: 2, two: 1, **dict.fromkeys(three, 1)}
        balanced.append(Entry(_devices(devices), ids, filter_as_string=ids == A30))
        balanced_targets.add(model)
    configs.append(Config("all-balanced", tuple(balanced), frozenset(balanced_targets)))
    return tuple(configs)


CONFIGS: tuple[Config, ...] = _build()
BY_NAME: Mapping[str, Config] = MappingProxyType({c.name: c for c in CONFIGS})


# The configs in the order upstream's file lists them (a YAML map's order means nothing to
# mig-parted; it keeps `kubectl diff` against NVIDIA's ConfigMap quiet).
ORDER = (
    "all-disabled", "all-enabled", "all-1g.5gb", "all-1g.5gb.me", "all-2g.10gb", "all-3g.20gb",
    "all-4g.20gb", "all-7g.40gb", "all-1g.24gb.gfx", "all-1g.24gb.me.all", "all-1g.24gb-me",
    "all-2g.48gb", "all-2g.48gb.gfx", "all-2g.48gb.me.all", "all-2g.48gb-me", "all-4g.96gb",
    "all-4g.96gb.gfx", "all-1g.10gb", "all-1g.10gb.me", "all-1g.20gb", "all-1g.23gb",
    "all-1g.23gb.me", "all-1g.24gb.me", "all-2g.20gb", "all-3g.40gb", "all-4g.40gb",
    "all-7g.80gb", "all-1g.6gb", "all-1g.6gb.me", "all-2g.12gb", "all-2g.12gb.me", "all-4g.24gb",
    "all-1g.12gb", "all-1g.12gb.me", "all-1g.24gb", "all-1g.45gb", "all-1g.47gb", "all-2g.24gb",
    "all-2g.45gb", "all-2g.47gb", "all-3g.47gb", "all-4g.47gb", "all-7g.94gb", "all-3g.48gb",
    "all-3g.90gb", "all-3g.93gb", "all-3g.95gb", "all-4g.48gb", "all-4g.90gb", "all-4g.93gb",
    "all-4g.95gb", "all-7g.96gb", "all-7g.180gb", "all-7g.186gb", "all-7g.189gb", "all-balanced",
    "all-1g.18gb", "all-1g.18gb.me", "all-1g.35gb", "all-2g.35gb", "all-3g.71gb", "all-4g.71gb",
    "all-7g.141gb", "all-1g.36gb", "all-2g.36gb", "all-3g.72gb", "all-4g.72gb", "all-7g.144gb",
    "all-1g.34gb", "all-1g.34gb.me", "all-1g.67gb", "all-2g.67gb", "all-3g.135gb", "all-4g.135gb",
    "all-7g.269gb", "all-1g.35gb.me", "all-1g.70gb", "all-2g.70gb", "all-3g.139gb",
    "all-4g.139gb", "all-7g.278gb",
)  # fmt: skip
assert sorted(ORDER) == sorted(BY_NAME)


def document() -> dict[str, list[dict[str, object]]]:
    """`mig-configs` as mig-parted reads it: config name -> its entries, in upstream's order."""
    return {name: [e.as_dict() for e in BY_NAME[name].entries] for name in ORDER}
