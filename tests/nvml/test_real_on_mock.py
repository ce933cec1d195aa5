"""The real backend (`RealNvml`) on a simulated NVML that keeps the C library's habits
(`mock_pynvml`): internal profile ids, memory v1/v2, per-field return codes, the library search,
privileges, lost GPUs. Each test names the review finding (R1..R15, docs/gpu-layer.md) it pins
and fails on the backend as it was before that fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_operator import nvml
from gpu_operator.nvml import catalog, library, machines, mock, mock_pynvml, real
from gpu_operator.nvml import protocol as p


def machine_of(
    model: str, *, driver: str | None = None, cuda: int | None = None, **group: object
) -> mock.MockMachine:
    data: dict[str, object] = {"name": "box", "gpus": [{"model": model, **group}]}
    if driver is not None:
        data["driverVersion"] = driver
    if cuda is not None:
        data["cudaDriverVersion"] = cuda
    return mock.MockMachine(machines.from_dict(data))


def real_on(
    machine: mock.MockMachine, *, privileged: bool = True, driver_root: object = None
) -> real.RealNvml:
    fake = mock_pynvml.MockPynvml(machine, privileged=privileged)
    lib = real.RealNvml(driver_root, module=fake, load_library=fake.load_library)  # type: ignore[arg-type]
    lib.init()
    return lib


# ----- R1: NVML's internal GPU-instance profile ids -----------------------------------------


def test_profile_info_carries_nvml_internal_id_not_the_enum() -> None:
    """R1: `nvidia-smi mig -lgip` on an H100 shows 1g 19, 1g+me 20, 1g.20gb 15, 2g 14, 3g 9,
    4g 5, 7g 0. Before the fix GpuInstanceProfileInfo had no `id` (the internal id was
    dropped) and callers took `GpuInstanceInfo.profile_id` for the enum."""
    lib = real_on(machine_of("H100-SXM5-80GB", migEnabled=True, migDevices=["2g.20gb"]))
    gpu = lib.device_by_index(0)
    ids = {
        e: gpu.gpu_instance_profile_info(e).id
        for e in (0, 7, 9, 1, 2, 3, 4)  # 1g, 1g+me, 1g double memory, 2g, 3g, 4g, 7g
    }
    assert ids == {0: 19, 7: 20, 9: 15, 1: 14, 2: 9, 3: 5, 4: 0}
    mig = gpu.mig_device_by_index(0)
    gi = gpu.gpu_instance_by_id(mig.gpu_instance_id())
    assert gi.info().profile_id == 14  # the internal id of 2g, not GI_PROFILE_2_SLICE (1)


def test_placements_of_a_profile_with_more_places_than_instances() -> None:
    """R1/R6 (found by this suite): 1g+me allows one instance in seven places. Before the fix
    the placement array was sized by the instance count (1), which NVML refuses as too small
    (INSUFFICIENT_SIZE); it is now sized by NVML's own count."""
    lib = real_on(machine_of("H100-SXM5-80GB", migEnabled=True))
    found = lib.device_by_index(0).gpu_instance_possible_placements(catalog.GI_PROFILE_1_SLICE_REV1)
    assert found == [catalog.Placement(s, 1) for s in range(7)]


@pytest.mark.parametrize("model", [m.key for m in catalog.mig_capable_models()])
def test_every_catalogued_profile_has_a_distinct_internal_id(model: str) -> None:
    """R1: the mock serves NVML's internal ids for every MIG model (before the fix it served
    the enum, so every test agreed with code that confused the two)."""
    profiles = catalog.model(model).mig_profiles
    ids = [prof.nvml_id for prof in profiles]
    assert all(i >= 0 for i in ids), ids
    assert len(set(ids)) == len(ids)


# ----- R2: the library under the driver root ------------------------------------------------


def test_library_is_loaded_from_the_driver_root(tmp_path: Path) -> None:
    """R2: in a pod the NVIDIA runtime did not set up, `libnvidia-ml.so.1` is only under the
    driver root. Before the fix RealNvml took no driver root and init failed with
    LibraryNotFound."""
    root = tmp_path / "driver-root"
    (root / "usr/lib64").mkdir(parents=True)
    (root / "usr/lib64" / library.NVML_LIBRARY).write_bytes(b"\x7fELF")
    machine = machine_of("T4")
    machine.library_on_loader_path = False
    fake = mock_pynvml.MockPynvml(machine)
    lib = real.RealNvml(root, module=fake, load_library=fake.load_library)
    lib.init()
    assert lib.device_count() == 1
    assert fake.nvmlLib.path == str(root / "usr/lib64" / library.NVML_LIBRARY)


