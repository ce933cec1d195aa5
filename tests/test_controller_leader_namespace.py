"""`gpu-operator controller --leader-elect-namespace` (upstream's flag): the leader Lease's
namespace reaches the operator's settings; unset, the Lease stays in the operator's namespace."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from gpu_operator.cli import app
from gpu_operator.controller import main as controller_main


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ([], {}, ""),
        (["--leader-elect-namespace", "kube-system"], {}, "kube-system"),
        ([], {"LEADER_ELECT_NAMESPACE": "leases"}, "leases"),
    ],
)
def test_the_lease_namespace_reaches_the_controller(
    monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], expected: str
) -> None:
    seen: dict[str, Any] = {}

    async def fake_run(**kwargs: Any) -> None:
        seen.update(kwargs)

    monkeypatch.setattr(controller_main, "run", fake_run)
    result = CliRunner().invoke(
        app, ["controller", "--namespace", "gpu-operator", "--leader-elect", *args], env=env
    )
    assert result.exit_code == 0, result.output
    assert seen["leader_elect"] is True
    assert seen["leader_namespace"] == expected
