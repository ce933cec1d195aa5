"""The served demo's hints name the policy it created: a GPUCluster's, not a ClusterPolicy's."""

from __future__ import annotations

from pathlib import Path

from gpudemo.cluster import kubectl_help


def test_kubectl_hints_name_the_gpucluster() -> None:
    text = "\n".join(kubectl_help(Path("kc"), "GPUCluster"))
    assert "get gpucluster" in text
    assert "edit gpucluster gpu-cluster" in text
    assert "clusterpolicy" not in text


def test_kubectl_hints_for_a_clusterpolicy_are_unchanged() -> None:
    text = "\n".join(kubectl_help(Path("kc")))
    assert "get clusterpolicy" in text
    assert "gpucluster" not in text
