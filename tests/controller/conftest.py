"""A kubesim cluster with CRDs, GPU and CPU nodes, and a running operator.

The cluster enforces RBAC and the operator runs as the chart's ServiceAccount with the
(Cluster)Roles `helm template` renders, so a permission the chart lacks fails here first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from kubesim_helpers import TEST_IMAGES
from operator_harness import CPU_LABELS, NAMESPACE, Env, gpu_node

import kubesim
from gpu_operator.api import crds, keys
from kubesim.controllers.kubelet import KubeletConfig


@pytest.fixture
async def cluster(
    chart_rbac: Callable[..., Path] | None,
) -> AsyncIterator[kubesim.Cluster]:
    # Without helm the chart cannot be rendered: the suite then runs with everything allowed.
    mode = "rbac" if chart_rbac is not None else "open"
    async with kubesim.Cluster(
        kubelet=KubeletConfig(instant=True), authorization=mode, images=TEST_IMAGES
    ) as sim:
        sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for crd in crds.all_crds().values():
            sim.store.create(crd)
        gpu_node(sim, "gpu-1")
        gpu_node(sim, "gpu-2", **{keys.MIG_CAPABLE: "true"})
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
    # A request the chart's RBAC refuses is a product bug even when the operator retries it.
    refused = [
        f"{u.name}: {a.verb} {a.combined_resource} {a.name}" for u, a in cluster.auth.denials
    ]
    assert not refused, refused
