"""`gpu-operator adopt`: reports only (--dry-run); images come from the operator Deployment."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpu_operator.api import crds
from gpu_operator.cli import adopt, app
from gpu_operator.operands import adoption


def test_adopt_without_dry_run_refuses_and_points_at_the_procedure() -> None:
    result = CliRunner().invoke(app, ["adopt", "--kubeconfig", "/nonexistent"])
    assert result.exit_code == adopt.EXIT_USAGE
    assert "pass --dry-run" in result.output
    assert "docs/swap-in.md" in result.output


def test_an_unreachable_cluster_is_one_line_and_exit_one() -> None:
    result = CliRunner().invoke(app, ["adopt", "--dry-run", "--kubeconfig", "/nonexistent/kc"])
    assert result.exit_code == adopt.EXIT_ERROR
    assert result.output.startswith("error: ")
    assert "Traceback" not in result.output


def test_image_env_comes_from_the_operator_deployment_before_the_process_env() -> None:
    deployment = {
        "spec": {"template": {"spec": {"containers": [{"name": "gpu-operator", "env": [
            {"name": "VALIDATOR_IMAGE", "value": "nvcr.io/nvidia/gpu-operator:v25.10.0"},
            {"name": "WATCH_NAMESPACE", "value": ""},
        ]}]}}}
    }  # fmt: skip
    found = adopt.operator_env([deployment], {"DRIVER_MANAGER_IMAGE": "x"})
    assert found == {"VALIDATOR_IMAGE": "nvcr.io/nvidia/gpu-operator:v25.10.0"}
    assert adopt.operator_env([], {"DRIVER_MANAGER_IMAGE": "x", "HOME": "/"}) == {
        "DRIVER_MANAGER_IMAGE": "x"
    }


def test_the_table_prints_field_paths_that_look_like_rich_markup_literally(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # one line per row
    # A volumeMount is keyed by its path: `[/sys/...]` reads as a Rich closing tag.
    changes = (
        "spec.template.spec.containers[mig-manager].volumeMounts"
        "[/sys/devices/system/memory/auto_online_blocks]",
        "metadata.labels[bold]",
        "data[/red]",
    )
    plan = adoption.AdoptionPlan((
        adoption.ObjectPlan("DaemonSet", "[/x]", "ns", "patch", "pod template changes: pods "
                            "roll once", changes=changes, rolls=True, pods_kept=False,
                            restarts=("[b]pod",)),
    ), notes=("note with [/sys/thing]",))  # fmt: skip
    snapshot = adopt.Snapshot([], [], {}, [], {})
    outcome = adopt.Outcome(snapshot, plan, ["CRD [/crd] has no marker"], [])
    adopt._print(outcome, "[/policy]")
    text = capsys.readouterr().out
    for literal in ("/sys/devices/system/memory/auto_online_blocks]", "metadata.labels[bold]",
                    "data[/red]", "DaemonSet/[/x]", "[b]pod", "note with [/sys/thing]",
                    "CRD [/crd] has no marker", "[/policy]"):  # fmt: skip
        assert literal in text, literal
    assert "pods that would restart (1): [b]pod" in text
    assert outcome.exit_code == adopt.EXIT_CRDS


def test_nvidias_crds_without_our_marker_must_be_applied_first() -> None:
    installed = {str(crd["metadata"]["name"]): crd for crd in crds.all_crds().values()}
    assert adopt.crd_problems(installed) == []
    nvidias = {
        name: {**crd, "metadata": {"name": name, "annotations": {
            "controller-gen.kubebuilder.io/version": "v0.21.0"}}}
        for name, crd in installed.items()
    }  # fmt: skip
    unmarked = (
        "has no nvidia.com/gpu-operator-crd-version marker "
        f"(NVIDIA's CRDs have none); ours is version {crds.SCHEMA_VERSION}"
    )
    # NVIDIA's 26.7 chart installs all five, the ComputeDomain CRDs of resource.nvidia.com too
    # (as its DRA driver chart does): each is ours to apply before our operator reconciles.
    assert adopt.crd_problems(nvidias) == [f"CRD {name} {unmarked}" for name in installed]
    # An older NVIDIA chart (25.10) had neither gpuclusters nor the ComputeDomain CRDs.
    added_in_26_7 = ("gpuclusters.nvidia.com", "computedomains.resource.nvidia.com",
                     "computedomaincliques.resource.nvidia.com")  # fmt: skip
    older = {name: crd for name, crd in nvidias.items() if name not in added_in_26_7}
    problems = adopt.crd_problems(older)
    assert problems == [
        f"CRD clusterpolicies.nvidia.com {unmarked}",
        "CRD gpuclusters.nvidia.com is not installed",
        f"CRD nvidiadrivers.nvidia.com {unmarked}",
        "CRD computedomains.resource.nvidia.com is not installed",
        "CRD computedomaincliques.resource.nvidia.com is not installed",
    ]
    plan = adoption.AdoptionPlan(())
    outcome = adopt.Outcome(adopt.Snapshot([], [], nvidias, [], {}), plan, problems, [])
    assert outcome.exit_code == adopt.EXIT_CRDS
    blocked = adoption.AdoptionPlan((adoption.ObjectPlan("ConfigMap", "c", "ns", "blocked"),))
    assert adopt.Outcome(outcome.snapshot, blocked, problems, []).exit_code == (
        adoption.EXIT_BLOCKED
    )
