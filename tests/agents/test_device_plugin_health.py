"""Health: which events are faults, which devices they hit, when a fault has cleared, and the
NVML monitor thread on the mock (fault injection and the simulated reset)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from waiting import DEADLINE, eventually_sync

from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.device_plugin import devices, facts, health
from gpu_operator.agents.device_plugin.health import Fault, FaultKind, Probe
from gpu_operator.agents.device_plugin.monitor import HealthChange, HealthMonitor
from gpu_operator.nvml import errors, mock, real
from gpu_operator.nvml.protocol import EventData, EventType, RecoveryAction

NOWHERE = Path("/nonexistent-root")
WAIT = DEADLINE


def test_default_policy_ignores_only_application_xids() -> None:
    policy = health.parse_policy(None, None)
    assert not policy.checks_off
    assert [x for x in (13, 31, 43, 45, 68, 109) if policy.is_fatal(x)] == []
    assert policy.is_fatal(48)
    assert policy.is_fatal(79)
    assert policy.is_fatal(94)


def test_disable_env_adds_ignored_xids_and_skips_malformed_entries() -> None:
    policy = health.parse_policy("48, nope ,94", None)
    assert not policy.is_fatal(48)
    assert not policy.is_fatal(94)
    assert policy.is_fatal(79)


@pytest.mark.parametrize("value", ["all", "xids", "ALL", "63,xids"])
def test_disable_all_turns_health_checks_off(value: str) -> None:
    assert health.parse_policy(value, None).checks_off


def test_enable_env_makes_xids_fatal_even_when_ignored_or_all_disabled() -> None:
    policy = health.parse_policy("all", "13,48")
    assert not policy.checks_off
    assert policy.is_fatal(13)
    assert policy.is_fatal(48)
    assert not policy.is_fatal(79)
    assert health.parse_policy(None, "all").is_fatal(31)


def dev(uuid: str, parent: str, gi: int | None = None, ci: int | None = None) -> devices.Device:
    return devices.Device(
        uuid, uuid, "0", 0, (), 1, "8.0", gpu_instance_id=gi, compute_instance_id=ci,
        parent_uuid=parent,
    )  # fmt: skip


GPU = dev("GPU-a", "GPU-a")
MIG1 = dev("MIG-1", "GPU-b", 1, 0)
MIG2 = dev("MIG-2", "GPU-b", 2, 0)
ALL = [GPU, MIG1, MIG2]
POLICY = health.XidPolicy()


def xid(uuid: str, value: int, gi: int | None = None, ci: int | None = None) -> EventData:
    return EventData(uuid, EventType.XID_CRITICAL, value, gi, ci)


def test_a_fatal_xid_hits_every_device_on_its_gpu() -> None:
    found = health.classify(xid("GPU-b", 48), ALL, POLICY)
    assert found is not None
    kind, reason, hit = found
    assert (kind, reason, hit) == (FaultKind.XID, "XID 48", [MIG1, MIG2])


def test_an_xid_scoped_to_a_gpu_and_compute_instance_hits_only_that_mig_device() -> None:
    found = health.classify(xid("GPU-b", 48, 2, 0), ALL, POLICY)
    assert found is not None
    assert found[2] == [MIG2]


def test_xid_79_is_a_lost_gpu() -> None:
    found = health.classify(xid("GPU-a", 79), ALL, POLICY)
    assert found is not None
    assert found[0] is FaultKind.LOST


def test_ignored_xids_sbe_and_other_gpus_are_no_fault() -> None:
    assert health.classify(xid("GPU-a", 43), ALL, POLICY) is None
    assert health.classify(xid("GPU-z", 48), ALL, POLICY) is None
    sbe = EventData("GPU-a", EventType.SINGLE_BIT_ECC, 0)
    assert health.classify(sbe, ALL, POLICY) is None
    assert health.classify(xid("GPU-a", 48), ALL, health.parse_policy("all", None)) is None


def test_a_double_bit_ecc_event_is_a_fault() -> None:
    dbe = EventData("GPU-a", EventType.DOUBLE_BIT_ECC, 0)
    found = health.classify(dbe, ALL, POLICY)
    assert found is not None
    assert found[0] is FaultKind.ECC
    assert found[2] == [GPU]


RESET = RecoveryAction.GPU_RESET
NONE = RecoveryAction.NONE


@pytest.mark.parametrize(
    ("fault", "probe", "expected"),
    [
        # The driver asked for a reset and now asks for nothing: cleared.
        (Fault(FaultKind.XID, "XID 48", RESET), Probe(True, NONE), True),
        (Fault(FaultKind.XID, "XID 48", RESET), Probe(True, RESET), False),
        (Fault(FaultKind.ECC, "DBE", RESET), Probe(True, NONE), True),
        # The driver never asked for anything: no evidence the fault is gone.
        (Fault(FaultKind.XID, "XID 94", NONE), Probe(True, NONE), False),
        (Fault(FaultKind.XID, "XID 48", None), Probe(True, None), False),
        # A lost GPU that answers again has been reset.
        (Fault(FaultKind.LOST, "XID 79", None), Probe(True, NONE), True),
        (Fault(FaultKind.LOST, "XID 79", None), Probe(True, None), True),
        (Fault(FaultKind.LOST, "XID 79", None), Probe(False), False),
        (Fault(FaultKind.LOST, "XID 79", None), Probe(True, RESET), False),
        # Our monitoring failed, not the GPU.
        (Fault(FaultKind.MONITOR, "wait", None), Probe(True, None), True),
        (Fault(FaultKind.MONITOR, "wait", None), Probe(False), False),
    ],
)
def test_recovery_needs_positive_evidence(fault: Fault, probe: Probe, expected: bool) -> None:
    assert health.recovered(fault, probe) is expected


def test_recovery_explanations_say_what_cleared() -> None:
    assert health.recovery_explanation(
        Fault(FaultKind.XID, "XID 48", RESET), Probe(True, NONE)
    ) == ("the driver no longer asks for GPU_RESET after XID 48")
    assert "answers NVML again" in health.recovery_explanation(
        Fault(FaultKind.LOST, "XID 79"), Probe(True, NONE)
    )


# The recovery-action field exists from R565 on (older drivers: NotSupported, and an XID fault
# then never clears), so the monitor's recoveries are exercised on an R570 driver.
R570 = "570.195.03"


def test_the_mock_driver_asks_for_a_reset_after_reset_xids_and_the_reset_clears_it() -> None:
    machine = mock.MockMachine.from_preset("t4x4", driver=R570)
    lib = machine.nvml()
    lib.init()
    gpu = lib.device_by_index(0)
    assert gpu.gpu_recovery_action() is NONE
    machine.inject_xid(0, 43)
    assert gpu.gpu_recovery_action() is NONE
    machine.inject_xid(0, 48)
    assert gpu.gpu_recovery_action() is RESET
    machine.reset(0)
    assert gpu.gpu_recovery_action() is NONE
    machine.inject_ecc_error(1, uncorrected=True)
    assert lib.device_by_index(1).gpu_recovery_action() is RESET
    machine.inject_xid(2, 94, recovery=RecoveryAction.DRAIN_AND_RESET)
    assert lib.device_by_index(2).gpu_recovery_action() is RecoveryAction.DRAIN_AND_RESET


class Recorder:
    """Collects health changes from the monitor thread; tests wait on a condition."""

    def __init__(self) -> None:
        self.changes: list[HealthChange] = []
        self._cond = threading.Condition()

    def __call__(self, changes: list[HealthChange]) -> None:
        with self._cond:
            self.changes.extend(changes)
            self._cond.notify_all()

    def seen(self) -> list[HealthChange]:
        with self._cond:
            return list(self.changes)

    def wait_for(self, n: int) -> list[HealthChange]:
        eventually_sync(
            lambda: len(self.seen()) >= n, f"{n} health change(s)", timeout=WAIT, state=self.seen
        )
        return self.seen()


def monitored(preset: str, cfg: pc.PluginConfig | None = None, **kwargs: object) -> tuple[
    mock.MockMachine, list[devices.Device], Recorder, HealthMonitor
]:  # fmt: skip
    machine = mock.MockMachine.from_preset(preset, driver=R570)
    lib = machine.nvml()
    lib.init()
    node = facts.collect(lib, driver_root=NOWHERE, sys_root=NOWHERE)
    devs = [d for r in devices.build_resources(node, cfg or pc.PluginConfig()) for d in r.devices]
    recorder = Recorder()
    policy = kwargs.pop("policy", health.XidPolicy())
    assert isinstance(policy, health.XidPolicy)
    monitor = HealthMonitor(machine.nvml, devs, policy, recorder, recheck_interval=0.05,
                            **kwargs)  # type: ignore[arg-type]  # fmt: skip
    monitor.start()
    assert monitor.started.wait(WAIT)
    return machine, devs, recorder, monitor


def test_monitor_reports_an_xid_then_the_recovery_after_a_reset() -> None:
    machine, devs, recorder, monitor = monitored("t4x4")
    try:
        machine.inject_xid(1, 48)
        (change,) = recorder.wait_for(1)
        assert change == HealthChange(devs[1].uuid, False, "XID 48")
        machine.reset(1)
        changes = recorder.wait_for(2)
        assert changes[1].uuid == devs[1].uuid
        assert changes[1].healthy
        assert "no longer asks for GPU_RESET after XID 48" in changes[1].reason
        assert monitor.faults == {}
    finally:
        monitor.stop()
        monitor.join(WAIT)


def test_monitor_keeps_a_device_unhealthy_while_the_driver_wants_a_reset() -> None:
    machine, devs, recorder, monitor = monitored("t4x4")
    try:
        machine.inject_xid(0, 48)
        recorder.wait_for(1)
        # Later unrelated events pass through the same loop that probes the faulted GPU.
        for _ in range(3):
            machine.inject_xid(2, 13)
        machine.inject_xid(3, 48)
        changes = recorder.wait_for(2)
        assert [(c.uuid, c.healthy) for c in changes] == [
            (devs[0].uuid, False),
            (devs[3].uuid, False),
        ]
        assert set(monitor.faults) == {devs[0].uuid, devs[3].uuid}
    finally:
        monitor.stop()
        monitor.join(WAIT)


def test_monitor_sees_a_gpu_fall_off_the_bus_and_come_back_after_a_reset() -> None:
    machine, devs, recorder, monitor = monitored("t4x4")
    try:
        machine.fall_off_bus(2)
        (lost,) = recorder.wait_for(1)
        assert (lost.uuid, lost.healthy, lost.reason) == (devs[2].uuid, False, "XID 79")
        assert monitor.faults[devs[2].uuid].kind is FaultKind.LOST
        machine.reset(2)
        back = recorder.wait_for(2)[1]
        assert back.healthy
        assert "answers NVML again" in back.reason
        # Events of the recovered GPU are watched again.
        machine.inject_xid(2, 48)
        assert not recorder.wait_for(3)[2].healthy
    finally:
        monitor.stop()
        monitor.join(WAIT)


def test_monitor_scopes_mig_xids_to_the_compute_instance() -> None:
    cfg = pc.parse({"flags": {"migStrategy": "mixed"}})
    machine, devs, recorder, monitor = monitored("dgx-a100-mig-mixed", cfg)
    try:
        target = next(d for d in devs if d.gpu == 3 and d.gpu_instance_id == 2)
        machine.inject_xid(3, 48, gpu_instance_id=2, compute_instance_id=0)
        (change,) = recorder.wait_for(1)
        assert change.uuid == target.uuid
        assert not change.healthy
    finally:
        monitor.stop()
        monitor.join(WAIT)


def test_monitor_without_recovery_keeps_faults_like_upstream() -> None:
    machine, _devs, recorder, monitor = monitored("t4x4", recovery=False)
    try:
        machine.inject_xid(0, 48)
        recorder.wait_for(1)
        machine.reset(0)
        machine.inject_xid(1, 48)  # a second fault proves the loop went round after the reset
        assert [c.healthy for c in recorder.wait_for(2)] == [False, False]
    finally:
        monitor.stop()
        monitor.join(WAIT)


def test_monitor_marks_everything_unhealthy_when_the_event_wait_fails_then_recovers() -> None:
    machine, devs, recorder, monitor = monitored("t4x4")
    try:
        machine.fail_next("wait", errors.Unknown, times=1)
        changes = recorder.wait_for(8)
        assert sorted(c.uuid for c in changes[:4]) == sorted(d.uuid for d in devs)
        assert not any(c.healthy for c in changes[:4])
        assert all(c.healthy for c in changes[4:8])
    finally:
        monitor.stop()
        monitor.join(WAIT)


def test_monitor_with_checks_off_starts_no_thread() -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    recorder = Recorder()
    monitor = HealthMonitor(machine.nvml, [GPU], health.parse_policy("all", None), recorder)
    monitor.start()
    assert monitor.started.is_set()
    assert not monitor.running


class _Field:
    def __init__(self, code: int, value: int) -> None:
        self.nvmlReturn = code
        self.value = type("Value", (), {"uiVal": value})()


def _real_device(code: int, value: int) -> real.RealDevice:
    class Lib:
        class NVMLError(Exception):
            pass

        @staticmethod
        def nvmlDeviceGetFieldValues(handle: object, ids: list[int]) -> list[_Field]:
            assert ids == [230]  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
            return [_Field(code, value)]

    return real.RealDevice(real._Calls(Lib), object())  # type: ignore[arg-type]


def test_the_real_backend_reads_the_recovery_action_field() -> None:
    assert _real_device(0, 1).gpu_recovery_action() is RecoveryAction.GPU_RESET
    assert _real_device(0, 0).gpu_recovery_action() is RecoveryAction.NONE
    # An action newer than this code knows still means "do something": a reset.
    assert _real_device(0, 99).gpu_recovery_action() is RecoveryAction.GPU_RESET
    with pytest.raises(errors.NotSupported):
        _real_device(errors.ERROR_NOT_SUPPORTED, 0).gpu_recovery_action()
