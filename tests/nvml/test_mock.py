"""The mock NVML backend: presets, MIG rules, handles, telemetry, events and faults."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pytest
from waiting import DEADLINE

from gpu_operator import nvml
from gpu_operator.nvml import catalog, machines, mock
from gpu_operator.nvml.catalog import Placement


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def open_machine(name: str, **kwargs: object) -> tuple[mock.MockMachine, mock.MockNvml]:
    machine = mock.MockMachine.from_preset(name, **kwargs)
    lib = machine.nvml()
    lib.init()
    return machine, lib


def enable_mig(machine: mock.MockMachine, lib: mock.MockNvml, index: int = 0) -> mock.MockDevice:
    dev = lib.device_by_index(index)
    dev.set_mig_mode(True)
    machine.reset(index)
    return dev


# -- presets and identity ---------------------------------------------------------------------

PRESET_MODELS = {
    "dgx-a100": ("NVIDIA A100-SXM4-40GB", 8),
    "dgx-a100-80gb": ("NVIDIA A100-SXM4-80GB", 8),
    "dgx-h100": ("NVIDIA H100 80GB HBM3", 8),
    "dgx-h200": ("NVIDIA H200", 8),
    "hgx-b200": ("NVIDIA B200", 8),
    "t4x4": ("Tesla T4", 4),
    "l4x8": ("NVIDIA L4", 8),
    "a30x4": ("NVIDIA A30", 4),
    "l40sx4": ("NVIDIA L40S", 4),
}


@pytest.mark.parametrize(("preset", "expected"), sorted(PRESET_MODELS.items()))
def test_presets_build_the_named_gpus(preset: str, expected: tuple[str, int]) -> None:
    _, lib = open_machine(preset)
    name, count = expected
    assert lib.device_count() == count
    devices = [lib.device_by_index(i) for i in range(count)]
    assert {d.name() for d in devices} == {name}
    uuids = [d.uuid() for d in devices]
    assert len(set(uuids)) == count
    assert all(u.startswith("GPU-") for u in uuids)
    assert [d.minor_number() for d in devices] == list(range(count))
    assert len({d.pci_info().bus_id for d in devices}) == count


def test_machine_is_deterministic_for_a_seed() -> None:
    _, a = open_machine("dgx-a100", seed=3)
    _, b = open_machine("dgx-a100", seed=3)
    _, c = open_machine("dgx-a100", seed=4)
    assert a.device_by_index(0).uuid() == b.device_by_index(0).uuid()
    assert a.device_by_index(0).uuid() != c.device_by_index(0).uuid()


def test_versions_follow_the_machine_spec() -> None:
    _, lib = open_machine("dgx-a100")
    assert lib.driver_version() == "550.54.15"
    assert lib.cuda_driver_version() == 12040
    assert lib.nvml_version() == "12.550.54.15"
    _, b200 = open_machine("hgx-b200")
    assert b200.driver_version() == "560.28.03"
    assert b200.cuda_driver_version() == 12060


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(machines.UnknownMachine, match="known presets: a30x4"):
        mock.MockMachine.from_preset("dgx-z9000")


def test_calls_before_init_and_after_shutdown_fail() -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    lib = machine.nvml()
    with pytest.raises(nvml.Uninitialized):
        lib.device_count()
    lib.init()
    dev = lib.device_by_index(0)
    lib.shutdown()
    with pytest.raises(nvml.Uninitialized):
        dev.name()


def test_device_by_uuid_finds_gpus_and_mig_devices() -> None:
    _, lib = open_machine("dgx-a100-mig-single")
    gpu = lib.device_by_index(3)
    mig = gpu.mig_device_by_index(2)
    assert lib.device_by_uuid(gpu.uuid()).index() == 3
    found = lib.device_by_uuid(mig.uuid())
    assert found.is_mig_device()
    assert found.parent().uuid() == gpu.uuid()
    with pytest.raises(nvml.NotFound):
        lib.device_by_uuid("GPU-00000000-0000-0000-0000-000000000000")


# -- YAML machines ----------------------------------------------------------------------------


def test_machine_file_builds_a_heterogeneous_node(tmp_path: Path) -> None:
    path = tmp_path / "box.yaml"
    path.write_text(
        """
