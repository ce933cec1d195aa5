"""The mig-parted config file and profile strings: what parses, and every error naming its place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_operator.agents.mig_manager import config as cfg
from gpu_operator.agents.mig_manager import profiles
from gpu_operator.agents.mig_manager.profiles import Profile

GOOD = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  custom:
    - device-filter: ["0x20B010DE", "0x20B110DE:0x134F10DE"]
      devices: [0, 1]
      mig-enabled: true
      mig-devices:
        1g.5gb: 2
        2g.10gb: 1
        3g.20gb: 0
    - device-filter: 0x233010DE
      devices: all
      mig-enabled: true
      mig-devices: {}
"""


def test_a_good_file_parses_into_entries_in_order() -> None:
    parsed = cfg.loads(GOOD, "config.yaml")
    first, second = parsed.select("custom")
    assert first.devices == (0, 1)
    assert [str(f) for f in first.device_filter] == ["0x20B010DE", "0x20B110DE:0x134F10DE"]
    assert first.wanted == {Profile(1, 1, 5): 2, Profile(2, 2, 10): 1}
    # An unquoted hex id reads as a number in YAML; it still means that id.
    assert [str(f) for f in second.device_filter] == ["0x233010DE"]
    assert second.mig_devices == {}
    assert parsed.select("all-disabled")[0].mig_enabled is False


def test_device_filters_match_primary_ids_and_subsystems_exactly() -> None:
    plain = cfg.DeviceId.parse("0x20B010DE")
    assert plain.matches(0x20B010DE, 0x134F10DE)
    assert not plain.matches(0x20B210DE, 0)
    sub = cfg.DeviceId.parse("0x20B010DE:0x134F10DE")
    assert sub.matches(0x20B010DE, 0x134F10DE)
    assert not sub.matches(0x20B010DE, 0x147F10DE)


def test_entries_cover_gpus_by_index_and_filter() -> None:
    (entry, _) = cfg.loads(GOOD).select("custom")
    assert entry.covers(1, 0x20B010DE)
    assert not entry.covers(2, 0x20B010DE)
    assert not entry.covers(0, 0x233010DE)


def _error(doc: Any) -> str:
    with pytest.raises(cfg.ConfigError) as info:
        cfg.parse(doc, "config.yaml")
    return str(info.value)


def _one(entry: dict[str, Any]) -> dict[str, Any]:
    return {"version": "v1", "mig-configs": {"custom": [entry]}}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("nope", "config.yaml: expected a mapping with version and mig-configs"),
        ({"mig-configs": {}}, "config.yaml: version: required (expected 'v1')"),
        ({"version": "v2", "mig-configs": {}}, "version: unknown version 'v2' (expected v1)"),
        ({"version": "v1", "mig-configs": {"a": []}, "extra": 1}, "extra: unknown field"),
        ({"version": "v1"}, "mig-configs: expected a mapping with at least one config"),
        ({"version": "v1", "mig-configs": {"a": []}}, "mig-configs.a: expected a non-empty list"),
        (_one({"devices": "all"}), "mig-configs.custom[0].mig-enabled: required"),
        (_one({"mig-enabled": False}), "mig-configs.custom[0].devices: required"),
        (
            _one({"devices": "all", "mig-enabled": False, "color": "red"}),
            "mig-configs.custom[0].color: unknown field",
        ),
        (
            _one({"devices": "some", "mig-enabled": False}),
            "mig-configs.custom[0].devices: the only string allowed is 'all', got 'some'",
        ),
        (
            _one({"devices": [0, -1], "mig-enabled": False}),
            "devices: expected 'all' or a list of GPU indices, got [0, -1]",
        ),
        (
            _one({"devices": "all", "mig-enabled": "yes"}),
            "mig-enabled: expected true or false, got 'yes'",
        ),
        (
            _one({"devices": "all", "mig-enabled": True}),
            "mig-configs.custom[0].mig-devices: required when mig-enabled is true",
        ),
        (
            _one({"devices": "all", "mig-enabled": False, "mig-devices": {"1g.5gb": 1}}),
            "mig-devices: must be empty when mig-enabled is false",
        ),
        (
            _one({"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": -1}}),
            "mig-devices.1g.5gb: expected a count of 0 or more, got -1",
        ),
        (
            _one({"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 0}}),
            "mig-devices: all counts are 0",
        ),
        (
            _one({"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5": 1}}),
            "mig-devices: '1g.5' is not a MIG profile",
        ),
        (
            _one({"devices": "all", "mig-enabled": True, "mig-devices": {"2c.1g.5gb": 1}}),
            "a compute instance cannot have more slices (2c) than its GPU instance (1g)",
        ),
        (
            _one({"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb+xx": 1}}),
            "unknown attribute 'xx'",
        ),
        (
            _one(
                {
                    "devices": "all",
                    "mig-enabled": True,
                    "mig-devices": {"7g.40gb": 1, "7c.7g.40gb": 1},
                }
            ),
            "7g.40gb is listed twice",
        ),
        (
            _one({"device-filter": "0xZZ", "devices": "all", "mig-enabled": False}),
            "mig-configs.custom[0].device-filter: '0xZZ' is not a device id",
        ),
        (
            _one({"device-filter": "0x1:0x2:0x3", "devices": "all", "mig-enabled": False}),
            "expected <devicevendor> or <devicevendor>:<subdevicevendor>",
        ),
        (
            _one({"device-filter": "0x1FFFFFFFF", "devices": "all", "mig-enabled": False}),
            "does not fit in 32 bits",
        ),
        (
            _one({"device-filter": [], "devices": "all", "mig-enabled": False}),
            "device-filter: expected a device id string or a list of them",
        ),
        (
            _one({"device-filter": [True], "devices": "all", "mig-enabled": False}),
            "device-filter: True is not a device id",
        ),
    ],
)
def test_every_bad_input_is_named(doc: Any, message: str) -> None:
    assert message in _error(doc)


def test_an_unknown_config_name_lists_the_known_ones() -> None:
    with pytest.raises(cfg.ConfigError) as info:
        cfg.loads(GOOD, "config.yaml").select("all-2g")
    assert str(info.value) == (
        "config.yaml: no MIG config named 'all-2g'; the file defines: all-disabled, custom"
    )


def test_unreadable_and_malformed_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(cfg.ConfigError, match="cannot read the MIG config file"):
        cfg.load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: [v1\n")
    with pytest.raises(cfg.ConfigError, match=r"bad\.yaml: not valid YAML"):
        cfg.load(bad)


@pytest.mark.parametrize(
    ("text", "name", "gi", "whole"),
    [
        ("1g.5gb", "1g.5gb", "1g.5gb", True),
        ("1c.7g.40gb", "1c.7g.40gb", "7g.40gb", False),
        ("7c.7g.40gb", "7g.40gb", "7g.40gb", True),
        ("1g.5gb+me", "1g.5gb+me", "1g.5gb+me", True),
        ("1g.24gb+gfx,me", "1g.24gb+gfx,me", "1g.24gb+gfx,me", True),
        ("1g.24gb-me", "1g.24gb-me", "1g.24gb-me", True),
    ],
)
def test_profile_strings_normalise(text: str, name: str, gi: str, whole: bool) -> None:
    profile = profiles.parse(text)
    assert (profile.name, profile.gpu_instance_name, profile.whole_instance) == (name, gi, whole)
