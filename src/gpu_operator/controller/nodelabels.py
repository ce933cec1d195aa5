"""The node labelling reconciler: one work key per node, `node/<name>`, one patch per change.

It labels GPU nodes for the ClusterPolicy's label policy (nodes/labelling.py), and in NVIDIADriver
mode writes each node's driver owner label as the NVIDIADriver reconciler decides it. Without a
ClusterPolicy it removes the labels the operator wrote and nothing else.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gpu_operator.api import keys
from gpu_operator.controller.runtime import NODES, PODS, Reconciler, Request, Runtime, Watch
from gpu_operator.nodes import coexist, gate, labelling, ledger
from gpu_operator.operands import device_plugin

if TYPE_CHECKING:
    from gpu_operator.controller.coexist_sources import CoexistSources

NODE_PREFIX = "node"
PREINSTALLED_REASON = "PreinstalledDriver"
COEXIST_REASON = "CoexistenceConflict"
GATE_REASON = "StartupTaintRemoved"
# The validator DaemonSet's pods (app label): Ready once every link of the node's chain passed.
VALIDATOR_APP = "nvidia-operator-validator"
# The device plugin DaemonSet's pods (app label): GPUs a node serves while one is there are ours.
PLUGIN_APP = device_plugin.DS_NAME
PLUGIN_LABEL = keys.DEPLOY_PREFIX + coexist.DEVICE_PLUGIN
# How soon a node held back for the coexistence sources is looked at again.
HOLD_RETRY = 0.5

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
        # The coexistence detector's findings per GPU node (nodes/coexist.py), for the status.
        self.coexist_findings: dict[str, list[coexist.Finding]] = {}
        self._coexist_adapted: set[str] = set()
        self._reported_coexist: set[tuple[str, str, str]] = set()
        # Per node, the pods of our device plugin on it (pod cache keys), and since when (monotonic)
        # it has served GPUs with none of our plugin in sight (coexist.Outcome.unexplained).
        self._plugin_pods: dict[str, set[str]] = {}
        self._unexplained_since: dict[str, float] = {}
        # NodeFeatures and DRA ResourceSlices (controller/coexist_sources.py), set by the
        # operator; None: the detector reads node facts only.
        self.sources: CoexistSources | None = None
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
        found = [Watch(NODES, self._on_node), Watch(PODS, self._on_plugin_pod)]
        if self.rt.settings.startup_taint is not None:
            # A validator pod turning Ready is what lets the gate open on its node.
            found.append(Watch(PODS, self._on_validator))
        return found

    def _on_validator(self, key: str, old: Any, new: Any) -> list[Request]:
        pod = new if new is not None else old
        if pod is None or pod.app != VALIDATOR_APP or not pod.node:
            return []
        if old is not None and new is not None and old.problem == new.problem:
            return []
        return [Request(self.key(pod.node))]

    def _on_plugin_pod(self, key: str, old: Any, new: Any) -> list[Request]:
        """Index our device plugin's pods by node; a node that gains or loses one while our
        plugin is not deployed there is planned again (the detector reads them)."""
        before = old.node if old is not None and old.app == PLUGIN_APP else ""
        after = new.node if new is not None and new.app == PLUGIN_APP else ""
        if before == after:
            return []
        if before:
            held = self._plugin_pods.get(before, set())
            held.discard(key)
            if not held:
                self._plugin_pods.pop(before, None)
        if after:
            self._plugin_pods.setdefault(after, set()).add(key)
        requests = []
        for name in (before, after):
            node = self.nodes.get(name) if name else None
            labels = ((node or {}).get("metadata") or {}).get("labels") or {}
            if node is not None and labels.get(PLUGIN_LABEL) != "true":
                requests.append(Request(self.key(name)))
        return requests

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
            if self.sources is not None:
                self.sources.forget(name)
            if self.coexist_findings.pop(name, None):
                self.on_settled()
            self._coexist_adapted.discard(name)
            self._unexplained_since.pop(name, None)
            self._settled(name)
            return
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        await self._gate(name, node)
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
            outcome = self._detect(name, node)
            if outcome is None:
                # A source the detector needs has not answered yet (coexist_sources.WAIT).
                self.rt.enqueue(self.key(name), after=HOLD_RETRY)
                return
            if outcome.wait > 0:
                # GPUs served with none of our plugin in sight, not for long yet: the kubelet
                # may not have reported our plugin's departure (coexist.CONFIRM_AFTER).
                self.rt.enqueue(self.key(name), after=outcome.wait)
                return
            plan = labelling.plan_node(
                labels, annotations, self.label_policy, owner,
                coexist=outcome.overrides, refuse=outcome.refused,
            )  # fmt: skip
            await self._report_coexist(name, meta, labels, outcome)
        if not plan.empty:
            # Settled only when the watch brings our write back and the plan comes out empty.
            await self.rt.writer.label_node(name, plan.merge_patch())
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

    def _validator_ready(self, name: str) -> bool:
        return any(
            pod.app == VALIDATOR_APP and pod.node == name and pod.problem is None
            for pod in self.rt.caches[PODS].objects.values()
        )

    def gate_waiting(self) -> dict[str, gate.GatePlan]:
        """The nodes that still carry the startup taint, with what each lacks (for the status
        message), from the caches: one pass over the pods, one over the nodes."""
        taint = self.rt.settings.startup_taint
        if taint is None:
            return {}
        ready = {
            pod.node
            for pod in self.rt.caches[PODS].objects.values()
            if pod.app == VALIDATOR_APP and pod.problem is None
        }
        waiting = {}
        for name, node in self.nodes.objects.items():
            taints = node.get("taints") or ()
            if not any(taint.matches(t) for t in taints):
                continue
            waiting[name] = gate.plan(self._gate_facts(name, node, name in ready), taint)
        return waiting

    def _gate_facts(
        self, name: str, node: Mapping[str, Any], validator_ready: bool
    ) -> gate.GateFacts:
        """The gate's facts from the caches: on a DRA node, the devices its gpu.nvidia.com
        ResourceSlices publish (the ResourceSlice cache, when resource.k8s.io/v1 is served)
        rather than allocatable GPUs."""
        status = node.get("status") or {}
        labels = (node.get("metadata") or {}).get("labels") or {}
        dra = labelling.dra_node(labels)
        return gate.GateFacts(
            taints=node.get("taints") or (),
            gpu_allocatable=int(status.get("gpuAllocatable") or 0),
            validator_ready=validator_ready,
            dra=dra,
            dra_devices=(
                self.sources.dra_devices(name) if dra and self.sources is not None else None
            ),
            gpus=gate.node_gpus(labels, int(status.get("gpu") or 0)) if dra else 0,
        )

    async def _gate(self, name: str, node: Mapping[str, Any]) -> None:
        """Remove the startup taint once the node validated (nodes/gate.py): one JSON patch of
        spec.taints, guarded by a `test` of the taints the plan read; a conflict plans again."""
        taint = self.rt.settings.startup_taint
        taints = node.get("taints") or ()
        if taint is None or not any(taint.matches(t) for t in taints):
            return
        plan = gate.plan(self._gate_facts(name, node, self._validator_ready(name)), taint)
        if not plan.remove:
            return
        # The guard tests spec.taints rather than the resourceVersion: the stripped cache keeps
        # no resourceVersion (it would wake every node on each status write), and the chart's
        # RBAC grants no `get` on nodes. The taints are exactly what this write must not lose.
        if not await self.rt.writer.json_patch_node(name, plan.json_patch()):
            self.rt.enqueue(self.key(name), after=0.5)  # changed under us: the watch re-plans
            return
        labels = (node.get("metadata") or {}).get("labels") or {}
        what = "DRA devices published" if labelling.dra_node(labels) else "allocatable GPUs"
        await self.rt.writer.event(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
             "uid": (node.get("metadata") or {}).get("uid")}},
            reason=GATE_REASON,
            message=f"node {name} validated ({what}, validator Ready): "
            f"removed the startup taint {taint}",
        )  # fmt: skip

    def coexist_adapted(self, name: object) -> bool:
        """Whether the node's `pre-installed` driver label is the detector's (see coexist)."""
        return name in self._coexist_adapted

    def _detect(self, name: str, node: Mapping[str, Any]) -> coexist.Outcome | None:
        """The detector's outcome for a node; None to hold the node back a moment."""
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        if not labelling.has_gpu(labels):
            if self.sources is not None:
                self.sources.forget(name)
            self._unexplained_since.pop(name, None)
            return coexist.Outcome()
        owned = ledger.read(meta.get("annotations") or {})
        # Once the operator deployed its driver here, a loaded module is its own driver's (now,
        # after an upgrade, after an operator restart): only a node it never put its driver on
        # can show a foreign one. The ledger survives restarts; `true` covers a lost ledger.
        driver_ledgered = (
            owned.get(keys.DEPLOY_DRIVER) == "true" or labels.get(keys.DEPLOY_DRIVER) == "true"
        )
        installs = self.label_policy is not None and self.label_policy.driver
        loaded = ""
        slices: tuple[str, ...] = ()
        if self.sources is not None:
            new_node = installs and not driver_ledgered and keys.DEPLOY_DRIVER not in owned
            if self.sources.wait_reason(name, new_node):
                return None
            loaded = self.sources.driver_loaded(name) if installs else ""
            slices = self.sources.dra_slices(name)
        status = node.get("status") or {}
        since = self._unexplained_since.get(name)
        now = time.monotonic()
        facts = coexist.NodeFacts(
            # Cloud labels (GKE's, AKS's) live among the labels the cache keeps apart.
            labels={**(node.get("selectable") or {}), **labels},
            gpu_capacity=int(status.get("gpu") or 0),
            gpu_allocatable=int(status.get("gpuWholeAllocatable") or 0),
            dra_slices=slices,
            plugin_ledgered=owned.get(PLUGIN_LABEL) == "true",
            driver_loaded=loaded,
            driver_ledgered=driver_ledgered,
            plugin_pod=bool(self._plugin_pods.get(name)),
            plugin_adapted=owned.get(PLUGIN_LABEL) == labels.get(PLUGIN_LABEL) == "false",
            unexplained_for=None if since is None else now - since,
        )
        outcome = coexist.detect(facts, self.rt.settings.coexist)
        if outcome.unexplained:
            self._unexplained_since.setdefault(name, now)
        else:
            self._unexplained_since.pop(name, None)
        return outcome

    async def _report_coexist(
        self, name: str, meta: Mapping[str, Any], labels: Mapping[str, str],
        outcome: coexist.Outcome,
    ) -> None:  # fmt: skip
        """One Warning Event per node and finding; the status follows the findings."""
        owned = ledger.read(meta.get("annotations") or {})
        if coexist.adapted_preinstalled(labels, outcome, owned):
            self._coexist_adapted.add(name)
        else:
            self._coexist_adapted.discard(name)
        before = self.coexist_findings.get(name, [])
        if outcome.findings:
            self.coexist_findings[name] = outcome.findings
        else:
            self.coexist_findings.pop(name, None)
        for finding in outcome.findings:
            key = (name, finding.case, finding.action)
            if key in self._reported_coexist:
                continue
            self._reported_coexist.add(key)
            await self.rt.writer.event(
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
                 "uid": meta.get("uid")}},
                reason=COEXIST_REASON, type_="Warning", message=finding.message,
            )  # fmt: skip
        gone = {(f.case, f.action) for f in before} - {(f.case, f.action) for f in outcome.findings}
        for case, action in gone:
            self._reported_coexist.discard((name, case, action))
        if before != outcome.findings:
            self.on_settled()

    async def _report_preinstalled(self, name: str, meta: Mapping[str, Any]) -> None:
        """One Event per node whose host runs its own driver while the policy installs drivers:
        the operator leaves such a node alone (no relabel, no restart), and says what to do."""
        labels = meta.get("labels") or {}
        if (
            not labelling.preinstalled_conflict(labels, self.label_policy)
            or name in self._coexist_adapted  # the detector's own label: its Event says why
        ):
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
