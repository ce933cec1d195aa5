"""The node agents on NVML as real GPUs answer it: each agent runs on the real backend over a
simulated machine that keeps the C library's habits (`nvml.mock_pynvml`), or on the mock where
the Protocol itself now follows real NVML. Each test names the review finding it pins (R1..R15,
docs/gpu-layer.md "What real NVML does") and fails on the agents as they were before its fix."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpu_operator import nvml
from gpu_operator.agents import cdi
from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.dcgm_exporter import fields, readers
from gpu_operator.agents.device_plugin import devices, health
from gpu_operator.agents.device_plugin import facts as dp_facts
from gpu_operator.agents.device_plugin.devices import Device
from gpu_operator.agents.device_plugin.monitor import HealthMonitor
from gpu_operator.agents.gfd import facts as gfd_facts
from gpu_operator.agents.gfd import labels as gfd_labels
from gpu_operator.agents.gfd import runner as gfd_runner
from gpu_operator.agents.mig_manager import config as cfg
from gpu_operator.agents.mig_manager import gpus as gpus_mod
from gpu_operator.agents.mig_manager import host as host_mod
from gpu_operator.agents.mig_manager import planner
from gpu_operator.nvml import catalog, machines, mock, mock_pynvml, real
from gpu_operator.nvml.catalog import Placement

NOWHERE = Path("/nonexistent")
H100_LAYOUT = ["2g.20gb", "2g.20gb", "1g.20gb", "1g.10gb+me"]


def machine_of(
    *groups: dict[str, object], driver: str | None = None, cuda: int | None = None
) -> mock.MockMachine:
    data: dict[str, object] = {"name": "box", "gpus": list(groups)}
    if driver is not None:
        data["driverVersion"] = driver
    if cuda is not None:
        data["cudaDriverVersion"] = cuda
    return mock.MockMachine(machines.from_dict(data))


def h100_mig(count: int = 1) -> mock.MockMachine:
    return machine_of(
        {"model": "H100-SXM5-80GB", "count": count, "migEnabled": True, "migDevices": H100_LAYOUT}
    )


def opener(machine: mock.MockMachine, *, privileged: bool = True) -> Callable[[], nvml.Nvml]:
    """What an agent's `--backend nvml` opens, with the simulated library underneath."""
    fake = mock_pynvml.MockPynvml(machine, privileged=privileged)
    return lambda: real.RealNvml(module=fake, load_library=fake.load_library)


@contextlib.contextmanager
def opened(open_nvml: Callable[[], nvml.Nvml]) -> Iterator[nvml.Nvml]:
    lib = open_nvml()
    lib.init()
    try:
        yield lib
    finally:
        lib.shutdown()


def gfd_labels_of(open_nvml: Callable[[], nvml.Nvml], strategy: str = "mixed") -> dict[str, str]:
    with opened(open_nvml) as lib:
        node = gfd_facts.collect(lib, machine_type="NVIDIA DGX H100")
    config = pc.parse({"flags": {"migStrategy": strategy}})
    return gfd_labels.compute_labels(node, config, gfd_labels.LabelOptions(timestamp=1))


# ----- R1: MIG profile names from NVML's internal ids ---------------------------------------


@pytest.mark.parametrize("backend", ["real", "mock"])
def test_mig_devices_keep_their_profile_names_on_an_h100(backend: str) -> None:
    """R1: NVML reports a GPU instance's profile by internal id (15 for 1g.20gb, 14 for 2g, 20
    for 1g+me on an H100). Before the fix that id was read as the enum, so 1g.20gb became
    `1g.20gb+me.all`, 2g.20gb became `2g.20gb-me`, and 1g.10gb+me lost its suffix."""
    machine = h100_mig()
    open_nvml = opener(machine) if backend == "real" else machine.nvml
    with opened(open_nvml) as lib:
        node = dp_facts.collect(lib, driver_root=NOWHERE, sys_root=NOWHERE, proc_root=NOWHERE)
    assert sorted(m.profile for m in node.gpus[0].migs) == sorted(H100_LAYOUT)
    config = pc.parse({"flags": {"migStrategy": "mixed"}})
    names = {r.name for r in devices.build_resources(node, config)}
    assert names == {
        "nvidia.com/mig-2g.20gb",
        "nvidia.com/mig-1g.20gb",
        "nvidia.com/mig-1g.10gb.me",
    }
    labels = gfd_labels_of(open_nvml)
    assert labels["nvidia.com/mig-2g.20gb.count"] == "2"
    assert labels["nvidia.com/mig-1g.20gb.count"] == "1"
    assert labels["nvidia.com/mig-1g.10gb.me.count"] == "1"
    assert not any("me.all" in k or "-me." in k for k in labels)


