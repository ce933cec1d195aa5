"""`gpu-operator controller --status-write-interval` / STATUS_WRITE_INTERVAL: bad values are one
clear error naming the setting, before anything connects."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpu_operator.cli import app


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "soon"])
def test_a_bad_status_write_interval_names_the_setting(value: str) -> None:
    result = CliRunner().invoke(
        app,
        ["controller", "--namespace", "gpu-operator", "--kubeconfig", "/nonexistent"],
        env={"STATUS_WRITE_INTERVAL": value},
    )
    assert result.exit_code == 2, result.output
    assert "STATUS_WRITE_INTERVAL" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
