"""Values compatibility: every key of NVIDIA's 26.7 chart is a key of ours, and the install notes
name the keys a release sets that neither chart knows ("ignored values keys")."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_operator.api import values_keys

from .conftest import CHART, NAMESPACE, helm, needs_helm

FACTS = Path(__file__).with_name("upstream_values_keys_26_7.yaml")
MIRROR = Path(__file__).resolve().parents[3] / ".mirror" / "NVIDIA+gpu-operator" / "repo"
IGNORED = "WARNING: ignored values keys: "


def facts() -> dict[str, dict[str, Any]]:
    loaded: dict[str, dict[str, Any]] = yaml.safe_load(FACTS.read_text())
    return loaded


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    """{"a.b": 1} -> {"a": {"b": 1}}."""
    out: dict[str, Any] = {}
    for path, value in flat.items():
        *parents, last = path.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def resolves(tree: Any, path: str) -> bool:
    for part in path.split("."):
        if tree is True:
            return True
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


def test_the_known_keys_file_is_generated_from_values_and_the_model() -> None:
    committed = values_keys.KNOWN_VALUES_FILE.read_text()
    assert committed == values_keys.generate(), (
        "charts/gpu-operator/files/known-values.yaml is stale (a values key or ClusterPolicy "
        "field changed): run `python -m gpu_operator.api.values_keys`"
    )


def test_every_upstream_values_key_is_a_key_of_our_values() -> None:
    # values.yaml alone, not the model: a key NVIDIA's values.yaml has must have our default too.
    ours = values_keys.defaults_tree(yaml.safe_load((CHART / "values.yaml").read_text()))
    missing = [path for path in facts()["values"] if not resolves(ours, path)]
    assert missing == [], f"keys of NVIDIA's values.yaml missing from ours: {missing}"


def test_every_upstream_key_is_known_to_the_notes() -> None:
    known = values_keys.known_keys(yaml.safe_load((CHART / "values.yaml").read_text()))
    every = {**facts()["values"], **facts()["commentedOut"]}
    assert [path for path in every if not resolves(known, path)] == []


@pytest.mark.skipif(not MIRROR.exists(), reason="NVIDIA/gpu-operator mirror not present")
def test_the_facts_are_nvidias_values_file() -> None:
    proc = subprocess.run(
        ["git", "-C", str(MIRROR), "show", "v26.7.0:deployments/gpu-operator/values.yaml"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"v26.7.0 not readable in the mirror: {proc.stderr.strip()}")
    assert nested(facts()["values"]) == yaml.safe_load(proc.stdout)


# --- the notes, rendered by the real helm -----------------------------------------------------


def notes(tmp_path: Path, chart: Path, *args: str) -> str:
    """The NOTES of a client-side dry-run install (no cluster is contacted)."""
    proc = helm(
        "install", "gpu-operator", str(chart), "-n", NAMESPACE, "--dry-run=client", *args,
        env={"KUBECONFIG": str(tmp_path / "no-kubeconfig")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("NOTES:", 1)[1]


def ignored(text: str) -> list[str]:
    lines = [line for line in text.splitlines() if line.startswith(IGNORED)]
    return lines[0].removeprefix(IGNORED).split(", ") if lines else []


@needs_helm
def test_default_values_list_nothing_as_ignored(tmp_path: Path, packaged_chart: Path) -> None:
    assert IGNORED not in notes(tmp_path, packaged_chart)


@needs_helm
def test_nvidias_own_values_list_nothing_as_ignored(tmp_path: Path, packaged_chart: Path) -> None:
    values = tmp_path / "nvidia-26.7-values.yaml"
    values.write_text(yaml.safe_dump(nested({**facts()["values"], **facts()["commentedOut"]})))
    assert ignored(notes(tmp_path, packaged_chart, "-f", str(values))) == []


@needs_helm
def test_unknown_keys_are_listed_and_free_form_ones_are_not(
    tmp_path: Path, packaged_chart: Path
) -> None:
    sets = [
        "driver.hostNetwrk=true",  # a typo of a section field
        "dcgmExporter.serviceMonitor.scrapTimeout=5s",  # a typo of a nested field
        "daemonsets.podSecurityContext.runAsUSer=0",  # inside a Kubernetes type
        "platfrom.openshift=false",  # a top-level typo: the whole key is named once
        "platfrom.other=1",
        # Free-form places and real fields: never listed.
        "operator.nodeSelector.pool=gpu",
        "daemonsets.labels.team=ml",
        "dcgmExporter.annotations.example\\.com/x=y",
        "driver.livenessProbe.periodSeconds=30",
        "dcgmExporter.service.type=NodePort",
        "node-feature-discovery.worker.nodeSelector.pool=gpu",
    ]
    text = notes(tmp_path, packaged_chart, "--set", ",".join(sets))
    assert ignored(text) == [
        "daemonsets.podSecurityContext.runAsUSer",
        "dcgmExporter.serviceMonitor.scrapTimeout",
        "driver.hostNetwrk",
        "platfrom",
    ]


@needs_helm
def test_nvidias_operator_image_in_a_values_file_runs_ours_and_says_so(
    tmp_path: Path, packaged_chart: Path, render: Any
) -> None:
    # NVIDIA's values file names its own operator image, which is not this chart's program.
    sets = ["operator.repository=nvcr.io/nvidia", "operator.image=gpu-operator"]
    ours = render([], []).one("Deployment", "gpu-operator")
    swapped = render([], sets).one("Deployment", "gpu-operator")
    image = ours["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.startswith("ghcr.io/gpu-operator-py/gpu-operator:")
    assert swapped["spec"]["template"]["spec"]["containers"][0]["image"] == image
    text = notes(tmp_path, packaged_chart, "--set", ",".join(sets))
    assert "name NVIDIA's operator image (nvcr.io/nvidia/gpu-operator)" in text
    assert image in text
    # A mirror of ours is used as given, with no note.
    mirror = ["operator.repository=registry.example.com/mirror"]
    mirrored = render([], mirror).one("Deployment", "gpu-operator")
    assert mirrored["spec"]["template"]["spec"]["containers"][0]["image"].startswith(
        "registry.example.com/mirror/gpu-operator:"
    )
    assert "NVIDIA's operator image" not in notes(tmp_path, packaged_chart, "--set", mirror[0])
