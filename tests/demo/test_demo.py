"""The demo end to end on small fleets: convergence, GFD labels, capacity, summary, --serve."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import subprocess
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner
from waiting import DEADLINE, eventually, within

from gpu_operator.api import keys
from gpu_operator.cli import app
from gpudemo import fleet, programs, session

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".tools" / "bin" / "kubectl"


def _console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=200, color_system=None, soft_wrap=True), buffer


def _options(**extra: object) -> session.Options:
    base: dict[str, object] = {
        "fleet": fleet.NAMED["small"],
        "timing": programs.Timing(scale=0.0),
        "timeout": DEADLINE,  # for convergence
        "live": False,
        "progress_interval": 0.2,
    }
    base.update(extra)
    return session.Options(**base)  # type: ignore[arg-type]


async def test_small_fleet_converges_with_gfd_labels_and_device_capacity() -> None:
    console, out = _console()
    result = await session.run(_options(), console)
    assert result.converged, out.getvalue()
    assert result.policy_status["state"] == "ready"
    a100 = result.node_labels["dgx-a100-1"]
    assert a100[keys.GPU_PRODUCT] == "NVIDIA-A100-SXM4-40GB"
    assert a100["nvidia.com/gpu.count"] == "8"
    assert a100[keys.GPU_PRESENT] == "true"
    assert a100[keys.MIG_CAPABLE] == "true"
    assert a100["nvidia.com/gpu.deploy.mig-manager"] == "true"
    t4 = result.node_labels["t4-1"]
    assert t4[keys.GPU_PRODUCT] == "Tesla-T4"
    assert t4["nvidia.com/gpu.count"] == "4"
    assert "nvidia.com/gpu.deploy.mig-manager" not in t4
    assert result.node_allocatable["dgx-a100-1"]["nvidia.com/gpu"] == "8"
    assert result.node_allocatable["t4-1"]["nvidia.com/gpu"] == "4"
    cpu = result.node_labels["cpu-1"]
    assert not any(k.startswith("nvidia.com/gpu.") for k in cpu)
    assert "nvidia.com/gpu" not in result.node_allocatable["cpu-1"]
    text = out.getvalue()
    assert "ClusterPolicy ready" in text
    assert "Summary" in text
    assert "8 x NVIDIA-A100-SXM4-40GB, 4 x Tesla-T4 (12 in all)" in text
    assert "simulated:" in text
    real = next(line for line in text.splitlines() if "real agents:" in line)
    assert {"gfd", "device-plugin"} <= set(real.split(":", 1)[1].replace(",", " ").split())
    assert "\x1b[" not in text  # no live redraws on a non-terminal
    assert result.summary is not None
    assert result.summary.gpu_nodes == 2


async def test_mig_fleet_advertises_mig_devices_per_strategy() -> None:
    policy = {**session.DEFAULT_POLICY, "spec": {**session.DEFAULT_POLICY["spec"]}}
    policy["spec"]["mig"] = {"strategy": "mixed"}
    mixed = fleet.parse(
        {"pools": [{"name": "mig", "machine": "dgx-a100-mig-mixed"}]}, "mig-mixed.yaml"
    )
    result = await session.run(_options(fleet=mixed, policy=policy), _console()[0])
    assert result.converged
    allocatable = result.node_allocatable["mig-1"]
    assert allocatable["nvidia.com/mig-3g.20gb"] == "8"
    assert allocatable["nvidia.com/mig-1g.5gb"] == "16"
    assert result.node_labels["mig-1"]["nvidia.com/mig.strategy"] == "mixed"


def test_timing_jitter_is_stable_per_node_and_scales_to_zero() -> None:
    timing = programs.Timing(scale=1.0)
    first = timing.delay(3.0, "gpu-1", "driver")
    assert first == timing.delay(3.0, "gpu-1", "driver")
    assert 3.0 <= first <= 3.0 * 1.4
    assert programs.Timing(scale=0.0).delay(3.0, "gpu-1", "driver") == 0.0


def test_cli_demo_exits_zero_with_a_summary() -> None:
    result = CliRunner().invoke(app, ["demo", "--fleet", "small", "--time-scale", "0"])
    assert result.exit_code == 0, result.output
    assert "Summary" in result.output
    assert "time to ready:" in result.output


def test_cli_demo_rejects_a_bad_fleet_file(tmp_path: Path) -> None:
    bad = tmp_path / "fleet.yaml"
    bad.write_text("pools:\n  - name: a\n    machine: dgx-z900\n")
    result = CliRunner().invoke(app, ["demo", "--fleet", str(bad)])
    assert result.exit_code == 2
    assert "pools.0.machine: unknown machine preset 'dgx-z900'" in result.output


def test_cli_demo_rejects_an_invalid_policy(tmp_path: Path) -> None:
    policy = tmp_path / "cp.yaml"
    policy.write_text(
        "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: p}\n"
        "spec: {mig: {strategy: sometimes}}\n"
    )
    result = CliRunner().invoke(app, ["demo", "--policy", str(policy)])
    assert result.exit_code == 1
    assert "spec.mig.strategy" in result.output


@pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl not installed (scripts/setup)")
async def test_serve_answers_kubectl_and_stops_on_sigterm(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    console, out = _console()
    task = asyncio.create_task(
        session.run(_options(serve=True, kubeconfig_out=kubeconfig), console)
    )

    def printed(text: str) -> bool:
        assert not task.done(), out.getvalue()
        return text in out.getvalue()

    await eventually(
        lambda: printed("Press Ctrl-C to stop."),
        "the demo to serve",
        interval=0.05,
        state=lambda: out.getvalue()[-1000:],
    )
    assert f"Kubeconfig: {kubeconfig}" in out.getvalue()
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL), "--kubeconfig", str(kubeconfig), "get", "nodes", "--show-labels",
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    stdout, _ = await proc.communicate()
    assert proc.returncode == 0, stdout
    assert b"nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB" in stdout
    os.kill(os.getpid(), signal.SIGTERM)
    result = await within(task, "the demo to stop on SIGTERM")
    assert result.converged
    assert "stopping" in out.getvalue()
