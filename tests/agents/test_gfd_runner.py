"""The GFD loop, output sinks, vGPU detection and the command-line contract."""

from __future__ import annotations

import asyncio
import io
import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner
from waiting import within

from gpu_operator import nvml
from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.gfd import output, runner
from gpu_operator.agents.gfd import vgpu as gfd_vgpu
from gpu_operator.cli import app
from gpu_operator.nvml import mock

NOW = 1_700_000_000.0


class RecordingSink:
    """Keeps every write and signals each one, so tests wait on a condition, not a sleep."""

    def __init__(self) -> None:
        self.writes: list[dict[str, str]] = []
        self.removed = False
        self.written = asyncio.Event()

    async def write(self, labels: dict[str, str]) -> None:
        self.writes.append(labels)
        self.written.set()

    async def remove(self) -> None:
        self.removed = True


def settings(**gfd: object) -> runner.Settings:
    return runner.Settings(config=pc.parse({"flags": {"gfd": gfd}}), machine_type="box")


async def test_oneshot_writes_once_and_keeps_the_output() -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    sink = RecordingSink()
    await runner.run(machine.nvml, sink, settings(oneshot=True), clock=lambda: NOW,
                     install_signals=False)  # fmt: skip
    assert len(sink.writes) == 1
    assert sink.writes[0]["nvidia.com/gpu.product"] == "Tesla-T4"
    assert sink.writes[0]["nvidia.com/gfd.timestamp"] == "1700000000"
    assert not sink.removed


async def test_loop_relabels_until_stopped_then_removes_the_output() -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    sink = RecordingSink()
    stop = asyncio.Event()
    task = asyncio.create_task(
        runner.run(
            machine.nvml, sink, settings(sleepInterval="1h"), stop=stop, install_signals=False
        )
    )
    await within(sink.written.wait(), "the labels written")
    stop.set()
    await within(task, "GFD to stop")
    assert len(sink.writes) == 1
    assert sink.removed


async def test_sighup_reload_picks_up_a_new_config(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("flags: {gfd: {sleepInterval: infinite}}\n")
    s = runner.Settings(config=pc.load(path), config_path=path, machine_type="box")
    machine = mock.MockMachine.from_preset("t4x4")
    sink = RecordingSink()
    stop, reload = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        runner.run(machine.nvml, sink, s, stop=stop, reload=reload, install_signals=False)
    )
    await within(sink.written.wait(), "the labels written")
    sink.written.clear()
    path.write_text(
        "flags: {gfd: {sleepInterval: infinite}}\n"
        "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}\n"
    )
    reload.set()
    await within(sink.written.wait(), "the labels written again")
    stop.set()
    await within(task, "GFD to stop")
    assert sink.writes[0]["nvidia.com/gpu.replicas"] == "1"
    assert sink.writes[1]["nvidia.com/gpu.replicas"] == "4"
    # "infinite" labels once and idles: upstream keeps the output in that mode.
    assert not sink.removed


async def test_init_failure_is_fatal_unless_tolerated() -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    machine.fail_next("init", nvml.DriverNotLoaded, times=None)
    with pytest.raises(runner.InitFailed, match="driver not loaded"):
        await runner.run(machine.nvml, RecordingSink(), settings(oneshot=True),
                         install_signals=False)  # fmt: skip
    tolerant = runner.Settings(
        config=pc.parse({"flags": {"failOnInitError": False, "gfd": {"oneshot": True}}})
    )
    sink = RecordingSink()
    await runner.run(machine.nvml, sink, tolerant, clock=lambda: NOW, install_signals=False)
    assert sink.writes == [{"nvidia.com/gfd.timestamp": "1700000000"}]


async def test_file_sink_writes_atomically_with_mode_0644_and_removes(tmp_path: Path) -> None:
    target = tmp_path / "features.d" / "gfd"
    sink = output.FileSink(target)
    await sink.write({"b": "2", "a": "1"})
    assert target.read_text() == "a=1\nb=2\n"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
    await sink.write({"a": "3"})
    assert target.read_text() == "a=3\n"
    assert [p.name for p in target.parent.iterdir()] == ["gfd"]
    await sink.remove()
    assert not target.exists()
    await sink.remove()


async def test_stdout_sink() -> None:
    buf = io.StringIO()
    await output.StdoutSink(buf).write({"z": "1", "a": "2"})
    assert buf.getvalue() == "a=2\nz=1\n"


def test_overrides_beat_the_config_file() -> None:
    base = pc.parse({"flags": {"migStrategy": "single", "gfd": {"oneshot": False}}})
    merged = runner.apply_overrides(base, {"flags.migStrategy": "mixed", "flags.gfd.oneshot": True})
    assert merged.flags.mig_strategy is pc.MigStrategy.MIXED
    assert merged.flags.gfd.oneshot is True


