"""The GPU catalog: model facts, MIG profile tables and the profile naming rule."""

from __future__ import annotations

import pytest

from gpu_operator.nvml import catalog

REQUIRED = [
    "A100-SXM4-40GB",
    "A100-SXM4-80GB",
    "H100-SXM5-80GB",
    "H200-141GB",
    "A30-24GB",
    "T4",
    "L4",
    "L40S",
    "B200",
]

# Default profiles per GPU from the operator's default mig-parted config (reference §4.5).
EXPECTED_PROFILES = {
    "A100-SXM4-40GB": {"1g.5gb": 7, "1g.5gb+me": 1, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2,
                       "4g.20gb": 1, "7g.40gb": 1},
    "A100-SXM4-80GB": {"1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2,
                       "4g.40gb": 1, "7g.80gb": 1},
    "H100-SXM5-80GB": {"1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2,
                       "4g.40gb": 1, "7g.80gb": 1},
    "H200-141GB": {"1g.18gb": 7, "1g.18gb+me": 1, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2,
                   "4g.71gb": 1, "7g.141gb": 1},
    "B200": {"1g.23gb": 7, "1g.23gb+me": 1, "1g.45gb": 4, "2g.45gb": 3, "3g.90gb": 2,
             "4g.90gb": 1, "7g.180gb": 1},
    "A30-24GB": {"1g.6gb": 4, "1g.6gb+me": 1, "2g.12gb": 2, "2g.12gb+me": 1, "4g.24gb": 1},
    # The newer GPUs of upstream's default config (operands/mig_configs.py).
    "H100-NVL": {"1g.12gb": 7, "1g.12gb+me": 1, "1g.24gb": 4, "2g.24gb": 3, "3g.47gb": 2,
                 "4g.47gb": 1, "7g.94gb": 1},
    "GH200-96GB": {"1g.12gb": 7, "1g.12gb+me": 1, "1g.24gb": 4, "2g.24gb": 3, "3g.48gb": 2,
                   "4g.48gb": 1, "7g.96gb": 1},
    "GH200-144GB": {"1g.18gb": 7, "1g.18gb+me": 1, "1g.36gb": 4, "2g.36gb": 3, "3g.72gb": 2,
                    "4g.72gb": 1, "7g.144gb": 1},
    "GB200-186GB": {"1g.23gb": 7, "1g.23gb+me": 1, "1g.47gb": 4, "2g.47gb": 3, "3g.93gb": 2,
                    "4g.93gb": 1, "7g.186gb": 1},
    "GB200-189GB": {"1g.24gb": 7, "1g.24gb+me": 1, "1g.47gb": 4, "2g.47gb": 3, "3g.95gb": 2,
                    "4g.95gb": 1, "7g.189gb": 1},
    "B300": {"1g.34gb": 7, "1g.34gb+me": 1, "1g.67gb": 4, "2g.67gb": 3, "3g.135gb": 2,
             "4g.135gb": 1, "7g.269gb": 1},
    "GB300": {"1g.35gb": 7, "1g.35gb+me": 1, "1g.70gb": 4, "2g.70gb": 3, "3g.139gb": 2,
              "4g.139gb": 1, "7g.278gb": 1},
    "RTX-PRO-6000": {"1g.24gb": 4, "1g.24gb+me": 1, "1g.24gb+gfx": 4, "1g.24gb-me": 4,
                     "1g.24gb+me.all": 1, "2g.48gb": 2, "2g.48gb+gfx": 2, "2g.48gb-me": 2,
                     "2g.48gb+me.all": 1, "4g.96gb": 1, "4g.96gb+gfx": 1},
}  # fmt: skip


def test_catalog_has_every_required_model() -> None:
    keys = {m.key for m in catalog.models()}
    assert set(REQUIRED) <= keys


@pytest.mark.parametrize(("key", "expected"), sorted(EXPECTED_PROFILES.items()))
def test_mig_profiles_and_instance_counts_match_the_default_config(
    key: str, expected: dict[str, int]
) -> None:
    model = catalog.model(key)
    assert {p.name: p.instance_count for p in model.mig_profiles} == expected


@pytest.mark.parametrize("key", ["T4", "L4", "L40S"])
def test_non_mig_models_have_no_profiles(key: str) -> None:
    model = catalog.model(key)
    assert not model.mig_capable
    with pytest.raises(KeyError, match="not MIG capable"):
        model.mig_profile("1g.5gb")


def test_a100_40gb_facts_match_the_reference_mock() -> None:
    a100 = catalog.model("A100-SXM4-40GB")
    assert a100.memory_mib == 40960
    assert a100.compute_capability == (8, 0)
    assert a100.pci_device_id_hex == "0x20B010DE"
    sizes = {p.name: (p.memory_mb, p.multiprocessor_count) for p in a100.mig_profiles}
    assert sizes["1g.5gb"] == (4864, 14)
    assert sizes["2g.10gb"] == (9856, 28)
    assert sizes["3g.20gb"] == (19968, 42)
    assert sizes["4g.20gb"] == (19968, 56)
    assert sizes["7g.40gb"] == (40192, 98)


