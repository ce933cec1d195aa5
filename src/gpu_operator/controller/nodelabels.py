"""The node labelling reconciler: one work key per node, `node/<name>`, one patch per change.

It labels GPU nodes for the ClusterPolicy's label policy (nodes/labelling.py), and in NVIDIADriver
mode writes each node's driver owner label as the NVIDIADriver reconciler decides it. Without a
ClusterPolicy it removes the labels the operator wrote and nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from gpu_operator.api import keys
from gpu_operator.controller.runtime import Reconciler, Request, Runtime, Watch
from gpu_operator.nodes import labelling, ledger

NODE_PREFIX = "node"
PREINSTALLED_REASON = "PreinstalledDriver"
NODES = "nodes"

# Given a cached node (strip.node), the owner label it should carry; None leaves it alone.
OwnerSource = Callable[[Mapping[str, Any]], labelling.OwnerLabel | None]


class NodeLabels(Reconciler):
    """Brings one node's labels in line with the active policy (or cleans up after it)."""

    prefix = NODE_PREFIX

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.nodes = rt.caches[NODES]
        self.label_policy: labelling.LabelPolicy | None = None
        self.conflicts: dict[str, list[str]] = {}
        # Nodes whose labels may still need a write; the policy is not ready while any remain.
        self.pending: set[str] = set()
        self._reported_conflicts: set[tuple[str, str]] = set()
        self._reported_preinstalled: set[str] = set()
        # Set by the ClusterPolicy reconciler: the answer to "is there a policy in charge?",
        # and what to call when the last pending node settles or conflicts change.
        self.has_policy: Callable[[], bool] = lambda: False
        self.on_settled: Callable[[], None] = lambda: None
        # Set by the NVIDIADriver reconciler: the owner label a node should carry.
        self.owner_of: OwnerSource = lambda node: None

    @staticmethod
    def key(name: str) -> str:
        return f"{NODE_PREFIX}/{name}"

    def watches(self) -> list[Watch]:
        return [Watch(NODES, self._on_node)]

    def initial(self) -> list[Request]:
        self.pending.update(self.nodes.objects)
        return [Request(self.key(name)) for name in list(self.nodes.objects)]

    def _on_node(self, key: str, old: Any, new: Any) -> list[Request]:
        if old == new:
            return []
        self.pending.add(key)
        return [Request(self.key(key))]

    def relabel_all(self) -> None:
        """Queue every node (the label policy or the owner decisions changed)."""
        for name in self.nodes.objects:
            self.pending.add(name)
            self.rt.enqueue(self.key(name))

    def set_policy(self, value: labelling.LabelPolicy | None) -> None:
        if value != self.label_policy:
            self.label_policy = value
            self.relabel_all()

    def _settled(self, name: str) -> None:
        if name in self.pending:
            self.pending.discard(name)
            if not self.pending:
                self.on_settled()

    async def reconcile(self, key: str) -> None:
        name = key.split("/", 1)[1]
        node = self.nodes.get(name)
        if node is None:
            self.conflicts.pop(name, None)
            self._settled(name)
            return
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        if self.label_policy is None:
            if self.has_policy():
                return  # the policy is invalid or not reconciled yet: leave nodes alone
            if ledger.ANNOTATION not in annotations:
                self._settled(name)
                return
            plan = labelling.plan_cleanup(labels, annotations)
        else:
            owner = self.owner_of(node)
            if owner is not None and owner.auto_upgrade and self.label_policy.sandbox:
                # Upstream: no upgrade annotation while sandbox workloads are on.
                owner = dataclasses.replace(owner, auto_upgrade=False)
            plan = labelling.plan_node(labels, annotations, self.label_policy, owner)
        if not plan.empty:
            # Settled only when the watch brings our write back and the plan comes out empty.
            await self.rt.writer.patch_node(name, plan.merge_patch())
        else:
            self._settled(name)
        had = bool(self.conflicts.get(name))
        if plan.conflicts:
            self.conflicts[name] = plan.conflicts
            for conflict in plan.conflicts:
                if (name, conflict) not in self._reported_conflicts:
                    self._reported_conflicts.add((name, conflict))
                    await self.rt.writer.event(
                        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
                         "uid": meta.get("uid")}},
                        reason="LabelLeftAlone", type_="Warning", message=conflict,
                    )  # fmt: skip
        else:
            self.conflicts.pop(name, None)
        if had != bool(plan.conflicts):
            self.on_settled()
        await self._report_preinstalled(name, meta)

    async def _report_preinstalled(self, name: str, meta: Mapping[str, Any]) -> None:
        """One Event per node whose host runs its own driver while the policy installs drivers:
        the operator leaves such a node alone (no relabel, no restart), and says what to do."""
        if not labelling.preinstalled_conflict(meta.get("labels") or {}, self.label_policy):
            self._reported_preinstalled.discard(name)
            return
        if name in self._reported_preinstalled:
            return
        self._reported_preinstalled.add(name)
        await self.rt.writer.event(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
             "uid": meta.get("uid")}},
            reason=PREINSTALLED_REASON, type_="Warning",
            message=f"node {name} already runs a preinstalled NVIDIA driver "
            f"({keys.DEPLOY_DRIVER}={keys.DRIVER_PREINSTALLED}): the operator's driver does not "
            "run here while driver.enabled=true; create the node pool with --gpu-driver none, "
            "or set driver.enabled=false",
        )  # fmt: skip
