"""How the operator image's containers run on kubesim, and the demo's install options."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from gpu_operator.cli import app
from gpudemo import fleet, install, programs, session

ROOT = Path(__file__).resolve().parents[2]


def test_var_references_expand_as_the_kubelet_expands_them() -> None:
    env = {"POD_IP": "10.0.0.7", "PORT": "8081"}
    assert install.expand("--health-probe-bind-address=$(POD_IP):$(PORT)", env) == (
        "--health-probe-bind-address=10.0.0.7:8081"
    )
    assert install.expand("$(UNSET) and $$(POD_IP)", env) == "$(UNSET) and $(POD_IP)"


def test_a_container_without_command_runs_the_image_entry_point() -> None:
    container = {"args": ["crds", "--apply"]}
    assert install.command_line(container, {}) == ["gpu-operator", "crds", "--apply"]


def test_listeners_move_to_free_loopback_ports_and_map_back_to_pod_ports() -> None:
    args, ports = install.bind_locally(
        [
            "--leader-elect",
            "--metrics-bind-address=:8080",
            "--health-probe-bind-address",
            "10.0.0.7:8081",
            "--other=:9",
        ]
    )
    assert set(ports) == {8080, 8081}
    assert args[0] == "--leader-elect"
    assert args[1] == f"--metrics-bind-address=127.0.0.1:{ports[8080]}"
    assert args[2:4] == ["--health-probe-bind-address", f"127.0.0.1:{ports[8081]}"]
    assert args[4] == "--other=:9"  # not an address flag: untouched
    assert install.bind_locally(["--metrics-bind-address=0"]) == (
        ["--metrics-bind-address=0"],
        {},
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--install", "helm", "--policy", "p.yaml"], "--policy needs --install in-process"),
        (["--install", "in-process", "--values", "v.yaml"], "--values and --chart need"),
        (["--values", "missing.yaml"], "--values missing.yaml: no such file"),
    ],
)
def test_demo_install_options_that_do_not_fit_are_refused(
    args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "examples" / "clusterpolicy-default.yaml", tmp_path / "p.yaml")
    (tmp_path / "v.yaml").write_text("{}\n")
    result = CliRunner().invoke(app, ["demo", "--fleet", "small", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


HELM = ROOT / ".tools" / "bin" / "helm"


@pytest.mark.slow
@pytest.mark.skipif(not HELM.exists(), reason="helm not installed: run scripts/setup")
async def test_helm_demo_with_the_aks_values_brings_nfd_as_the_cluster_would() -> None:
    out = io.StringIO()
    options = session.Options(
        fleet=fleet.NAMED["small"],
        timing=programs.Timing(scale=0.0),
        timeout=60.0,
        live=False,
        install="helm",
        values=[ROOT / "charts" / "gpu-operator" / "ci" / "aks-rdma-values.yaml"],
    )
    result = await session.run(options, Console(file=out, width=200))
    assert result.converged, out.getvalue()
    assert "the values turn NFD off" in out.getvalue()
    assert result.policy_status["state"] == "ready"
    assert result.node_labels["t4-1"]["feature.node.kubernetes.io/pci-0302_10de.present"] == "true"
    assert result.node_labels["t4-1"]["nvidia.com/gpu.present"] == "true"
