"""Device discovery and naming: NVML facts in, resources out (MIG strategies, sharing, paths)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.device_plugin import devices, facts
from gpu_operator.agents.device_plugin.facts import GpuFacts, MigFacts, NodeFacts
from gpu_operator.nvml import machines, mock

NOWHERE = Path("/nonexistent-root")


def node_of(preset: str, **kwargs: Path) -> NodeFacts:
    lib = mock.MockMachine.from_preset(preset).nvml()
    lib.init()
    return facts.collect(
        lib,
        driver_root=kwargs.get("driver_root", NOWHERE),
        sys_root=kwargs.get("sys_root", NOWHERE),
    )


def config(**flags: object) -> pc.PluginConfig:
    return pc.parse({"flags": flags})


def names(resources: tuple[devices.Resource, ...]) -> dict[str, int]:
    return {r.name: len(r.devices) for r in resources}


def gpu(index: int, *migs: MigFacts, mig: bool = False) -> GpuFacts:
    return GpuFacts(
        index=index,
        uuid=f"GPU-{index}",
        name="NVIDIA A100-SXM4-40GB",
        minor=index,
        bus_id=f"00000000:{0x10 + index:02X}:00.0",
        memory_mib=40960,
        compute_capability=(8, 0),
        mig_enabled=mig or bool(migs),
        migs=migs,
    )


def mig(index: int, profile: str, gi: int, ci: int = 0, attrs: tuple[int, ...] = (1,)) -> MigFacts:
    return MigFacts(index, f"MIG-{profile}-{gi}-{ci}", gi, ci, profile, 4864, attrs)


STANDARD = facts.standard_mig_minors((0, 1, 2))


def test_full_gpus_are_nvidia_com_gpu_with_uuid_ids_index_paths_and_compute_capability() -> None:
    resources = devices.build_resources(node_of("t4x4"), pc.PluginConfig())
    assert names(resources) == {"nvidia.com/gpu": 4}
    first = resources[0].devices[0]
    assert first.id == first.uuid
    assert first.id.startswith("GPU-")
    assert (first.index, first.paths, first.compute_capability) == ("0", ("/dev/nvidia0",), "7.5")
    assert first.memory_mib == 15360
    assert resources[0].socket_name == "nvidia-gpu.sock"


def test_mig_strategy_none_advertises_mig_enabled_gpus_as_whole_gpus() -> None:
    resources = devices.build_resources(node_of("dgx-a100-mig-mixed"), config(migStrategy="none"))
    assert names(resources) == {"nvidia.com/gpu": 8}
    assert not any(d.is_mig for d in resources[0].devices)


def test_mig_strategy_single_advertises_uniform_mig_devices_as_nvidia_com_gpu() -> None:
    resources = devices.build_resources(
        node_of("dgx-a100-mig-single"), config(migStrategy="single")
    )
    assert names(resources) == {"nvidia.com/gpu": 56}
    d = resources[0].devices[0]
    assert d.is_mig
    assert d.index == "0:0"
    assert d.id.startswith("MIG-")
    assert d.parent_uuid.startswith("GPU-")


def test_mig_strategy_single_rejects_mixed_profiles_with_upstreams_message() -> None:
    with pytest.raises(devices.DeviceError, match="more than one MIG device type present on node"):
        devices.build_resources(node_of("dgx-a100-mig-mixed"), config(migStrategy="single"))


def test_mig_strategy_single_rejects_mig_and_non_mig_gpus_together() -> None:
    node = NodeFacts((gpu(0, mig(0, "1g.5gb", 1)), gpu(1)), STANDARD)
    with pytest.raises(devices.DeviceError, match="same migEnabled value"):
        devices.build_resources(node, config(migStrategy="single"))


def test_mig_strategy_single_rejects_a_mig_enabled_gpu_without_mig_devices() -> None:
    node = NodeFacts((gpu(0, mig(0, "1g.5gb", 1)), gpu(1, mig=True)), STANDARD)
    with pytest.raises(devices.DeviceError, match="device 1 has an invalid MIG configuration"):
        devices.build_resources(node, config(migStrategy="single"))


def test_mig_strategy_single_without_any_mig_gpu_advertises_full_gpus() -> None:
    resources = devices.build_resources(node_of("t4x4"), config(migStrategy="single"))
    assert names(resources) == {"nvidia.com/gpu": 4}


def test_mig_strategy_mixed_names_each_profile_and_keeps_non_mig_gpus_as_gpu() -> None:
    node = NodeFacts(
        (gpu(0, mig(0, "3g.20gb", 2), mig(1, "1g.5gb+me", 3), mig(2, "1g.5gb", 4)), gpu(1)),
        STANDARD,
    )
    resources = devices.build_resources(node, config(migStrategy="mixed"))
    assert names(resources) == {
        "nvidia.com/gpu": 1,
        "nvidia.com/mig-1g.5gb": 1,
        "nvidia.com/mig-1g.5gb.me": 1,
        "nvidia.com/mig-3g.20gb": 1,
    }
    by_name = {r.name: r for r in resources}
    assert by_name["nvidia.com/mig-1g.5gb.me"].socket_name == "nvidia-mig-1g.5gb.me.sock"


def test_mig_strategy_mixed_on_a_preset_counts_every_profile() -> None:
    resources = devices.build_resources(node_of("dgx-a100-mig-mixed"), config(migStrategy="mixed"))
    assert names(resources) == {
        "nvidia.com/mig-1g.5gb": 16,
        "nvidia.com/mig-2g.10gb": 8,
        "nvidia.com/mig-3g.20gb": 8,
    }


def test_mig_strategy_mixed_rejects_a_profile_with_fewer_compute_slices() -> None:
    node = NodeFacts((gpu(0, mig(0, "1c.2g.10gb", 1)),), STANDARD)
    with pytest.raises(devices.DeviceError, match=r"MIG profile '1c\.2g\.10gb' does not match"):
        devices.build_resources(node, config(migStrategy="mixed"))


def test_mig_strategy_mixed_only_warns_about_an_empty_mig_gpu() -> None:
    node = NodeFacts((gpu(0, mig(0, "1g.5gb", 1)), gpu(1, mig=True)), STANDARD)
    assert names(devices.build_resources(node, config(migStrategy="mixed"))) == {
        "nvidia.com/mig-1g.5gb": 1
    }


def test_mig_device_paths_add_the_gi_and_ci_capability_nodes_of_mig_minors() -> None:
    minors = facts.parse_mig_minors(
        "config 1\nmonitor 2\ngpu0/gi2/access 21\ngpu0/gi2/ci0/access 22\n"
    )
    d = devices.mig_device(gpu(0), mig(1, "3g.20gb", 2), minors)
    assert d.paths == (
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap22",
    )


def test_mig_device_without_its_capability_minor_is_an_error() -> None:
    with pytest.raises(devices.DeviceError, match="no capability minor for gpu0/gi2/access"):
        devices.mig_device(gpu(0), mig(1, "3g.20gb", 2), {})


def test_standard_mig_minors_match_the_kernel_modules_published_table() -> None:
    table = facts.standard_mig_minors(tuple(range(32)))
    assert table["config"] == 1
    assert table["monitor"] == 2
    assert table["gpu0/gi0/access"] == 3
    assert table["gpu0/gi0/ci0/access"] == 4
    assert table["gpu3/gi3/ci3/access"] == 439
    assert table["gpu6/gi11/ci7/access"] == 920
    assert table["gpu31/gi14/ci7/access"] == 4322


def test_mig_minors_file_under_the_driver_root_wins_over_the_standard_table(tmp_path: Path) -> None:
    path = tmp_path / facts.MIG_MINORS_FILE
    path.parent.mkdir(parents=True)
    path.write_text("gpu0/gi1/access 100\nbad line\ngpu0/gi1/ci0/access 101\n")
    assert facts.read_mig_minors(tmp_path, (0,)) == {
        "gpu0/gi1/access": 100,
        "gpu0/gi1/ci0/access": 101,
    }
    assert facts.read_mig_minors(tmp_path / "missing", (0,))["gpu0/gi1/access"] == 12


def test_numa_node_comes_from_sysfs_and_negative_or_missing_means_none(tmp_path: Path) -> None:
    folder = tmp_path / "sys/bus/pci/devices/0000:07:00.0"
    folder.mkdir(parents=True)
    (folder / "numa_node").write_text("1\n")
    assert facts.read_numa_node(tmp_path, "00000000:07:00.0") == 1
    (folder / "numa_node").write_text("-1\n")
    assert facts.read_numa_node(tmp_path, "00000000:07:00.0") is None
    assert facts.read_numa_node(tmp_path, "00000000:0F:00.0") is None


def test_collect_reads_numa_for_the_mock_gpus_bus_ids(tmp_path: Path) -> None:
    folder = tmp_path / "sys/bus/pci/devices/0000:0f:00.0"
    folder.mkdir(parents=True)
    (folder / "numa_node").write_text("0\n")
    node = node_of("dgx-a100", sys_root=tmp_path)
    assert [g.numa_node for g in node.gpus[:2]] == [None, 0]


def test_time_slicing_replicates_every_gpu_with_numbered_ids() -> None:
    cfg = pc.parse(
        {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 10}]}}}
    )
    resources = devices.build_resources(node_of("dgx-a100"), cfg)
    assert names(resources) == {"nvidia.com/gpu": 80}
    r = resources[0]
    assert r.sharing is pc.SharingStrategy.TIME_SLICING
    assert not r.fail_requests_greater_than_one
    first = r.devices[0]
    assert first.id == f"{first.uuid}::0"
    assert first.replicas == 10
    assert first.is_replica
    assert [d.id for d in r.devices[:3]] == [f"{first.uuid}::{n}" for n in range(3)]
    assert devices.physical_id(r.devices[9].id) == first.uuid


def test_rename_by_default_moves_replicas_to_the_shared_resource() -> None:
    cfg = pc.parse(
        {
            "sharing": {
                "timeSlicing": {
                    "renameByDefault": True,
                    "failRequestsGreaterThanOne": True,
                    "resources": [{"name": "nvidia.com/gpu", "replicas": 2}],
                }
            }
        }
    )
    resources = devices.build_resources(node_of("t4x4"), cfg)
    assert names(resources) == {"nvidia.com/gpu.shared": 8}
    assert resources[0].socket_name == "nvidia-gpu.shared.sock"
    assert resources[0].fail_requests_greater_than_one


def test_time_slicing_of_one_mig_profile_leaves_the_others_alone() -> None:
    cfg = pc.parse(
        {
            "flags": {"migStrategy": "mixed"},
            "sharing": {
                "timeSlicing": {"resources": [{"name": "nvidia.com/mig-1g.5gb", "replicas": 3}]}
            },
        }
    )
    resources = devices.build_resources(node_of("dgx-a100-mig-mixed"), cfg)
    assert names(resources) == {
        "nvidia.com/mig-1g.5gb": 48,
        "nvidia.com/mig-2g.10gb": 8,
        "nvidia.com/mig-3g.20gb": 8,
    }
    shared = {r.name: r for r in resources}
    assert shared["nvidia.com/mig-2g.10gb"].sharing is pc.SharingStrategy.NONE


def test_mps_defaults_to_failing_requests_greater_than_one() -> None:
    cfg = pc.parse({"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}})
    (r,) = devices.build_resources(node_of("t4x4"), cfg)
    assert r.sharing is pc.SharingStrategy.MPS
    assert r.fail_requests_greater_than_one
    assert len(r.devices) == 16


def test_mps_on_mig_devices_is_rejected() -> None:
    cfg = pc.parse(
        {
            "flags": {"migStrategy": "single"},
            "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}},
        }
    )
    with pytest.raises(devices.DeviceError, match="MPS is not supported for MIG devices"):
        devices.build_resources(node_of("dgx-a100-mig-single"), cfg)


def _time_sliced(replicas: dict[str, int], **flags: object) -> pc.PluginConfig:
    resources = [{"name": name, "replicas": n} for name, n in replicas.items()]
    return pc.parse({"flags": flags, "sharing": {"timeSlicing": {"resources": resources}}})


def test_time_slicing_at_the_per_gpu_limit_advertises_every_replica() -> None:
    cfg = _time_sliced({"nvidia.com/gpu": pc.MAX_REPLICAS})
    resources = devices.build_resources(node_of("dgx-a100"), cfg)
    assert names(resources) == {"nvidia.com/gpu": 8 * 1024}


def test_a_node_past_the_device_limit_is_refused_before_any_replica_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 16 MIG devices of one profile times 1,024, plus the other 16 devices: 16,400 > 16,384.
    def not_reached(*_args: object) -> list[devices.Device]:
        raise AssertionError("replicas built before the node's total was checked")

    monkeypatch.setattr(devices, "replicate", not_reached)
    cfg = _time_sliced({"nvidia.com/mig-1g.5gb": 1024}, migStrategy="mixed")
    with pytest.raises(devices.DeviceError) as err:
        devices.build_resources(node_of("dgx-a100-mig-mixed"), cfg)
    assert str(err.value) == (
        "this node would advertise 16,400 devices (nvidia.com/mig-1g.5gb 16,384, "
        "nvidia.com/mig-2g.10gb 8, nvidia.com/mig-3g.20gb 8), more than the 16,384 one node may "
        "advertise (the kubelet reads each resource's device list as one gRPC message of at "
        "most 4 MiB): lower the replicas in sharing.timeSlicing or sharing.mps"
    )


@pytest.mark.parametrize(
    ("preset", "cfg"),
    [
        ("dgx-a100", pc.PluginConfig()),
        ("dgx-a100", _time_sliced({"nvidia.com/gpu": 7})),
        ("dgx-a100-mig-mixed", _time_sliced({"nvidia.com/mig-1g.5gb": 3}, migStrategy="mixed")),
        ("dgx-a100-mig-single", _time_sliced({"nvidia.com/gpu": 5}, migStrategy="single")),
        (
            "t4x4",
            pc.parse(
                {
                    "sharing": {
                        "timeSlicing": {
                            "renameByDefault": True,
                            "resources": [{"name": "nvidia.com/gpu", "replicas": 2}],
                        }
                    }
                }
            ),
        ),
    ],
)
def test_the_counted_total_is_what_is_built(preset: str, cfg: pc.PluginConfig) -> None:
    node = node_of(preset)
    base = devices.base_devices(node, cfg.flags.mig_strategy)
    assert devices.advertised_count(base, cfg) == names(devices.build_resources(node, cfg))


def test_nvswitch_boards_count_links_through_shared_switches() -> None:
    node = node_of("dgx-a100")
    link = node.links[(0, 1)]
    assert link.nvlinks == 12  # 12 links, two to each of six switches shared by every GPU
    assert node_of("t4x4").links[(0, 1)].nvlinks == 0


def test_direct_nvlinks_count_only_links_to_the_other_gpu() -> None:
    buses = frozenset({"0000:10:00.0", "0000:20:00.0", "0000:30:00.0"})
    peers = ["0000:20:00.0", "0000:20:00.0", "0000:30:00.0"]
    assert facts.count_nvlinks(peers, [], "0000:20:00.0", buses) == 2
    assert facts.count_nvlinks(peers, [], "0000:30:00.0", buses) == 1
    switched = ["0000:c0:00.0", "0000:c0:00.0", "0000:c1:00.0"]
    assert facts.count_nvlinks(switched, ["0000:c0:00.0"], "0000:20:00.0", buses) == 1


def _rtx_pro_node(*layout: str) -> NodeFacts:
    spec = machines.from_dict(
        {
            "name": "rtx-pro",
            "gpus": [{"model": "RTX-PRO-6000", "migEnabled": True, "migDevices": list(layout)}],
        }
    )
    lib = mock.MockMachine(spec).nvml()
    lib.init()
    return facts.collect(lib, driver_root=NOWHERE, sys_root=NOWHERE)


def test_mixed_names_gfx_no_me_and_all_me_profiles_with_their_suffix_as_upstream() -> None:
    node = _rtx_pro_node("1g.24gb+gfx", "1g.24gb-me", "2g.48gb+me.all")
    assert sorted(m.profile for m in node.gpus[0].migs) == [
        "1g.24gb+gfx",
        "1g.24gb-me",
        "2g.48gb+me.all",
    ]
    resources = devices.build_resources(node, config(migStrategy="mixed"))
    # Upstream's mixed rules replace `+` with `.` (a resource name is a DNS subdomain).
    assert names(resources) == {
        "nvidia.com/mig-1g.24gb.gfx": 1,
        "nvidia.com/mig-1g.24gb-me": 1,
        "nvidia.com/mig-2g.48gb.me.all": 1,
    }


def test_a_plain_profile_and_its_gfx_twin_are_different_resources() -> None:
    node = _rtx_pro_node("2g.48gb", "2g.48gb+gfx")
    resources = devices.build_resources(node, config(migStrategy="mixed"))
    assert names(resources) == {"nvidia.com/mig-2g.48gb": 1, "nvidia.com/mig-2g.48gb.gfx": 1}