# -- vGPU capability parsing ------------------------------------------------------------------


def _vgpu_capability(version: bytes, branch: bytes) -> bytes:
    record0 = bytes([0, 22]) + version.ljust(10, b"\0") + branch.ljust(10, b"\0")
    body = bytes([0x09, 0, 0, ord("V"), ord("F")]) + bytes([1, 3, 0xAA]) + record0
    return bytes([body[0], body[1], len(body)]) + body[3:]


def test_vgpu_capability_parsing() -> None:
    facts = gfd_vgpu.parse_capability(_vgpu_capability(b"550.54.16", b"r550_40"))
    assert facts is not None
    assert (facts.host_driver_version, facts.host_driver_branch) == ("550.54.16", "r550_40")
    assert gfd_vgpu.parse_capability(b"\x09\x00\x08XX\x00") is None


def test_vgpu_probe_scans_sysfs(tmp_path: Path) -> None:
    cap = _vgpu_capability(b"550.54.16", b"r550_40")
    config = bytearray(256)
    config[0x06] = 0x10
    config[0x34] = 0x40
    config[0x40 : 0x40 + len(cap)] = cap
    dev = tmp_path / "0000:00:05.0"
    dev.mkdir()
    (dev / "vendor").write_text("0x10de\n")
    (dev / "class").write_text("0x030200\n")
    (dev / "config").write_bytes(bytes(config))
    other = tmp_path / "0000:00:01.0"
    other.mkdir()
    (other / "vendor").write_text("0x8086\n")
    found = gfd_vgpu.probe(tmp_path)
    assert found is not None
    assert found.host_driver_branch == "r550_40"
    assert gfd_vgpu.probe(tmp_path / "missing") is None


# -- the command-line contract ----------------------------------------------------------------

cli = CliRunner()
BASE = ["agent", "gpu-feature-discovery", "--oneshot", "--backend", "mock"]


def test_cli_prints_sorted_labels_for_a_preset() -> None:
    result = cli.invoke(app, [*BASE, "--machine", "dgx-a100", "--output", "-"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines == sorted(lines)
    assert "nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB" in lines
    assert "nvidia.com/gpu.machine=NVIDIA-DGX-A100" in lines
    assert all("=" in line for line in lines)


def test_cli_mig_strategy_and_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "ts.yaml"
    cfg.write_text(
        "sharing: {timeSlicing: {resources: [{name: nvidia.com/mig-1g.5gb, replicas: 2}]}}"
    )
    result = cli.invoke(
        app,
        [*BASE, "--machine", "dgx-a100-mig-mixed", "--mig-strategy", "mixed",
         "--config", str(cfg), "--output", "-"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "nvidia.com/mig-1g.5gb.replicas=2" in result.stdout.splitlines()
    assert "nvidia.com/mig.strategy=mixed" in result.stdout.splitlines()


def test_cli_machine_file(tmp_path: Path) -> None:
    machine = tmp_path / "m.yaml"
    machine.write_text("name: m\nproductName: Lab Box\ngpus: [{model: L4, count: 2}]\n")
    result = cli.invoke(app, [*BASE, "--machine-file", str(machine), "--output", "-"])
    assert result.exit_code == 0, result.output
    assert "nvidia.com/gpu.count=2" in result.stdout
    assert "nvidia.com/gpu.machine=Lab-Box" in result.stdout


def test_cli_writes_a_features_file(tmp_path: Path) -> None:
    target = tmp_path / "gfd"
    result = cli.invoke(app, [*BASE, "--machine", "t4x4", "--output", str(target)])
    assert result.exit_code == 0, result.output
    assert "nvidia.com/gpu.count=4\n" in target.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--machine", "dgx-z9000"], "unknown machine 'dgx-z9000'"),
        (["--machine", "t4x4", "--mig-strategy", "sometimes"], "migStrategy"),
        (["--machine", "t4x4", "--config", "/nonexistent.yaml"], "nonexistent.yaml: no such file"),
        ([], "needs exactly one of --machine or --machine-file"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(args: list[str], message: str) -> None:
    result = cli.invoke(app, [*BASE, *args, "--output", "-"])
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_cli_bad_config_content_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 1}]}}")
    result = cli.invoke(app, [*BASE, "--machine", "t4x4", "--config", str(cfg), "--output", "-"])
    assert result.exit_code == 2
    assert "sharing.timeSlicing.resources.0.replicas" in result.stderr


def test_cli_node_feature_mode_needs_a_node_name() -> None:
    result = cli.invoke(app, [*BASE, "--machine", "t4x4"], env={"NODE_NAME": ""})
    assert result.exit_code == 2
    assert "NODE_NAME" in result.stderr