name: lab-box
productName: PowerEdge XE8545
driverVersion: "535.104.05"
cudaDriverVersion: 12020
gpus:
  - model: A100-SXM4-80GB
    count: 2
    migEnabled: true
    migDevices: [3g.40gb, 3g.40gb]
  - model: T4
"""
    )
    machine = mock.MockMachine.from_file(path)
    lib = machine.nvml()
    lib.init()
    assert lib.device_count() == 3
    assert lib.driver_version() == "535.104.05"
    assert lib.device_by_index(0).mig_mode() == nvml.MigMode(True, True)
    names = [lib.device_by_index(0).mig_device_by_index(i).name() for i in range(2)]
    assert names == ["NVIDIA A100-SXM4-80GB MIG 3g.40gb"] * 2
    assert lib.device_by_index(2).name() == "Tesla T4"
    assert not machine.nvswitch


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("name: x\ngpus: [{model: GTX-1080}]", "gpus.0.model"),
        ("name: x\ngpus: [{model: T4, migEnabled: true}]", "T4 is not MIG capable"),
        ("name: x\ngpus: [{model: T4, count: 0}]", "gpus.0.count"),
        ("name: x\ngpus: []", "gpus"),
        ("name: x\ngpus: [{model: T4}]\ncolour: red", "colour"),
        ("name: x\ngpus: [{model: A100-SXM4-40GB, migEnabled: true, migDevices: [9g.99gb]}]",
         "no MIG profile '9g.99gb'"),
        ("- a\n- b", "expected a mapping"),
        ("name: [unclosed", "not valid YAML"),
    ],
)  # fmt: skip
def test_bad_machine_files_name_the_field(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(machines.MachineFileError, match=message):
        mock.MockMachine.from_file(path)


def test_machine_file_with_an_impossible_layout_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: x\ngpus: [{model: A100-SXM4-40GB, migEnabled: true, migDevices: [4g.20gb, 4g.20gb]}]"
    )
    with pytest.raises(machines.MachineFileError, match="cannot hold MIG layout"):
        mock.MockMachine.from_file(path)


def test_missing_machine_file() -> None:
    with pytest.raises(machines.MachineFileError, match=r"machine\.yaml: no such file"):
        mock.MockMachine.from_file("/nonexistent/machine.yaml")


# -- MIG mode ---------------------------------------------------------------------------------


def test_mig_mode_change_is_pending_until_reset() -> None:
    machine, lib = open_machine("dgx-a100")
    dev = lib.device_by_index(0)
    assert dev.mig_mode() == nvml.MigMode(False, False)
    dev.set_mig_mode(True)
    assert dev.mig_mode() == nvml.MigMode(False, True)
    with pytest.raises(nvml.NotSupported, match="MIG mode is not enabled"):
        dev.create_gpu_instance(catalog.GI_PROFILE_1_SLICE)
    machine.reset(0)
    assert dev.mig_mode() == nvml.MigMode(True, True)
    assert dev.max_mig_device_count() == 7


def test_mig_mode_on_a_non_mig_gpu_is_not_supported() -> None:
    _, lib = open_machine("t4x4")
    dev = lib.device_by_index(0)
    with pytest.raises(nvml.NotSupported):
        dev.mig_mode()
    with pytest.raises(nvml.NotSupported):
        dev.set_mig_mode(True)
    assert dev.max_mig_device_count() == 0


def test_mig_mode_cannot_change_while_instances_exist() -> None:
    machine, lib = open_machine("dgx-a100")
    dev = enable_mig(machine, lib)
    dev.create_gpu_instance(catalog.GI_PROFILE_7_SLICE)
    with pytest.raises(nvml.InUse):
        dev.set_mig_mode(False)


def test_reset_refuses_while_processes_run() -> None:
    machine, _lib = open_machine("dgx-a100")
    machine.start_process(0, 42, used_memory_mib=100)
    with pytest.raises(nvml.InUse):
        machine.reset(0)


# -- MIG placement rules: an independent oracle enumerates every valid layout ------------------


def _valid_layouts(model: catalog.GpuModel) -> set[tuple[tuple[int, Placement], ...]]:
    """Every set of (profile, placement) a GPU can hold, found by brute force."""
    options = [(p, pl) for p in model.mig_profiles for pl in p.placements]
    found: set[tuple[tuple[int, Placement], ...]] = set()

    def ok(chosen: list[tuple[catalog.MigProfile, Placement]]) -> bool:
        counts = Counter(p.profile_id for p, _ in chosen)
        if any(counts[p.profile_id] > p.instance_count for p, _ in chosen):
            return False
        if sum(1 for p, _ in chosen if p.media_extensions) > 1:
            return False
        if sum(p.slice_count for p, _ in chosen) > model.mig_compute_slices:
            return False
        spans = [pl for _, pl in chosen]
        return all(not a.overlaps(b) for i, a in enumerate(spans) for b in spans[i + 1 :])

    def walk(start: int, chosen: list[tuple[catalog.MigProfile, Placement]]) -> None:
        found.add(tuple(sorted(((p.profile_id, pl) for p, pl in chosen),
                               key=lambda x: (x[1].start, x[0]))))  # fmt: skip
        for i in range(start, len(options)):
            candidate = [*chosen, options[i]]
            if ok(candidate):
                walk(i + 1, candidate)

    walk(0, [])
    return found


MIG_MODELS = [m.key for m in catalog.mig_capable_models()]
PRESET_FOR = {
    "A100-SXM4-40GB": "dgx-a100",
    "A100-SXM4-80GB": "dgx-a100-80gb",
    "H100-SXM5-80GB": "dgx-h100",
    "H200-141GB": "dgx-h200",
    "B200": "hgx-b200",
    "A30-24GB": "a30x4",
}


def open_model(key: str) -> tuple[mock.MockMachine, mock.MockNvml]:
    """A preset with GPUs of `key`, or (models without one) a one-GPU machine of it."""
    if key in PRESET_FOR:
        return open_machine(PRESET_FOR[key])
    spec = machines.from_dict({"name": key.lower(), "gpus": [{"model": key}]})
    machine = mock.MockMachine(spec)
    lib = machine.nvml()
    lib.init()
    return machine, lib


@pytest.mark.parametrize("key", MIG_MODELS)
def test_every_valid_layout_can_be_created_and_nothing_more_fits(key: str) -> None:
    model = catalog.model(key)
    layouts = _valid_layouts(model)
    assert len(layouts) > 20
    machine, lib = open_model(key)
    dev = enable_mig(machine, lib)
    for layout in layouts:
        created = [dev.create_gpu_instance(pid, pl) for pid, pl in layout]
        # Whatever the oracle says cannot be added must be refused with the driver's error.
        have = {(pid, pl) for pid, pl in layout}
        for prof in model.mig_profiles:
            extendable = any(
                tuple(sorted([*have, (prof.profile_id, pl)], key=lambda x: (x[1].start, x[0])))
                in layouts
                for pl in prof.placements
            )
            expected = 1 if extendable else 0
            assert min(dev.gpu_instance_remaining_capacity(prof.profile_id), 1) == expected
            if not extendable:
                with pytest.raises(nvml.InsufficientResources):
                    dev.create_gpu_instance(prof.profile_id)
        for gi in created:
            gi.destroy()


def test_reference_consequences_on_a100() -> None:
    machine, lib = open_machine("dgx-a100")
    dev = enable_mig(machine, lib)
    ids = {p.name: p.profile_id for p in catalog.model("A100-SXM4-40GB").mig_profiles}

    def layout(*names: str) -> None:
        gis = [dev.create_gpu_instance(ids[n]) for n in names]
        for gi in gis:
            gi.destroy()

    layout("4g.20gb", "3g.20gb")
    layout("3g.20gb", "3g.20gb")
    layout("2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb")
    layout(*["1g.5gb"] * 7)
    layout("4g.20gb", "2g.10gb", "1g.5gb")
    seven = dev.create_gpu_instance(ids["7g.40gb"])
    with pytest.raises(nvml.InsufficientResources):
        dev.create_gpu_instance(ids["1g.5gb"])
    seven.destroy()
    # Order matters: a 3g at slot 0 leaves no room for the 4g.
    three = dev.create_gpu_instance(ids["3g.20gb"], Placement(0, 4))
    with pytest.raises(nvml.InsufficientResources):
        dev.create_gpu_instance(ids["4g.20gb"])
    three.destroy()


@pytest.mark.parametrize(
    ("key", "names"),
    [
        ("A100-SXM4-40GB", ["1g.5gb"] * 8),
        ("A100-SXM4-40GB", ["4g.20gb", "4g.20gb"]),
        ("A100-SXM4-40GB", ["3g.20gb"] * 3),
        ("A100-SXM4-40GB", ["1g.5gb+me", "1g.5gb+me"]),
        ("A100-SXM4-40GB", ["1g.10gb"] * 5),
        ("H100-SXM5-80GB", ["2g.20gb"] * 4),
        ("H200-141GB", ["7g.141gb", "1g.18gb"]),
        ("B200", ["4g.90gb", "4g.90gb"]),
        ("A30-24GB", ["1g.6gb"] * 5),
        ("A30-24GB", ["2g.12gb", "2g.12gb", "1g.6gb"]),
        ("A30-24GB", ["1g.6gb+me", "2g.12gb+me"]),
        ("B300", ["1g.34gb"] * 8),
        ("GB300", ["4g.139gb", "3g.139gb", "1g.35gb"]),
        ("RTX-PRO-6000", ["1g.24gb+me", "1g.24gb+me.all"]),
        ("RTX-PRO-6000", ["2g.48gb+gfx", "2g.48gb-me", "1g.24gb"]),
        ("RTX-PRO-6000", ["4g.96gb+gfx", "1g.24gb+gfx"]),
    ],
)
def test_invalid_layouts_fail_with_insufficient_resources(key: str, names: list[str]) -> None:
    machine, lib = open_model(key)
    dev = enable_mig(machine, lib)
    model = catalog.model(key)
    *fits, last = names
    for n in fits:
        dev.create_gpu_instance(model.mig_profile(n).profile_id)
    with pytest.raises(nvml.InsufficientResources):
        dev.create_gpu_instance(model.mig_profile(last).profile_id)


def test_bad_profile_ids_and_placements() -> None:
    machine, lib = open_machine("a30x4")
    dev = enable_mig(machine, lib)
    with pytest.raises(nvml.InvalidArgument):
        dev.create_gpu_instance(99)
    with pytest.raises(nvml.NotSupported):
        dev.create_gpu_instance(catalog.GI_PROFILE_7_SLICE)
    with pytest.raises(nvml.InvalidArgument, match="valid: 0:2, 2:2"):
        dev.create_gpu_instance(catalog.GI_PROFILE_2_SLICE, Placement(1, 2))
    dev.create_gpu_instance(catalog.GI_PROFILE_2_SLICE, Placement(2, 2))
    with pytest.raises(nvml.InsufficientResources, match="overlaps"):
        dev.create_gpu_instance(catalog.GI_PROFILE_1_SLICE, Placement(3, 1))


def test_profile_info_and_placements() -> None:
    _machine, lib = open_machine("dgx-a100")
    dev = lib.device_by_index(0)
    info = dev.gpu_instance_profile_info(catalog.GI_PROFILE_3_SLICE)
    assert (info.name, info.slice_count, info.instance_count, info.memory_size_mb) == (
        "MIG 3g.20gb", 3, 2, 19968,
    )  # fmt: skip
    # R550 drivers answer profile and placement queries with MIG off (NVML change log)...
    assert dev.gpu_instance_possible_placements(catalog.GI_PROFILE_3_SLICE) == [
        Placement(0, 4),
        Placement(4, 4),
    ]
    # ...older ones only with MIG on.
    old = mock.MockMachine.from_preset("dgx-a100", driver="535.183.01")
    old_lib = old.nvml()
    old_lib.init()
    old_dev = old_lib.device_by_index(0)
    for query in (old_dev.gpu_instance_possible_placements, old_dev.gpu_instance_profile_info):
        with pytest.raises(nvml.NotSupported):
            query(catalog.GI_PROFILE_3_SLICE)
    enable_mig(old, old_lib)
    assert old_dev.gpu_instance_profile_info(catalog.GI_PROFILE_3_SLICE).slice_count == 3


# -- compute instances and MIG devices --------------------------------------------------------


def test_compute_instances_inside_a_gpu_instance() -> None:
    machine, lib = open_machine("dgx-a100")
    dev = enable_mig(machine, lib)
    gi = dev.create_gpu_instance(catalog.GI_PROFILE_7_SLICE)
    cis = [gi.create_compute_instance(catalog.CI_PROFILE_BY_SLICES[2]) for _ in range(3)]
    assert gi.compute_instance_remaining_capacity(catalog.CI_PROFILE_BY_SLICES[2]) == 0
    assert gi.compute_instance_remaining_capacity(catalog.CI_PROFILE_BY_SLICES[1]) == 1
    with pytest.raises(nvml.InsufficientResources):
        gi.create_compute_instance(catalog.CI_PROFILE_BY_SLICES[2])
    gi.create_compute_instance(catalog.CI_PROFILE_BY_SLICES[1])
    with pytest.raises(nvml.InsufficientResources):
        gi.create_compute_instance(catalog.CI_PROFILE_BY_SLICES[1])
    names = [dev.mig_device_by_index(i).name() for i in range(4)]
    assert names == ["NVIDIA A100-SXM4-40GB MIG 2c.7g.40gb"] * 3 + [
        "NVIDIA A100-SXM4-40GB MIG 1c.7g.40gb"
    ]
    with pytest.raises(nvml.InUse):
        gi.destroy()
    for ci in [*cis, *gi.compute_instances(catalog.CI_PROFILE_BY_SLICES[1])]:
        ci.destroy()
    gi.destroy()
    with pytest.raises(nvml.InvalidArgument):
        gi.info()


def test_compute_profile_errors() -> None:
    machine, lib = open_machine("dgx-a100")
    dev = enable_mig(machine, lib)
    gi = dev.create_gpu_instance(catalog.GI_PROFILE_4_SLICE)
    with pytest.raises(nvml.NotSupported):
        gi.create_compute_instance(catalog.CI_PROFILE_BY_SLICES[3])
    with pytest.raises(nvml.InvalidArgument):
        gi.create_compute_instance(42)
    with pytest.raises(nvml.NotSupported):
        gi.compute_instance_profile_info(0, engine_profile=1)
    assert gi.compute_instance_profile_info(0).multiprocessor_count == 14


def test_mig_device_handles_and_attributes() -> None:
    _, lib = open_machine("dgx-a100-mig-mixed")
    gpu = lib.device_by_index(0)
    migs = [gpu.mig_device_by_index(i) for i in range(4)]
    with pytest.raises(nvml.NotFound):
        gpu.mig_device_by_index(4)
    with pytest.raises(nvml.InvalidArgument):
        gpu.mig_device_by_index(7)
    profiles = sorted(m.name().rsplit(" ", 1)[1] for m in migs)
    assert profiles == ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]
    assert all(m.uuid().startswith("MIG-") for m in migs)
    three = next(m for m in migs if m.name().endswith("3g.20gb"))
    attrs = three.mig_attributes()
    assert (attrs.gpu_instance_slice_count, attrs.memory_size_mb, attrs.multiprocessor_count) == (
        3, 19968, 42,
    )  # fmt: skip
    assert three.memory_info().total == 19968 << 20
    assert three.parent().uuid() == gpu.uuid()
    gi = gpu.gpu_instance_by_id(three.gpu_instance_id())
    # NVML reports the profile's internal id (lgip's ID column, 9 for 3g), not the enum.
    assert gi.info().profile_id == 9
    assert gpu.gpu_instance_profile_info(catalog.GI_PROFILE_3_SLICE).id == 9
    with pytest.raises(nvml.NotSupported):
        three.mig_mode()
    with pytest.raises(nvml.NotSupported):
        gpu.mig_attributes()


def test_mig_handle_goes_stale_when_its_instance_is_destroyed() -> None:
    machine, lib = open_machine("dgx-a100")
    dev = enable_mig(machine, lib)
    gi = dev.create_gpu_instance(catalog.GI_PROFILE_7_SLICE)
    ci = gi.create_compute_instance(catalog.CI_PROFILE_BY_SLICES[7])
    mig = dev.mig_device_by_index(0)
    ci.destroy()
    with pytest.raises(nvml.InvalidArgument, match="no longer exists"):
        mig.uuid()


# -- telemetry --------------------------------------------------------------------------------


def test_telemetry_follows_load_and_is_deterministic() -> None:
    clock = FakeClock()
    machine, lib = open_machine("dgx-h100", clock=clock)
    dev = lib.device_by_index(0)
    idle_power = dev.power_usage()
    idle_temp = dev.temperature()
    assert dev.utilization().gpu <= 2
    assert dev.clock(nvml.ClockType.SM) < 1000
    machine.start_process(0, 100, used_memory_mib=40000, load=100)
    busy = dev.utilization().gpu
    assert busy >= 80
    # The instant reading has the load at once; NVML's power usage averages the last second.
    assert dev.power_usage_instant() > idle_power + 400_000
    assert dev.power_usage() < dev.power_usage_instant()
    clock.now += 1.0
    assert dev.power_usage() > idle_power + 400_000
    assert dev.temperature() > idle_temp + 25
    assert dev.clock(nvml.ClockType.SM) == 1980
    assert dev.memory_info().used == 40000 << 20
    assert [x.pid for x in dev.running_processes()] == [100]
    _, twin = open_machine("dgx-h100", clock=FakeClock())
    assert twin.device_by_index(0).temperature() == idle_temp


def test_telemetry_moves_over_time_and_energy_accumulates() -> None:
    clock = FakeClock()
    machine, lib = open_machine("dgx-a100", clock=clock)
    machine.start_process(1, 7, used_memory_mib=1000, load=70)
    dev = lib.device_by_index(1)
    samples = []
    e0 = dev.total_energy_consumption()
    for _ in range(30):
        clock.now += 1.0
        samples.append(dev.utilization().gpu)
    assert len(set(samples)) > 3
    assert all(50 <= s <= 75 for s in samples)
    e1 = dev.total_energy_consumption()
    # 30 s at a few hundred watts: several kJ, in mJ.
    assert 3_000_000 < e1 - e0 < 12_000_000


def test_utilization_is_not_supported_in_mig_mode() -> None:
    _, lib = open_machine("dgx-a100-mig-single")
    with pytest.raises(nvml.NotSupported):
        lib.device_by_index(0).utilization()


# -- NVLink and topology ----------------------------------------------------------------------


def test_eight_gpu_boards_have_nvlink_to_nvswitches() -> None:
    _, lib = open_machine("dgx-h100")
    dev = lib.device_by_index(0)
    assert all(dev.nvlink_state(link) for link in range(18))
    with pytest.raises(nvml.InvalidArgument):
        dev.nvlink_state(18)
    remotes = {dev.nvlink_remote_pci_bus_id(link) for link in range(18)}
    assert len(remotes) == 4
    other = lib.device_by_index(1)
    far = lib.device_by_index(7)
    assert dev.topology_common_ancestor(other) == nvml.protocol.TopologyLevel.SINGLE
    assert dev.topology_common_ancestor(far) == nvml.protocol.TopologyLevel.SYSTEM


def test_pcie_only_machines_have_no_nvlink() -> None:
    _, lib = open_machine("l4x8")
    with pytest.raises(nvml.NotSupported):
        lib.device_by_index(0).nvlink_state(0)


def test_gpus_report_the_cpus_and_numa_node_of_their_socket() -> None:
    """Four GPUs per socket in index order; a socket's CPUs are its cores, then their
    hyper-thread siblings (Linux numbering), as nvmlDeviceGetCpuAffinity reports them."""
    _, lib = open_machine("dgx-a100")  # two 64-core EPYCs
    first, last = lib.device_by_index(3), lib.device_by_index(4)
    assert first.cpu_affinity() == (*range(64), *range(128, 192))
    assert last.cpu_affinity() == (*range(64, 128), *range(192, 256))
    assert (first.memory_affinity(), last.memory_affinity()) == ((0,), (1,))
    _, mig_lib = open_machine("dgx-a100-mig-single")
    with pytest.raises(nvml.NotSupported):
        mig_lib.device_by_index(0).mig_device_by_index(0).cpu_affinity()
    one_socket = mock.MockMachine(
        machines.from_dict({"name": "box", "gpus": [{"model": "L4", "count": 8}],
                            "host": {"sockets": 1, "coresPerSocket": 16}})
    )  # fmt: skip
    lib = one_socket.nvml()
    lib.init()
    assert lib.device_by_index(7).memory_affinity() == (0,)
    assert lib.device_by_index(0).topology_common_ancestor(lib.device_by_index(7)) == (
        nvml.protocol.TopologyLevel.NODE
    )


def test_nics_share_the_pcie_switches_of_the_gpus_they_serve() -> None:
    machine, _ = open_machine("dgx-h100")
    assert [n.name for n in machine.nics] == [f"mlx5_{k}" for k in range(8)]
    gpu0, gpu1, gpu2, gpu7 = (machine.gpus[i].bus_id for i in (0, 1, 2, 7))
    nic0 = machine.nics[0].bus_id
    level = machine.pci_common_ancestor
    assert level(gpu0, nic0) == nvml.protocol.TopologyLevel.SINGLE
    assert level(gpu1, nic0) == nvml.protocol.TopologyLevel.SINGLE
    assert level(gpu2, nic0) == nvml.protocol.TopologyLevel.NODE
    assert level(gpu7, nic0) == nvml.protocol.TopologyLevel.SYSTEM
    assert level(nic0, nic0.lower()) == nvml.protocol.TopologyLevel.INTERNAL
    assert open_machine("t4x4")[0].nics == []
    with pytest.raises(machines.MachineFileError, match=r"host\.nics: 3 NICs for 1 GPU"):
        machines.from_dict({"name": "box", "gpus": [{"model": "T4"}], "host": {"nics": 3}})


# -- events and faults ------------------------------------------------------------------------


def test_xid_and_ecc_events_reach_registered_sets() -> None:
    machine, lib = open_machine("dgx-a100")
    events = lib.event_set()
    dev = lib.device_by_index(2)
    events.register(dev, nvml.EventType.XID_CRITICAL | nvml.EventType.DOUBLE_BIT_ECC)
    machine.inject_xid(2, 48)
    machine.inject_xid(3, 31)  # not registered
    machine.inject_ecc_error(2, uncorrected=False)  # single-bit: not registered
    machine.inject_ecc_error(2, uncorrected=True, count=2)
    first = events.wait(0)
    assert (first.device_uuid, first.event_type, first.event_data) == (
        dev.uuid(), nvml.EventType.XID_CRITICAL, 48,
    )  # fmt: skip
    assert events.wait(0).event_type == nvml.EventType.DOUBLE_BIT_ECC
    with pytest.raises(nvml.Timeout):
        events.wait(0)
    vol = dev.total_ecc_errors(nvml.EccErrorType.UNCORRECTED, nvml.EccCounterType.VOLATILE)
    assert vol == 2
    assert dev.total_ecc_errors(nvml.EccErrorType.CORRECTED, nvml.EccCounterType.AGGREGATE) == 1
    machine.reset(2)
    assert dev.total_ecc_errors(nvml.EccErrorType.UNCORRECTED, nvml.EccCounterType.VOLATILE) == 0
    assert dev.total_ecc_errors(nvml.EccErrorType.UNCORRECTED, nvml.EccCounterType.AGGREGATE) == 2


def test_xid_event_can_be_scoped_to_a_mig_instance() -> None:
    machine, lib = open_machine("dgx-a100-mig-single")
    events = lib.event_set()
    events.register(lib.device_by_index(0), nvml.EventType.XID_CRITICAL)
    machine.inject_xid(0, 94, gpu_instance_id=3, compute_instance_id=0)
    event = events.wait(0)
    assert (event.gpu_instance_id, event.compute_instance_id) == (3, 0)


def test_wait_blocks_until_an_event_arrives_from_another_thread() -> None:
    machine, lib = open_machine("dgx-a100")
    events = lib.event_set()
    events.register(lib.device_by_index(0), nvml.EventType.XID_CRITICAL)
    started = threading.Event()

    def fire() -> None:
        assert started.wait(DEADLINE)
        machine.inject_xid(0, 63)

    thread = threading.Thread(target=fire)
    thread.start()
    started.set()
    assert events.wait(int(DEADLINE * 1000)).event_data == 63
    thread.join(DEADLINE)
    assert not thread.is_alive()


def test_gpu_falling_off_the_bus() -> None:
    machine, lib = open_machine("dgx-a100")
    events = lib.event_set()
    dev = lib.device_by_index(5)
    events.register(dev, nvml.EventType.XID_CRITICAL)
    machine.fall_off_bus(5)
    assert events.wait(0).event_data == mock.XID_FALLEN_OFF_BUS
    with pytest.raises(nvml.GpuLost):
        dev.uuid()
    with pytest.raises(nvml.GpuLost):
        lib.device_by_index(5)
    assert lib.device_by_index(4).name() == "NVIDIA A100-SXM4-40GB"
    machine.reset(5)
    assert dev.uuid().startswith("GPU-")


def test_xid_79_is_the_gpu_falling_off_the_bus() -> None:
    """Issue 30 item 14: XID 79 means the GPU fell off the bus, so NVML answers GPU_IS_LOST for
    it from then on. Before the fix an injected XID 79 left the GPU answering: utilisation,
    power and memory kept coming."""
    machine, lib = open_machine("dgx-a100")
    dev = lib.device_by_index(2)
    machine.inject_xid(2, mock.XID_FALLEN_OFF_BUS)
    for read in (dev.utilization, dev.power_usage, dev.memory_info, dev.temperature):
        with pytest.raises(nvml.GpuLost):
            read()
    with pytest.raises(nvml.GpuLost):
        lib.device_by_index(2)
    machine.reset(2)
    assert dev.utilization().gpu >= 0


def test_a_mig_device_of_a_lost_gpu_is_lost_too() -> None:
    machine, lib = open_machine("dgx-a100-mig-single")
    uuid = lib.device_by_index(1).mig_device_by_index(0).uuid()
    machine.fall_off_bus(1)
    with pytest.raises(nvml.GpuLost):
        lib.device_by_uuid(uuid)


def test_injected_call_errors_fire_the_requested_number_of_times() -> None:
    machine, lib = open_machine("dgx-a100")
    machine.fail_next("memory_info", nvml.Unknown, gpu=1, times=2)
    assert lib.device_by_index(0).memory_info().total == 40960 << 20
    dev = lib.device_by_index(1)
    for _ in range(2):
        with pytest.raises(nvml.Unknown):
            dev.memory_info()
    assert dev.memory_info().total == 40960 << 20


def test_persistent_fault_until_cleared_and_init_failure() -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    machine.fail_next("init", nvml.LibraryNotFound, times=None)
    lib = machine.nvml()
    for _ in range(3):
        with pytest.raises(nvml.LibraryNotFound, match="is the NVIDIA driver installed"):
            lib.init()
    machine.clear_faults()
    lib.init()
    assert lib.device_count() == 4


def test_fault_on_an_unknown_call_name_is_rejected() -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    with pytest.raises(ValueError, match="unknown NVML call"):
        machine.fail_next("nvmlDeviceGetNmae", nvml.Unknown)


def test_concurrent_instance_creation_never_oversubscribes() -> None:
    machine, lib = open_machine("dgx-a100")
    dev = enable_mig(machine, lib)
    made: list[object] = []
    refused: list[Exception] = []

    def worker() -> None:
        for _ in range(4):
            try:
                made.append(dev.create_gpu_instance(catalog.GI_PROFILE_1_SLICE))
            except nvml.InsufficientResources as err:
                refused.append(err)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
        assert not t.is_alive(), "a worker did not finish"
    assert len(made) == 7
    assert len(refused) == 9
