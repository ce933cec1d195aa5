"""The readiness gate's values: the startup taint reaches the operator as STARTUP_TAINT, in a form
it accepts, and NFD's worker tolerates the taint (it must label the node before anything else
runs there) next to the chart's default tolerations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_operator.nodes.gate import StartupTaint

VALUES = Path(__file__).resolve().parents[2] / "charts/gpu-operator/ci/startup-taint-values.yaml"


def _env(rendered: Any) -> dict[str, str]:
    operator = rendered.one("Deployment", "gpu-operator")
    [container] = operator["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def test_the_startup_taint_reaches_the_operator_and_nfd_tolerates_it(render: Any) -> None:
    rendered = render([VALUES])
    taint = StartupTaint.parse(_env(rendered)["STARTUP_TAINT"])
    assert taint.key == "startup-taint.cluster-autoscaler.kubernetes.io/gpu-not-ready"
    worker = next(
        d for d in rendered.of_kind("DaemonSet") if d["metadata"]["name"].endswith("-worker")
    )
    tolerations = worker["spec"]["template"]["spec"]["tolerations"]
    assert {"key": taint.key, "operator": "Exists", "effect": taint.effect} in tolerations
    defaults = render([])
    default_worker = next(
        d for d in defaults.of_kind("DaemonSet") if d["metadata"]["name"].endswith("-worker")
    )
    assert default_worker["spec"]["template"]["spec"]["tolerations"] == tolerations[:-1]
    assert "STARTUP_TAINT" not in _env(defaults)
