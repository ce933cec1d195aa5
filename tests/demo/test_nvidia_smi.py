"""nvidia-smi in the demo's GPU containers: the pure formatting, which devices a container sees,
and the program's answers (list, no devices, lost GPU, reset); plus the demo's fault injector and
simulated signals."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpu_operator.demo import gpu_faults, nvidia_smi
from gpu_operator.demo.processes import ProcessTable
from gpu_operator.nvml import catalog, mock

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
