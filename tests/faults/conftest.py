"""The fault suite: the operator in-process on kubesim, under the chart's RBAC, with faults.

Reuses the operator harness of tests/controller (the same cluster layout and `Env` handle).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "controller"))

from kubesim_helpers import TEST_IMAGES
from operator_harness import CPU_LABELS, NAMESPACE, Env, gpu_node

import kubesim
from gpu_operator.api import crds
from kubesim.controllers.kubelet import KubeletConfig


@pytest.fixture
async def cluster(chart_rbac: Callable[..., Path] | None) -> AsyncIterator[kubesim.Cluster]:
    mode = "rbac" if chart_rbac is not None else "open"
    async with kubesim.Cluster(
        kubelet=KubeletConfig(instant=True), authorization=mode, images=TEST_IMAGES
    ) as sim:
        sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for crd in crds.all_crds().values():
            sim.store.create(crd)
        gpu_node(sim, "gpu-1")
        sim.add_node("cpu-1", labels=CPU_LABELS)
        yield sim


@pytest.fixture
async def env(
    cluster: kubesim.Cluster, chart_rbac: Callable[..., Path] | None
) -> AsyncIterator[Env]:
    kubeconfig = chart_rbac(cluster) if chart_rbac is not None else cluster.kubeconfig_path
    environment = Env(cluster, [], [], kubeconfig)
    yield environment
    for operator in list(environment.operators):
        await environment.stop_operator(operator)
