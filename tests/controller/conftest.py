"""A kubesim cluster with CRDs, GPU and CPU nodes, and a running operator."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from operator_harness import CPU_LABELS, NAMESPACE, Env, gpu_node

import kubesim
from gpu_operator.api import crds, keys
from kubesim.controllers.kubelet import KubeletConfig


@pytest.fixture
async def cluster() -> AsyncIterator[kubesim.Cluster]:
    async with kubesim.Cluster(kubelet=KubeletConfig(instant=True)) as sim:
        sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for crd in crds.all_crds().values():
            sim.store.create(crd)
        gpu_node(sim, "gpu-1")
        gpu_node(sim, "gpu-2", **{keys.MIG_CAPABLE: "true"})
        sim.add_node("cpu-1", labels=CPU_LABELS)
        yield sim


@pytest.fixture
async def env(cluster: kubesim.Cluster) -> AsyncIterator[Env]:
    environment = Env(cluster, [], [])
    yield environment
    for operator in list(environment.operators):
        await environment.stop_operator(operator)