def test_missing_library_names_where_it_was_looked_for(tmp_path: Path) -> None:
    """R2: the error names the roots searched and the fix (before: pynvml's bare 'NVML Shared
    Library Not Found' with no path)."""
    machine = machine_of("T4")
    machine.library_on_loader_path = False
    fake = mock_pynvml.MockPynvml(machine)
    lib = real.RealNvml(tmp_path / "empty", module=fake, load_library=fake.load_library)
    with pytest.raises(nvml.LibraryNotFound) as info:
        lib.init()
    text = str(info.value)
    assert str(tmp_path / "empty") in text
    assert "usr/lib/x86_64-linux-gnu" in text
    assert "mount the driver root" in text


def test_mock_library_search_follows_the_same_rule(tmp_path: Path) -> None:
    """R2 (mock side): a machine whose library is not on the loader path initialises only with
    a driver root that holds it."""
    machine = machine_of("T4")
    machine.library_on_loader_path = False
    with pytest.raises(nvml.LibraryNotFound, match="is not on the loader path"):
        machine.nvml().init()
    (tmp_path / "lib/x86_64-linux-gnu").mkdir(parents=True)
    (tmp_path / "lib/x86_64-linux-gnu" / library.NVML_LIBRARY).touch()
    machine.nvml(driver_root=tmp_path).init()


# ----- R3: privileges ------------------------------------------------------------------------


def test_unprivileged_mig_queries_name_the_fix() -> None:
    """R3: NVML keeps GPU-instance lookups from unprivileged users (our image runs as uid
    65532). Before the fix the error said only 'needs root or CAP_SYS_ADMIN'; it now names the
    setting that fixes it and the uid the agent runs as."""
    machine = machine_of("A100-SXM4-40GB", migEnabled=True, migDevices=["3g.20gb"])
    lib = real_on(machine, privileged=False)
    gpu = lib.device_by_index(0)
    mig = gpu.mig_device_by_index(0)
    with pytest.raises(nvml.NoPermission) as info:
        gpu.gpu_instance_by_id(mig.gpu_instance_id())
    assert "runAsUser: 0" in str(info.value)
    assert "runs as uid" in str(info.value)
    # What needs no privileges still answers.
    assert mig.memory_info().total == 19968 << 20


# ----- R4: memory v2 -------------------------------------------------------------------------


def test_memory_reports_reserved_apart_from_used() -> None:
    """R4: nvmlMemory_t (v1) counts the driver's reserved memory as used; v2 reports it
    apart. Before the fix an idle H100 showed hundreds of MiB used and nothing reserved."""
    machine = machine_of("H100-SXM5-80GB")
    info = real_on(machine).device_by_index(0).memory_info()
    reserved = catalog.model("H100-SXM5-80GB").system_reserved_mib << 20
    assert info.used == 0
    assert info.reserved == reserved
    assert info.total == info.free + info.used + info.reserved


def test_memory_falls_back_to_v1_on_drivers_without_v2() -> None:
    """R4: drivers before R510 have no nvmlDeviceGetMemoryInfo_v2; v1 still answers."""
    machine = machine_of("A100-SXM4-40GB", driver="470.199.02", cuda=11040)
    info = real_on(machine).device_by_index(0).memory_info()
    assert info.reserved == 0
    assert info.total == info.free + info.used


# ----- R5: fields newer than the driver ------------------------------------------------------


def test_recovery_action_field_is_not_supported_before_r565() -> None:
    """R5: field 230 arrived in R565; an R550 driver answers the field with
    INVALID_ARGUMENT. Before the fix that surfaced as InvalidArgument, which the health
    monitor read as 'GPU not answering'."""
    lib = real_on(machine_of("H100-SXM5-80GB", driver="550.127.05"))
    with pytest.raises(nvml.NotSupported, match="field 230"):
        lib.device_by_index(0).gpu_recovery_action()
    newer = real_on(machine_of("H100-SXM5-80GB", driver="570.195.03"))
    assert newer.device_by_index(0).gpu_recovery_action() is p.RecoveryAction.NONE


# ----- R9: events from a lost GPU ------------------------------------------------------------