def test_seven_slice_placements_follow_the_a100_table() -> None:
    for model in catalog.mig_capable_models():
        if model.mig_compute_slices != 7:
            continue
        starts = {
            p.name.split(".")[0] + ("d" if p.profile_id == 9 else ""): [
                (pl.start, pl.size) for pl in p.placements
            ]
            for p in model.mig_profiles
        }
        assert starts["1g"] == [(i, 1) for i in range(7)]
        assert starts["1gd"] == [(0, 2), (2, 2), (4, 2), (6, 2)]
        assert starts["2g"] == [(0, 2), (2, 2), (4, 2)]
        assert starts["3g"] == [(0, 4), (4, 4)]
        assert starts["4g"] == [(0, 4)]
        assert starts["7g"] == [(0, 8)]


def test_profile_names_follow_the_eighths_rule() -> None:
    assert catalog.mig_profile_name(1, 1, 4864, 40960) == "1g.5gb"
    assert catalog.mig_profile_name(2, 2, 9856, 40960) == "2g.10gb"
    assert catalog.mig_profile_name(7, 1, 40192, 40960) == "1c.7g.40gb"
    assert catalog.mig_profile_name(1, 1, 4864, 40960, media_extensions=True) == "1g.5gb+me"
    # 70.5 rounds half up, as Go's math.Round does.
    assert catalog.mig_profile_name(3, 3, 66816, 143771) == "3g.71gb"


def test_every_profile_name_is_consistent_with_its_memory() -> None:
    for model in catalog.mig_capable_models():
        for prof in model.mig_profiles:
            derived = catalog.mig_profile_name(
                prof.slice_count, prof.slice_count, prof.memory_mb, model.memory_mib,
                suffix=catalog.profile_suffix(prof.profile_id),
            )  # fmt: skip
            assert derived == prof.name


def test_compute_profiles_inside_a_seven_slice_instance() -> None:
    seven = catalog.model("A100-SXM4-40GB").mig_profile("7g.40gb")
    counts = {c.slice_count: c.instance_count for c in seven.compute_profiles}
    assert counts == {1: 7, 2: 3, 3: 2, 4: 1, 7: 1}
    four = catalog.model("A100-SXM4-40GB").mig_profile("4g.20gb")
    assert {c.slice_count for c in four.compute_profiles} == {1, 2, 4}


def test_lookups_by_name_and_pci_id() -> None:
    h100 = catalog.model("H100-SXM5-80GB")
    assert catalog.by_nvml_name("NVIDIA H100 80GB HBM3") is h100
    assert catalog.by_pci_device_id(0x233010DE) is h100
    assert catalog.by_pci_device_id(0x12345678) is None
    assert h100.mig_profile("1g.10gb.me").name == "1g.10gb+me"


def test_pci_variants_and_boards_sized_differently_resolve_to_one_model() -> None:
    assert catalog.for_pci_device_id(0x233A10DE) is catalog.model("H100-NVL")  # H800 NVL
    assert catalog.for_pci_device_id(0x232910DE) is catalog.model("GH200-96GB")  # H20
    assert catalog.for_pci_device_id(0x233B10DE) is catalog.model("H200-141GB")  # H200 NVL
    assert catalog.for_pci_device_id(0x12345678) is None
    # GB200 under two drivers: one PCI id, told apart by the memory NVML reports.
    assert catalog.for_pci_device_id(0x294110DE) is catalog.model("GB200-186GB")
    assert catalog.for_pci_device_id(0x294110DE, 193024) is catalog.model("GB200-189GB")
    assert catalog.for_pci_device_id(0x294110DE, 189471) is catalog.model("GB200-186GB")


def test_rtx_pro_6000_profiles_carry_their_attribute_suffixes() -> None:
    rtx = catalog.model("RTX-PRO-6000")
    suffixes = {p.name: p.suffix for p in rtx.mig_profiles}
    assert suffixes["1g.24gb+gfx"] == "+gfx"
    assert suffixes["2g.48gb-me"] == "-me"
    assert suffixes["1g.24gb+me.all"] == "+me.all"
    assert suffixes["4g.96gb"] == ""
    assert rtx.mig_profile("1g.24gb.me.all").profile_id == catalog.GI_PROFILE_1_SLICE_ALL_ME
    # +me and +me.all both take the shared media engines; -me and +gfx do not.
    owners = {p.name for p in rtx.mig_profiles if p.media_extensions}
    assert owners == {"1g.24gb+me", "1g.24gb+me.all", "2g.48gb+me.all"}
    assert [(pl.start, pl.size) for pl in rtx.mig_profile("2g.48gb+gfx").placements] == [
        (0, 2),
        (2, 2),
    ]


def test_unknown_model_lists_known_ones() -> None:
    with pytest.raises(KeyError, match="known models: A100-SXM4-40GB"):
        catalog.model("GTX-1080")


def test_placement_overlap() -> None:
    a = catalog.Placement(0, 4)
    assert a.overlaps(catalog.Placement(3, 1))
    assert not a.overlaps(catalog.Placement(4, 4))
