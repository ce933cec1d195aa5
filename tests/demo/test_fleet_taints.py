"""Fleet pools that register their nodes with taints, as an autoscaled node pool does."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudemo import fleet


def test_a_pool_registers_its_nodes_with_its_taints() -> None:
    gated = fleet.NAMED["autoscaled"]
    plans = fleet.plan_nodes(gated)
    assert [p.name for p in plans] == ["a100-1", "a100-2", "cpu-1"]
    assert plans[0].taints == (
        {
            "key": "startup-taint.cluster-autoscaler.kubernetes.io/gpu-not-ready",
            "value": "true",
            "effect": "NoSchedule",
        },
    )
    assert plans[2].taints == ()
    assert (
        "tainted startup-taint.cluster-autoscaler.kubernetes.io/gpu-not-ready=true:NoSchedule"
        in (fleet.describe(gated)[0])
    )


def test_a_taint_without_value_defaults_to_no_schedule(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text("pools:\n  - name: a\n    machine: t4x4\n    taints: [{key: wait}]\n")
    [plan] = fleet.plan_nodes(fleet.load(path))
    assert plan.taints == ({"key": "wait", "effect": "NoSchedule"},)


def test_a_bad_taint_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("pools:\n  - name: a\n    taints: [{key: wait, effect: Sometimes}]\n")
    with pytest.raises(fleet.FleetError, match=r"pools\.0\.taints\.0\.effect: Input should be"):
        fleet.load(path)