def test_mig_names_use_the_device_attribute_memory_as_go_nvlib_does() -> None:
    """R12 (no change): go-nvlib names a MIG device from its own attribute memory, not the GPU
    instance profile's; so do we. The review's suggestion to switch was wrong; this pins it
    (passes before and after)."""
    machine = h100_mig()
    with opened(opener(machine)) as lib:
        gpu = lib.device_by_index(0)
        mig = gpu.mig_device_by_index(0)
        attrs = mig.mig_attributes()
        node = gfd_facts.collect(lib, machine_type="x")
    first = node.gpus[0].mig_devices[0]
    assert first.memory_mb == attrs.memory_size_mb


# ----- R3: unprivileged agents ---------------------------------------------------------------


def test_gfd_without_privileges_fails_with_the_fix_in_the_message() -> None:
    """R3: as uid 65532 NVML refuses the GPU-instance lookups MIG naming needs. Before the fix
    GFD crashed out of its loop with 'needs root or CAP_SYS_ADMIN'; now the collection fails
    with the setting that fixes it, and the loop survives (R10)."""
    machine = machine_of(
        {"model": "A100-SXM4-40GB", "migEnabled": True, "migDevices": ["3g.20gb", "3g.20gb"]}
    )
    settings = gfd_runner.Settings(pc.parse({"flags": {"migStrategy": "mixed"}}), machine_type="x")
    with pytest.raises(gfd_runner.CollectFailed) as info:
        gfd_runner.labels_once(opener(machine, privileged=False), settings, 1)
    assert "runAsUser: 0" in str(info.value)


def test_mig_manager_without_privileges_says_how_to_run_it() -> None:
    """R3: MIG management needs a privileged user; the manager's error says so."""
    machine = machine_of({"model": "A100-SXM4-40GB", "migEnabled": True, "migDevices": ["7g.40gb"]})
    gpus = gpus_mod.Gpus(opener(machine, privileged=False), host_mod.MockHost(machine))
    with pytest.raises(nvml.NoPermission, match="runAsUser: 0"):
        gpus.read()


# ----- R4: framebuffer metrics ---------------------------------------------------------------


