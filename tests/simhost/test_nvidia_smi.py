"""nvidia-smi in the demo's GPU containers: the pure formatting, which devices a container sees,
and the program's answers (list, query report, -i, topology, no devices, lost GPU, reset); plus
the demo's fault injector and simulated signals, and the runbook queries through the real kubectl
on the served demo."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from demo_served import run_kubectl, serve_demo
from kubesim_helpers import needs_kubectl
from waiting import DEADLINE

from gpu_operator.nvml import catalog, mock
from gpu_operator.nvml.protocol import fabric_health_mask as p_mask
from gpudemo import fleet, session
from simhost import gpu_faults, nvidia_smi
from simhost.processes import ProcessTable

NOW = dt.datetime(2026, 11, 22, 20, 39, 38)
A100 = nvidia_smi.GpuRow(
    index=0,
    name="NVIDIA A100-SXM4-40GB",
    uuid="GPU-1",
    bus_id="00000000:07:00.0",
    temperature_c=32,
    power_w=56,
    power_cap_w=400,
    memory_used_mib=1,
    memory_total_mib=40960,
    utilization=0,
    ecc_uncorrected=0,
    mig_mode=False,
)


def _view(**extra: Any) -> nvidia_smi.SmiView:
    base: dict[str, Any] = {
        "timestamp": "Sun Nov 22 20:39:38 2026",
        "driver_version": "550.54.15",
        "cuda_version": "12.4",
        "gpus": (A100,),
    }
    base.update(extra)
    return nvidia_smi.SmiView(**base)


def test_the_table_has_nvidia_smis_layout_for_one_gpu() -> None:
    lines = nvidia_smi.format_table(_view()).splitlines()
    assert lines[0] == "Sun Nov 22 20:39:38 2026"
    assert lines[2] == (
        "| NVIDIA-SMI 550.54.15             Driver Version: 550.54.15      "
        "CUDA Version: 12.4      |"
    )
    assert lines[3] == (
        "|-----------------------------------------+------------------------+----------------------+"
    )
    assert lines[8:11] == [
        "|   0  NVIDIA A100-SXM4-40GB          On  |   00000000:07:00.0 Off |"
        "                    0 |",
        "| N/A   32C    P0             56W /  400W |       1MiB /  40960MiB |"
        "      0%      Default |",
        "|                                         |                        |"
        "             Disabled |",
    ]
    assert "|  No running processes found" in "\n".join(lines)
    assert {len(line) for line in lines[1:] if line} == {91}


def test_mig_devices_and_processes_get_their_own_tables() -> None:
    gpu = nvidia_smi.GpuRow(**{**A100.__dict__, "mig_mode": True, "utilization": None})
    mig = nvidia_smi.MigRow(
        gpu=0, gpu_instance=1, compute_instance=0, index=0, profile="3g.20gb", uuid="MIG-1",
        memory_used_mib=13, memory_total_mib=20096, multiprocessors=42, copy_engines=3,
        encoders=0, decoders=2, ofa=0, jpeg=0,
    )  # fmt: skip
    proc = nvidia_smi.ProcessRow(gpu=0, gpu_instance=1, compute_instance=0, pid=4242, used_mib=512)
    text = nvidia_smi.format_table(_view(gpus=(gpu,), migs=(mig,), processes=(proc,)))
    assert "|     N/A      Default |" in text
    assert "|              Enabled |" in text
    assert "| MIG devices:" in text
    assert (
        "|  0    1   0   0  |              13MiB / 20096MiB    | 42      0 |"
        "  3   0    2    0    0 |"
    ) in text
    assert "|    0    1    0       4242      C   N/A" in text
    assert "512MiB |" in text
    assert "No running processes found" not in text
    assert {len(line) for line in text.splitlines()[1:] if line} == {91}


def test_the_list_indents_mig_devices_under_their_gpu() -> None:
    mig = nvidia_smi.MigRow(
        gpu=0, gpu_instance=1, compute_instance=0, index=0, profile="1g.5gb", uuid="MIG-abc",
        memory_used_mib=0, memory_total_mib=4864, multiprocessors=14, copy_engines=1,
        encoders=0, decoders=0, ofa=0, jpeg=0,
    )  # fmt: skip
    assert nvidia_smi.format_list([A100], [mig]) == (
        "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-1)\n  MIG 1g.5gb      Device  0: (UUID: MIG-abc)\n"
    )


def test_cuda_versions_print_as_major_dot_minor() -> None:
    assert nvidia_smi.cuda_version(12040) == "12.4"
    assert nvidia_smi.cuda_version(12060) == "12.6"


@dataclass
class Allocation:
    envs: dict[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Any, ...] = ()


@dataclass
class Mount:
    container_path: str
    host_path: str = "/dev/null"


@pytest.mark.parametrize(
    ("env", "allocation", "expected"),
    [
        ({}, None, None),
        ({"NVIDIA_VISIBLE_DEVICES": "void"}, None, None),
        ({"NVIDIA_VISIBLE_DEVICES": ""}, None, None),
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, None, nvidia_smi.Visible(all=True)),
        ({"NVIDIA_VISIBLE_DEVICES": "none"}, None, nvidia_smi.Visible()),
        (
            {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"},
            None,
            nvidia_smi.Visible(ids=("GPU-a", "GPU-b")),
        ),
        (
            {},
            Allocation(cdi_devices=("k8s.device-plugin.nvidia.com/gpu=GPU-a",)),
            nvidia_smi.Visible(ids=("GPU-a",)),
        ),
        (
            {},
            Allocation(
                annotations={
                    "cdi.k8s.io/nvidia-device-plugin_x": "k8s.device-plugin.nvidia.com/gpu=0:1"
                }
            ),
            nvidia_smi.Visible(ids=("0:1",)),
        ),
        ({}, Allocation(cdi_devices=("example.com/widget=1",)), None),
        (
            {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"},
            Allocation(mounts=(Mount("/var/run/nvidia-container-devices/GPU-c"),)),
            nvidia_smi.Visible(ids=("GPU-c",)),
        ),
    ],
)
def test_visible_devices_follow_what_the_runtime_injects(
    env: dict[str, str], allocation: Allocation | None, expected: nvidia_smi.Visible | None
) -> None:
    assert nvidia_smi.visible_devices(env, allocation) == expected
    assert nvidia_smi.has_nvidia_smi(env, allocation) is (expected is not None)


def _lib(preset: str) -> tuple[mock.MockMachine, Any]:
    machine = mock.MockMachine.from_preset(preset, seed=1)
    return machine, machine.nvml()


def test_a_container_sees_only_its_gpus_renumbered_from_zero() -> None:
    machine, lib = _lib("dgx-a100")
    wanted = (machine.gpus[5].uuid, machine.gpus[2].uuid)
    code, text = nvidia_smi.run(lib, nvidia_smi.Visible(ids=wanted), ["-L"], NOW)
    assert code == 0
    assert text == (
        f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {machine.gpus[2].uuid})\n"
        f"GPU 1: NVIDIA A100-SXM4-40GB (UUID: {machine.gpus[5].uuid})\n"
    )
    code, table = nvidia_smi.run(lib, nvidia_smi.Visible(ids=("3",)), [], NOW)
    assert code == 0
    assert machine.gpus[3].bus_id in table


def test_a_mig_device_shows_its_parent_and_only_itself() -> None:
    _, lib = _lib("dgx-a100-mig-mixed")
    code, text = nvidia_smi.run(lib, nvidia_smi.Visible(ids=("1:2",)), ["-L"], NOW)
    assert code == 0
    lines = text.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-")
    assert lines[1].startswith("  MIG 1g.5gb      Device  0: (UUID: MIG-")
    code, table = nvidia_smi.run(lib, nvidia_smi.Visible(ids=("1:2",)), [], NOW)
    assert table.count("|  0    ") == 1  # one MIG row


def test_no_devices_bad_arguments_and_a_lost_gpu_answer_like_nvidia_smi() -> None:
    machine, lib = _lib("t4x4")
    assert nvidia_smi.run(lib, nvidia_smi.Visible(), [], NOW) == (6, "No devices were found\n")
    code, text = nvidia_smi.run(lib, nvidia_smi.Visible(all=True), ["--frobnicate"], NOW)
    assert code == 2
    assert "Please run 'nvidia-smi -h' for help." in text
    machine.fall_off_bus(1)
    code, text = nvidia_smi.run(lib, nvidia_smi.Visible(all=True), [], NOW)
    assert code == 15
    assert "GPU is lost" in text
    assert nvidia_smi.run(lib, nvidia_smi.Visible(ids=("0",)), ["-L"], NOW)[0] == 0


def test_a_driver_that_does_not_load_fails_like_nvidia_smi() -> None:
    machine, lib = _lib("t4x4")
    machine.fail_next("init", mock.errors.DriverNotLoaded)
    code, text = nvidia_smi.run(lib, nvidia_smi.Visible(all=True), [], NOW)
    assert code == 9
    assert "couldn't communicate with the NVIDIA driver" in text


def test_reset_needs_the_driver_container_and_clears_a_lost_gpu() -> None:
    machine, lib = _lib("t4x4")
    visible = nvidia_smi.Visible(all=True)
    assert nvidia_smi.run(lib, visible, ["-r", "-i", "1"], NOW) == (4, "Insufficient Permissions\n")
    machine.fall_off_bus(1)

    def reset(index: int) -> str:
        machine.reset(index)
        return machine.gpus[index].bus_id

    code, text = nvidia_smi.run(lib, visible, ["-r", "-i", "1"], NOW, reset=reset)
    assert code == 0
    assert text == f"GPU {machine.gpus[1].bus_id} was successfully reset.\nAll done.\n"
    assert nvidia_smi.run(lib, visible, [], NOW)[0] == 0


def test_the_fault_injector_raises_xids_and_explains_its_usage() -> None:
    machine, lib = _lib("t4x4")
    lib.init()
    events = lib.event_set()
    events.register(lib.device_by_index(2), mock.p.EventType.XID_CRITICAL)
    assert gpu_faults.run(machine, ["xid", "2", "48"]) == (0, "XID 48 raised on GPU 2\n")
    assert events.wait(1000).event_data == 48
    code, text = gpu_faults.run(machine, ["xid", "9", "48"])
    assert code == 2
    assert "no GPU 9" in text
    assert gpu_faults.run(machine, ["melt", "1"])[0] == 2


def test_signals_reach_only_processes_of_a_pod_sharing_its_namespace() -> None:
    table = ProcessTable()
    got: list[int] = []
    shared = {"metadata": {"uid": "u1"}, "spec": {"shareProcessNamespace": True}}
    private = {"metadata": {"uid": "u1"}, "spec": {}}
    with table.running(shared, "nvidia-device-plugin", got.append):
        assert table.signaller(shared).signal("nvidia-device-plugin", 1) is True
        assert table.signaller(shared).signal("gpu-feature-discovery", 1) is False
        assert table.signaller(private).signal("nvidia-device-plugin", 1) is False
    assert got == [1]
    assert table.signaller(shared).signal("nvidia-device-plugin", 1) is False
    assert table.pods == {}


# ----- the read-only listings scripts/gpu-check compares with ---------------------------------

ALL = nvidia_smi.Visible(all=True)


def test_query_gpu_writes_csv_with_units_unless_told_otherwise() -> None:
    _, lib = _lib("t4x4")
    fields = "--query-gpu=index,name,memory.total,power.draw,mig.mode.current"
    code, text = nvidia_smi.run(lib, ALL, [fields, "--format=csv"], NOW)
    assert code == 0
    lines = text.splitlines()
    assert lines[0] == "index, name, memory.total [MiB], power.draw [W], mig.mode.current"
    assert len(lines) == 5
    assert lines[1].startswith("0, Tesla T4, 15360 MiB, ")
    assert lines[1].endswith(" W, [N/A]")  # T4 has no MIG mode
    bare = ["--query-gpu=index,memory.total,mig.mode.current", "--format=csv,noheader,nounits"]
    assert nvidia_smi.run(lib, ALL, bare, NOW)[1].splitlines()[3] == "3, 15360, [N/A]"


def test_query_gpu_reports_memory_as_v2_and_mig_mode_where_there_is_one() -> None:
    _, lib = _lib("dgx-h100")
    args = ["--query-gpu=memory.total,memory.used,memory.free,memory.reserved,mig.mode.current",
            "--format=csv,noheader,nounits"]  # fmt: skip
    code, text = nvidia_smi.run(lib, ALL, args, NOW)
    assert code == 0
    total, used, free, reserved, mode = text.splitlines()[0].split(", ")
    assert int(used) + int(free) + int(reserved) == int(total) == 81559
    assert mode == "Disabled"


def test_query_gpu_refuses_what_nvidia_smi_refuses() -> None:
    _, lib = _lib("t4x4")
    unknown = ["--query-gpu=index,fan.speedy", "--format=csv"]
    assert nvidia_smi.run(lib, ALL, unknown, NOW) == (
        2,
        'Field "fan.speedy" is not a valid field to query.\n',
    )
    assert nvidia_smi.run(lib, ALL, ["--query-gpu=index"], NOW)[0] == 2
    assert nvidia_smi.run(lib, ALL, ["--query-gpu=index", "--format=xml"], NOW)[0] == 2


def _rows(text: str) -> list[list[str]]:
    return [line.strip("| ").split() for line in text.splitlines() if " MIG " in line]


def test_mig_listings_show_profiles_instances_and_compute_instances() -> None:
    _, lib = _lib("dgx-a100-mig-mixed")
    lib.init()
    gpu = lib.device_by_index(0)
    code, text = nvidia_smi.run(lib, ALL, ["mig", "-lgip"], NOW)
    assert code == 0
    assert "GPU instance profiles:" in text
    profiles = [row for row in _rows(text) if row[0] == "0"]
    names = [row[2] for row in profiles]
    assert names == ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb", "1g.5gb+me", "1g.10gb"]
    two_g = gpu.gpu_instance_profile_info(catalog.GI_PROFILE_2_SLICE)
    assert profiles[1][3] == str(two_g.id)  # NVML's own profile id, as the real tool prints
    assert profiles[1][4] == "0/3"  # the 2g.10gb instance's placement leaves room for no other
    code, text = nvidia_smi.run(lib, ALL, ["mig", "-lgi"], NOW)
    assert code == 0
    instances = _rows(text)
    assert len(instances) == 32  # 4 GPU instances on each of 8 GPUs
    gi = gpu.gpu_instances(catalog.GI_PROFILE_3_SLICE)[0].info()
    row = ["0", "MIG", "3g.20gb", str(gi.profile_id), str(gi.id), f"{gi.placement.start}:4"]
    assert row in instances
    code, text = nvidia_smi.run(lib, ALL, ["mig", "-lci"], NOW)
    assert code == 0
    compute = _rows(text)
    assert len(compute) == 32
    assert all(len(row) == 7 and row[2] == "MIG" for row in compute)


def test_mig_listings_say_when_there_is_nothing_to_list() -> None:
    _, lib = _lib("t4x4")
    expected = (6, "No MIG-enabled devices found.\n")
    assert nvidia_smi.run(lib, ALL, ["mig", "-lgip"], NOW) == expected
    machine, lib = _lib("dgx-a100")
    lib.init()
    lib.device_by_index(0).set_mig_mode(True)
    machine.reset(0)  # MIG on, no instances yet
    code, text = nvidia_smi.run(lib, ALL, ["mig", "-lgi"], NOW)
    assert (code, text) == (6, "No GPU instances found: Not Found\n")
    assert nvidia_smi.run(lib, ALL, ["mig", "-lci"], NOW)[0] == 6
    assert nvidia_smi.run(lib, ALL, ["mig", "-lgip"], NOW)[0] == 0


def test_the_program_runs_on_a_preset_from_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert nvidia_smi.main(["--machine", "t4x4", "-L"]) == 0
    assert capsys.readouterr().out.count("Tesla T4 (UUID: GPU-") == 4
    assert nvidia_smi.main(["--machine", "t4x4", "-r", "-i", "0"]) == 4  # resets are refused
    assert nvidia_smi.main(["--machine", "no-such-box", "-L"]) == 2
    assert "no-such-box" in capsys.readouterr().err


# ----- -q / -d, -i, topo -m: the pure formats -----------------------------------------------


def _report(*sections: tuple[str, nvidia_smi.Section]) -> nvidia_smi.Report:
    gpu = nvidia_smi.ReportGpu("00000000:07:00.0", dict(sections))
    return nvidia_smi.Report("Sun Nov  1 09:05:03 2026", "550.54.15", "12.4", 8, (gpu,))


def test_the_query_report_aligns_values_at_column_42_under_the_nvsmi_log_header() -> None:
    E = nvidia_smi.Entry
    memory = ("MEMORY", (E(1, "FB Memory Usage"), E(2, "Total", "40960 MiB")))
    long_key = ("TEMPERATURE", (E(2, "Memory Max Operating T.Limit Temp", "0 C"),))
    text = nvidia_smi.format_report(_report(memory, long_key))
    assert text.splitlines() == [
        "",
        "==============NVSMI LOG==============",
        "",
        "Timestamp                                 : Sun Nov  1 09:05:03 2026",
        "Driver Version                            : 550.54.15",
        "CUDA Version                              : 12.4",
        "",
        "Attached GPUs                             : 8",
        "GPU 00000000:07:00.0",
        "    FB Memory Usage",
        "        Total                             : 40960 MiB",
        "        Memory Max Operating T.Limit Temp : 0 C",
        "",
    ]


def test_display_types_pick_sections_in_the_reports_own_order() -> None:
    E = nvidia_smi.Entry
    report = _report(
        ("identity", (E(1, "Product Name", "NVIDIA A100-SXM4-40GB"),)),
        ("MEMORY", (E(1, "FB Memory Usage"),)),
        ("PIDS", (E(1, "Processes", "None"),)),
        ("TEMPERATURE", (E(1, "Temperature"),)),
    )
    picked = nvidia_smi.format_report(report, ("PIDS", "MEMORY")).splitlines()[9:-1]
    assert picked == ["    FB Memory Usage", "    Processes                             : None"]
    full = nvidia_smi.format_report(report)
    assert full.index("Product Name") < full.index("FB Memory") < full.index("Temperature")
    assert full.index("Temperature") < full.index("Processes")


def test_the_topology_matrix_is_tab_separated_with_affinities_and_legends() -> None:
    topo = nvidia_smi.Topology(
        rows=("GPU0", "GPU1", "NIC0"),
        cells=(("X", "NV18", "PIX"), ("NV18", "X", "NODE"), ("PIX", "NODE", "X")),
        cpu_affinity=("0-55,112-167", "0-55,112-167"),
        numa_affinity=("0", "0"),
        nic_names=("mlx5_0",),
    )
    lines = nvidia_smi.format_topology(topo).splitlines()
    assert lines[:4] == [
        "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID",
        "GPU0\t X \tNV18\tPIX\t0-55,112-167\t0\t\tN/A",
        "GPU1\tNV18\t X \tNODE\t0-55,112-167\t0\t\tN/A",
        "NIC0\tPIX\tNODE\t X \t\t\t\t",
    ]
    assert lines[4:7] == ["", "Legend:", ""]
    assert "  NV#  = Connection traversing a bonded set of # NVLinks" in lines
    assert lines[-3:] == ["NIC Legend:", "", "  NIC0: mlx5_0"]
    assert nvidia_smi.ranges([5, 0, 1, 2, 7, 6, 9]) == "0-2,5-7,9"


def test_timestamps_pad_the_day_with_a_space_as_nvidia_smi_does() -> None:
    assert nvidia_smi.timestamp(dt.datetime(2026, 11, 1, 9, 5, 3)) == "Sun Nov  1 09:05:03 2026"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-q", "-i", "0,GPU-x", "-d", "memory,PIDS"],
         nvidia_smi.Invocation("query", ids=("0", "GPU-x"), sections=("MEMORY", "PIDS"))),
        (["--query", "--id=1", "--display=ECC"],
         nvidia_smi.Invocation("query", ids=("1",), sections=("ECC",))),
        (["-i", "0"], nvidia_smi.Invocation("table", ids=("0",))),
        (["topo", "-m"], nvidia_smi.Invocation("topo")),
        (["topo", "--matrix"], nvidia_smi.Invocation("topo")),
        (["mig", "-i", "1", "-lgi"],
         nvidia_smi.Invocation("mig", ids=("1",), mig="gpu-instances")),
    ],
)  # fmt: skip
def test_command_lines_parse_as_nvidia_smi_reads_them(
    args: list[str], expected: nvidia_smi.Invocation
) -> None:
    assert nvidia_smi.parse_args(args) == expected


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-d", "MEMORY"], "Invalid combination of input arguments"),
        (["-L", "-i", "0"], "Invalid combination of input arguments"),
        (["-q", "--query-gpu=index", "--format=csv"], "Invalid combination of input arguments"),
        (["-q", "-i"], "ERROR: Option -i requires a value."),
        (["--frobnicate"], "ERROR: Option --frobnicate is not recognized."),
        (["-q", "-d", "FOO"], '"FOO" is not a valid display type for -d (one of: MEMORY,'),
        (["-q", "-d", "VOLTAGE"], "-d VOLTAGE is not simulated; the mock GPUs report CLOCK,"),
        (["topo", "-p2p", "r"], "only -m (--matrix) is simulated; '-p2p' is not"),
        (["mig", "-cgi", "9"], "MIG changes go through the MIG manager"),
    ],
)
def test_what_nvidia_smi_refuses_exits_2_with_its_reason(args: list[str], message: str) -> None:
    _, lib = _lib("t4x4")
    code, text = nvidia_smi.run(lib, ALL, args, NOW)
    assert code == 2
    assert message in text


# ----- -q / -d, -i, topo -m on the mock GPUs ------------------------------------------------


def _value(text: str, key: str) -> list[str]:
    lines = text.splitlines()
    return [line.split(" : ", 1)[1] for line in lines if line.strip().startswith(f"{key} ")]


def test_q_d_memory_reports_each_gpus_framebuffer_from_nvml() -> None:
    machine, lib = _lib("dgx-h100")
    machine.start_process(1, 4242, used_memory_mib=1024)
    code, text = nvidia_smi.run(lib, ALL, ["-q", "-d", "MEMORY"], NOW)
    assert code == 0
    assert _value(text, "Attached GPUs") == ["8"]
    assert text.count("    FB Memory Usage\n") == 8
    assert _value(text, "Total") == ["81559 MiB"] * 8
    assert _value(text, "Used")[:2] == ["0 MiB", "1024 MiB"]
    reserved = int(_value(text, "Reserved")[1].split()[0])
    assert int(_value(text, "Free")[1].split()[0]) == 81559 - reserved - 1024
    assert "Product Name" not in text
    assert "Utilization" not in text


def test_the_full_report_has_identity_utilisation_power_and_processes() -> None:
    machine, lib = _lib("t4x4")
    machine.start_process(2, 4242, used_memory_mib=512, load=80)
    code, text = nvidia_smi.run(lib, ALL, ["-q", "-i", "2"], NOW)
    assert code == 0
    assert text.count("\nGPU 0000") == 1
    assert _value(text, "Product Name") == ["Tesla T4"]
    assert _value(text, "GPU UUID") == [machine.gpus[2].uuid]
    assert _value(text, "Bus Id") == [machine.gpus[2].bus_id]
    assert int(_value(text, "Gpu")[0].rstrip(" %")) > 50
    assert _value(text, "Current Power Limit") == ["70.00 W"]
    assert _value(text, "Process ID") == ["4242"]
    assert _value(text, "Used GPU Memory") == ["512 MiB"]
    assert _value(text, "Remapped Rows") == ["N/A"]  # GDDR6: no row remapper
    assert "\n    GPU Reset Status\n" in text  # R550: no recovery-action field to show
    assert _value(text, "Reset Required") == ["N/A"]


def test_a_mig_gpu_reports_its_mig_devices_and_no_utilisation() -> None:
    _, lib = _lib("dgx-a100-mig-mixed")
    code, text = nvidia_smi.run(lib, nvidia_smi.Visible(ids=("1:2",)), ["-q"], NOW)
    assert code == 0
    assert _value(text, "Attached GPUs") == ["1"]
    assert text.count("        MIG Device\n") == 1  # only the container's MIG device
    assert _value(text, "Multiprocessor count") == ["14"]
    assert _value(text, "Gpu") == ["N/A"]


def test_recovery_action_shows_on_drivers_that_have_it() -> None:
    machine = mock.MockMachine.from_preset("t4x4", seed=1, driver="570.195.03")
    lib = machine.nvml()
    machine.inject_xid(1, 48)
    code, text = nvidia_smi.run(lib, ALL, ["-q", "-d", "RESET_STATUS"], NOW)
    assert code == 0
    assert _value(text, "GPU Recovery Action") == ["None", "Reset", "None", "None"]


def test_i_picks_gpus_by_index_uuid_or_pci_bus_id() -> None:
    machine, lib = _lib("dgx-a100")
    fields = ["--query-gpu=index,uuid,count", "--format=csv,noheader"]
    by_uuid = machine.gpus[5].uuid
    by_bus = machine.gpus[2].bus_id.replace("00000000:", "0000:").lower()
    code, text = nvidia_smi.run(lib, ALL, ["-i", f"{by_uuid},{by_bus},7", *fields], NOW)
    assert code == 0
    assert [row.split(", ")[0] for row in text.splitlines()] == ["2", "5", "7"]
    assert text.splitlines()[1] == f"5, {by_uuid}, 8"
    # In a container the GPUs are numbered from 0, and -i uses that numbering.
    mine = nvidia_smi.Visible(ids=(machine.gpus[6].uuid, machine.gpus[3].uuid))
    code, text = nvidia_smi.run(lib, mine, ["-i", "1", *fields], NOW)
    assert text == f"1, {machine.gpus[6].uuid}, 2\n"
    code, table = nvidia_smi.run(lib, mine, ["-i", "1"], NOW)
    assert code == 0
    assert machine.gpus[6].bus_id in table
    assert machine.gpus[3].bus_id not in table


def test_i_naming_no_gpu_of_the_container_finds_no_devices() -> None:
    machine, lib = _lib("dgx-a100")
    mine = nvidia_smi.Visible(ids=(machine.gpus[0].uuid,))
    for args in (["-i", "1"], ["-q", "-i", machine.gpus[1].uuid], ["-i", "nonsense", "-q"],
                 ["-i", "0,3", "--query-gpu=index", "--format=csv"]):  # fmt: skip
        assert nvidia_smi.run(lib, mine, args, NOW) == (6, "No devices were found\n"), args


def test_topo_m_shows_nvlinks_pcie_paths_nics_and_affinities() -> None:
    machine, lib = _lib("dgx-a100")
    code, text = nvidia_smi.run(lib, ALL, ["topo", "-m"], NOW, host=machine)
    assert code == 0
    rows = [line.split("\t") for line in text.splitlines()[:17]]
    assert rows[0][1:] == [f"GPU{i}" for i in range(8)] + [f"NIC{k}" for k in range(8)] + [
        "CPU Affinity", "NUMA Affinity", "GPU NUMA ID",
    ]  # fmt: skip
    gpu0, gpu5, nic0 = rows[1], rows[6], rows[9]
    assert gpu0[1:9] == [" X "] + ["NV12"] * 7  # every pair meets at the six NVSwitches
    assert gpu0[9:17] == ["PIX", "PIX", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"]
    assert gpu0[17:] == ["0-63,128-191", "0", "", "N/A"]
    assert gpu5[17:19] == ["64-127,192-255", "1"]
    assert nic0[1:3] == ["PIX", "PIX"]
    assert nic0[9] == " X "
    assert "  NIC7: mlx5_7" in text


def test_topo_m_without_nvlink_shows_the_pcie_levels_of_the_containers_gpus() -> None:
    machine, lib = _lib("l4x8")
    mine = nvidia_smi.Visible(ids=("0", "1", "4"))
    code, text = nvidia_smi.run(lib, mine, ["topo", "-m"], NOW, host=machine)
    assert code == 0
    rows = [line.split("\t") for line in text.splitlines()[:4]]
    assert rows[0][1:4] == ["GPU0", "GPU1", "GPU2"]
    assert rows[1][1:4] == [" X ", "PIX", "SYS"]
    assert rows[3][1:6] == ["SYS", "SYS", " X ", "32-63,96-127", "1"]
    assert "NIC Legend" not in text


def test_xid_79_from_the_fault_injector_loses_the_gpu_for_nvidia_smi() -> None:
    """Issue 30 item 14: `demo-gpu-fault xid N 79` is the GPU falling off the bus. Before the
    fix the GPU kept answering, so `--query-gpu=utilization.gpu` still reported its load."""
    machine, lib = _lib("t4x4")
    machine.start_process(1, 4242, used_memory_mib=512, load=90)
    code, text = gpu_faults.run(machine, ["xid", "1", "79"])
    assert (code, text) == (0, "XID 79 raised on GPU 1: it has fallen off the bus\n")
    query = ["--query-gpu=index,utilization.gpu", "--format=csv,noheader"]
    code, text = nvidia_smi.run(lib, ALL, query, NOW)
    assert code == 15
    assert "GPU is lost" in text
    assert "%" not in text
    assert nvidia_smi.run(lib, ALL, ["-q", "-d", "UTILIZATION", "-i", "1"], NOW)[0] == 15
    # The GPUs that still answer are reported when asked for.
    assert nvidia_smi.run(lib, ALL, ["-i", "0", *query], NOW)[0] == 0
    machine.stop_process(1, 4242)
    machine.reset(1)
    assert nvidia_smi.run(lib, ALL, ["-i", "1", *query], NOW)[0] == 0


def test_a_container_given_a_lost_gpu_by_uuid_says_it_is_lost() -> None:
    """The runtime gave the container the GPU by UUID; once it fell off the bus nvidia-smi
    fails on it (exit 15) rather than saying there are no devices (as it did before)."""
    machine, lib = _lib("t4x4")
    mine = nvidia_smi.Visible(ids=(machine.gpus[2].uuid,))
    machine.fall_off_bus(2)
    for args in ([], ["-q"], ["topo", "-m"], ["--query-gpu=index", "--format=csv"]):
        code, text = nvidia_smi.run(lib, mine, args, NOW, host=machine)
        assert code == 15, (args, text)
        assert text.startswith("Unable to determine the device handle for GPU 0: GPU is lost.")


def test_the_program_answers_topo_and_q_on_a_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert nvidia_smi.main(["--machine", "dgx-h100", "topo", "-m"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].startswith("GPU0\t X \tNV18\t")
    assert "  NIC0: mlx5_0" in out
    assert nvidia_smi.main(["--machine", "t4x4", "-q", "-d", "TEMPERATURE", "-i", "3"]) == 0
    assert capsys.readouterr().out.count("GPU Current Temp") == 1


# ----- the served demo, with the real kubectl ------------------------------------------------

TWO_GPUS = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "two-gpus"},
    "spec": {
        "containers": [
            {
                "name": "work",
                "image": "nvcr.io/nvidia/cuda:12.6.0-base-ubuntu22.04",
                "command": ["sleep", "infinity"],
                "resources": {"limits": {"nvidia.com/gpu": "2"}},
            }
        ]
    },
}


@needs_kubectl
async def test_kubectl_exec_runs_the_runbook_queries_in_a_gpu_pod(tmp_path: Path) -> None:
    """`kubectl exec POD -- nvidia-smi -q -d MEMORY`, `topo -m`, `-i 0 --query-gpu=...` on the
    served demo answer from the pod's two GPUs; XID 79 raised in the driver container loses one
    of them, and the pod's nvidia-smi says so instead of reporting its utilisation."""
    chosen = fleet.parse({"pools": [{"name": "a100", "machine": "dgx-a100"}]}, "smi.yaml")
    async with serve_demo(tmp_path, chosen) as (sim, nodes, kubeconfig):

        async def kubectl(*args: str, expect: int = 0) -> str:
            code, out = await run_kubectl(kubeconfig, *args)
            assert code == expect, f"kubectl {' '.join(args)} -> {code}:\n{out}"
            return out

        manifest = tmp_path / "two.json"
        manifest.write_text(json.dumps(TWO_GPUS))
        await kubectl("create", "-f", str(manifest))
        await kubectl("wait", "pod/two-gpus", "--for=condition=Ready", f"--timeout={DEADLINE:g}s")
        machine = nodes.node("a100-1").machine
        assert machine is not None

        memory = await kubectl("exec", "two-gpus", "--", "nvidia-smi", "-q", "-d", "MEMORY")
        assert "==============NVSMI LOG==============" in memory
        assert _value(memory, "Attached GPUs") == ["2"]
        assert _value(memory, "Total") == ["40960 MiB", "40960 MiB"]
        assert "Product Name" not in memory

        topo = await kubectl("exec", "two-gpus", "--", "nvidia-smi", "topo", "-m")
        header, gpu0 = (line.split("\t") for line in topo.splitlines()[:2])
        assert header[1:4] == ["GPU0", "GPU1", "NIC0"]
        assert gpu0[1:3] == [" X ", "NV12"]
        assert "NIC Legend:" in topo

        query = ["--query-gpu=index,uuid,memory.total", "--format=csv,noheader"]
        first = await kubectl("exec", "two-gpus", "--", "nvidia-smi", "-i", "0", *query)
        index, uuid, total = first.strip().split(", ")
        assert (index, total) == ("0", "40960 MiB")
        host_index = next(g.index for g in machine.gpus if g.uuid == uuid)
        missing = await kubectl("exec", "two-gpus", "--", "nvidia-smi", "-q", "-i", "2", expect=6)
        assert "No devices were found" in missing

        driver = next(
            p["metadata"]["name"]
            for p in sim.store.list("pods", session.NAMESPACE)
            if (p["metadata"].get("labels") or {}).get("app", "").startswith("nvidia-driver")
        )
        fault = ["demo-gpu-fault", "xid", str(host_index), "79"]
        said = await kubectl(
            "exec", "-n", session.NAMESPACE, driver, "-c", "nvidia-driver-ctr", "--", *fault
        )
        assert "it has fallen off the bus" in said
        util = ["--query-gpu=index,utilization.gpu", "--format=csv"]
        lost = await kubectl("exec", "two-gpus", "--", "nvidia-smi", *util, expect=15)
        assert "GPU is lost" in lost
        assert "%" not in lost.replace("utilization.gpu [%]", "")


