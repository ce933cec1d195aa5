"""GPU feature discovery: labels as a pure function of facts and config, per preset and strategy."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest

from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.gfd import facts as gfd_facts
from gpu_operator.agents.gfd import labels as gfd_labels
from gpu_operator.agents.gfd.facts import GpuFacts, NodeFacts, VgpuFacts
from gpu_operator.nvml import catalog, machines, mock

TS = gfd_labels.LabelOptions(timestamp=1724632719)


def facts_for(preset: str, machine_type: str = "NVIDIA DGX A100") -> NodeFacts:
    lib = mock.MockMachine.from_preset(preset).nvml()
    lib.init()
    return gfd_facts.collect(lib, machine_type=machine_type)


def config(
    mig: str = "none", sharing: Mapping[str, object] | None = None, **gfd: object
) -> pc.PluginConfig:
    data: dict[str, object] = {"flags": {"migStrategy": mig, "gfd": gfd}}
    if sharing:
        data["sharing"] = dict(sharing)
    return pc.parse(data)


def labels(facts: NodeFacts, cfg: pc.PluginConfig | None = None) -> dict[str, str]:
    return gfd_labels.compute_labels(facts, cfg or config(), TS)


def time_slicing(replicas: int, name: str = "nvidia.com/gpu", **extra: object) -> dict[str, object]:
    return {"timeSlicing": {"resources": [{"name": name, "replicas": replicas}], **extra}}


def test_dgx_a100_without_mig_gives_exactly_the_upstream_label_set() -> None:
    assert labels(facts_for("dgx-a100")) == {
        "nvidia.com/gfd.timestamp": "1724632719",
        "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/cuda.driver.minor": "54",
        "nvidia.com/cuda.driver.rev": "15",
        "nvidia.com/cuda.driver-version.major": "550",
        "nvidia.com/cuda.driver-version.minor": "54",
        "nvidia.com/cuda.driver-version.revision": "15",
        "nvidia.com/cuda.driver-version.full": "550.54.15",
        "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "4",
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "4",
        "nvidia.com/cuda.runtime-version.full": "12.4",
        "nvidia.com/gpu.machine": "NVIDIA-DGX-A100",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
        "nvidia.com/gpu.memory": "40960",
        "nvidia.com/gpu.family": "ampere",
        "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.mode": "compute",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mps.capable": "false",
        "nvidia.com/vgpu.present": "false",
    }


PRESETS = {
    # preset: (product, count, memory, family, major, minor, mig.capable)
    "dgx-a100": ("NVIDIA-A100-SXM4-40GB", "8", "40960", "ampere", "8", "0", "true"),
    "dgx-a100-80gb": ("NVIDIA-A100-SXM4-80GB", "8", "81920", "ampere", "8", "0", "true"),
    "dgx-h100": ("NVIDIA-H100-80GB-HBM3", "8", "81559", "hopper", "9", "0", "true"),
    "dgx-h200": ("NVIDIA-H200", "8", "143771", "hopper", "9", "0", "true"),
    "hgx-b200": ("NVIDIA-B200", "8", "183359", "blackwell", "10", "0", "true"),
    "t4x4": ("Tesla-T4", "4", "15360", "turing", "7", "5", "false"),
    "l4x8": ("NVIDIA-L4", "8", "23034", "ada-lovelace", "8", "9", "false"),
    "a30x4": ("NVIDIA-A30", "4", "24576", "ampere", "8", "0", "true"),
    "l40sx4": ("NVIDIA-L40S", "4", "46068", "ada-lovelace", "8", "9", "false"),
}


@pytest.mark.parametrize("strategy", ["none", "single", "mixed"])
@pytest.mark.parametrize(("preset", "expected"), sorted(PRESETS.items()))
def test_full_gpu_labels_per_preset(preset: str, expected: tuple[str, ...], strategy: str) -> None:
    got = labels(facts_for(preset), config(strategy))
    keys = ("product", "count", "memory", "family", "compute.major", "compute.minor")
    got_values = (*(got[f"nvidia.com/gpu.{k}"] for k in keys), got["nvidia.com/mig.capable"])
    assert got_values == expected
    assert got["nvidia.com/gpu.replicas"] == "1"
    if strategy == "none":
        assert "nvidia.com/mig.strategy" not in got
    else:
        assert got["nvidia.com/mig.strategy"] == strategy
    assert not any(k.startswith("nvidia.com/mig-") for k in got)


def test_b200_machine_reports_its_newer_driver() -> None:
    got = labels(facts_for("hgx-b200"))
    assert got["nvidia.com/cuda.driver-version.full"] == "560.28.03"
    assert got["nvidia.com/cuda.runtime-version.full"] == "12.6"


def test_single_strategy_overloads_gpu_labels_with_the_mig_device() -> None:
    got = labels(facts_for("dgx-a100-mig-single"), config("single"))
    expected = {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "nvidia.com/gpu.count": "56",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.memory": "4864",
        "nvidia.com/gpu.multiprocessors": "14",
        "nvidia.com/gpu.slices.gi": "1",
        "nvidia.com/gpu.slices.ci": "1",
        "nvidia.com/gpu.engines.copy": "1",
        "nvidia.com/gpu.engines.decoder": "0",
        "nvidia.com/gpu.engines.encoder": "0",
        "nvidia.com/gpu.engines.jpeg": "0",
        "nvidia.com/gpu.engines.ofa": "0",
        "nvidia.com/gpu.family": "ampere",
        "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/gpu.mode": "compute",
    }
    assert {k: got[k] for k in expected} == expected


def test_none_strategy_on_a_mig_node_labels_full_gpus_without_sharing() -> None:
    got = labels(facts_for("dgx-a100-mig-single"), config("none"))
    assert got["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert got["nvidia.com/gpu.count"] == "8"
    assert got["nvidia.com/gpu.replicas"] == "0"
    assert "nvidia.com/gpu.multiprocessors" not in got


def test_mixed_strategy_labels_every_profile() -> None:
    got = labels(facts_for("dgx-a100-mig-mixed"), config("mixed"))
    assert got["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert got["nvidia.com/gpu.count"] == "8"
    assert got["nvidia.com/gpu.replicas"] == "0"
    counts = {k: v for k, v in got.items() if k.endswith(".count") and "mig-" in k}
    assert counts == {
        "nvidia.com/mig-1g.5gb.count": "16",
        "nvidia.com/mig-2g.10gb.count": "8",
        "nvidia.com/mig-3g.20gb.count": "8",
    }
    assert got["nvidia.com/mig-3g.20gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"
    assert got["nvidia.com/mig-3g.20gb.memory"] == "19968"
    assert got["nvidia.com/mig-3g.20gb.multiprocessors"] == "42"
    assert got["nvidia.com/mig-3g.20gb.engines.decoder"] == "2"
    assert got["nvidia.com/mig-2g.10gb.slices.gi"] == "2"
    assert got["nvidia.com/mig-1g.5gb.replicas"] == "1"
    assert got["nvidia.com/mig-1g.5gb.sharing-strategy"] == "none"


INVALID_SINGLE = {
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-INVALID",
    "nvidia.com/gpu.count": "0",
    "nvidia.com/gpu.replicas": "0",
    "nvidia.com/gpu.memory": "0",
    "nvidia.com/gpu.sharing-strategy": "",
}


def _subset(got: dict[str, str]) -> dict[str, str]:
    return {k: got[k] for k in INVALID_SINGLE}


def test_single_strategy_with_several_profiles_is_invalid() -> None:
    assert _subset(labels(facts_for("dgx-a100-mig-mixed"), config("single"))) == INVALID_SINGLE


def test_single_strategy_with_an_empty_mig_gpu_is_invalid() -> None:
    facts = facts_for("dgx-a100-mig-single")
    gpus = list(facts.gpus)
    gpus[3] = dataclasses.replace(gpus[3], mig_devices=())
    got = labels(dataclasses.replace(facts, gpus=tuple(gpus)), config("single"))
    assert _subset(got) == INVALID_SINGLE


def test_single_strategy_with_mig_and_full_gpus_mixed_is_invalid() -> None:
    facts = facts_for("dgx-a100-mig-single")
    gpus = list(facts.gpus)
    gpus[0] = dataclasses.replace(gpus[0], mig_enabled=False, mig_devices=())
    got = labels(dataclasses.replace(facts, gpus=tuple(gpus)), config("single"))
    assert _subset(got) == INVALID_SINGLE


def test_mixed_strategy_full_gpus_override_mig_enabled_ones_of_the_same_model() -> None:
    facts = facts_for("dgx-a100-mig-single")
    gpus = list(facts.gpus)
    gpus[0] = dataclasses.replace(gpus[0], mig_enabled=False, mig_devices=())
    got = labels(dataclasses.replace(facts, gpus=tuple(gpus)), config("mixed"))
    assert got["nvidia.com/gpu.replicas"] == "1"
    assert got["nvidia.com/gpu.count"] == "8"
    assert got["nvidia.com/mig-1g.5gb.count"] == "49"


@pytest.mark.parametrize("preset", ["t4x4", "dgx-h100", "l40sx4"])
def test_time_slicing_marks_the_product_shared(preset: str) -> None:
    got = labels(facts_for(preset), config(sharing=time_slicing(4)))
    assert got["nvidia.com/gpu.replicas"] == "4"
    assert got["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert got["nvidia.com/gpu.product"] == PRESETS[preset][0] + "-SHARED"
    assert got["nvidia.com/mps.capable"] == "false"


def test_rename_by_default_drops_the_shared_suffix() -> None:
    got = labels(facts_for("t4x4"), config(sharing=time_slicing(4, renameByDefault=True)))
    assert got["nvidia.com/gpu.product"] == "Tesla-T4"
    assert got["nvidia.com/gpu.replicas"] == "4"


def test_time_slicing_of_another_resource_leaves_gpu_unshared() -> None:
    got = labels(facts_for("t4x4"), config(sharing=time_slicing(4, name="nvidia.com/other")))
    assert got["nvidia.com/gpu.replicas"] == "1"
    assert got["nvidia.com/gpu.sharing-strategy"] == "none"
    assert got["nvidia.com/gpu.product"] == "Tesla-T4"


def test_time_slicing_of_a_mig_resource_in_mixed_mode() -> None:
    sharing = time_slicing(2, name="nvidia.com/mig-1g.5gb")
    got = labels(facts_for("dgx-a100-mig-mixed"), config("mixed", sharing))
    assert got["nvidia.com/mig-1g.5gb.replicas"] == "2"
    assert got["nvidia.com/mig-1g.5gb.sharing-strategy"] == "time-slicing"
    assert got["nvidia.com/mig-1g.5gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED"
    assert got["nvidia.com/mig-2g.10gb.replicas"] == "1"


def test_time_slicing_in_single_mode_shares_the_mig_devices() -> None:
    got = labels(facts_for("dgx-a100-mig-single"), config("single", time_slicing(3)))
    assert got["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED"
    assert got["nvidia.com/gpu.replicas"] == "3"


def test_mps_sharing() -> None:
    mps = {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 10}]}}
    got = labels(facts_for("dgx-h100"), config(sharing=mps))
    assert got["nvidia.com/mps.capable"] == "true"
    assert got["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert got["nvidia.com/gpu.replicas"] == "10"
    assert got["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"
    on_mig = labels(facts_for("dgx-a100-mig-single"), config("single", mps))
    assert on_mig["nvidia.com/mps.capable"] == "false"


def test_mps_wins_over_time_slicing() -> None:
    sharing = {**time_slicing(2), "mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 5}]}}
    got = labels(facts_for("t4x4"), config(sharing=sharing))
    assert (got["nvidia.com/gpu.sharing-strategy"], got["nvidia.com/gpu.replicas"]) == ("mps", "5")


def test_no_timestamp_and_no_gpus() -> None:
    got = labels(facts_for("t4x4"), config(noTimestamp=True))
    assert gfd_labels.TIMESTAMP not in got
    empty = NodeFacts("550.54.15", 12040, "x", ())
    assert labels(empty) == {gfd_labels.TIMESTAMP: "1724632719"}
    assert labels(empty, config(noTimestamp=True)) == {}


def _one_gpu(**kw: object) -> NodeFacts:
    gpu = GpuFacts(name="NVIDIA L4", memory_mib=23034, compute_capability=(8, 9))
    return NodeFacts("550.54.15", 12040, "box", (dataclasses.replace(gpu, **kw),))  # type: ignore[arg-type]


def test_driver_versions_with_two_parts_and_malformed_ones() -> None:
    facts = dataclasses.replace(_one_gpu(), driver_version="535.104")
    got = labels(facts)
    assert got["nvidia.com/cuda.driver.rev"] == ""
    assert got["nvidia.com/cuda.driver-version.revision"] == ""
    for bad in ("550", "1.2.3.4"):
        with pytest.raises(gfd_labels.LabelError, match=r"X\.Y"):
            labels(dataclasses.replace(facts, driver_version=bad))


@pytest.mark.parametrize(
    ("pci_classes", "mode"),
    [
        ((catalog.PCI_CLASS_3D,), "compute"),
        ((catalog.PCI_CLASS_VGA,), "graphics"),
        ((catalog.PCI_CLASS_3D, catalog.PCI_CLASS_VGA), "unknown"),
        ((None,), "unknown"),
        ((0x0380,), "unknown"),
    ],
)
def test_gpu_mode(pci_classes: tuple[int | None, ...], mode: str) -> None:
    gpu = _one_gpu().gpus[0]
    gpus = tuple(dataclasses.replace(gpu, pci_class=c) for c in pci_classes)
    got = labels(dataclasses.replace(_one_gpu(), gpus=gpus))
    assert got["nvidia.com/gpu.mode"] == mode


def test_clique_label_needs_agreeing_fabric_ids() -> None:
    gpu = _one_gpu().gpus[0]
    agree = (dataclasses.replace(gpu, fabric=("c1", 3)), dataclasses.replace(gpu, fabric=("c1", 3)))
    got = labels(dataclasses.replace(_one_gpu(), gpus=(*agree, gpu)))
    assert got["nvidia.com/gpu.clique"] == "c1.3"
    split = (dataclasses.replace(gpu, fabric=("c1", 3)), dataclasses.replace(gpu, fabric=("c1", 4)))
    assert "nvidia.com/gpu.clique" not in labels(dataclasses.replace(_one_gpu(), gpus=split))


def test_vgpu_labels() -> None:
    facts = dataclasses.replace(_one_gpu(), vgpu=VgpuFacts("550.54.16", "r550_40"))
    got = labels(facts)
    assert got["nvidia.com/vgpu.present"] == "true"
    assert got["nvidia.com/vgpu.host-driver-version"] == "550.54.16"
    assert got["nvidia.com/vgpu.host-driver-branch"] == "r550_40"


def test_machine_type_is_sanitised_and_defaults_to_unknown(tmp_path: object) -> None:
    got = labels(dataclasses.replace(_one_gpu(), machine_type="  ProLiant DL380 (Gen10)+ "))
    assert got["nvidia.com/gpu.machine"] == "ProLiant-DL380-Gen10"
    assert gfd_facts.read_machine_type("/nonexistent/product_name") == "unknown"


@pytest.mark.parametrize(
    ("text", "clean"),
    [
        ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
        ("Tesla  T4", "Tesla-T4"),
        ("GRID A100-8C", "GRID-A100-8C"),
        ("a/b:c d", "abc-d"),
        ("tab\tgone", "tabgone"),
        ("1g.5gb_x", "1g.5gb_x"),
    ],
)
def test_sanitise(text: str, clean: str) -> None:
    assert gfd_labels.sanitise(text) == clean


@pytest.mark.parametrize(
    ("cc", "name"),
    [
        ((1, 0), "tesla"), ((2, 1), "fermi"), ((3, 5), "kepler"), ((5, 2), "maxwell"),
        ((6, 0), "pascal"), ((7, 0), "volta"), ((7, 5), "turing"), ((8, 6), "ampere"),
        ((8, 9), "ada-lovelace"), ((9, 0), "hopper"), ((10, 0), "blackwell"),
        ((12, 0), "blackwell"), ((13, 0), "rubin"), ((4, 0), "undefined"),
    ],
)  # fmt: skip
def test_family_table(cc: tuple[int, int], name: str) -> None:
    assert gfd_labels.family(*cc) == name


def test_compute_capability_zero_leaves_out_family_and_compute() -> None:
    got = labels(_one_gpu(compute_capability=(0, 0), memory_mib=0))
    assert "nvidia.com/gpu.family" not in got
    assert "nvidia.com/gpu.compute.major" not in got
    assert "nvidia.com/gpu.memory" not in got


def test_media_extension_profile_is_labelled_with_dots() -> None:
    mig = gfd_facts.MigDeviceFacts("1g.5gb+me", 4864, 14, 1, 1, 1, 1, 0, 1, 1)
    gpu = GpuFacts("NVIDIA A100-SXM4-40GB", 40960, (8, 0), True, True, mig_devices=(mig,))
    got = labels(NodeFacts("550.54.15", 12040, "x", (gpu,)), config("mixed"))
    assert got["nvidia.com/mig-1g.5gb.me.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb.me"
    assert got["nvidia.com/mig-1g.5gb.me.engines.ofa"] == "1"


def test_render_sorts_key_value_lines() -> None:
    assert gfd_labels.render({"b": "2", "a": "1"}) == "a=1\nb=2\n"


def test_facts_from_mock_read_mig_devices_and_fabric(tmp_path: object) -> None:
    facts = facts_for("dgx-a100-mig-mixed")
    assert facts.gpus[0].mig_enabled
    assert sorted(m.profile for m in facts.gpus[0].mig_devices) == [
        "1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb",
    ]  # fmt: skip
    assert facts.gpus[0].fabric is None


def test_gfx_no_me_and_all_me_profiles_keep_their_suffix_in_mixed_labels() -> None:
    spec = machines.from_dict(
        {
            "name": "rtx-pro",
            "gpus": [
                {
                    "model": "RTX-PRO-6000",
                    "migEnabled": True,
                    "migDevices": ["1g.24gb+gfx", "1g.24gb-me", "2g.48gb+me.all"],
                }
            ],
        }
    )
    lib = mock.MockMachine(spec).nvml()
    lib.init()
    got = labels(gfd_facts.collect(lib, machine_type="x"), config("mixed"))
    counts = {k: v for k, v in got.items() if k.startswith("nvidia.com/mig-") and ".count" in k}
    assert counts == {
        "nvidia.com/mig-1g.24gb.gfx.count": "1",
        "nvidia.com/mig-1g.24gb-me.count": "1",
        "nvidia.com/mig-2g.48gb.me.all.count": "1",
    }
    assert got["nvidia.com/mig-1g.24gb.gfx.product"].endswith("-MIG-1g.24gb.gfx")