def test_exporter_framebuffer_metrics_separate_reserved_memory() -> None:
    """R4: memory v1 counts the driver's reserved memory as used. Before the fix an idle H100
    exported FB_USED of several hundred MiB and FB_RESERVED 0; DCGM reports used 0."""
    machine = machine_of({"model": "H100-SXM5-80GB"})
    wanted = [fields.by_name(n) for n in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED")]
    with opened(opener(machine)) as lib:
        reading = readers.read(lib, [f for f in wanted if f is not None]).readings[0]
    reserved = catalog.model("H100-SXM5-80GB").system_reserved_mib
    assert reading.values == {"DCGM_FI_DEV_FB_USED": 0, "DCGM_FI_DEV_FB_RESERVED": reserved}


# ----- R5: the health probe on drivers without the recovery-action field --------------------


def test_health_probe_answers_when_the_recovery_action_cannot_be_read() -> None:
    """R5: a driver that cannot read the recovery action (any error but a lost GPU) still
    answers for the device. Before the fix only NotSupported counted, so an INVALID_ARGUMENT
    or UNKNOWN kept a LOST/MONITOR fault from ever clearing."""
    machine = machine_of({"model": "H100-SXM5-80GB"}, driver="570.195.03", cuda=12080)
    lib = machine.nvml()
    lib.init()
    uuid = lib.device_by_index(0).uuid()
    device = Device(
        id=uuid,
        uuid=uuid,
        index="0",
        gpu=0,
        paths=("/dev/nvidia0",),
        memory_mib=81559,
        compute_capability="9.0",
        parent_uuid=uuid,
    )
    monitor = HealthMonitor(machine.nvml, [device], health.XidPolicy(), lambda _: None)
    machine.fail_next("gpu_recovery_action", nvml.Unknown, times=None)
    probe = monitor._probe(lib, device)
    assert probe.answers
    assert probe.action is None
    fault = health.Fault(health.FaultKind.MONITOR, "event wait failed")
    assert health.recovered(fault, probe)


# ----- R6: the MIG manager asks NVML ---------------------------------------------------------


def test_mig_manager_reads_gpus_whose_driver_lacks_a_catalogued_profile() -> None:
    """R6: an A30 on an R515 driver has no 2g.12gb+me (it came in R525). Before the fix the
    manager asked NVML for every catalogued profile and the first NOT_SUPPORTED aborted the
    read of the whole node."""
    machine = machine_of(
        {"model": "A30-24GB", "count": 2, "migEnabled": True, "migDevices": ["2g.12gb", "2g.12gb"]},
        driver="515.105.01",
        cuda=11070,
    )
    states = gpus_mod.Gpus(opener(machine), host_mod.MockHost(machine)).read()
    assert [s.devices for s in states] == [{"2g.12gb": 2}, {"2g.12gb": 2}]
    assert "2g.12gb+me" not in [p.name for p in states[0].model.mig_profiles]


def test_mig_manager_partitions_a_gpu_the_catalog_does_not_know(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """R6: a PCI id missing from the catalog is still a MIG GPU when NVML says so (mig-parted
    asks NVML). Before the fix such a GPU was 'not MIG capable' and configs skipped it."""
    machine = machine_of({"model": "H100-SXM5-80GB", "migEnabled": True})
    monkeypatch.setattr(gpus_mod, "model_for", lambda *_: None)
    gpus = gpus_mod.Gpus(opener(machine), host_mod.MockHost(machine))
    before = gpus.read()
    assert before[0].mig_capable
    assert before[0].model.key == "NVIDIA H100 80GB HBM3"
    config = cfg.parse(
        {"version": "v1", "mig-configs": {"halves": [
            {"devices": "all", "mig-enabled": True, "mig-devices": {"3g.40gb": 2}}
        ]}}
    )  # fmt: skip
    entries = config.select("halves")
    plan = planner.plan_node("halves", entries, before)
    gpus.apply(plan, lambda states: planner.plan_node("halves", entries, states))
    assert [s.devices for s in gpus.read()] == [{"3g.40gb": 2}]


class _Gi:
    """A GPU instance whose NVML lists other compute-instance placements than planned."""

    def __init__(self, valid: list[Placement]) -> None:
        self.valid = valid

    def compute_instance_possible_placements(self, profile_id: int) -> list[Placement]:
        return self.valid


def test_compute_instances_go_where_nvml_lists_them() -> None:
    """R6: compute-instance placements come from NVML for the new GPU instance, not from the
    catalog's formula. Before the fix the planned placement was passed as is, and a wrong
    guess failed the apply."""
    gi = _Gi([Placement(0, 3), Placement(4, 3)])
    assert gpus_mod._ci_placement(gi, 2, Placement(3, 3), []) == Placement(0, 3)  # type: ignore[arg-type]
    assert gpus_mod._ci_placement(gi, 2, Placement(4, 3), []) == Placement(4, 3)  # type: ignore[arg-type]
    taken = [Placement(0, 3)]
    assert gpus_mod._ci_placement(gi, 2, Placement(3, 3), taken) == Placement(4, 3)  # type: ignore[arg-type]


# ----- R7: activity of MIG GPU instances -----------------------------------------------------


def test_exporter_reports_graphics_activity_per_mig_instance() -> None:
    """R7: NVML has no utilization with MIG on; GPU performance monitoring (Hopper+) has it per
    GPU instance. Before the fix MIG entities had no DCGM_FI_PROF_GR_ENGINE_ACTIVE at all."""
    clock = [1000.0]
    spec = machines.from_dict(
        {"name": "h", "gpus": [{"model": "H100-SXM5-80GB", "migEnabled": True,
                                "migDevices": ["3g.40gb", "3g.40gb"]}]}
    )  # fmt: skip
    machine = mock.MockMachine(spec, clock=lambda: clock[0])
    lib = opener(machine)()
    lib.init()
    first_mig = lib.device_by_index(0).mig_device_by_index(0).uuid()
    machine.start_workload([first_mig], load=80)
    wanted = [fields.by_name("DCGM_FI_PROF_GR_ENGINE_ACTIVE")]
    gpm = readers.GpmTracker()
    readers.read(lib, [f for f in wanted if f is not None], gpm=gpm)  # the first sample
    clock[0] += 30.0
    node = readers.read(lib, [f for f in wanted if f is not None], gpm=gpm)
    values = {r.entity.mig_uuids[0]: r.values for r in node.readings}
    assert values[first_mig] == {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.8}
    other = next(v for k, v in values.items() if k != first_mig)
    assert other == {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.0}
    gpm.clear()


# ----- R8: the CDI spec's libraries ----------------------------------------------------------


def test_cdi_spec_mounts_the_libraries_nvidia_ctk_mounts(tmp_path: Path) -> None:
    """R8: R545+ drivers JIT PTX through libnvidia-gpucomp; nvidia-ctk also mounts the
    allocator, cfg, OpenCL, debugger, pkcs11 and nscq libraries and the persistenced socket.
    Before the fix only four libraries were mounted."""
    lib_dir = tmp_path / "usr/lib/x86_64-linux-gnu"
    lib_dir.mkdir(parents=True)
    names = [
        "libcuda.so.570.133.20", "libnvidia-ml.so.570.133.20", "libnvidia-gpucomp.so.570.133.20",
        "libnvidia-allocator.so.570.133.20", "libnvidia-cfg.so.570.133.20",
        "libcudadebugger.so.570.133.20", "libnvidia-pkcs11-openssl3.so.570.133.20",
    ]  # fmt: skip
    for name in names:
        (lib_dir / name).touch()
    (tmp_path / "run/nvidia-persistenced").mkdir(parents=True)
    (tmp_path / "run/nvidia-persistenced/socket").touch()
    found = cdi.find_driver_files(tmp_path)
    assert {Path(f).name for f in found} >= set(names)
    assert "run/nvidia-persistenced/socket" in found
    node = dp_facts.NodeFacts(gpus=())
    spec = cdi.gpu_class_spec("nvidia.com/gpu", node, names=lambda d: [d.uuid], driver_files=found)
    socket = next(
        m for m in spec["containerEdits"]["mounts"] if m["containerPath"].endswith("socket")
    )
    assert "noexec" in socket["options"]


# ----- R10: one GPU's error ------------------------------------------------------------------


def test_gfd_labels_the_gpus_that_answer_when_one_has_fallen_off_the_bus() -> None:
    """R10: GPU_IS_LOST on one GPU. Before the fix it escaped GFD's collection and the node
    lost every label."""
    machine = mock.MockMachine.from_preset("dgx-a100")
    machine.fall_off_bus(5)
    labels = gfd_labels_of(opener(machine), strategy="none")
    assert labels["nvidia.com/gpu.count"] == "7"


def test_gfd_loop_keeps_running_after_a_failed_collection(tmp_path: Path) -> None:
    """R10: an NVML error inside a collection ends the GFD loop before the fix; now it logs,
    keeps the previous labels and tries again next interval."""
    machine = mock.MockMachine.from_preset("t4x4")
    machine.fail_next("name", nvml.Unknown, times=1)
    written: list[dict[str, str]] = []
    stop = asyncio.Event()

    class Sink:
        async def write(self, labels: dict[str, str]) -> None:
            written.append(labels)
            stop.set()

        async def remove(self) -> None:
            return None

    config = pc.parse({"flags": {"gfd": {"sleepInterval": "10ms"}}})
    settings = gfd_runner.Settings(config, machine_type="x")
    asyncio.run(
        asyncio.wait_for(
            gfd_runner.run(machine.nvml, Sink(), settings, stop=stop, install_signals=False), 30
        )
    )
    assert written
    assert written[0]["nvidia.com/gpu.count"] == "4"


def test_device_plugin_discovery_survives_a_link_nvml_cannot_describe() -> None:
    """R10: NVLink errors other than NotSupported/InvalidArgument (NOT_FOUND, UNKNOWN) failed
    the plugin's start before the fix; links only score preferred allocations."""
    machine = mock.MockMachine.from_preset("dgx-a100")
    machine.fail_next("nvlink_remote_pci_bus_id", nvml.Unknown, gpu=2, times=None)
    with opened(machine.nvml) as lib:
        node = dp_facts.collect(lib, driver_root=NOWHERE, sys_root=NOWHERE, proc_root=NOWHERE)
    assert len(node.gpus) == 8


# ----- R11: the clique label -----------------------------------------------------------------


def test_no_clique_label_when_fabric_registration_completed_with_an_error() -> None:
    """R11: state COMPLETED with status TIMEOUT is a failed registration (DCGM, UCX). Before
    the fix GFD labelled the clique from the state alone."""
    data = {
        "name": "nvl",
        "driverVersion": "570.195.03",
        "gpus": [{"model": "GB200-186GB", "count": 4}],
        "fabric": {"clusterUuid": "5e2f3a4b-0000-4000-8000-00000000beef", "cliqueId": 7,
                   "status": 10},
    }  # fmt: skip
    machine = mock.MockMachine(machines.from_dict(data))
    assert "nvidia.com/gpu.clique" not in gfd_labels_of(machine.nvml, strategy="none")
    assert "nvidia.com/gpu.clique" not in gfd_labels_of(opener(machine), strategy="none")


# ----- R13: mig-minors -----------------------------------------------------------------------


def test_mig_minors_come_from_procfs_before_the_driver_root(tmp_path: Path) -> None:
    """R13: /proc/driver/nvidia-caps/mig-minors is the kernel's and every container sees it;
    a containerised driver root has no procfs. Before the fix only the driver root was read."""
    proc = tmp_path / "proc-root"
    (proc / "proc/driver/nvidia-caps").mkdir(parents=True)
    (proc / dp_facts.MIG_MINORS_FILE).write_text("config 1\nmonitor 2\ngpu0/gi1/access 21\n")
    minors = dp_facts.read_mig_minors(tmp_path / "driver-root", (0,), proc)
    assert minors == {"config": 1, "monitor": 2, "gpu0/gi1/access": 21}


# ----- R14: the cost of a collection ---------------------------------------------------------


def test_exporter_reads_gpus_side_by_side() -> None:
    """R14: nvmlDeviceGetPcieThroughput samples for 20 ms; read one GPU after another, eight
    GPUs cost 16 samples per collection. Before the fix GPUs were always read serially."""
    machine = mock.MockMachine.from_preset("dgx-a100")
    machine.pcie_sample_seconds = 0.05
    wanted = [fields.by_name("DCGM_FI_DEV_PCIE_TX_THROUGHPUT")]
    lib = machine.nvml()
    lib.init()
    with ThreadPoolExecutor(max_workers=8) as pool:
        node = readers.read(lib, [f for f in wanted if f is not None], executor=pool)
    assert len(node.readings) == 8
    assert machine.pcie_peak_concurrency > 1


# ----- R9/R15: XIDs --------------------------------------------------------------------------


def test_an_instance_xid_does_not_survive_a_reconfiguration_that_reuses_the_id() -> None:
    """R15: the last XID was kept per (GPU, GPU-instance id); a MIG change that recreated GI 1
    showed the old instance's XID on the new one before the fix."""
    machine = mock.MockMachine.from_preset("dgx-a100-mig-single")
    lib = machine.nvml()
    lib.init()
    wanted = [f for f in [fields.by_name("DCGM_FI_DEV_XID_ERRORS")] if f is not None]
    xids = readers.XidTracker()
    gpu = lib.device_by_index(0)
    uuid = gpu.uuid()
    readers.read(lib, wanted, xids)
    xids.record(uuid, 43, gpu_instance_id=1)
    assert _xid(readers.read(lib, wanted, xids), uuid, 1) == 43
    # Destroy GI 1 and create a new GPU instance that gets id 1 again.
    handle = gpu.gpu_instance_by_id(1)
    for ci in handle.compute_instances(0):
        ci.destroy()
    handle.destroy()
    new = gpu.create_gpu_instance(catalog.GI_PROFILE_1_SLICE)
    new.create_compute_instance(0)
    assert new.info().id == 1
    assert _xid(readers.read(lib, wanted, xids), uuid, 1) == 0


def _xid(node: readers.NodeReading, uuid: str, gi: int) -> object:
    return next(
        r.values["DCGM_FI_DEV_XID_ERRORS"]
        for r in node.readings
        if r.entity.uuid == uuid and r.entity.gpu_instance_id == gi
    )


def test_xid_watcher_records_the_loss_of_a_gpu_on_the_real_backend() -> None:
    """R9: the XID 79 a GPU raises as it falls off the bus must be recorded. Before the fix the
    event wait asked the lost GPU for its UUID, failed, and the XID was dropped."""
    machine = mock.MockMachine.from_preset("dgx-a100")
    tracker = readers.XidTracker()
    stop = threading.Event()
    lib = opener(machine)()
    lib.init()
    uuid = lib.device_by_index(6).uuid()
    thread = threading.Thread(target=tracker.watch, args=(lib, stop), kwargs={"timeout_ms": 50})
    thread.start()
    try:
        assert tracker.watching.wait(30)
        machine.fall_off_bus(6)
        assert tracker.wait_for_count(1, 30)
        assert tracker.last(uuid) == mock.XID_FALLEN_OFF_BUS
    finally:
        stop.set()
        thread.join(30)


def test_plugin_socket_folder_not_writable_names_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R3: as uid 65532 the plugin cannot create its socket in the kubelet's root-owned
    device-plugins folder. Before the fix gRPC failed later with an unexplained bind error."""
    from gpu_operator.agents.device_plugin import server

    folder = tmp_path / "device-plugins"
    folder.mkdir()
    monkeypatch.setattr(server.os, "access", lambda *_: False)
    endpoint = server.Endpoint("nvidia.com/gpu", folder / "nvidia-gpu.sock", None)
    with pytest.raises(server.StartError, match="runAsUser: 0"):
        asyncio.run(endpoint.start())
