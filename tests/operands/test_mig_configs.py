"""Upstream's default mig-parted config: all 81 configs with their specs, each accepted exactly
on the catalogued GPUs it is meant for (and refused elsewhere with the reason), and the MIG
manager applying the new GPUs' configs on mock machines."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from operand_helpers import find, make_facts, make_policy

from gpu_operator.agents.mig_manager import config as cfg
from gpu_operator.agents.mig_manager import gpus as gpus_mod
from gpu_operator.agents.mig_manager import host as host_mod
from gpu_operator.agents.mig_manager import planner, profiles, reconfigure
from gpu_operator.api import keys
from gpu_operator.nvml import catalog, machines, mock
from gpu_operator.operands import mig_configs, mig_manager

# Upstream's config names at a22dbf6, written out independently of the facts module.
_NAMES = """
all-disabled all-enabled all-balanced
all-1g.5gb all-1g.5gb.me all-2g.10gb all-3g.20gb all-4g.20gb all-7g.40gb
all-1g.10gb all-1g.10gb.me all-1g.20gb all-2g.20gb all-3g.40gb all-4g.40gb all-7g.80gb
all-1g.6gb all-1g.6gb.me all-2g.12gb all-2g.12gb.me all-4g.24gb
all-1g.12gb all-1g.12gb.me all-1g.24gb all-2g.24gb all-3g.47gb all-4g.47gb all-7g.94gb
all-3g.48gb all-4g.48gb all-7g.96gb
all-1g.18gb all-1g.18gb.me all-1g.35gb all-2g.35gb all-3g.71gb all-4g.71gb all-7g.141gb
all-1g.36gb all-2g.36gb all-3g.72gb all-4g.72gb all-7g.144gb
all-1g.23gb all-1g.23gb.me all-1g.45gb all-2g.45gb all-3g.90gb all-4g.90gb all-7g.180gb
all-1g.47gb all-2g.47gb all-3g.93gb all-4g.93gb all-7g.186gb
all-1g.24gb.me all-3g.95gb all-4g.95gb all-7g.189gb
all-1g.24gb.gfx all-1g.24gb.me.all all-1g.24gb-me all-2g.48gb all-2g.48gb.gfx
all-2g.48gb.me.all all-2g.48gb-me all-4g.96gb all-4g.96gb.gfx
all-1g.34gb all-1g.34gb.me all-1g.67gb all-2g.67gb all-3g.135gb all-4g.135gb all-7g.269gb
all-1g.35gb.me all-1g.70gb all-2g.70gb all-3g.139gb all-4g.139gb all-7g.278gb
"""
UPSTREAM_NAMES = _NAMES.split()

MIG_MODELS = catalog.mig_capable_models()
REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "upstream-objects-26.7"


def rendered() -> dict[str, Any]:
    objects = mig_manager.render(make_policy(), make_facts())
    text = find(objects, "ConfigMap", "default-mig-parted-config")["data"]["config.yaml"]
    document: dict[str, Any] = yaml.safe_load(text)
    return document


def plan_on(name: str, model: catalog.GpuModel, pci_id: int = 0) -> planner.NodePlan:
    entries = cfg.parse(rendered(), "default").select(name)
    return planner.plan_node(name, entries, [planner.GpuState(0, model, pci_device_id=pci_id)])


# -- names and specs --------------------------------------------------------------------------


def test_the_default_config_map_has_upstreams_81_configs() -> None:
    configs = rendered()["mig-configs"]
    assert len(UPSTREAM_NAMES) == len(set(UPSTREAM_NAMES)) == 81
    assert set(configs) == set(UPSTREAM_NAMES)
    assert rendered()["version"] == "v1"


@pytest.mark.parametrize("config", mig_configs.CONFIGS, ids=lambda c: c.name)
def test_each_config_spec_equals_the_recorded_facts(config: mig_configs.Config) -> None:
    specs = rendered()["mig-configs"][config.name]
    assert len(specs) == len(config.entries)
    for spec, fact in zip(specs, config.entries, strict=True):
        filters = spec.get("device-filter", [])
        assert ([filters] if isinstance(filters, str) else filters) == list(fact.device_filter)
        assert spec["devices"] == "all"
        assert spec["mig-enabled"] is (fact.devices is not None)
        assert spec.get("mig-devices") == (None if fact.devices is None else dict(fact.devices))


def test_specs_of_upstreams_file_spot_checked() -> None:
    configs = rendered()["mig-configs"]
    assert configs["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    assert configs["all-enabled"] == [{"devices": "all", "mig-enabled": True, "mig-devices": {}}]
    assert configs["all-7g.186gb"] == [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"7g.186gb": 1}}
    ]
    assert configs["all-1g.24gb-me"][0]["mig-devices"] == {"1g.24gb-me": 4}
    assert configs["all-4g.96gb.gfx"][0]["mig-devices"] == {"4g.96gb+gfx": 1}
    assert configs["all-1g.24gb.me.all"][0]["mig-devices"] == {"1g.24gb+me.all": 1}
    # One profile name, two meanings: split by device filter.
    assert configs["all-1g.10gb"] == [
        {
            "device-filter": ["0x233010DE", "0x233110DE", "0x232210DE", "0x20B210DE",
                              "0x20B510DE", "0x20F310DE", "0x20F510DE", "0x232410DE"],
            "devices": "all",
            "mig-enabled": True,
            "mig-devices": {"1g.10gb": 7},
        },
        {
            "device-filter": ["0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE"],
            "devices": "all",
            "mig-enabled": True,
            "mig-devices": {"1g.10gb": 4},
        },
    ]  # fmt: skip
    # As upstream writes it: A30's filter alone is a plain string.
    assert configs["all-balanced"][8]["device-filter"] == "0x20B710DE"
    balanced = {
        tuple(f if isinstance(f, list) else [f]): s["mig-devices"]
        for s in configs["all-balanced"]
        for f in [s["device-filter"]]
    }
    assert balanced[("0x20B710DE",)] == {"1g.6gb": 2, "2g.12gb": 1}
    assert balanced[("0x2BB510DE",)] == {"1g.24gb": 2, "2g.48gb": 1}
    assert balanced[("0x294110DE",)] == {"1g.23gb": 2, "2g.47gb": 1, "3g.93gb": 1}
    assert balanced[("0x234210DE", "0x233D10DE", "0x20B610DE", "0x232910DE")] == {
        "1g.12gb": 2,
        "2g.24gb": 1,
        "3g.48gb": 1,
    }
    assert len(balanced) == 12


def test_the_config_map_equals_the_one_nvidias_operator_26_7_writes() -> None:
    """Config for config, in the same order, with the same entries and filters (H200's
    `all-1g.35gb` entry names the 141GB part only; B300 and GB300 close `all-balanced`)."""
    path = REFERENCE / "configmaps.yaml"
    if not path.is_file():
        pytest.skip(f"{path} is not here")
    theirs = next(
        d for d in yaml.safe_load_all(path.read_text())
        if d and d["metadata"]["name"] == "default-mig-parted-config"
    )  # fmt: skip
    upstream = yaml.safe_load(theirs["data"]["config.yaml"])
    ours = rendered()
    assert list(ours["mig-configs"]) == list(upstream["mig-configs"])
    assert ours == upstream
    assert list(theirs["data"]) == ["config.yaml"]


# -- the GPUs each config is for --------------------------------------------------------------


@pytest.mark.parametrize("config", mig_configs.CONFIGS, ids=lambda c: c.name)
def test_a_config_is_accepted_exactly_on_the_gpus_it_targets(config: mig_configs.Config) -> None:
    accepted, refused = set(), {}
    for model in MIG_MODELS:
        try:
            plan = plan_on(config.name, model)
        except planner.PlanError as err:
            refused[model.key] = str(err)
            continue
        if plan.gpus:  # covered (a filter for other GPUs covers nothing: no change, no error)
            accepted.add(model.key)
    assert accepted == config.targets
    for key, message in refused.items():
        # Elsewhere the MIG manager refuses it, naming the config, the GPU and the reason.
        assert message.startswith(f"mig-configs.{config.name}["), message
        assert f"GPU 0 ({key}): {key} " in message, message
        assert "has no MIG profile" in message or "holds at most" in message, message


def test_targets_cover_every_mig_model_of_the_catalog() -> None:
    targeted = set().union(*(c.targets for c in mig_configs.CONFIGS))
    assert targeted == {m.key for m in MIG_MODELS} == mig_configs.EVERY_MIG_MODEL


def _filtered() -> list[tuple[str, int, str]]:
    return [
        (c.name, i, device_id)
        for c in mig_configs.CONFIGS
        for i, e in enumerate(c.entries)
        for device_id in e.device_filter
    ]


@pytest.mark.parametrize(("name", "index", "device_id"), _filtered())
def test_every_filtered_pci_id_is_a_catalogued_gpu_that_accepts_its_entry(
    name: str, index: int, device_id: str
) -> None:
    pci_id = int(device_id, 16)
    model = catalog.for_pci_device_id(pci_id)
    assert model is not None, f"{device_id} is not in the GPU catalog"
    plan = plan_on(name, model, pci_id)
    wanted = mig_configs.BY_NAME[name].entries[index].devices
    assert wanted is not None
    (gpu,) = plan.gpus
    assert gpu.target_devices == dict(wanted)


def test_every_profile_a_config_names_is_in_the_catalog() -> None:
    known = {p.name for m in MIG_MODELS for p in m.mig_profiles}
    for config in mig_configs.CONFIGS:
        for entry in config.entries:
            for name in entry.devices or {}:
                assert profiles.parse(name).name in known, (config.name, name)


# -- the MIG manager on mock machines ---------------------------------------------------------


class FakeNode:
    """A Node with no GPU client pods: enough for the manager's protocol."""

    def __init__(self, config: str) -> None:
        self.labels = {keys.MIG_CONFIG: config, "nvidia.com/gpu.deploy.device-plugin": "true"}
        self.annotations: dict[str, str] = {}
        self.events: list[tuple[str, str, str]] = []

    async def metadata(self) -> tuple[dict[str, str], dict[str, str]]:
        return dict(self.labels), dict(self.annotations)

    async def patch(self, patch: Mapping[str, Any]) -> None:
        meta = patch.get("metadata") or {}
        for target, changes in ((self.labels, meta.get("labels")),
                                (self.annotations, meta.get("annotations"))):  # fmt: skip
            for key, value in (changes or {}).items():
                if value is None:
                    target.pop(key, None)
                else:
                    target[key] = value

    async def pods(self) -> list[dict[str, Any]]:
        return []

    async def delete_pod(self, namespace: str, name: str) -> None:
        return None

    async def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))


