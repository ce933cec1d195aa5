"""The operator: one runtime (controller/runtime.py) with one reconciler per kind registered on it.

- `policy`: the ClusterPolicy reconciler (controller/clusterpolicy.py): operand states, status.
- `node/<name>`: node labelling (controller/nodelabels.py), one work item per node.
- `nvidiadrivers`: the NVIDIADriver reconciler (controller/nvidiadriver.py): driver pools.
- `gpucluster`: the GPUCluster reconciler (controller/gpucluster.py): the DRA driver.
- `driver-upgrade`: rolling driver upgrades (controller/upgrade.py, planner in upgrade/).

Watch events enqueue only the keys they affect; nothing polls. A new reconciler is a module plus
one `register` line below (see controller/runtime.py for the interface).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from gpu_operator.controller import (
    clusterpolicy,
    coexist_sources,
    gpucluster,
    nodelabels,
    nvidiadriver,
    runtime,
    strip,
    upgrade,
)
from gpu_operator.controller.metrics import OperatorMetrics
from gpu_operator.controller.runtime import OWNED_KINDS, Runtime, Settings
from gpu_operator.kube import resources, server_version
from gpu_operator.kube.cache import Informer
from gpu_operator.kube.client import AsyncClient
from gpu_operator.kube.leader import LeaderElector
from gpu_operator.kube.queue import WorkQueue
from gpu_operator.operands.facts import ClusterFacts


class Operator:
    """Runs the operator's reconcilers against one API server."""

    def __init__(self, client: AsyncClient, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        rt = self.runtime = Runtime(client, settings)
        ns = settings.namespace
        caches = rt.caches
        # The caches the reconcilers share; each is listed and watched once.
        # Bounded nesting: one hostile policy must not break validation for the others.
        caches.add(runtime.POLICIES, resources.CLUSTER_POLICY, transform=strip.bounded)
        caches.add(runtime.NODES, resources.NODE, transform=strip.node)
        # One list and watch of every pod (the upgrade planner drains any namespace's GPU pods);
        # the status side reads the operator namespace's pods through a view of it.
        caches.add(
            runtime.ALL_PODS, resources.POD, namespace=resources.ALL_NAMESPACES,
            transform=strip.pod_record(ns),
        )  # fmt: skip
        caches.add_view(runtime.PODS, runtime.ALL_PODS, strip.pod_summary)
        caches.add(
            runtime.REVISIONS, resources.CONTROLLER_REVISION, namespace=ns,
            transform=strip.revision,
        )  # fmt: skip
        caches.add(runtime.CRDS, resources.CRD, transform=strip.crd)
        caches.add(runtime.GPU_CLUSTERS, resources.GPU_CLUSTER)
        for api_version, kind in OWNED_KINDS:
            caches.add_owned(api_version, kind)

        self.labels = nodelabels.NodeLabels(rt)
        self.policy = clusterpolicy.ClusterPolicyReconciler(rt, self.labels)
        self.labels.has_policy = lambda: self.policy.policy_in_charge() is not None
        self.drivers = nvidiadriver.NVIDIADriverReconciler(rt, self.labels)
        rt.register(self.labels)
        rt.register(self.policy)
        rt.register(self.drivers)
        self.gpu_cluster = gpucluster.GPUClusterReconciler(
            rt, functools.partial(server_version.git_version, client)
        )
        rt.register(self.gpu_cluster)
        self.upgrade = upgrade.UpgradeReconciler(rt)
        rt.register(self.upgrade)
        # NodeFeatures and ResourceSlices for the coexistence detector (both APIs optional).
        self.coexist_sources = coexist_sources.CoexistSources(rt, nodelabels.NodeLabels.key)
        self.labels.sources = self.coexist_sources
        rt.register(self.coexist_sources)

    # What tests, the demo and the process entry point read.

    @property
    def ready(self) -> asyncio.Event:
        return self.runtime.ready

    @property
    def metrics(self) -> OperatorMetrics:
        return self.runtime.metrics

    @property
    def queue(self) -> WorkQueue:
        return self.runtime.queue

    @property
    def nodes(self) -> Informer:
        return self.runtime.caches.informers[runtime.NODES]

    @property
    def pending_nodes(self) -> set[str]:
        return self.labels.pending

    @property
    def elector(self) -> LeaderElector | None:
        return self.runtime.elector

    def cluster_facts(self) -> ClusterFacts:
        return clusterpolicy.cluster_facts(self.runtime)

    def active_policy(self) -> dict[str, Any] | None:
        """The ClusterPolicy in charge (None when there is none or a GPUCluster refuses it)."""
        return self.policy.policy_in_charge()

    async def run(self) -> None:
        """Start caches, wait for them, then (as leader when electing) work until cancelled."""
        await self.runtime.run()


__all__ = ["Operator", "Settings"]
