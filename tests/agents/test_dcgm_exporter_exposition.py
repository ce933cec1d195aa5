"""The exposition text, as dcgm-exporter writes it: golden text of a fixed mock machine (whole
GPUs, a MIG-enabled A100, a T4) and the label rules one by one.

Regenerate the golden file after a deliberate change with `UPDATE_GOLDEN=1 pytest <this file>`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from gpu_operator.agents.dcgm_exporter import attribution, counters, exposition, readers
from gpu_operator.nvml import mock

GOLDEN = Path(__file__).parent / "golden" / "dcgm_exporter_fixed_machine.txt"
MACHINE = """\
name: golden-box
seed: 11
gpus:
  - model: A100-SXM4-40GB
    count: 2
  - model: A100-SXM4-40GB
    migEnabled: true
    migDevices: [3g.20gb, 1g.5gb, 1g.5gb]
  - model: T4
"""
NOW = 1_000.0


@pytest.fixture
def machine(tmp_path: Path) -> mock.MockMachine:
    path = tmp_path / "box.yaml"
    path.write_text(MACHINE)
    return mock.MockMachine.from_file(path, clock=lambda: NOW)


def collect(
    m: mock.MockMachine,
    text: str | None = None,
    *,
    holders: dict[str, tuple[exposition.PodRef, ...]] | None = None,
    options: exposition.Options | None = None,
    xids: readers.XidTracker | None = None,
) -> str:
    cs = counters.parse(text, "t") if text is not None else counters.default()
    lib = m.nvml()
    lib.init()
    try:
        node = readers.read(lib, [c.field for c in (*cs.metrics, *cs.labels)], xids)
    finally:
        lib.shutdown()
    return exposition.render(cs, node, holders, options or exposition.Options(hostname="node-1"))


def mig_uuid(m: mock.MockMachine, gpu: int, index: int) -> str:
    lib = m.nvml()
    lib.init()
    return lib.device_by_index(gpu).mig_device_by_index(index).uuid()


def samples(text: str, metric: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(metric + "{")]


def test_golden_exposition_of_a_fixed_machine(machine: mock.MockMachine) -> None:
    gpu1 = machine.gpus[1].uuid
    small = mig_uuid(machine, 2, 1)
    machine.start_workload([gpu1], load=80, memory_mib=20_000)
    machine.start_workload([small], load=60, memory_mib=1_000)
    xids = readers.XidTracker()
    xids.record(gpu1, 13)
    lib = machine.nvml()
    lib.init()
    topology = attribution.Topology(*_tables(lib))
    holders = attribution.holders(
        [
            attribution.Allocation("ml", "train-0", "trainer", "nvidia.com/gpu", gpu1),
            attribution.Allocation("ml", "infer-0", "server", "nvidia.com/mig-1g.5gb", small),
        ],
        topology,
    )
    text = collect(machine, holders=holders, xids=xids)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def _tables(lib: mock.MockNvml) -> tuple[dict[str, str], dict[int, str]]:
    node = readers.read(lib, [])
    return node.mig_keys(), node.index_keys()


def test_labels_come_in_upstreams_order(machine: mock.MockMachine) -> None:
    text = collect(machine, "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DRIVER_VERSION, label, v\n")
    first = samples(text, "DCGM_FI_DEV_GPU_TEMP")[0]
    names = re.findall(r'([A-Za-z_]+)="', first)
    assert names == [
        "gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION",
    ]  # fmt: skip


def test_mig_instances_are_entities_with_profile_and_instance_labels(
    machine: mock.MockMachine,
) -> None:
    text = collect(machine, "DCGM_FI_DEV_FB_FREE, gauge, free\n")
    mig = [line for line in samples(text, "DCGM_FI_DEV_FB_FREE") if 'gpu="2"' in line]
    profiles = [re.search(r'GPU_I_PROFILE="([^"]+)",GPU_I_ID="(\d+)"', s) for s in mig]
    assert [p.groups() for p in profiles if p] == [
        ("3g.20gb", "1"),
        ("1g.5gb", "2"),
        ("1g.5gb", "3"),
    ]
    # Each instance reports its own framebuffer, not the GPU's.
    free = [int(s.rsplit(" ", 1)[1]) for s in mig]
    whole = int(samples(text, "DCGM_FI_DEV_FB_FREE")[0].rsplit(" ", 1)[1])
    assert free[1] == free[2] < free[0] < whole


def test_utilization_is_absent_on_mig_gpus_and_memory_temp_on_gddr_boards(
    machine: mock.MockMachine,
) -> None:
    text = collect(machine, "DCGM_FI_DEV_GPU_UTIL, gauge, u\nDCGM_FI_DEV_MEMORY_TEMP, gauge, m\n")
    assert [s.split('"')[1] for s in samples(text, "DCGM_FI_DEV_GPU_UTIL")] == ["0", "1", "3"]
    assert [s.split('"')[1] for s in samples(text, "DCGM_FI_DEV_MEMORY_TEMP")] == [
        "0", "1", "2", "2", "2",
    ]  # fmt: skip


def test_doubles_print_six_decimals_and_integers_plainly(machine: mock.MockMachine) -> None:
    text = collect(machine, "DCGM_FI_DEV_POWER_USAGE, gauge, p\nDCGM_FI_DEV_FB_USED, gauge, u\n")
    assert re.fullmatch(r".* \d+\.\d{6}", samples(text, "DCGM_FI_DEV_POWER_USAGE")[0])
    assert re.fullmatch(r".* \d+", samples(text, "DCGM_FI_DEV_FB_USED")[0])


def test_xid_errors_carry_code_and_message(machine: mock.MockMachine) -> None:
    xids = readers.XidTracker()
    xids.record(machine.gpus[0].uuid, 79)
    xids.record(machine.gpus[1].uuid, 9999)
    text = collect(machine, "DCGM_FI_DEV_XID_ERRORS, gauge, x\n", xids=xids)
    lines = samples(text, "DCGM_FI_DEV_XID_ERRORS")
    assert lines[0].endswith(',err_code="79",err_msg="GPU has fallen off the bus"} 79')
    assert lines[1].endswith(',err_code="9999",err_msg="Unknown Error"} 9999')
    assert lines[3].endswith(',err_code="0",err_msg="No Error"} 0')


def test_pod_attributes_follow_labels_sorted_with_the_xid_attributes(
    machine: mock.MockMachine,
) -> None:
    uuid = machine.gpus[0].uuid
    holders = {uuid: (exposition.PodRef("ns", "p", "c"),)}
    text = collect(
        machine, "DCGM_FI_DEV_XID_ERRORS, gauge, x\nDCGM_FI_DRIVER_VERSION, label, v\n",
        holders=holders,
    )  # fmt: skip
    first = samples(text, "DCGM_FI_DEV_XID_ERRORS")[0]
    assert first.endswith(
        ',Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15",container="c",err_code="0",'
        'err_msg="No Error",namespace="ns",pod="p"} 0'
    )


def test_every_holder_of_a_shared_gpu_gets_its_own_sample(machine: mock.MockMachine) -> None:
    uuid = machine.gpus[0].uuid
    holders = {
        uuid: (
            exposition.PodRef("a", "p1", "c", "0"),
            exposition.PodRef("b", "p2", "c", "1"),
        )
    }
    plain = collect(machine, "DCGM_FI_DEV_GPU_UTIL, gauge, u\n", holders=holders)
    shared = [s for s in samples(plain, "DCGM_FI_DEV_GPU_UTIL") if 'gpu="0"' in s]
    assert [re.search(r'pod="(\w+)"', s).group(1) for s in shared if re.search("pod=", s)] == [
        "p1", "p2",
    ]  # fmt: skip
    assert "vgpu=" not in plain
    virtual = collect(
        machine, "DCGM_FI_DEV_GPU_UTIL, gauge, u\n", holders=holders,
        options=exposition.Options(hostname="n", virtual_gpus=True),
    )  # fmt: skip
    assert ',pod="p2",vgpu="1"}' in virtual


def test_old_namespace_no_hostname_and_blank_free_model_names(machine: mock.MockMachine) -> None:
    uuid = machine.gpus[0].uuid
    options = exposition.Options(hostname="", old_namespace=True, replace_blanks_in_model_name=True)
    text = collect(
        machine, "DCGM_FI_DEV_GPU_TEMP, gauge, t\n",
        holders={uuid: (exposition.PodRef("ns", "p", "c"),)}, options=options,
    )  # fmt: skip
    first = samples(text, "DCGM_FI_DEV_GPU_TEMP")[0]
    assert f'uuid="{uuid}"' in first
    assert "Hostname" not in first
    assert 'modelName="NVIDIA-A100-SXM4-40GB"' in first
    assert 'container_name="c",pod_name="p",pod_namespace="ns"' in first
    t4 = samples(text, "DCGM_FI_DEV_GPU_TEMP")[-1]
    assert 'modelName="Tesla-T4"' in t4


def test_hostname_label_name_is_configurable(machine: mock.MockMachine) -> None:
    options = exposition.Options(hostname="node-1", hostname_label="hostname")
    text = collect(machine, "DCGM_FI_DEV_GPU_TEMP, gauge, t\n", options=options)
    assert ',hostname="node-1"' in samples(text, "DCGM_FI_DEV_GPU_TEMP")[0]


def test_label_values_are_escaped() -> None:
    assert exposition.escape('a "b" \\ c\nd') == 'a \\"b\\" \\\\ c\\nd'


def test_a_counter_without_any_value_prints_no_help_or_type(machine: mock.MockMachine) -> None:
    # Encoder utilization is not reported on MIG GPUs; with only such a GPU nothing is printed.
    text = collect(machine, "DCGM_FI_DEV_ENC_UTIL, gauge, e\nDCGM_FI_DEV_GPU_TEMP, gauge, t\n")
    assert "# HELP DCGM_FI_DEV_ENC_UTIL" in text
    only_mig = mock.MockMachine.from_preset("dgx-a100-mig-single", clock=lambda: NOW)
    text = collect(only_mig, "DCGM_FI_DEV_ENC_UTIL, gauge, e\nDCGM_FI_DEV_GPU_TEMP, gauge, t\n")
    assert "DCGM_FI_DEV_ENC_UTIL" not in text
    assert text.startswith("# HELP DCGM_FI_DEV_GPU_TEMP t\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n")


def test_a_workload_moves_only_its_own_gpus_metrics(machine: mock.MockMachine) -> None:
    before = collect(machine, "DCGM_FI_DEV_GPU_UTIL, gauge, u\nDCGM_FI_DEV_FB_USED, gauge, f\n")
    machine.start_workload([machine.gpus[1].uuid], load=90, memory_mib=8_000)
    after = collect(machine, "DCGM_FI_DEV_GPU_UTIL, gauge, u\nDCGM_FI_DEV_FB_USED, gauge, f\n")

    def values(text: str, metric: str) -> list[int]:
        return [int(s.rsplit(" ", 1)[1]) for s in samples(text, metric)]

    util_before, util_after = (
        values(before, "DCGM_FI_DEV_GPU_UTIL"),
        values(after, "DCGM_FI_DEV_GPU_UTIL"),
    )
    assert util_after[1] > 70 >= util_before[1]
    assert util_after[0] == util_before[0]
    assert values(after, "DCGM_FI_DEV_FB_USED")[1] == 8_000
    assert values(after, "DCGM_FI_DEV_FB_USED")[0] == 0


def test_a_gpu_that_fell_off_the_bus_reports_no_utilisation(machine: mock.MockMachine) -> None:
    """Issue 30 item 14: after XID 79 (the demo's `demo-gpu-fault xid N 79`) NVML answers
    GPU_IS_LOST for the GPU, so the exporter has no utilisation (nor memory, power) to report
    for it; the other GPUs keep theirs. Before the fix the lost GPU's load was still exported."""
    wanted = "DCGM_FI_DEV_GPU_UTIL, gauge, u\nDCGM_FI_DEV_POWER_USAGE, gauge, p\n"
    machine.start_workload([machine.gpus[1].uuid], load=90)
    machine.inject_xid(1, mock.XID_FALLEN_OFF_BUS)
    text = collect(machine, wanted)
    for metric in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE"):
        gpus = [s.split('"')[1] for s in samples(text, metric)]
        assert "1" not in gpus, f"{metric} still reported for the lost GPU: {gpus}"
    assert [s.split('"')[1] for s in samples(text, "DCGM_FI_DEV_GPU_UTIL")] == ["0", "3"]