def machine_of(*groups: tuple[str, int]) -> mock.MockMachine:
    spec = machines.from_dict(
        {"name": "new-gpus", "gpus": [{"model": m, "count": n} for m, n in groups]}
    )
    return mock.MockMachine(spec)


async def apply(machine: mock.MockMachine, name: str) -> tuple[reconfigure.Outcome, FakeNode]:
    node = FakeNode(name)
    config = cfg.loads(mig_manager.default_mig_config_yaml(), "default-mig-parted-config")
    gpus = gpus_mod.Gpus(machine.nvml, host_mod.MockHost(machine))
    settings = reconfigure.Settings(poll_interval=0.0, clients_timeout=5.0)
    outcome = await reconfigure.Reconfigurer(node, gpus, lambda: config, settings).run(name)
    return outcome, node


def layout_of(machine: mock.MockMachine) -> list[dict[str, int]]:
    return [g.devices for g in gpus_mod.Gpus(machine.nvml, host_mod.MockHost(machine)).read()]


async def test_the_manager_partitions_b300s_with_their_default_configs() -> None:
    machine = machine_of(("B300", 4))
    outcome, node = await apply(machine, "all-1g.34gb")
    assert outcome.state == "success", outcome.message
    assert layout_of(machine) == [{"1g.34gb": 7}] * 4
    assert node.labels[keys.MIG_CONFIG_STATE] == "success"
    outcome, _ = await apply(machine, "all-7g.269gb")
    assert outcome.state == "success", outcome.message
    assert layout_of(machine) == [{"7g.269gb": 1}] * 4
    lib = machine.nvml()
    lib.init()
    mig = lib.device_by_index(0).mig_device_by_index(0)
    assert mig.name() == "NVIDIA B300 SXM6 AC MIG 7g.269gb"


