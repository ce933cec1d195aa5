"""Every fleet the demo ships comes up ready as `scripts/demo --fleet NAME` runs it: the chart
installed with the real helm (the demo's default), and with the operator in-process. Where the
chart's defaults do not fit a fleet (several MIG device types on one node, startup-tainted
nodes), the demo picks the values it needs and says which and why (demo/fit.py)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from waiting import deadline

from gpudemo import fleet, install, programs, session

ROOT = Path(__file__).resolve().parents[2]
HELM = ROOT / ".tools" / "bin" / "helm"
# What the named fleets show once ready, besides convergence.
MIG_MIXED = {"nvidia.com/mig-3g.20gb": "8", "nvidia.com/mig-2g.10gb": "8"}


def _options(name: str, mode: str) -> session.Options:
    return session.Options(
        fleet=fleet.NAMED[name],
        install=mode,
        chart=install.find_chart() if mode == "helm" else None,
        timing=programs.Timing(scale=0.0),
        # Convergence takes seconds; the deadline only ends a run that would hang.
        timeout=deadline(240.0),
        live=False,
        progress_interval=0.5,
    )


# Every fleet as `scripts/demo` installs it (helm), and in-process the fleets whose values the
# demo chooses (set in the ClusterPolicy and the operator's settings there).
RUNS = [(name, "helm") for name in sorted(fleet.NAMED)] + [
    ("autoscaled", "in-process"),
    ("mig", "in-process"),
]


@pytest.mark.parametrize(("name", "mode"), RUNS)
async def test_every_built_in_fleet_converges_to_ready(name: str, mode: str) -> None:
    if mode == "helm" and not HELM.exists():
        pytest.skip("helm not installed: run scripts/setup")
    out = io.StringIO()
    result = await session.run(_options(name, mode), Console(file=out, width=250))
    text = out.getvalue()
    assert result.converged, text
    assert result.policy_status["state"] == "ready", text
    assert "Summary" in text
    assert "error:" not in text
    # While labels are written, a CPU node is only checked, never said to be labelled (the
    # state's name, node-labelling, may precede "(checking ... (cpu-1, ...)": that is right).
    assert not re.search(r"\blabelling \d+ GPU nodes? \([^)]*\bcpu-\d", text), text
    if name == "mig":
        # The chart's single strategy would crash-loop the plugin on mig-mixed-1: the demo says
        # it installs with the mixed strategy, and why.
        chosen = "  mig.strategy=mixed: node pool mig-mixed (dgx-a100-mig-mixed) has several MIG"
        assert chosen in text
        allocatable = result.node_allocatable["mig-mixed-1"]
        assert {k: allocatable.get(k) for k in MIG_MIXED} == MIG_MIXED
    if name == "autoscaled":
        assert "  operator.startupTaint=startup-taint.cluster-autoscaler" in text
    if name == "kubevirt":
        # Without sandbox workloads the VM pools' GPUs go to containers: said at the start and
        # in the summary, and no "VM nodes" line claims otherwise.
        assert "warning: node pool(s) passthrough, vgpu-t4, vgpu-a30 ask for VM workloads" in text
        assert "VM nodes:" not in text
        assert result.node_allocatable["passthrough-1"]["nvidia.com/gpu"] == "8"
