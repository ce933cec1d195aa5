"""The `gpu-operator` command: help, version, crds and validate with their exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import gpu_operator
from gpu_operator.api import crds
from gpu_operator.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]

GOOD = """
apiVersion: nvidia.com/v1
kind: ClusterPolicy
metadata: {name: cluster-policy}
spec:
  operator: {}
  daemonsets: {}
  driver: {repository: nvcr.io/nvidia, image: driver, version: "580.95.05"}
  toolkit: {}
  devicePlugin: {}
  dcgmExporter: {}
  dcgm: {}
  nodeStatusExporter: {}
  gfd: {}
"""


def test_help_lists_commands() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("crds", "validate", "agent"):
        assert command in result.output


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"gpu-operator {gpu_operator.__version__}"


def test_crds_to_stdout_are_all_our_crds() -> None:
    result = runner.invoke(app, ["crds"])
    assert result.exit_code == 0
    docs = list(yaml.safe_load_all(result.stdout))
    assert [d["metadata"]["name"] for d in docs] == [
        "clusterpolicies.nvidia.com",
        "gpuclusters.nvidia.com",
        "nvidiadrivers.nvidia.com",
        "computedomains.resource.nvidia.com",
        "computedomaincliques.resource.nvidia.com",
    ]


def test_crds_out_dir(tmp_path: Path) -> None:
    result = runner.invoke(app, ["crds", "--out", str(tmp_path / "crds")])
    assert result.exit_code == 0
    for filename, crd in crds.all_crds().items():
        assert yaml.safe_load((tmp_path / "crds" / filename).read_text()) == crd


def test_valid_file_exits_0(tmp_path: Path) -> None:
    path = tmp_path / "cp.yaml"
    path.write_text(GOOD)
    result = runner.invoke(app, ["validate", "-f", str(path)])
    assert result.exit_code == 0, result.output
    assert "ClusterPolicy/cluster-policy: valid" in result.stderr


def test_warnings_are_printed_but_exit_0(tmp_path: Path) -> None:
    path = tmp_path / "cp.yaml"
    path.write_text(GOOD.replace("daemonsets: {}", "daemonsets: {priorityClasName: x}"))
    result = runner.invoke(app, ["validate", "-f", str(path)])
    assert result.exit_code == 0
    assert 'did you mean "priorityClassName"?' in result.stderr


def test_invalid_file_exits_1_with_one_line_per_problem(tmp_path: Path) -> None:
    path = tmp_path / "cp.yaml"
    path.write_text(
        GOOD.replace(
            'driver: {repository: nvcr.io/nvidia, image: driver, version: "580.95.05"}',
            "driver: {upgradePolicy: {maxUnavailable: abc}}\n  mig: {strategy: x}",
        )
    )
    result = runner.invoke(app, ["validate", "-f", str(path)])
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        f"{path}: ClusterPolicy/cluster-policy: spec.mig.strategy: expected one of 'none', "
        "'single' or 'mixed', got \"x\"",
        f"{path}: ClusterPolicy/cluster-policy: spec.driver.upgradePolicy.maxUnavailable: "
        'expected an integer or a percentage like "25%", got "abc"',
    ]


def test_stdin_and_several_documents() -> None:
    nvd = (
        "---\napiVersion: nvidia.com/v1alpha1\nkind: NVIDIADriver\nmetadata: {name: d}\n"
        "spec: {default: true, nodeSelector: {a: b}, version: '1', repository: r}\n"
    )
    result = runner.invoke(app, ["validate", "-f", "-"], input=GOOD + nvd)
    assert result.exit_code == 1
    assert result.stdout.strip() == (
        "<stdin>: NVIDIADriver/d: spec.nodeSelector: a default NVIDIADriver must not have a "
        "nodeSelector"
    )
    assert "<stdin>: ClusterPolicy/cluster-policy: valid" in result.stderr


def test_json_input(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    path.write_text(json.dumps(yaml.safe_load(GOOD)))
    assert runner.invoke(app, ["validate", "-f", str(path)]).exit_code == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("spec: [unclosed", "not valid YAML at line 2"),
        ('{"kind": ', "not valid JSON"),
        ("- 1\n- 2\n", "document 1 is not an object"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "no ClusterPolicy"),
    ],
)
def test_unreadable_input_exits_2(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    result = runner.invoke(app, ["validate", "-f", str(path)])
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_missing_file_exits_2() -> None:
    result = runner.invoke(app, ["validate", "-f", "/nonexistent/cp.yaml"])
    assert result.exit_code == 2
    assert "/nonexistent/cp.yaml: no such file" in result.stderr


def test_console_script_runs() -> None:
    # The installed entry point, not just the typer app object.
    result = subprocess.run(
        [sys.executable, "-m", "gpu_operator", "--version"], capture_output=True, text=True
    )
    assert result.returncode == 0
    assert result.stdout.startswith("gpu-operator ")
