"""NVIDIA's entry-point names in our image (agents/entrypoints.py): every program the operand
renderers start in a container of our image is one of them, `gpu-operator`, or a shell utility of
the image's base; each name runs our agent with the same arguments and environment; Go-style flag
spellings reach click; the config manager finds a plugin that runs as such a script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from builtin_commands import HELM, programs, rendered_operands

from gpu_operator.agents import entrypoints
from gpu_operator.agents.config_manager import signals
from gpu_operator.cli.render import CHART_OPERATOR_ENV
from gpu_operator.operands import builtin

# What the image's Debian base brings (coreutils, sed, dash): docs/image.md.
BASE_UTILITIES = {"sh", "cat", "rm", "sed", "sleep", "tail", "tr"}
OURS = CHART_OPERATOR_ENV["OPERATOR_IMAGE"]


@pytest.mark.skipif(not HELM.exists(), reason="helm not installed: run scripts/setup")
def test_every_program_an_operand_starts_in_our_image_is_ours_or_the_bases() -> None:
    found = programs(rendered_operands(), OURS)
    unknown = {
        name: sorted(where)
        for name, where in found.items()
        if name not in entrypoints.NAMES and name not in BASE_UTILITIES and name != "gpu-operator"
    }
    assert unknown == {}
    # Every agent with a builtin section is started by its NVIDIA name (vectorAdd by the
    # validator's workload pods, which it creates itself). The GPU DRA kubelet plugin is started
    # by the GPUCluster's state-dra-driver, not by the ClusterPolicy's operands rendered here;
    # so are the compute-domain controller and kubelet plugin.
    expected = {
        "nvidia-ctk-installer", "vectorAdd", "gpu-kubelet-plugin",
        "compute-domain-controller", "compute-domain-kubelet-plugin",
    }  # fmt: skip
    assert set(entrypoints.NAMES) - set(found) == expected - set(found)


@pytest.mark.parametrize("name", entrypoints.NAMES)
def test_each_name_runs_its_agent_and_shows_its_help_under_nvidias_name(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert entrypoints.run(name, ["--help"]) == 0
    out = capsys.readouterr().out
    assert f"Usage: {name}" in out


@pytest.mark.parametrize(
    ("env", "args", "agent"),
    [
        ({"COMPONENT": "driver"}, [], "validator"),
        ({"COMPONENT": "metrics"}, [], "node-status-exporter"),
        ({"COMPONENT": "vfio-pci"}, [], "sandbox-validator"),
        ({}, ["--component", "vgpu-devices"], "sandbox-validator"),
        ({}, ["-c=metrics"], "node-status-exporter"),
        ({}, ["-c", "toolkit"], "validator"),
    ],
)
def test_nvidia_validator_is_three_programs_told_apart_by_component(
    env: dict[str, str], args: list[str], agent: str
) -> None:
    resolved = entrypoints.resolve("nvidia-validator", args, env)
    assert resolved[0] == agent
    if agent == "node-status-exporter":
        assert "-c" not in " ".join(resolved)  # the exporter has no such flag


def test_go_flag_spellings_become_clicks() -> None:
    argv = entrypoints.agent_argv(
        "gpu-feature-discovery",
        ["-oneshot", "--no-timestamp=true", "--fail-on-init-error=false", "--output-file=-"],
        {},
    )
    assert argv == [
        "gpu-feature-discovery",
        "--oneshot",
        "--no-timestamp",
        "--no-fail-on-init-error",
        "--output-file=-",
    ]


def test_an_unknown_name_is_refused_with_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert entrypoints.run("nvidia-smi", []) == 127
    assert "nvidia-device-plugin" in capsys.readouterr().err


def test_installed_scripts_run_the_agents_with_their_arguments(tmp_path: Path) -> None:
    written = entrypoints.install(tmp_path / "bin", sys.executable)
    assert sorted(p.name for p in written) == sorted(entrypoints.NAMES)
    env = {**os.environ, "COLUMNS": "100"}
    script = tmp_path / "bin" / "gpu-feature-discovery"
    assert os.access(script, os.X_OK)
    done = subprocess.run(
        [str(script), "--oneshot", "--output-file=-", "--no-timestamp", "--backend=mock",
         "--machine=dgx-a100"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "nvidia.com/gpu.count=8" in done.stdout


def test_the_config_manager_finds_a_plugin_started_as_a_python_script() -> None:
    # The kernel starts `#!/opt/gpu-operator/bin/python` scripts as `python <script> args`.
    assert signals.matches(["nvidia-device-plugin"], "nvidia-device-plugin")
    assert signals.matches(
        ["/opt/gpu-operator/bin/python", "/opt/gpu-operator/bin/nvidia-device-plugin"],
        "nvidia-device-plugin",
    )
    assert not signals.matches(
        ["/opt/gpu-operator/bin/python", "/opt/gpu-operator/bin/config-manager"],
        "nvidia-device-plugin",
    )
    assert not signals.matches(["/bin/sh", "/opt/x/nvidia-device-plugin"], "nvidia-device-plugin")


def test_our_image_is_known_by_name_whatever_its_tag_or_digest() -> None:
    assert builtin.image_name("registry:5000/a/gpu-operator:v1") == "registry:5000/a/gpu-operator"
    assert builtin.image_name("ghcr.io/x/gpu-operator@sha256:ab") == "ghcr.io/x/gpu-operator"
    assert builtin.image_name("localhost:5000/gpu-operator") == "localhost:5000/gpu-operator"