def test_event_from_a_gpu_that_fell_off_the_bus_still_names_it() -> None:
    """R9: the event's device handle no longer answers once the GPU is lost. Before the fix
    wait() asked NVML for its UUID and raised GpuLost, dropping the XID 79."""
    machine = mock.MockMachine.from_preset("dgx-a100")
    lib = real_on(machine)
    events = lib.event_set()
    lost = lib.device_by_index(3)
    events.register(lost, p.EventType.XID_CRITICAL)
    uuid = lost.uuid()
    machine.fall_off_bus(3)
    event = events.wait(1000)
    assert (event.device_uuid, event.event_data) == (uuid, mock.XID_FALLEN_OFF_BUS)
    with pytest.raises(nvml.GpuLost):
        lib.device_by_index(3)


# ----- R11: fabric status --------------------------------------------------------------------


def _fabric_machine(driver: str, state: int = 3, status: int = 0) -> mock.MockMachine:
    data = {
        "name": "nvl",
        "driverVersion": driver,
        "gpus": [{"model": "GB200-186GB", "count": 4}],
        "fabric": {
            "clusterUuid": "5e2f3a4b-0000-4000-8000-00000000beef",
            "cliqueId": 7,
            "state": state,
            "status": status,
        },
    }
    return mock.MockMachine(machines.from_dict(data))


def test_fabric_registration_that_timed_out_is_not_completed() -> None:
    """R11: a fabric probe can complete with an error status (a timeout). Before the fix only
    the state was read, so such a GPU was labelled as a clique member."""
    info = real_on(_fabric_machine("570.195.03", status=10)).device_by_index(0).fabric_info()
    assert (info.state, info.status, info.completed) == (3, 10, False)
    ok = real_on(_fabric_machine("570.195.03")).device_by_index(0).fabric_info()
    assert ok.completed
    assert ok.clique_id == 7
    assert ok.cluster_uuid == "5e2f3a4b-0000-4000-8000-00000000beef"


def test_fabric_info_works_on_drivers_without_the_versioned_call() -> None:
    """R11: nvmlDeviceGetGpuFabricInfoV exists from R550; older drivers keep the plain call."""
    info = real_on(_fabric_machine("535.183.01")).device_by_index(0).fabric_info()
    assert info.completed
    assert info.clique_id == 7


# ----- R13: PCI addresses --------------------------------------------------------------------


def test_sysfs_names_keep_32_bit_pci_domains() -> None:
    """R13: NVML pads the domain to 8 digits, sysfs to at least 4; a VMD domain such as
    0x10000 kept only its last 4 digits before the fix."""
    from gpu_operator.nvml import pciaddr

    assert pciaddr.sysfs_name("00000000:07:00.0") == "0000:07:00.0"
    assert pciaddr.sysfs_name("00010000:01:00.0") == "10000:01:00.0"


# ----- R15: instant power --------------------------------------------------------------------


def test_instant_power_is_the_instant_field_not_the_average() -> None:
    """R15: nvmlDeviceGetPowerUsage averages over a second on Ampere and later; the instant
    reading is field 186. Before the fix there was no instant reading at all."""
    clock = [100.0]
    machine = mock.MockMachine(machines.preset("dgx-a100"), clock=lambda: clock[0])
    gpu = real_on(machine).device_by_index(0)
    machine.start_process(0, 4242, used_memory_mib=1024, load=100)
    # The load began just now: the instant reading has it, the one-second average not yet.
    instant = gpu.power_usage_instant()
    assert instant == 400_000
    assert gpu.power_usage() < instant


# ----- host affinity (nvidia-smi topo -m) ---------------------------------------------------


def test_cpu_and_memory_affinity_decode_nvmls_bitmasks() -> None:
    """nvmlDeviceGetCpuAffinity and nvmlDeviceGetMemoryAffinity fill 64-bit words, one bit per
    logical CPU or NUMA node; the real backend decodes them to the mock's own answer."""
    machine = mock.MockMachine(machines.preset("dgx-h100"))
    lib = real_on(machine)
    direct = machine.nvml()
    direct.init()
    for index in (0, 6):
        gpu, same = lib.device_by_index(index), direct.device_by_index(index)
        assert gpu.cpu_affinity() == same.cpu_affinity()
        assert gpu.memory_affinity() == same.memory_affinity() == (index // 4,)
    far = lib.device_by_index(6).cpu_affinity()  # socket 1: CPUs 56-111 and 168-223
    assert (far[0], far[55], far[56], far[-1]) == (56, 111, 168, 223)  # across four words
