"""NVL72 trays in the mock: fabric identity, state, status and health, through the mock
backend and through the real backend (pynvml's structs on the mock library)."""

from __future__ import annotations

import pydantic
import pytest

from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.gfd import facts as gfd_facts
from gpu_operator.agents.gfd import labels as gfd_labels
from gpu_operator.nvml import machines, mock, mock_pynvml, real
from gpu_operator.nvml import protocol as p

RACK_A = "0b6c2d1e-7f3a-4c5b-8d9e-aa0000000001"


def clique_label(lib: mock.MockNvml) -> str | None:
    node = gfd_facts.collect(lib, machine_type="NVIDIA GB200 NVL72")
    options = gfd_labels.LabelOptions(timestamp=1)
    return gfd_labels.compute_labels(node, pc.parse({}), options).get("nvidia.com/gpu.clique")


def real_on(machine: mock.MockMachine) -> real.RealNvml:
    fake = mock_pynvml.MockPynvml(machine)
    lib = real.RealNvml(None, module=fake, load_library=fake.load_library)  # type: ignore[arg-type]
    lib.init()
    return lib


@pytest.mark.parametrize(("preset", "name"), [("gb200-nvl72", "NVIDIA GB200"),
                                              ("gb300-nvl72", "NVIDIA GB300")])  # fmt: skip
def test_nvl72_tray_has_four_gpus_in_the_racks_default_partition(preset: str, name: str) -> None:
    spec = machines.preset(preset)
    machine = mock.MockMachine(spec)
    lib = machine.nvml()
    lib.init()
    assert lib.device_count() == machines.NVL72_GPUS_PER_TRAY == 4
    assert (spec.host.sockets, spec.host.threads_per_core) == (2, 1)  # two Grace CPUs
    for index in range(4):
        dev = lib.device_by_index(index)
        assert dev.name() == name
        info = dev.fabric_info()
        assert info.completed
        assert info.clique_id == machines.DEFAULT_PARTITION == 32766
        assert info.health_mask == p.HEALTHY_FABRIC_MASK == 0x1AA
        assert info.unhealthy() == []
        assert dev.nvlink_state(17)  # 18 NVLinks, all up


def test_real_backend_reads_state_status_and_health_mask() -> None:
    """nvmlDeviceGetGpuFabricInfoV's v2 struct carries the health bits; the real backend must
    read them, not only the identity (before: health was dropped)."""
    machine = mock.MockMachine(machines.in_rack(machines.preset("gb200-nvl72"), RACK_A, 7))
    degraded = p.fabric_health_mask(degraded_bandwidth=True, route_unhealthy=True)
    machine.set_fabric(1, health_mask=degraded)
    lib = real_on(machine)
    healthy = lib.device_by_index(0).fabric_info()
    assert (healthy.cluster_uuid, healthy.clique_id) == (RACK_A, 7)
    assert healthy.health_mask == p.HEALTHY_FABRIC_MASK
    bad = lib.device_by_index(1).fabric_info()
    assert bad.health_mask == degraded
    assert bad.completed  # registered, but its links are not all well
    assert bad.unhealthy() == ["bandwidth degraded", "route unhealthy"]


def test_drivers_without_the_versioned_call_report_no_health() -> None:
    spec = machines.preset("gb200-nvl72").model_copy(
        update={"driver_version": "535.183.01", "cuda_driver_version": 12020}
    )
    info = real_on(mock.MockMachine(spec)).device_by_index(0).fabric_info()
    assert info.completed
    assert info.health_mask == 0
    assert info.health(p.FabricHealth.DEGRADED_BANDWIDTH) == 0  # not reported


@pytest.mark.parametrize(
    ("state", "status", "completed"),
    [(p.FABRIC_STATE_NOT_STARTED, 0, False), (p.FABRIC_STATE_IN_PROGRESS, 0, False),
     (p.FABRIC_STATE_COMPLETED, 10, False), (p.FABRIC_STATE_COMPLETED, 0, True)],
)  # fmt: skip
def test_fabric_state_and_status_set_per_gpu(state: int, status: int, completed: bool) -> None:
    machine = mock.MockMachine.from_preset("gb300-nvl72")
    machine.set_fabric(2, state=state, status=status)
    lib = real_on(machine)
    info = lib.device_by_index(2).fabric_info()
    assert (info.state, info.status, info.completed) == (state, status, completed)
    assert lib.device_by_index(3).fabric_info().completed  # the others are untouched


def test_set_fabric_without_gpu_changes_the_whole_node_and_survives_a_reset() -> None:
    machine = mock.MockMachine.from_preset("gb200-nvl72")
    machine.set_fabric(state=p.FABRIC_STATE_IN_PROGRESS)
    machine.reset(0)
    lib = machine.nvml()
    lib.init()
    assert {lib.device_by_index(i).fabric_info().state for i in range(4)} == {2}


def test_set_fabric_on_a_machine_without_fabric_is_refused() -> None:
    with pytest.raises(ValueError, match="dgx-h100 has no NVLink fabric"):
        mock.MockMachine.from_preset("dgx-h100").set_fabric(0, state=1)
    with pytest.raises(ValueError, match="cannot join a rack"):
        machines.in_rack(machines.preset("dgx-h100"), RACK_A)


def test_misconfiguration_is_named() -> None:
    info = p.FabricInfo(RACK_A, 1, 3, 0, p.fabric_health_mask(incorrect_configuration=4))
    assert info.unhealthy() == ["incorrect configuration (No Partition)"]


def test_cluster_uuid_must_be_a_uuid() -> None:
    with pytest.raises(pydantic.ValidationError, match="clusterUuid"):
        machines.Fabric.model_validate({"clusterUuid": "rack-a", "cliqueId": 1})


def test_gfd_clique_label_follows_the_rack_and_drops_on_an_unfinished_registration() -> None:
    machine = mock.MockMachine(machines.in_rack(machines.preset("gb200-nvl72"), RACK_A))
    lib = machine.nvml()
    lib.init()
    assert clique_label(lib) == f"{RACK_A}.32766"
    # As NVIDIA's GFD does: GPUs not (yet) registered are skipped, the others still agree.
    machine.set_fabric(3, state=p.FABRIC_STATE_IN_PROGRESS)
    assert clique_label(lib) == f"{RACK_A}.32766"
    machine.set_fabric(state=p.FABRIC_STATE_NOT_STARTED)
    assert clique_label(lib) is None
