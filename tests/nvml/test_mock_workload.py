"""The mock's workload model (what a GPU pod's runner drives) and the telemetry calls the metrics
exporter reads: encoder/decoder, memory temperature, PCIe throughput and replays, remapped rows."""

from __future__ import annotations

import pytest

from gpu_operator import nvml
from gpu_operator.nvml import mock
from gpu_operator.nvml import protocol as p

NOW = 500.0


def lib_of(machine: mock.MockMachine) -> mock.MockNvml:
    lib = machine.nvml()
    lib.init()
    return lib


def test_a_workload_drives_exactly_its_gpus() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100", clock=lambda: NOW)
    lib = lib_of(machine)
    idle = [lib.device_by_index(i) for i in range(8)]
    before = [(d.utilization().gpu, d.power_usage(), d.temperature()) for d in idle]
    job = machine.start_workload([machine.gpus[3].uuid, machine.gpus[5].uuid], load=95)
    for i, device in enumerate(idle):
        util, power, temp = device.utilization().gpu, device.power_usage(), device.temperature()
        if i in (3, 5):
            assert util > 80
            assert power > before[i][1]
            assert temp > before[i][2]
            assert device.memory_info().used == (40960 // 4) << 20
            assert len(device.running_processes()) == 1
        else:
            assert (util, power, temp) == before[i]
            assert device.memory_info().used == 0
    machine.stop_workload(job)
    assert [d.utilization().gpu for d in idle] == [b[0] for b in before]


def test_a_workload_on_a_mig_device_stays_in_its_gpu_instance() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100-mig-mixed", clock=lambda: NOW)
    gpu = lib_of(machine).device_by_index(0)
    migs = [gpu.mig_device_by_index(j) for j in range(4)]
    target = migs[2]
    machine.start_workload([target.uuid()], memory_mib=1234)
    assert target.memory_info().used == 1234 << 20
    assert [m.memory_info().used for m in migs if m.uuid() != target.uuid()] == [0, 0, 0]
    [proc] = gpu.running_processes()
    assert proc.gpu_instance_id == target.gpu_instance_id()
    assert proc.compute_instance_id == target.compute_instance_id()


def test_unknown_uuids_and_bad_loads_are_refused() -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    with pytest.raises(ValueError, match="no GPU or MIG device with UUID 'GPU-nope'"):
        machine.start_workload(["GPU-nope"])
    with pytest.raises(ValueError, match=r"load must be within 0\.\.100"):
        machine.start_workload([machine.gpus[0].uuid], load=101)


def test_pcie_throughput_follows_the_load() -> None:
    machine = mock.MockMachine.from_preset("t4x4", clock=lambda: NOW)
    device = lib_of(machine).device_by_index(0)
    idle = device.pcie_throughput(p.PcieUtilCounter.RX_BYTES)
    machine.start_workload([machine.gpus[0].uuid], load=100)
    busy = device.pcie_throughput(p.PcieUtilCounter.RX_BYTES)
    assert busy > 50 * idle
    assert device.pcie_throughput(p.PcieUtilCounter.TX_BYTES) < busy
    assert (device.encoder_utilization(), device.decoder_utilization()) == (0, 0)
    assert device.pcie_replay_counter() == 0


def test_memory_temperature_and_row_remapping_exist_on_hbm_boards_only() -> None:
    a100 = lib_of(mock.MockMachine.from_preset("dgx-a100", clock=lambda: NOW)).device_by_index(0)
    t4 = lib_of(mock.MockMachine.from_preset("t4x4", clock=lambda: NOW)).device_by_index(0)
    assert a100.memory_temperature() > a100.temperature()
    with pytest.raises(nvml.NotSupported):
        t4.memory_temperature()
    with pytest.raises(nvml.NotSupported):
        t4.remapped_rows()


def test_an_uncorrectable_error_remaps_a_row_pending_until_reset() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100")
    device = lib_of(machine).device_by_index(1)
    assert device.remapped_rows() == p.RemappedRows(0, 0, False, False)
    machine.inject_ecc_error(1, uncorrected=True, count=2)
    assert device.remapped_rows() == p.RemappedRows(0, 2, True, False)
    machine.reset(1)
    assert device.remapped_rows() == p.RemappedRows(0, 2, False, False)


def test_mig_device_handles_have_no_gpu_level_telemetry() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100-mig-single")
    mig = lib_of(machine).device_by_index(0).mig_device_by_index(0)
    for call in (mig.memory_temperature, mig.pcie_replay_counter, mig.encoder_utilization):
        with pytest.raises(nvml.NotSupported):
            call()
    parent = lib_of(machine).device_by_index(0)
    with pytest.raises(nvml.NotSupported, match="MIG is enabled"):
        parent.encoder_utilization()