def _fabric_block(text: str) -> dict[str, str]:
    """The `name: value` rows from the first Fabric heading to the Processes line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "Fabric")
    rows: dict[str, str] = {}
    for line in lines[start + 1 :]:
        if line.strip().startswith("Processes"):
            break
        if ":" in line:
            name, value = line.split(":", 1)
            rows[name.strip()] = value.strip()
    return rows


def test_query_report_shows_the_nvl72_fabric_and_its_health() -> None:
    """`nvidia-smi -q` on a GB200 NVL72 tray: State, Status, CliqueId, ClusterUUID and the Health
    block as the real tool prints them; a degraded route moves Summary to Unhealthy."""
    machine = mock.MockMachine.from_preset("gb200-nvl72")
    lib = machine.nvml()
    lib.init()
    code, text = nvidia_smi.run(lib, nvidia_smi.Visible(all=True), ["-q", "-i", "1"], NOW)
    assert code == 0
    fabric = machine.spec.fabric
    assert fabric is not None
    assert _fabric_block(text) == {
        "State": "Completed",
        "Status": "Success",
        "CliqueId": "32766",
        "ClusterUUID": fabric.cluster_uuid,
        "Summary": "Healthy",
        "Bandwidth": "Full",
        "Route Recovery in progress": "False",
        "Route Unhealthy": "False",
        "Access Timeout Recovery": "False",
        "Incorrect Configuration": "None",
    }
    assert "        Health\n            Summary" in text  # nested under Fabric, as the tool nests
    machine.set_fabric(1, health_mask=p_mask(route_unhealthy=True))
    rows = _fabric_block(
        nvidia_smi.run(lib, nvidia_smi.Visible(all=True), ["-q", "-i", "1"], NOW)[1]
    )
    assert (rows["Summary"], rows["Route Unhealthy"]) == ("Unhealthy", "True")
    machine.set_fabric(1, health_mask=p_mask(degraded_bandwidth=True))
    rows = _fabric_block(
        nvidia_smi.run(lib, nvidia_smi.Visible(all=True), ["-q", "-i", "1"], NOW)[1]
    )
    assert (rows["Summary"], rows["Bandwidth"]) == ("Limited Capacity", "Degraded")
    machine.set_fabric(1, state=2, health_mask=0)
    rows = _fabric_block(
        nvidia_smi.run(lib, nvidia_smi.Visible(all=True), ["-q", "-i", "1"], NOW)[1]
    )
    assert (rows["State"], rows["Summary"], rows["Bandwidth"]) == ("In Progress", "N/A", "N/A")
