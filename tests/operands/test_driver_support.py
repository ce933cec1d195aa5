"""Driver version checks: a pool's version and module flavor against its nodes' GPUs."""

from __future__ import annotations

import pytest

from gpu_operator.api import keys
from gpu_operator.operands import driver_support
from gpu_operator.operands.driver_support import NodeGpus, check, parse_version


def gpus(node: str, major: str, minor: str = "0", **labels: str) -> NodeGpus:
    return NodeGpus.from_labels(
        node,
        {"nvidia.com/gpu.compute.major": major, "nvidia.com/gpu.compute.minor": minor, **labels},
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [("580.95.05", (580, 95, 5)), ("535", (535,)), ("v570.86.15", (570, 86, 15)),
     ("sha256:abc", None), ("latest", None), (None, None)],
)  # fmt: skip
def test_versions_parse_as_numbers_or_not_at_all(
    text: str | None, expected: tuple[int, ...] | None
) -> None:
    assert parse_version(text) == expected


@pytest.mark.parametrize(
    ("labels", "arch"),
    [
        ({"nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0"}, "Hopper"),
        ({"nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.compute.minor": "9"}, "Ada"),
        ({"nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.compute.minor": "0"}, "Ampere"),
        ({"nvidia.com/gpu.compute.major": "7", "nvidia.com/gpu.compute.minor": "5"}, "Turing"),
        ({"nvidia.com/gpu.compute.major": "7", "nvidia.com/gpu.compute.minor": "0"}, "Volta"),
        ({"nvidia.com/gpu.compute.major": "12", "nvidia.com/gpu.compute.minor": "0"}, "Blackwell"),
        ({"nvidia.com/gpu.family": "pascal"}, "Pascal"),
        ({}, None),
    ],
)
def test_architecture_comes_from_gfd_labels(labels: dict[str, str], arch: str | None) -> None:
    assert driver_support.architecture_of(labels) == arch


def test_a_current_driver_on_hopper_passes() -> None:
    report = check("580.95.05", "auto", [gpus("h1", "9")])
    assert report.ok
    assert report.unchecked == []


def test_a_driver_older_than_the_architecture_fails_with_its_source() -> None:
    report = check("515.65.01", "auto", [gpus("h1", "9"), gpus("h2", "9"), gpus("a1", "8")])
    assert not report.ok
    assert len(report.problems) == 1
    problem = report.problems[0]
    assert "515.65.01 is older than 520.61.05" in problem
    assert "Hopper" in problem
    assert "CUDA Toolkit release notes" in problem
    assert "nodes h1, h2" in problem


def test_blackwell_needs_r570() -> None:
    assert not check("565.57.01", "auto", [gpus("b1", "10")]).ok
    assert check("570.86.15", "auto", [gpus("b1", "10")]).ok


def test_a_product_minimum_beyond_its_architecture() -> None:
    b200 = gpus("b1", "10", **{keys.GPU_PRODUCT: "NVIDIA-B200"})
    report = check("570.124.06", "auto", [b200])
    assert any("minimum for B200" in p for p in report.problems)
    assert check("570.133.20", "auto", [b200]).ok


def test_volta_is_not_supported_after_r580() -> None:
    report = check("590.48.01", "auto", [gpus("v1", "7")])
    assert any("newer than R580" in p and "Volta" in p for p in report.problems)
    assert check("580.95.05", "auto", [gpus("v1", "7")]).ok


def test_open_modules_on_pre_turing_gpus_fail() -> None:
    report = check("580.95.05", "open", [gpus("p1", "6")])
    assert any("cannot use the open kernel modules" in p for p in report.problems)
    assert check("580.95.05", "open", [gpus("t1", "7", "5")]).ok


def test_proprietary_modules_are_gone_from_r620() -> None:
    report = check("620.10.01", "proprietary", [gpus("h1", "9")])
    assert any("no proprietary kernel modules" in p for p in report.problems)
    assert check("620.10.01", "auto", [gpus("h1", "9")]).ok


def test_a_known_bad_version_fails_only_where_its_issue_applies() -> None:
    mig = gpus("a1", "8", **{keys.MIG_CONFIG: "all-1g.10gb"})
    plain = gpus("a2", "8", **{keys.MIG_CONFIG: "all-disabled"})
    report = check("570.148.08", "auto", [mig, plain])
    assert len(report.problems) == 1
    assert "known issue" in report.problems[0]
    assert "nodes a1)" in report.problems[0]
    assert check("570.86.15", "auto", [mig]).ok


def test_nodes_without_gpu_labels_are_unchecked_not_failed() -> None:
    report = check("470.82.01", "auto", [NodeGpus.from_labels("fresh", {})])
    assert report.ok
    assert report.unchecked == ["fresh"]


def test_a_branch_only_version_is_compared_by_branch() -> None:
    assert not check("515", "auto", [gpus("h1", "9")]).ok
    assert check("520", "auto", [gpus("h1", "9")]).ok  # same branch as the minimum: cannot tell


def test_a_digest_is_checked_for_the_module_flavor_only() -> None:
    assert check("sha256:0123", "auto", [gpus("p1", "6")]).ok
    assert not check("sha256:0123", "open", [gpus("p1", "6")]).ok


def test_every_table_fact_names_its_source() -> None:
    for arch in driver_support.ARCHITECTURES.values():
        assert arch.min_driver is None or arch.min_source
    assert all(m.source for m in driver_support.PRODUCT_MINIMUMS)
    assert all(i.source for i in driver_support.KNOWN_ISSUES)
