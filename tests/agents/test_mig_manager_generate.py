"""The MIG config a node generates from the profiles its GPUs report through NVML (upstream's
dynamic MIG config, GPU Operator 26.x with MIG manager 0.14+), and the fallback to the operator's
`default-mig-parted-config` (DEFAULT_CONFIG_FILE) when there is nothing to generate from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_operator.agents.mig_manager import command, generate, planner
from gpu_operator.agents.mig_manager import config as cfg
from gpu_operator.agents.mig_manager import gpus as gpus_mod
from gpu_operator.agents.mig_manager import host as host_mod
from gpu_operator.nvml import catalog, errors, machines, mock

DEFAULT_FILE = "version: v1\nmig-configs:\n  all-disabled: [{devices: all, mig-enabled: false}]\n"


def machine(*groups: tuple[str, int]) -> mock.MockMachine:
    spec = machines.MachineSpec.model_validate(
        {"name": "node", "gpus": [{"model": m, "count": n} for m, n in groups]}
    )
    return mock.MockMachine(spec)


def gpus_of(m: mock.MockMachine, open_nvml: Any = None) -> gpus_mod.Gpus:
    return gpus_mod.Gpus(open_nvml or m.nvml, host_mod.MockHost(m))


def generated(m: mock.MockMachine) -> dict[str, Any]:
    return generate.generate(gpus_of(m).profiles())


class _HidingDevice:
    """A device whose driver does not offer some GPU-instance profiles (or none at all)."""

    def __init__(self, device: Any, hidden: set[int] | None) -> None:
        self._device = device
        self._hidden = hidden

    def gpu_instance_profile_info(self, profile_id: int) -> Any:
        if self._hidden is None or profile_id in self._hidden:
            raise errors.NotSupported(f"profile {profile_id} is not supported")
        return self._device.gpu_instance_profile_info(profile_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._device, name)


class _HidingNvml:
    def __init__(self, lib: Any, hidden: set[int] | None) -> None:
        self._lib = lib
        self._hidden = hidden

    def device_by_index(self, index: int) -> Any:
        return _HidingDevice(self._lib.device_by_index(index), self._hidden)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lib, name)


def hiding(m: mock.MockMachine, hidden: set[int] | None) -> Any:
    return lambda: _HidingNvml(m.nvml(), hidden)


def test_an_h200_node_gets_configs_named_after_the_profiles_it_reports() -> None:
    doc = generated(machine(("H200-141GB", 8)))
    configs = doc["mig-configs"]
    assert {name: spec[0].get("mig-devices") for name, spec in configs.items()} == {
        "all-disabled": None,
        "all-enabled": {},
        "all-1g.18gb": {"1g.18gb": 7},
        "all-1g.18gb.me": {"1g.18gb+me": 1},
        "all-1g.35gb": {"1g.35gb": 4},
        "all-2g.35gb": {"2g.35gb": 3},
        "all-3g.71gb": {"3g.71gb": 2},
        "all-4g.71gb": {"4g.71gb": 1},
        "all-7g.141gb": {"7g.141gb": 1},
        "all-balanced": {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1},
    }
    # One kind of GPU: no device filters.
    assert not any("device-filter" in s for specs in configs.values() for s in specs)


@pytest.mark.parametrize("model", catalog.mig_capable_models(), ids=lambda m: m.key)
def test_every_generated_config_applies_on_the_gpus_it_was_generated_from(
    model: catalog.GpuModel,
) -> None:
    m = machine((model.key, 2))
    parsed = cfg.parse(generated(m), "generated")
    states = gpus_of(m).read()
    for name in parsed.configs:
        plan = planner.plan_node(name, parsed.select(name), states)
        assert [g.index for g in plan.gpus] == [0, 1], name


def test_a_mixed_node_filters_by_each_gpus_own_pci_id_and_skips_gpus_without_mig() -> None:
    m = machine(("A100-SXM4-40GB", 2), ("H200-141GB", 1), ("T4", 1))
    configs = generated(m)["mig-configs"]
    assert configs["all-balanced"] == [
        {"device-filter": ["0x20B010DE"], "devices": "all", "mig-enabled": True,
         "mig-devices": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}},
        {"device-filter": ["0x233510DE"], "devices": "all", "mig-enabled": True,
         "mig-devices": {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}},
    ]  # fmt: skip
    assert [s["device-filter"] for s in configs["all-7g.141gb"]] == [["0x233510DE"]]
    # Applied on the node: each GPU gets its own model's layout, the T4 is left alone.
    parsed = cfg.parse(generated(m), "generated")
    plan = planner.plan_node("all-balanced", parsed.select("all-balanced"), gpus_of(m).read())
    assert {g.index: g.target_devices for g in plan.gpus} == {
        0: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
        1: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
        2: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1},
    }


def test_a_gpu_variant_is_filtered_by_the_id_it_reports_not_its_catalog_model() -> None:
    h200 = catalog.model("H200-141GB")
    nvl = generate.GpuProfiles(1, 0x233B10DE, generate.from_model(h200).profiles)
    doc = generate.generate([generate.from_model(catalog.model("A100-SXM4-40GB")), nvl])
    assert doc["mig-configs"]["all-7g.141gb"][0]["device-filter"] == ["0x233B10DE"]


def test_the_profiles_are_what_the_driver_reports_not_what_the_catalog_lists() -> None:
    m = machine(("H200-141GB", 1))
    # A driver that does not offer the double-memory 1g (profile 9) or the 4g (profile 3).
    tables = gpus_of(m, hiding(m, {catalog.GI_PROFILE_1_SLICE_REV2, 3})).profiles()
    configs = generate.generate(tables)["mig-configs"]
    assert "all-1g.35gb" not in configs
    assert "all-4g.71gb" not in configs
    assert "all-1g.18gb" in configs


def test_a_driver_that_reports_no_profiles_falls_back_to_the_default_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Upstream's reason for keeping `default-mig-parted-config`: some drivers (R535) cannot
    describe their MIG profiles, and then the manager uses the operator's file."""
    m = machine(("A100-SXM4-40GB", 2))
    default = tmp_path / "config-default.yaml"
    default.write_text(DEFAULT_FILE)
    options = command.Options(default_config_file=str(default), generated_config_file="")
    source = command.config_source(options, gpus_of(m, hiding(m, None)))
    assert source.generated is None
    assert source.origin == str(default)
    assert list(source.load().configs) == ["all-disabled"]
    assert "GPU 0 reports no MIG profiles" in caplog.text
    with pytest.raises(command.UsageError, match="the GPUs report no MIG profiles"):
        command.config_source(
            command.Options(generated_config_file=""), gpus_of(m, hiding(m, None))
        )


def test_a_node_without_mig_gpus_uses_the_default_file(tmp_path: Path) -> None:
    m = machine(("T4", 4))
    assert gpus_of(m).profiles() == []
    default = tmp_path / "config-default.yaml"
    default.write_text(DEFAULT_FILE)
    options = command.Options(default_config_file=str(default), generated_config_file="")
    assert command.config_source(options, gpus_of(m)).origin == str(default)


def test_a_users_config_file_is_used_instead_and_nothing_is_generated(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\nmig-configs:\n  mine: [{devices: all, mig-enabled: false}]\n")
    target = tmp_path / "generated-config.yaml"
    options = command.Options(config_file=str(path), generated_config_file=str(target))
    source = command.config_source(options, gpus_of(machine(("H200-141GB", 1))))
    assert list(source.load().configs) == ["mine"]
    assert source.generated is None
    assert not target.exists()
