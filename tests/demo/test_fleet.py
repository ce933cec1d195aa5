"""Fleets: named fleets, the fleet file format and its errors, scaling, node plans."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_operator.api import keys
from gpudemo import fleet


def test_default_fleet_is_the_documented_mix() -> None:
    default = fleet.resolve(None)
    assert [(p.machine, p.count) for p in default.pools] == [
        ("dgx-a100", 2), ("dgx-h100", 2), ("t4x4", 2), ("l4x8", 1), (None, 2),
    ]  # fmt: skip
    assert default.node_count == 9


def test_named_fleets_resolve_by_name() -> None:
    for name in fleet.NAMED:
        assert fleet.resolve(name).name == name


def test_fleet_file_with_every_field(tmp_path: Path) -> None:
    path = tmp_path / "lab.yaml"
    path.write_text(
        "pools:\n"
        "  - name: rhel-a30\n    machine: a30x4\n    count: 3\n    os: rhel\n"
        "    osVersion: '9.4'\n    kernel: 5.14.0-427.el9.x86_64\n    runtime: cri-o\n"
        "    workload: vm-passthrough\n    labels: {team: ml}\n"
        "  - name: cpu\n"
    )
    parsed = fleet.resolve(str(path))
    assert parsed.name == "lab"
    assert parsed.node_count == 4
    plans = fleet.plan_nodes(parsed)
    assert [p.name for p in plans] == ["rhel-a30-1", "rhel-a30-2", "rhel-a30-3", "cpu-1"]
    first = plans[0]
    # Only what a node is created with: NFD derives the hardware labels (tests/simhost/test_nfd.py).
    assert first.labels == {keys.GPU_WORKLOAD_CONFIG: "vm-passthrough", "team": "ml"}
    assert not any(k.startswith("feature.node.kubernetes.io/") for p in plans for k in p.labels)
    assert first.pool.os == "rhel"
    assert first.node_info["containerRuntimeVersion"].startswith("cri-o://")
    assert first.node_info["kernelVersion"] == "5.14.0-427.el9.x86_64"
    assert "Red Hat" in first.node_info["osImage"]
    assert plans[3].labels == {}
    assert len({p.seed for p in plans}) == 4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pools: []\n", "pools: List should have at least 1 item"),
        ("pools:\n  - name: a\n    machine: dgx-z\n", "pools.0.machine: unknown machine preset"),
        (
            "pools:\n  - name: a\n    colour: red\n",
            "pools.0.colour: Extra inputs are not permitted",
        ),
        ("pools:\n  - name: a\n    count: -1\n", "pools.0.count: Input should be greater than"),
        ("pools:\n  - name: a\n    runtime: rkt\n", "pools.0.runtime: Input should be"),
        ("pools:\n  - name: A_B\n", "pools.0.name: String should match pattern"),
        ("pools:\n  - name: a\n  - name: a\n", "pool names must be unique; repeated: a"),
        ("- just a list\n", "expected a mapping with `pools:`"),
        ("pools: [\n", "not valid YAML"),
    ],
)
def test_bad_fleet_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(fleet.FleetError) as caught:
        fleet.load(path)
    assert message in str(caught.value)
    assert str(path) in str(caught.value)


def test_unknown_name_and_missing_file_are_errors() -> None:
    with pytest.raises(fleet.FleetError, match="unknown fleet 'nope'"):
        fleet.resolve("nope")
    with pytest.raises(fleet.FleetError, match=r"fleet\.yaml: no such file"):
        fleet.resolve("/nonexistent/fleet.yaml")


@pytest.mark.parametrize("target", [1, 3, 9, 20, 100, 1000])
def test_scaling_hits_the_target_and_keeps_the_mix(target: int) -> None:
    scaled = fleet.scale(fleet.NAMED["default"], target)
    assert scaled.node_count == target
    if target >= 9:
        assert all(p.count >= 1 for p in scaled.pools)


def test_scaling_below_one_is_refused() -> None:
    with pytest.raises(fleet.FleetError):
        fleet.scale(fleet.NAMED["default"], 0)
