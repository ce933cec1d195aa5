"""`gpu-operator adopt`: reports only (--dry-run); images come from the operator Deployment."""

from __future__ import annotations

from typer.testing import CliRunner

from gpu_operator import adopt_cli
from gpu_operator.cli import app


def test_adopt_without_dry_run_refuses_and_points_at_the_procedure() -> None:
    result = CliRunner().invoke(app, ["adopt", "--kubeconfig", "/nonexistent"])
    assert result.exit_code == adopt_cli.EXIT_USAGE
    assert "pass --dry-run" in result.output
    assert "docs/swap-in.md" in result.output


def test_an_unreachable_cluster_is_one_line_and_exit_one() -> None:
    result = CliRunner().invoke(app, ["adopt", "--dry-run", "--kubeconfig", "/nonexistent/kc"])
    assert result.exit_code == adopt_cli.EXIT_ERROR
    assert result.output.startswith("error: ")
    assert "Traceback" not in result.output


def test_image_env_comes_from_the_operator_deployment_before_the_process_env() -> None:
    deployment = {
        "spec": {"template": {"spec": {"containers": [{"name": "gpu-operator", "env": [
            {"name": "VALIDATOR_IMAGE", "value": "nvcr.io/nvidia/gpu-operator:v25.10.0"},
            {"name": "WATCH_NAMESPACE", "value": ""},
        ]}]}}}
    }  # fmt: skip
    found = adopt_cli.operator_env([deployment], {"DRIVER_MANAGER_IMAGE": "x"})
    assert found == {"VALIDATOR_IMAGE": "nvcr.io/nvidia/gpu-operator:v25.10.0"}
    assert adopt_cli.operator_env([], {"DRIVER_MANAGER_IMAGE": "x", "HOME": "/"}) == {
        "DRIVER_MANAGER_IMAGE": "x"
    }