async def test_all_balanced_on_a_node_mixing_new_gpus_follows_each_device_filter() -> None:
    machine = machine_of(("GB300", 2), ("RTX-PRO-6000", 2))
    outcome, _ = await apply(machine, "all-balanced")
    assert outcome.state == "success", outcome.message
    assert (
        layout_of(machine)
        == [{"1g.35gb": 2, "2g.70gb": 1, "3g.139gb": 1}] * 2 + [{"1g.24gb": 2, "2g.48gb": 1}] * 2
    )


async def test_graphics_instances_on_rtx_pro_6000_keep_their_suffix() -> None:
    machine = machine_of(("RTX-PRO-6000", 2))
    outcome, _ = await apply(machine, "all-1g.24gb.gfx")
    assert outcome.state == "success", outcome.message
    assert layout_of(machine) == [{"1g.24gb+gfx": 4}] * 2
    lib = machine.nvml()
    lib.init()
    assert lib.device_by_index(1).mig_device_by_index(3).name().endswith("MIG 1g.24gb+gfx")


async def test_a_config_for_other_gpus_fails_clearly_and_changes_nothing() -> None:
    machine = machine_of(("B300", 2))
    outcome, node = await apply(machine, "all-1g.24gb.gfx")
    assert outcome.state == "failed"
    assert outcome.message.startswith("mig-configs.all-1g.24gb.gfx[0]: GPU 0 (B300): ")
    assert "B300 has no MIG profile '1g.24gb+gfx'; its profiles are 1g.34gb," in outcome.message
    assert layout_of(machine) == [{}, {}]
    assert node.labels[keys.MIG_CONFIG_STATE] == "failed"
    assert [e[1] for e in node.events] == ["MigConfigFailed"]
