"""The ClusterPolicy controller: caches -> planners -> writer.

Work items are keys in one queue: `policy` (render every operand state, apply what changed, prune
what is no longer wanted, compute status) and `node/<name>` (that node's labels only). Watch
events enqueue only the keys they affect; nothing polls.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpu_operator import api
from gpu_operator.api import crds as crd_schema
from gpu_operator.api import enablement, keys
from gpu_operator.controller import facts as facts_mod
from gpu_operator.controller import strip
from gpu_operator.controller.metrics import (
    STATUS_ERROR,
    STATUS_NO_POLICY,
    STATUS_NOT_READY,
    STATUS_READY,
    OperatorMetrics,
)
from gpu_operator.kube import resources
from gpu_operator.kube.cache import Informer
from gpu_operator.kube.client import AsyncClient
from gpu_operator.kube.leader import LeaderElector
from gpu_operator.kube.queue import WorkQueue
from gpu_operator.kube.writer import Writer, needs_write
from gpu_operator.nodes import labelling, ledger
from gpu_operator.operands import readiness, registry
from gpu_operator.operands.facts import ClusterFacts
from gpu_operator.status import conditions, summary

log = logging.getLogger(__name__)

POLICY_KEY = "policy"
NODE_PREFIX = "node/"
SERVICEMONITOR_CRD = "servicemonitors.monitoring.coreos.com"
PROMETHEUSRULE_CRD = "prometheusrules.monitoring.coreos.com"

# Kinds the renderers produce; objects of these kinds carrying our state label are ours to prune.
OWNED_KINDS = (
    ("node.k8s.io/v1", "RuntimeClass"),
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("apps/v1", "DaemonSet"),
)
OPTIONAL_OWNED_KINDS = (
    ("monitoring.coreos.com/v1", "ServiceMonitor", SERVICEMONITOR_CRD),
    ("monitoring.coreos.com/v1", "PrometheusRule", PROMETHEUSRULE_CRD),
)
OUR_CRDS = ("clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com")
PSA_LABELS = {
    f"pod-security.kubernetes.io/{mode}": "privileged" for mode in ("enforce", "audit", "warn")
}
DRIVER_DS_PREFIXES = ("nvidia-driver-daemonset", "nvidia-vgpu-manager-daemonset")


@dataclass
class Settings:
    """How the operator runs (from flags and env)."""

    namespace: str
    identity: str = "gpu-operator"
    leader_elect: bool = False
    operator_env: Mapping[str, str] = field(default_factory=dict)
    status_debounce: float = 0.2
    write_concurrency: int = 16
    workers: int = 8


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ref(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    meta = obj.get("metadata") or {}
    return (
        str(obj.get("apiVersion")),
        str(obj.get("kind")),
        str(meta.get("namespace") or ""),
        str(meta.get("name")),
    )


def _created(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("creationTimestamp") or ""), str(meta.get("name") or ""))


class Operator:
    """Runs the ClusterPolicy controller against one API server."""

    def __init__(self, client: AsyncClient, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self.writer = Writer(client, namespace=settings.namespace)
        self.queue = WorkQueue()
        self.metrics = OperatorMetrics()
        self.elector = (
            LeaderElector(client, namespace=settings.namespace, identity=settings.identity)
            if settings.leader_elect
            else None
        )
        ns = settings.namespace
        self.policies = Informer(client, resources.CLUSTER_POLICY, on_change=self._on_policy)
        self.nodes = Informer(client, resources.NODE, transform=strip.node, on_change=self._on_node)
        self.pods = Informer(
            client, resources.POD, namespace=ns, transform=strip.pod, on_change=self._on_status
        )
        self.revisions = Informer(
            client, resources.CONTROLLER_REVISION, namespace=ns, transform=strip.revision,
            on_change=self._on_status,
        )  # fmt: skip
        self.crds = Informer(client, resources.CRD, transform=strip.crd, on_change=self._on_crd)
        self.owned: dict[tuple[str, str], Informer] = {}
        for api_version, kind in OWNED_KINDS:
            self._add_owned(api_version, kind)
        self.label_policy: labelling.LabelPolicy | None = None
        self.active_uid: str | None = None
        self.conflicts: dict[str, list[str]] = {}
        # Nodes whose labels may still need a write; status is not ready while any remain.
        self.pending_nodes: set[str] = set()
        self.ready = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._reported_conflicts: set[tuple[str, str]] = set()
        self._last_state_outcomes: dict[str, str] = {}
        self._write_slots = asyncio.Semaphore(settings.write_concurrency)
        self._psa_labelled = False

    # ----- caches and event routing ------------------------------------------------------------

    def _add_owned(self, api_version: str, kind: str) -> Informer:
        info = resources.kind_of(api_version, kind)
        # ConfigMaps are watched whole in the namespace: the driver mounts the user's ConfigMaps
        # key by key, so the renderers need their keys too. Pruning still only touches objects
        # the active policy owns.
        labels = None if kind == "ConfigMap" else {keys.OPERATOR_STATE_LABEL: None}
        informer = Informer(
            self.client,
            resources.resource(api_version, kind),
            namespace=self.settings.namespace if info.namespaced else None,
            labels=labels,
            transform=strip.owned,
            on_change=self._on_status,
        )
        self.owned[(api_version, kind)] = informer
        return informer

    def _on_policy(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if old is not None and new is not None:
            same_spec = old.get("spec") == new.get("spec")
            same_meta = (old.get("metadata") or {}).get("deletionTimestamp") == (
                new.get("metadata") or {}
            ).get("deletionTimestamp")
            if same_spec and same_meta:
                return  # our own status writes come back as events; nothing to do
        self.queue.add(POLICY_KEY)

    def _on_node(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if old == new:
            return
        self.pending_nodes.add(key)
        self.queue.add(NODE_PREFIX + key)
        if self._facts_input(old) != self._facts_input(new):
            self.queue.add_after(POLICY_KEY, self.settings.status_debounce)

    @staticmethod
    def _facts_input(node: dict[str, Any] | None) -> tuple[Any, ...]:
        if node is None:
            return ()
        labels = (node.get("metadata") or {}).get("labels") or {}
        return (
            labels.get(keys.GPU_PRESENT),
            node.get("nfd"),
            labels.get(keys.NFD_OS_ID),
            labels.get(keys.NFD_OS_VERSION_ID),
            labels.get(keys.NFD_KERNEL_FULL),
            facts_mod.runtime_of(node),
        )

    def _on_status(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if old != new:
            self.queue.add_after(POLICY_KEY, self.settings.status_debounce)

    def _on_crd(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        for api_version, kind, crd in OPTIONAL_OWNED_KINDS:
            if key == crd and new is not None and (api_version, kind) not in self.owned:
                informer = self._add_owned(api_version, kind)
                self._tasks.append(asyncio.create_task(informer.run()))
        if key in (SERVICEMONITOR_CRD, PROMETHEUSRULE_CRD, *OUR_CRDS):
            self.queue.add(POLICY_KEY)

    # ----- running -----------------------------------------------------------------------------

    def _informers(self) -> list[Informer]:
        return [
            self.policies,
            self.nodes,
            self.pods,
            self.revisions,
            self.crds,
            *self.owned.values(),
        ]

    async def run(self) -> None:
        """Start caches, wait for them, then (as leader when electing) work until cancelled."""
        self._tasks = [asyncio.create_task(i.run()) for i in self._informers()]
        try:
            await asyncio.gather(*(i.synced.wait() for i in self._informers()))
            self.ready.set()
            if self.elector is not None:
                self._tasks.append(asyncio.create_task(self.elector.run()))
                await self.elector.is_leader.wait()
            for name in list(self.nodes.objects):
                self.pending_nodes.add(name)
                self.queue.add(NODE_PREFIX + name)
            self.queue.add(POLICY_KEY)
            await self._work_all()
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            if self.elector is not None:
                await self.elector.release()

    async def _work_all(self) -> None:
        """Several workers drain the queue; the queue never hands one key to two of them."""
        workers = [asyncio.create_task(self._work()) for _ in range(self.settings.workers)]
        try:
            await asyncio.gather(*workers)
        finally:
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _work(self) -> None:
        lost = asyncio.create_task(self.elector.lost.wait()) if self.elector else None
        while True:
            getter = asyncio.create_task(self.queue.get())
            waiting: set[asyncio.Task[Any]] = {getter, *([lost] if lost else [])}
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if lost is not None and lost in done:
                getter.cancel()
                raise RuntimeError("lost the leader lease; exiting so a standby can take over")
            key = getter.result()
            try:
                if key == POLICY_KEY:
                    await self.reconcile_policy()
                else:
                    await self.reconcile_node(key.removeprefix(NODE_PREFIX))
                self.queue.forget(key)
            except Exception as err:
                delay = self.queue.retry(key)
                log.warning("reconcile of %s failed: %s; retrying in %.1fs", key, err, delay)
                if key == POLICY_KEY:
                    self.metrics.failed.inc()
                    self.metrics.status.set(STATUS_ERROR)
            finally:
                self.queue.done(key)

    # ----- policy -----------------------------------------------------------------------------

    def active_policy(self) -> dict[str, Any] | None:
        live = [
            p
            for p in self.policies.objects.values()
            if not (p.get("metadata") or {}).get("deletionTimestamp")
        ]
        return min(live, key=_created) if live else None

    def cluster_facts(self) -> ClusterFacts:
        crds = self.crds.objects
        return facts_mod.from_nodes(
            self.nodes.objects.values(),
            namespace=self.settings.namespace,
            operator_env=self.settings.operator_env,
            has_servicemonitor_crd=SERVICEMONITOR_CRD in crds,
            has_prometheusrule_crd=PROMETHEUSRULE_CRD in crds,
            config_map_keys={
                cm["metadata"]["name"]: tuple(cm["keys"])
                for cm in self.owned[("v1", "ConfigMap")].objects.values()
            },
        )

    async def _patch_status(self, policy: dict[str, Any], status: dict[str, Any]) -> None:
        current = policy.get("status") or {}
        if _without_times(current) == _without_times(status):
            return
        await self.writer.patch_status(resources.CLUSTER_POLICY, policy["metadata"]["name"], status)

    def _set_label_policy(self, value: labelling.LabelPolicy | None) -> None:
        if value != self.label_policy:
            self.label_policy = value
            for name in self.nodes.objects:
                self.pending_nodes.add(name)
                self.queue.add(NODE_PREFIX + name)

    async def reconcile_policy(self) -> None:
        """Render, apply, prune and report for the active ClusterPolicy."""
        self.metrics.total.inc()
        active = self.active_policy()
        if active is None:
            self.active_uid = None
            self._set_label_policy(None)
            self.metrics.status.set(STATUS_NO_POLICY)
            return
        name = active["metadata"]["name"]
        for other in self.policies.objects.values():
            if other is not active and (other.get("status") or {}).get("state") != "ignored":
                status = summary.ignored(
                    active=name, namespace=self.settings.namespace, now=_now(),
                    generation=(other.get("metadata") or {}).get("generation"),
                )  # fmt: skip
                await self.writer.patch_status(
                    resources.CLUSTER_POLICY, other["metadata"]["name"], status
                )
        generation = (active.get("metadata") or {}).get("generation")
        outdated = [
            schema
            for schema in (crd_schema.installed_schema(c) for n, c in self.crds.objects.items()
                           if n in OUR_CRDS)
            if schema.older
        ]  # fmt: skip
        if outdated:
            message = "; ".join(schema.message for schema in outdated)
            log.error("refusing to reconcile: %s", message)
            before = (active.get("status") or {}).get("conditions") or []
            if not any(c.get("reason") == conditions.CRD_OUTDATED for c in before):
                await self.writer.event(
                    active, reason=conditions.CRD_OUTDATED, type_="Warning", message=message
                )
            await self._patch_status(
                active,
                summary.refused(
                    conditions.CRD_OUTDATED, message, namespace=self.settings.namespace,
                    now=_now(), generation=generation, previous=active.get("status"),
                ),
            )  # fmt: skip
            self.metrics.status.set(STATUS_ERROR)
            return
        checked = api.check_document(active)
        if not checked.ok or not isinstance(checked.obj, api.ClusterPolicy):
            problems = [str(p) for p in checked.errors]
            log.warning("ClusterPolicy %s is invalid: %s", name, "; ".join(problems))
            await self._patch_status(
                active,
                summary.invalid(
                    problems,
                    namespace=self.settings.namespace,
                    now=_now(),
                    generation=generation,
                    previous=active.get("status"),
                ),
            )
            self.metrics.status.set(STATUS_ERROR)
            return
        policy = checked.obj
        self.active_uid = active["metadata"].get("uid")
        self._set_label_policy(labelling.LabelPolicy.from_policy(policy))
        if enablement.is_enabled(policy.spec, "psa") and not self._psa_labelled:
            await self.writer.patch_namespace_labels(self.settings.namespace, PSA_LABELS)
            self._psa_labelled = True
        # Taken before the facts: node work finishing during this pass must not make the
        # facts we rendered from look complete.
        pending = sorted(self.pending_nodes)
        facts = self.cluster_facts()
        reports = await self._sync_states(policy, active, facts)
        if pending:
            shown = ", ".join(pending[:3]) + (
                f" and {len(pending) - 3} more" if len(pending) > 3 else ""
            )
            reports.insert(
                0, summary.StateReport("node-labelling", "notReady", f"labelling {shown}")
            )
        status = summary.build(
            reports,
            summary.ClusterView(
                has_nfd=facts.has_nfd,
                gpu_nodes=facts.gpu_node_count,
                label_conflicts=sum(len(c) for c in self.conflicts.values()),
            ),
            namespace=self.settings.namespace,
            now=_now(),
            generation=generation,
            previous=active.get("status"),
        )
        await self._report_transitions(active, reports)
        await self._patch_status(active, status)
        ready = status["state"] == "ready"
        self.metrics.status.set(STATUS_READY if ready else STATUS_NOT_READY)
        self.metrics.gpu_nodes.set(facts.gpu_node_count)
        self.metrics.has_nfd.set(1 if facts.has_nfd else 0)
        self.metrics.auto_upgrade.set(
            1 if self.label_policy and self.label_policy.upgrade_annotation else 0
        )
        if ready:
            self.metrics.last_success.set(time.time())

    def _owner_reference(self, active: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "name": active["metadata"]["name"],
            "uid": active["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def _live(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        informer = self.owned.get((str(obj.get("apiVersion")), str(obj.get("kind"))))
        if informer is None:
            return None
        meta = obj.get("metadata") or {}
        live: dict[str, Any] | None = informer.get(str(meta.get("name")), meta.get("namespace"))
        return live

    async def _write(self, obj: dict[str, Any]) -> None:
        async with self._write_slots:
            await self.writer.apply(obj)

    async def _sync_states(
        self, policy: api.ClusterPolicy, active: dict[str, Any], facts: ClusterFacts
    ) -> list[summary.StateReport]:
        owner = self._owner_reference(active)
        reports: list[summary.StateReport] = []
        desired: set[tuple[str, str, str, str]] = set()
        keep_states: set[str] = set()
        to_write: list[dict[str, Any]] = []
        daemonsets: dict[str, list[dict[str, Any]]] = {}
        for state in registry.render_all(policy, facts):
            if state.error is not None:
                keep_states.add(state.name)  # a failed render never deletes what runs
                if facts.gpu_node_count == 0:
                    # Upstream renders nothing without GPU nodes; facts such as the OS come from
                    # GPU nodes, so a render failure now is not an error yet.
                    message = f"nothing to deploy without GPU nodes ({state.error})"
                    reports.append(summary.StateReport(state.name, "ready", message))
                else:
                    reports.append(summary.StateReport(state.name, "failed", state.error))
                continue
            if not state.enabled:
                reports.append(summary.StateReport(state.name, "disabled"))
                continue
            for obj in state.objects:
                if obj.get("kind") == "DaemonSet" and facts.gpu_node_count == 0:
                    continue  # upstream: no GPU node, no DaemonSet, state counts as ready
                if (obj.get("apiVersion"), obj.get("kind")) not in self.owned:
                    continue  # e.g. a ServiceMonitor whose CRD is not installed
                obj.setdefault("metadata", {})["ownerReferences"] = [owner]
                desired.add(_ref(obj))
                if needs_write(obj, self._live(obj)):
                    to_write.append(obj)
                if obj.get("kind") == "DaemonSet":
                    daemonsets.setdefault(state.name, []).append(obj)
            reports.append(summary.StateReport(state.name, "ready"))
        for obj in to_write:
            log.debug("applying %s %s", obj.get("kind"), _ref(obj)[3])
        await asyncio.gather(*(self._write(obj) for obj in to_write))
        written = {_ref(obj) for obj in to_write}
        await self._prune(
            desired, keep_states, crd_mode=bool(policy.spec.driver.useNvidiaDriverCRD)
        )
        by_owner = _index_by_owner(self.pods.objects.values(), self.revisions.objects.values())
        return [self._readiness(r, daemonsets.get(r.name, []), written, by_owner) for r in reports]

    def _readiness(
        self,
        report: summary.StateReport,
        daemonsets: list[dict[str, Any]],
        written: set[tuple[str, str, str, str]],
        by_owner: dict[str, tuple[list[readiness.PodSummary], list[dict[str, Any]]]],
    ) -> summary.StateReport:
        if report.outcome != "ready":
            return report
        problems: list[str] = []
        for ds in daemonsets:
            name = ds["metadata"]["name"]
            if _ref(ds) in written:
                problems.append(f"{name}: rolling out the new spec")
                continue
            live = self._live(ds)
            if live is None:
                problems.append(f"{name}: not created yet")
                continue
            pods, revisions = by_owner.get(str(live["metadata"].get("uid")), ([], []))
            verdict = readiness.daemonset_readiness(live, pods, revisions)
            if not verdict.ready:
                problems.append(verdict.reason or f"{name}: not ready")
        if problems:
            return summary.StateReport(report.name, "notReady", "; ".join(problems))
        return report

    async def _prune(
        self, desired: set[tuple[str, str, str, str]], keep_states: set[str], *, crd_mode: bool
    ) -> None:
        doomed: list[tuple[dict[str, Any], bool]] = []
        for informer in self.owned.values():
            for obj in informer.objects.values():
                meta = obj.get("metadata") or {}
                state = (meta.get("labels") or {}).get(keys.OPERATOR_STATE_LABEL)
                if state in keep_states or _ref(obj) in desired:
                    continue
                if not _owned_by(obj, self.active_uid):
                    continue  # not created by the active policy: not ours to delete
                orphan = (
                    crd_mode
                    and obj.get("kind") == "DaemonSet"
                    and str(meta.get("name")).startswith(DRIVER_DS_PREFIXES)
                )
                doomed.append((obj, orphan))
        for obj, orphan in doomed:
            log.info("deleting %s %s (no longer wanted)", obj.get("kind"), _ref(obj)[3])
            await self.writer.delete(obj, orphan=orphan)

    async def _report_transitions(
        self, active: dict[str, Any], reports: list[summary.StateReport]
    ) -> None:
        for report in reports:
            before = self._last_state_outcomes.get(report.name)
            self._last_state_outcomes[report.name] = report.outcome
            if before is None or before == report.outcome:
                continue
            if report.outcome == "failed":
                await self.writer.event(
                    active, reason="StateFailed", type_="Warning",
                    message=f"{report.name}: {report.message}",
                )  # fmt: skip
            elif report.outcome == "ready" and before in ("notReady", "failed"):
                await self.writer.event(
                    active, reason="StateReady", message=f"{report.name} is ready"
                )

    # ----- nodes ------------------------------------------------------------------------------

    def _node_settled(self, name: str) -> None:
        if name in self.pending_nodes:
            self.pending_nodes.discard(name)
            if not self.pending_nodes:
                self.queue.add_after(POLICY_KEY, self.settings.status_debounce)

    async def reconcile_node(self, name: str) -> None:
        """Bring one node's labels in line with the active policy (or clean up after it)."""
        node = self.nodes.get(name)
        if node is None:
            self.conflicts.pop(name, None)
            self._node_settled(name)
            return
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        if self.label_policy is None:
            if self.active_policy() is not None:
                return  # the policy is invalid or not reconciled yet: leave nodes alone
            if ledger.ANNOTATION not in annotations:
                self._node_settled(name)
                return
            plan = labelling.plan_cleanup(labels, annotations)
        else:
            plan = labelling.plan_node(labels, annotations, self.label_policy)
        if not plan.empty:
            # Settled only when the watch brings our write back and the plan comes out empty.
            await self.writer.patch_node(name, plan.merge_patch())
        else:
            self._node_settled(name)
        had = bool(self.conflicts.get(name))
        if plan.conflicts:
            self.conflicts[name] = plan.conflicts
            for conflict in plan.conflicts:
                if (name, conflict) not in self._reported_conflicts:
                    self._reported_conflicts.add((name, conflict))
                    await self.writer.event(
                        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
                         "uid": meta.get("uid")}},
                        reason="LabelLeftAlone", type_="Warning", message=conflict,
                    )  # fmt: skip
        else:
            self.conflicts.pop(name, None)
        if had != bool(plan.conflicts):
            self.queue.add_after(POLICY_KEY, self.settings.status_debounce)


def _owned_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    if not uid:
        return False
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid for ref in refs)


def _index_by_owner(
    pods: Iterable[readiness.PodSummary], revisions: Iterable[dict[str, Any]]
) -> dict[str, tuple[list[readiness.PodSummary], list[dict[str, Any]]]]:
    """Pod summaries and ControllerRevisions grouped by the uid of their owner."""
    index: dict[str, tuple[list[readiness.PodSummary], list[dict[str, Any]]]] = {}
    for pod in pods:
        for uid in pod.owner_uids:
            index.setdefault(uid, ([], []))[0].append(pod)
    for revision in revisions:
        for ref in (revision.get("metadata") or {}).get("ownerReferences") or []:
            index.setdefault(str(ref.get("uid")), ([], []))[1].append(revision)
    return index


def _without_times(status: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(status)
    out["conditions"] = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"}
        for c in status.get("conditions") or []
    ]
    return out


__all__ = ["Operator", "Settings"]
