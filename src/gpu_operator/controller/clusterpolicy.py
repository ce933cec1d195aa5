"""The ClusterPolicy reconciler: render every operand state, apply what changed, prune what is no
longer wanted, and report status.

One work key, `policy`: the oldest live ClusterPolicy is in charge. Node labels are the node
labelling reconciler's (controller/nodelabels.py); this one hands it the label policy and counts
the nodes still being labelled as not ready.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from gpu_operator import api
from gpu_operator.api import crds as crd_schema
from gpu_operator.api import enablement, keys
from gpu_operator.controller import drift, strip, validate_refs
from gpu_operator.controller import facts as facts_mod
from gpu_operator.controller.metrics import (
    STATUS_ERROR,
    STATUS_NO_POLICY,
    STATUS_NOT_READY,
    STATUS_READY,
)
from gpu_operator.controller.node_verdicts import NodeVerdicts
from gpu_operator.controller.nodelabels import NodeLabels
from gpu_operator.controller.runtime import (
    CRDS,
    GPU_CLUSTERS,
    NODES,
    OWNED_KINDS,
    PODS,
    POLICIES,
    REVISIONS,
    Reconciler,
    Request,
    Runtime,
    Watch,
)
from gpu_operator.kube import resources
from gpu_operator.kube.errors import describe
from gpu_operator.kube.writer import content_hash, needs_write
from gpu_operator.nodes import coexist, gate, labelling
from gpu_operator.operands import config_manager, dcgm_exporter, device_plugin, readiness, registry
from gpu_operator.operands.facts import ClusterFacts
from gpu_operator.status import coalesce, conditions, explain, rollout, summary
from gpu_operator.status import gpucluster as gc_status
from gpu_operator.upgrade import snapshot as upgrade_snapshot
from gpu_operator.upgrade import states as upgrade_states

log = logging.getLogger(__name__)

POLICY_KEY = "policy"
# Event-driven status passes wait at least this many times the last pass's duration (at most
# MAX_STATUS_SPACING): at thousands of nodes a pass reads every node and pod, and passes spaced by
# one duration (at most 1 s) kept half a core busy through a rollout, and a whole one at 20,000
# nodes, CPU the API server needed to roll the pods out. A pass is at most a quarter of a core.
STATUS_PASS_SPACING = 3.0
# The longest wait (or the status write window, if longer): the status lags a change by at most
# this much on the biggest fleets (a pass of a few milliseconds keeps the configured debounce).
MAX_STATUS_SPACING = 5.0
SERVICEMONITOR_CRD = "servicemonitors.monitoring.coreos.com"
PROMETHEUSRULE_CRD = "prometheusrules.monitoring.coreos.com"
# How long an applied object not yet back from the watch is not applied again (seconds).
ECHO_WAIT = 5.0
OPTIONAL_OWNED_KINDS = (
    ("monitoring.coreos.com/v1", "ServiceMonitor", SERVICEMONITOR_CRD),
    ("monitoring.coreos.com/v1", "PrometheusRule", PROMETHEUSRULE_CRD),
)
OUR_CRDS = ("clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com")
PSA_LABELS = {
    f"pod-security.kubernetes.io/{mode}": "privileged" for mode in ("enforce", "audit", "warn")
}
DRIVER_DS_PREFIXES = ("nvidia-driver-daemonset", "nvidia-vgpu-manager-daemonset")


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ref(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
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


def active_policy(policies: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The ClusterPolicy that would be in charge: the oldest one not being deleted (a GPUCluster
    may still refuse it: policy_in_charge)."""
    live = [p for p in policies if not (p.get("metadata") or {}).get("deletionTimestamp")]
    return min(live, key=_created) if live else None


def policy_in_charge(rt: Runtime) -> dict[str, Any] | None:
    """The ClusterPolicy the operator acts on, from the shared caches: the active one unless an
    older GPUCluster refuses it (status/gpucluster.py). The ClusterPolicy, NVIDIADriver and
    node-labelling reconcilers all follow this one."""
    active = active_policy(rt.caches[POLICIES].objects.values())
    if active is None or GPU_CLUSTERS not in rt.caches:
        return active
    clusters = rt.caches[GPU_CLUSTERS].objects.values()
    return active if gc_status.policy_in_charge([active], clusters) is not None else None


def outdated_crds(crds: Mapping[str, dict[str, Any]]) -> list[crd_schema.InstalledSchema]:
    """Our CRDs whose installed schema is older than the operator's."""
    schemas = (crd_schema.installed_schema(c) for n, c in crds.items() if n in OUR_CRDS)
    return [schema for schema in schemas if schema.older]


def cluster_facts(rt: Runtime) -> ClusterFacts:
    """The renderers' cluster facts, from the shared caches."""
    caches = rt.caches
    crds = caches[CRDS].objects
    config_maps = caches.owned("v1", "ConfigMap")
    maps = config_maps.objects.values() if config_maps is not None else []
    fold = rt.node_facts
    fold.sync(caches[NODES].objects)
    return facts_mod.from_fold(
        fold,
        namespace=rt.settings.namespace,
        operator_env=rt.settings.operator_env,
        has_servicemonitor_crd=SERVICEMONITOR_CRD in crds,
        has_prometheusrule_crd=PROMETHEUSRULE_CRD in crds,
        config_map_keys={cm["metadata"]["name"]: tuple(cm["keys"]) for cm in maps},
        config_map_data={cm["metadata"]["name"]: cm["data"] for cm in maps if cm.get("data")},
        startup_toleration=taint.toleration() if (taint := rt.settings.startup_taint) else None,
    )


def upgrade_fold(rt: Runtime) -> facts_mod.UpgradeFold:
    """The node cache's upgrade facts (kept from its events), in step with the cache."""
    fold = rt.upgrade_nodes
    fold.sync(rt.caches[NODES].objects)
    return fold


def index_by_owner(
    pods: Iterable[readiness.PodSummary], revisions: Iterable[dict[str, Any]]
) -> dict[str, tuple[list[readiness.PodSummary], list[dict[str, Any]]]]:
    """Pod summaries and ControllerRevisions grouped by the uid of their owner."""
    index: dict[str, tuple[list[readiness.PodSummary], list[dict[str, Any]]]] = {}
    for pod in pods:
        for uid in pod.owner_uids:
            index.setdefault(uid, ([], []))[0].append(pod)
    for revision in revisions:
        for owner in (revision.get("metadata") or {}).get("ownerReferences") or []:
            index.setdefault(str(owner.get("uid")), ([], []))[1].append(revision)
    return index


class PodsByOwner(Mapping[str, tuple[list[readiness.PodSummary], list[dict[str, Any]]]]):
    """`index_by_owner` kept from the pod cache's events (`changed`) instead of regrouping every
    pod each status pass (35,000 pods at 5,000 nodes, every pass; 0.6 s of CPU over the passes
    to ready): a pass then copies out only its DaemonSets' pods. Revisions (a few per
    DaemonSet) are grouped per pass (`with_revisions`).

    Each owner's pods come in the pod cache's order (a replaced pod keeps its place, one deleted
    and added again goes last), so a lookup equals `index_by_owner` over the whole cache. A pod
    whose owners change (adopted or orphaned: rare) would take another place than the cache's:
    the index then asks to be rebuilt from the cache (`stale`).
    """

    def __init__(self) -> None:
        self._pods: dict[str, dict[str, readiness.PodSummary]] = {}
        self._revisions: dict[str, list[dict[str, Any]]] = {}
        self._count = 0
        self.stale = False

    def changed(
        self, key: str, old: readiness.PodSummary | None, new: readiness.PodSummary | None
    ) -> None:
        """One pod cache event: added (old None), replaced, or deleted (new None)."""
        by_owner = self._pods
        if old is not None and new is not None and old.owner_uids == new.owner_uids:
            for uid in new.owner_uids:
                by_owner.setdefault(uid, {})[key] = new  # keeps its place
            return
        if old is not None:
            self._count -= 1
            if new is not None:
                self.stale = True  # its owners changed: it belongs elsewhere in the order
            for uid in old.owner_uids:
                held = by_owner.get(uid)
                if held is not None and held.pop(key, None) is not None and not held:
                    del by_owner[uid]
        if new is not None:
            self._count += 1
            for uid in new.owner_uids:
                by_owner.setdefault(uid, {})[key] = new

    def reset(self, pods: Mapping[str, readiness.PodSummary]) -> None:
        """Rebuild from the whole cache, in its order."""
        self._pods, self._count, self.stale = {}, 0, False
        for key, pod in pods.items():
            self.changed(key, None, pod)

    def held(self) -> int:
        """How many pods the index holds (the cache's size when fed every event)."""
        return self._count

    def with_revisions(self, revisions: Iterable[dict[str, Any]]) -> PodsByOwner:
        """This index, with the revisions grouped by owner for one pass."""
        grouped: dict[str, list[dict[str, Any]]] = {}
        for revision in revisions:
            for owner in (revision.get("metadata") or {}).get("ownerReferences") or []:
                grouped.setdefault(str(owner.get("uid")), []).append(revision)
        self._revisions = grouped
        return self

    def __getitem__(self, uid: str) -> tuple[list[readiness.PodSummary], list[dict[str, Any]]]:
        pods = self._pods.get(uid)
        revisions = self._revisions.get(uid)
        if pods is None and revisions is None:
            raise KeyError(uid)
        return list(pods.values()) if pods else [], revisions or []

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(self._pods), **dict.fromkeys(self._revisions)})

    def __len__(self) -> int:
        return len({*self._pods, *self._revisions})


def _owned_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    if not uid:
        return False
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid for r in refs)


class ClusterPolicyReconciler(Reconciler):
    """Renders, applies, prunes and reports for the active ClusterPolicy."""

    prefix = POLICY_KEY
    # Served ahead of the node keys: a new policy relabels every node, and the pass that applies
    # the DaemonSets must not wait for all of them (pods start as nodes get labelled).
    first_keys = (POLICY_KEY,)

    def __init__(self, rt: Runtime, nodes: NodeLabels) -> None:
        self.rt = rt
        self.nodes = nodes
        self.caches = rt.caches
        self.metrics = rt.metrics
        self.active_uid: str | None = None
        self._last_state_outcomes: dict[str, str] = {}
        self._last_failures: dict[str, str] = {}
        # Messages of the ConfigMap problems and notes already recorded as Events.
        self._reported: set[str] = set()
        self._psa_labelled = False
        self._write_errors: list[BaseException] = []
        self._edit_events: list[tuple[dict[str, Any], str]] = []
        # What was last recorded as an Event, so that a repeated pass does not record it again:
        # hand edits per object, the outdated CRDs.
        self._edits_reported: dict[tuple[str, str, str, str], str] = {}
        self._crds_reported = ""
        self._upgrades_enabled: dict[str, tuple[str, bool]] = {}
        # JSON patches removing what a hand edit added, sent before the DaemonSet's apply.
        self._restore_patches: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
        # The last drift comparison per DaemonSet: (the cached live object, our view, the
        # differences). The cache replaces a live object on every change, so an unchanged one
        # compared with an equal view gives the same differences without walking them again.
        self._drift_seen: dict[
            tuple[str, str, str, str], tuple[dict[str, Any], drift.View, list[drift.Change]]
        ] = {}
        nodes.on_settled = self._poke
        # Most watch events ask for the same debounced pass: one shared answer.
        self._debounced = (Request(POLICY_KEY, rt.settings.status_debounce),)
        self._debounce = rt.settings.status_debounce
        self._status_writes = coalesce.StatusWrites(rt.settings.status_write_interval)
        # The node chain's verdicts the status's worst node comes from, per node (memoized).
        self._verdicts = NodeVerdicts()
        self._owners = PodsByOwner()  # the pod cache by owner uid, from its events
        self._labelling_issues: dict[str, rollout.Issue] = {}  # the last pass's, by node
        self._gpu_nodes = 0  # GPU nodes the last pass saw (none: no DaemonSet was applied)
        # What each object was last applied as (its content hash) over which cached object: a
        # pass before the watch brings the write back does not send it again. Trusted for
        # ECHO_WAIT seconds (an object deleted before the cache saw it is written again).
        self._sent: dict[tuple[str, str, str, str], tuple[str, dict[str, Any] | None, float]] = {}

    # ----- events ------------------------------------------------------------------------------

    def watches(self) -> list[Watch]:
        status = [
            Watch(PODS, self._on_pod),
            Watch(REVISIONS, self._on_status),
            *(Watch(f"owned:{v}/{k}", self._on_status) for v, k in OWNED_KINDS),
        ]
        return [
            Watch(POLICIES, self._on_policy),
            Watch(NODES, self._on_node),
            Watch(CRDS, self._on_crd),
            # A GPUCluster refuses the newer ClusterPolicy (status/gpucluster.py).
            *([Watch(GPU_CLUSTERS, self._on_policy)] if GPU_CLUSTERS in self.caches else []),
            *status,
        ]

    def initial(self) -> list[Request]:
        return [Request(POLICY_KEY)]

    def _poke(self) -> None:
        self.rt.enqueue(POLICY_KEY, self._debounce)

    def _on_policy(self, key: str, old: Any, new: Any) -> list[Request]:
        if old is not None and new is not None:
            same_spec = old.get("spec") == new.get("spec")
            same_meta = (old.get("metadata") or {}).get("deletionTimestamp") == (
                new.get("metadata") or {}
            ).get("deletionTimestamp")
            if same_spec and same_meta:
                return []  # our own status writes come back as events; nothing to do
        return [Request(POLICY_KEY)]

    def _on_node(self, key: str, old: Any, new: Any) -> tuple[Request, ...]:
        if old == new or _facts_input(old) == _facts_input(new):
            return ()
        if not self._gpu_nodes and _gpu_present(new) and not _gpu_present(old):
            return (Request(POLICY_KEY),)  # the first GPU node: the DaemonSets are due now
        return self._debounced

    def _on_status(self, key: str, old: Any, new: Any) -> tuple[Request, ...]:
        return self._debounced if old != new else ()

    def _on_pod(self, key: str, old: Any, new: Any) -> tuple[Request, ...]:
        # The worst node's per-node pod index: a pass regroups the changed nodes' pods only.
        self._verdicts.pods.changed(key, old, new)
        self._owners.changed(key, old, new)
        return self._on_status(key, old, new)

    def _on_crd(self, key: str, old: Any, new: Any) -> list[Request]:
        for api_version, kind, crd in OPTIONAL_OWNED_KINDS:
            if key == crd and new is not None and self.caches.owned(api_version, kind) is None:
                informer = self.caches.add_owned(api_version, kind)
                self.rt.watch(f"owned:{api_version}/{kind}", self._on_status)
                log.info("watching %s (its CRD appeared)", informer.kind)
        if key in (SERVICEMONITOR_CRD, PROMETHEUSRULE_CRD, *OUR_CRDS):
            return [Request(POLICY_KEY)]
        return []

    def failed(self, key: str, err: Exception) -> None:
        self.metrics.failed.inc()
        self.metrics.status.set(STATUS_ERROR)

    # ----- reconcile ---------------------------------------------------------------------------

    def active_policy(self) -> dict[str, Any] | None:
        return active_policy(self.caches[POLICIES].objects.values())

    def policy_in_charge(self) -> dict[str, Any] | None:
        return policy_in_charge(self.rt)

    def cluster_facts(self) -> ClusterFacts:
        return cluster_facts(self.rt)

    async def _patch_status(self, policy: dict[str, Any], status: dict[str, Any]) -> None:
        """Write the status unless unchanged; within the write window, pass again when it ends
        (status/coalesce.py). A failed write raises: the queue retries the pass."""
        name = policy["metadata"]["name"]
        writes = self._status_writes
        decision = writes.decide(name, policy.get("status"), status, time.monotonic())
        if decision.action == "defer":
            self.rt.enqueue_within(POLICY_KEY, decision.delay)
        elif decision.action == "write":
            await self.rt.writer.patch_status(resources.CLUSTER_POLICY, name, status)
            writes.wrote(name, status, time.monotonic())

    async def reconcile(self, key: str) -> None:
        """One pass (below); the debounce of the passes watch events ask for follows its cost."""
        started = time.monotonic()
        try:
            await self._reconcile()
        finally:
            self._space_passes(time.monotonic() - started)

    def _space_passes(self, took: float) -> None:
        """Debounce the event-driven passes by STATUS_PASS_SPACING times the last pass's
        duration (at most MAX_STATUS_SPACING, or the status write window if longer): a pass
        reads every node and pod, so at thousands of nodes passes asked for back to back by a
        rollout's events would keep a core busy. A small cluster keeps the configured debounce.
        Changes to the ClusterPolicy itself are still reconciled at once."""
        settings = self.rt.settings
        longest = max(MAX_STATUS_SPACING, settings.status_write_interval)
        spacing = max(settings.status_debounce, min(STATUS_PASS_SPACING * took, longest))
        if spacing != self._debounce:
            self._debounce = spacing
            self._debounced = (Request(POLICY_KEY, spacing),)

    async def _reconcile(self) -> None:
        """Render, apply, prune and report for the active ClusterPolicy."""
        self.metrics.total.inc()
        namespace = self.rt.settings.namespace
        writer = self.rt.writer
        active = self.active_policy()
        if active is None:
            self.active_uid = None
            self.nodes.set_policy(None)
            self.metrics.status.set(STATUS_NO_POLICY)
            return
        name = active["metadata"]["name"]
        # A copy: the watch adds policies to the cache while the status writes below await.
        for other in list(self.caches[POLICIES].objects.values()):
            if other is not active and (other.get("status") or {}).get("state") != "ignored":
                status = summary.ignored(
                    active=name, namespace=namespace, now=now(),
                    generation=(other.get("metadata") or {}).get("generation"),
                )  # fmt: skip
                await writer.patch_status(
                    resources.CLUSTER_POLICY, other["metadata"]["name"], status
                )
        generation = (active.get("metadata") or {}).get("generation")
        if await self._refused_by_gpu_cluster(active):
            return
        outdated = outdated_crds(self.caches[CRDS].objects)
        if outdated:
            message = "; ".join(schema.message for schema in outdated)
            log.error("refusing to reconcile: %s", message)
            before = (active.get("status") or {}).get("conditions") or []
            # Not again while the status written for it has not come back from the watch (or
            # waits for its write window), nor after a restart when the status already says it.
            said = any(c.get("reason") == conditions.CRD_OUTDATED for c in before)
            if not said and self._crds_reported != message:
                await writer.event(
                    active, reason=conditions.CRD_OUTDATED, type_="Warning", message=message
                )
            self._crds_reported = message
            await self._patch_status(
                active,
                summary.refused(
                    conditions.CRD_OUTDATED, message, namespace=namespace,
                    now=now(), generation=generation, previous=active.get("status"),
                ),
            )  # fmt: skip
            self.metrics.status.set(STATUS_ERROR)
            return
        self._crds_reported = ""
        too_deep = active.get(strip.TOO_DEEP)
        checked = api.check_document(active)
        if too_deep or not checked.ok or not isinstance(checked.obj, api.ClusterPolicy):
            problems = [*(too_deep or []), *(str(p) for p in checked.errors)]
            log.warning("ClusterPolicy %s is invalid: %s", name, "; ".join(problems))
            await self._patch_status(
                active,
                summary.invalid(
                    problems,
                    namespace=namespace,
                    now=now(),
                    generation=generation,
                    previous=active.get("status"),
                ),
            )
            self.metrics.status.set(STATUS_ERROR)
            return
        policy = checked.obj
        self.active_uid = active["metadata"].get("uid")
        self.nodes.set_policy(labelling.LabelPolicy.from_policy(policy))
        if enablement.is_enabled(policy.spec, "psa") and not self._psa_labelled:
            await writer.patch_namespace_labels(namespace, PSA_LABELS)
            self._psa_labelled = True
        # Taken before the facts: node work finishing during this pass must not make the
        # facts we rendered from look complete.
        pending = sorted(self.nodes.pending)
        facts = self.cluster_facts()
        self._gpu_nodes = facts.gpu_node_count
        self._write_errors = []
        self._edit_events = []
        refs = validate_refs.check_facts(policy, facts)
        notes = policy_notes(refs, dcgm_exporter.service_monitor_skipped(policy, facts))
        reports = await self._sync_states(policy, active, facts, refs.blocked)
        reports = with_notes(reports, notes)
        # Once per edit: a pass that reads the edited object again before the restore comes
        # back from the watch, or that is retried after a rejected write, finds the same edit.
        edits_reported: dict[tuple[str, str, str, str], str] = {}
        for edited, message in self._edit_events:
            edits_reported[ref(edited)] = message
            if self._edits_reported.get(ref(edited)) != message:
                await writer.event(
                    edited, reason="HandEditReverted", type_="Warning", message=message
                )
        self._edits_reported = edits_reported
        if pending:
            shown = labelling.pending_message(*self._by_gpu(pending))
            # One Issue per pending node, made when it starts pending, not on every pass.
            known = self._labelling_issues
            issues = tuple(known.get(n) or rollout.Issue(n, "labelling") for n in pending)
            self._labelling_issues = {issue.node: issue for issue in issues}
            relabel = rollout.Workload(
                "node-labelling", shown, labelling=True, issues=issues,
            )  # fmt: skip
            judged = rollout.judge([relabel], self.upgrade_view(every_owner=True))
            labels_report = summary.StateReport(
                "node-labelling", "notReady", shown, planned=judged.planned, driver=judged.upgrade
            )
            reports.insert(0, labels_report)
        status = summary.build(
            reports,
            summary.ClusterView(
                has_nfd=facts.has_nfd,
                gpu_nodes=facts.gpu_node_count,
                label_conflicts=sum(len(c) for c in self.nodes.conflicts.values()),
                preinstalled_drivers=self.preinstalled_drivers(),
                coexistence=coexist.summary(self.nodes.coexist_findings),
                worst_node=self.worst_node(policy),
                startup_gate=gate.waiting_summary(self.nodes.gate_waiting()),
                notes=tuple(finding.message for _, finding in notes),
            ),
            namespace=namespace,
            now=now(),
            generation=generation,
            previous=active.get("status"),
        )
        await self._report_transitions(active, reports)
        await self._report_findings(active, [*refs.problems, *(f for _, f in notes)])
        await self._patch_status(active, status)
        ready = status["state"] == "ready"
        self.metrics.status.set(STATUS_READY if ready else STATUS_NOT_READY)
        self.metrics.gpu_nodes.set(facts.gpu_node_count)
        self.metrics.has_nfd.set(1 if facts.has_nfd else 0)
        label_policy = self.nodes.label_policy
        self.metrics.auto_upgrade.set(1 if label_policy and label_policy.upgrade_annotation else 0)
        if ready:
            self.metrics.last_success.set(time.time())
        if self._write_errors:
            first = self._write_errors[0]
            raise WriteFailed(
                f"{len(self._write_errors)} write(s) rejected, first: {describe(first)}"
            ) from first

    async def _refused_by_gpu_cluster(self, active: dict[str, Any]) -> bool:
        """An older GPUCluster runs the cluster: nothing of this ClusterPolicy is applied, its
        status and an Event say why and what to do (the GPUCluster's side: its reconciler)."""
        if GPU_CLUSTERS not in self.caches:
            return False
        cluster = active_policy(self.caches[GPU_CLUSTERS].objects.values())
        clash = gc_status.conflict(cluster, [active])
        if clash is None or clash.refused_kind != "ClusterPolicy":
            return False
        if self.active_uid is not None:
            self.active_uid = None
            self.nodes.set_policy(None)
        before = (active.get("status") or {}).get("conditions") or []
        said = any(c.get("message") == clash.refused_message for c in before)
        if not said and clash.refused_message not in self._reported:
            await self.rt.writer.event(
                active, reason=gc_status.CONFLICT_REASON, type_="Warning",
                message=clash.refused_message,
            )  # fmt: skip
        self._reported.add(clash.refused_message)
        await self._patch_status(
            active,
            summary.refused(
                gc_status.CONFLICT_REASON, clash.refused_message,
                namespace=self.rt.settings.namespace, now=now(),
                generation=(active.get("metadata") or {}).get("generation"),
                previous=active.get("status"),
            ),
        )  # fmt: skip
        self.metrics.status.set(STATUS_ERROR)
        return True

    def worst_node(self, policy: api.ClusterPolicy) -> str:
        """The node chain's verdict for the GPU node furthest from usable, from the caches
        alone (no capacity, no logs: status/explain.py skips what it cannot know)."""
        spec = policy.spec
        sandbox = spec.sandboxWorkloads
        view = explain.PolicyView(
            driver=enablement.is_enabled(spec, "driver"),
            toolkit=enablement.is_enabled(spec, "toolkit"),
            device_plugin=enablement.is_enabled(spec, "devicePlugin"),
            mig_manager=enablement.is_enabled(spec, "migManager"),
            sandbox_workloads=enablement.sandbox_enabled(spec),
            default_workload=sandbox.defaultWorkload if sandbox else keys.WORKLOAD_CONTAINER,
        )
        # Walked again only for the nodes whose node object, pods or policy view changed.
        sources = self.nodes.sources
        pods = self.caches[PODS].objects
        if len(self._verdicts.pods) != len(pods):
            # Filled without its events (a cache set up by hand): index the whole cache again.
            self._verdicts.pods.reset(pods)
        worst = self._verdicts.worst(
            self.caches[NODES].objects, None, view,
            sources.dra_slice_objects if sources is not None else None,
        )  # fmt: skip
        return worst.message() if worst is not None else ""

    def preinstalled_drivers(self) -> tuple[str, ...]:
        """GPU nodes whose host runs its own driver while the policy installs drivers."""
        policy = self.nodes.label_policy
        if policy is None or not policy.driver:
            return ()  # `labelling.preinstalled_conflict`: no conflict without our driver
        fold = self.rt.node_labels
        fold.sync(self.caches[NODES].objects)
        names = (
            node.name
            for node in fold.picked.values()
            # The coexistence detector's own `pre-installed` is reported as its finding.
            if not self.nodes.coexist_adapted(node.name)
        )
        return tuple(sorted(names))

    def _owner_reference(self, active: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "name": active["metadata"]["name"],
            "uid": active["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }

    async def _sync_states(
        self,
        policy: api.ClusterPolicy,
        active: dict[str, Any],
        facts: ClusterFacts,
        blocked: Mapping[str, str],
    ) -> list[summary.StateReport]:
        owner = self._owner_reference(active)
        reports: list[summary.StateReport] = []
        desired: set[tuple[str, str, str, str]] = set()
        keep_states: set[str] = set()
        to_write: list[tuple[str, dict[str, Any]]] = []
        self._restore_patches = {}
        daemonsets: dict[str, list[dict[str, Any]]] = {}
        for state in registry.render_all(policy, facts):
            if state.enabled and state.name in blocked:
                # A ConfigMap it mounts is missing or lacks a key (validate_refs): what runs
                # keeps running, nothing new rolls out until the user fixes it.
                keep_states.add(state.name)
                waiting = blocked[state.name]
                if facts.gpu_node_count == 0:
                    waiting = f"nothing to deploy without GPU nodes ({waiting})"
                outcome: summary.StateOutcome = "ready" if facts.gpu_node_count == 0 else "notReady"
                reports.append(summary.StateReport(state.name, outcome, waiting))
                continue
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
                if self.caches.owned(str(obj.get("apiVersion")), str(obj.get("kind"))) is None:
                    continue  # e.g. a ServiceMonitor whose CRD is not installed
                obj.setdefault("metadata", {})["ownerReferences"] = [owner]
                desired.add(ref(obj))
                live = self.caches.live(obj)
                if (needs_write(obj, live) or (
                    live is not None and obj.get("kind") == "DaemonSet"
                    and self._hand_edited(obj, live)
                )) and not self._echo_pending(obj, live):  # fmt: skip
                    to_write.append((state.name, obj))
                if obj.get("kind") == "DaemonSet":
                    daemonsets.setdefault(state.name, []).append(obj)
            reports.append(summary.StateReport(state.name, "ready"))
        # Written over an existing object: a new spec rolling out, not an install.
        before = {ref(obj): self.caches.live(obj) for _, obj in to_write}
        updated = {key for key, live in before.items() if live is not None}
        for _, obj in to_write:
            log.debug("applying %s %s", obj.get("kind"), ref(obj)[3])
        results = await asyncio.gather(
            *(self._write(obj) for _, obj in to_write), return_exceptions=True
        )
        written = {ref(obj) for _, obj in to_write}
        # A rejected write fails its state at once (the status says why, an Event is recorded);
        # `reconcile` raises afterwards so the queue retries the pass with backoff.
        rejected: dict[str, str] = {}
        for (state_name, obj), result in zip(to_write, results, strict=True):
            if isinstance(result, asyncio.CancelledError):
                raise result
            if isinstance(result, BaseException):
                self._write_errors.append(result)
                what = f"{obj.get('kind')} {ref(obj)[3]}"
                log.debug("writing %s failed: %s", what, describe(result))
                rejected.setdefault(state_name, f"writing {what} failed: {describe(result)}")
            else:
                self._sent[ref(obj)] = (content_hash(obj), before[ref(obj)], time.monotonic())
        reports = [
            summary.StateReport(r.name, "failed", rejected[r.name]) if r.name in rejected else r
            for r in reports
        ]
        # Objects no longer desired (pruned, disabled) are applied afresh if wanted again.
        self._sent = {key: sent for key, sent in self._sent.items() if key in desired}
        await self._prune(
            desired, keep_states, crd_mode=bool(policy.spec.driver.useNvidiaDriverCRD)
        )
        pods = self.caches[PODS].objects
        owners = self._owners
        if owners.stale or owners.held() != len(pods):
            # Filled without its events (a cache set up by hand), or a pod changed owners.
            owners.reset(pods)
        by_owner = owners.with_revisions(self.caches[REVISIONS].objects.values())
        own, every = self.upgrade_view(), self.upgrade_view(every_owner=True)
        judged = []
        for r in reports:
            upgrade = own if r.name == DRIVER_STATE else every
            owned = daemonsets.get(r.name, [])
            judged.append(self._readiness(r, owned, written, updated, by_owner, upgrade))
        return judged

    def _echo_pending(self, desired: dict[str, Any], live: dict[str, Any] | None) -> bool:
        """Whether `desired` was applied over the cached object still in the cache: the watch
        has not brought the write back yet (a pass right after the one that wrote it)."""
        sent = self._sent.get(ref(desired))
        if sent is not None and (sent[1] is not live or time.monotonic() - sent[2] > ECHO_WAIT):
            del self._sent[ref(desired)]  # the cache moved on: compare with what it holds
            return False
        return sent is not None and sent[0] == content_hash(desired)

    def _hand_edited(self, desired: dict[str, Any], live: dict[str, Any]) -> bool:
        """Whether someone changed fields we render on a live DaemonSet (our hash annotation is
        unchanged then); records a Warning Event naming the fields and who changed them."""
        wanted = drift.view(desired)
        seen = self._drift_seen.get(ref(desired))
        if seen is not None and seen[0] is live and seen[1] == wanted:
            diffs = seen[2]
        else:
            diffs = drift.differences(wanted, live.get("drift"))
            self._drift_seen[ref(desired)] = (live, wanted, diffs)
        if not diffs:
            return False
        editors = live.get("editors") or []
        manager = drift.who_changed(diffs[0].path, editors)
        name = f"DaemonSet {live['metadata'].get('name')}"
        message = drift.message(name, diffs, manager)
        log.warning("%s", message)
        self._edit_events.append((live, message))
        patch = drift.restore_patch(diffs, str(live["metadata"].get("resourceVersion") or ""))
        if patch is not None:
            self._restore_patches[ref(desired)] = patch
        return True

    async def _write(self, obj: dict[str, Any]) -> None:
        """Apply an object; a hand-edited DaemonSet with additions to remove first gets its
        restoring JSON patch (server-side apply keeps fields other managers added)."""
        patch = self._restore_patches.pop(ref(obj), None)
        if patch is not None and not await self.rt.writer.json_patch(obj, patch):
            # It changed since we judged it: that change's watch event brings a new pass.
            log.info("%s %s changed while being restored; judging it again", obj.get("kind"),
                     ref(obj)[3])  # fmt: skip
            return
        await self.rt.write(obj)

    def upgrade_view(self, *, every_owner: bool = False) -> rollout.Upgrade:
        """Where the nodes of the policy's own driver stand in the driver upgrade; with
        `every_owner`, every node's (NVIDIADrivers' upgrades restart operands too)."""
        active = self.active_policy()
        enabled = active is not None and upgrades_enabled(active, self._upgrades_enabled)
        return upgrade_view(
            (), owner=None, enabled=enabled, every_owner=every_owner,
            fold=upgrade_fold(self.rt),
        )  # fmt: skip

    def _by_gpu(self, names: Iterable[str]) -> tuple[list[str], list[str]]:
        """The nodes NFD found an NVIDIA GPU on, and the others (from the node cache)."""
        gpu: list[str] = []
        other: list[str] = []
        fold = self.rt.node_labels
        fold.sync(self.caches[NODES].objects)
        read = fold.values.get
        for name in names:
            found = read(name)
            (gpu if found is not None and found.nfd_gpu else other).append(name)
        return gpu, other

    def _readiness(
        self,
        report: summary.StateReport,
        daemonsets: list[dict[str, Any]],
        written: set[tuple[str, str, str, str]],
        updated: set[tuple[str, str, str, str]],
        by_owner: Mapping[str, tuple[list[readiness.PodSummary], list[dict[str, Any]]]],
        upgrade: rollout.Upgrade,
    ) -> summary.StateReport:
        """A ready state's readiness from its DaemonSets' pods, judged against planned work
        (status/rollout.py): a driver upgrade or a new spec rolling out is not an error."""
        if report.outcome != "ready":
            return report
        driver = report.name == DRIVER_STATE
        workloads: list[rollout.Workload] = []
        for ds in daemonsets:
            name = ds["metadata"]["name"]
            if ref(ds) in written:
                workloads.append(rollout.Workload(
                    name, f"{name}: rolling out the new spec", updating=ref(ds) in updated,
                    driver=driver,
                ))  # fmt: skip
                continue
            live = self.caches.live(ds)
            if live is None:
                workloads.append(rollout.Workload(name, f"{name}: not created yet", driver=driver))
                continue
            pods, revisions = by_owner.get(str(live["metadata"].get("uid")), ([], []))
            # The pods-by-owner index picked them by this DaemonSet's uid already.
            verdict = readiness.daemonset_readiness(live, pods, revisions, owned=True)
            if not verdict.ready:
                workloads.append(
                    workload(live, verdict, pods, revisions, driver=driver, owned=True)
                )
        judged = rollout.judge(workloads, upgrade, driver=driver)
        if judged.kind == "ready":
            return report
        return summary.StateReport(
            report.name, "notReady", judged.message, planned=judged.planned,
            driver=judged.upgrade,
        )  # fmt: skip

    async def _prune(
        self, desired: set[tuple[str, str, str, str]], keep_states: set[str], *, crd_mode: bool
    ) -> None:
        doomed: list[tuple[dict[str, Any], bool]] = []
        for api_version, kind in self.caches.owned_kinds():
            informer = self.caches.owned(api_version, kind)
            assert informer is not None
            for obj in informer.objects.values():
                meta = obj.get("metadata") or {}
                state = (meta.get("labels") or {}).get(keys.OPERATOR_STATE_LABEL)
                if state in keep_states or ref(obj) in desired:
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
            log.info("deleting %s %s (no longer wanted)", obj.get("kind"), ref(obj)[3])
            await self.rt.writer.delete(obj, orphan=orphan)

    async def _report_transitions(
        self, active: dict[str, Any], reports: list[summary.StateReport]
    ) -> None:
        """A Warning Event for each new failure of a state; a StateReady Event when a state
        that was not ready is ready again. While planned work goes on (a driver upgrade flaps
        the validator on every node it upgrades), a state turning ready again is announced
        once that work is over: one Event per state and rollout, not one per node or pass."""
        writer = self.rt.writer
        planned = summary.in_progress(reports)
        for report in reports:
            before = self._last_state_outcomes.get(report.name)
            if planned and report.outcome == "ready" and before in ("notReady", "failed"):
                continue  # still remembered as not ready: announced when the work is over
            self._last_state_outcomes[report.name] = report.outcome
            if report.outcome == "failed":
                # Every new reason is news, also on the first pass (e.g. a bad ConfigMap that was
                # there before the operator started) and when one failure replaces another.
                if self._last_failures.get(report.name) != report.message:
                    self._last_failures[report.name] = report.message
                    message = report.message
                    if not message.startswith(report.name):
                        message = f"{report.name}: {message}"
                    await writer.event(
                        active, reason="StateFailed", type_="Warning", message=message
                    )
                continue
            self._last_failures.pop(report.name, None)
            if before is None or before == report.outcome:
                continue
            if report.outcome == "ready" and before in ("notReady", "failed"):
                await writer.event(active, reason="StateReady", message=f"{report.name} is ready")

    async def _report_findings(
        self, active: dict[str, Any], findings: list[validate_refs.Finding]
    ) -> None:
        """One Event per ConfigMap problem or note, when it first shows: not again on later
        passes, nor after a restart when the status already says it; again if it comes back."""
        previous = active.get("status") or {}
        shown = "\n".join(
            str(item.get("message") or "")
            for key in ("states", "conditions")
            for item in previous.get(key) or []
            if isinstance(item, dict)
        )
        current: set[str] = set()
        for finding in findings:
            current.add(finding.message)
            if finding.message in self._reported or finding.message in shown:
                continue
            await self.rt.writer.event(
                active,
                reason=finding.reason,
                type_="Warning" if finding.warning else "Normal",
                message=finding.message,
            )
        self._reported = current


def policy_notes(
    refs: validate_refs.FactsReport, monitor: dcgm_exporter.MonitorSkipped | None
) -> list[tuple[str, validate_refs.Finding]]:
    """What the status says without holding a state back, by the state it concerns: a
    device-plugin ConfigMap no node uses, a ServiceMonitor without its CRD."""
    notes = [(device_plugin.NAME, finding) for finding in refs.notes]
    if monitor is not None:
        finding = validate_refs.Finding(
            "ServiceMonitorSkipped", monitor.message, warning=monitor.explicit
        )
        notes.append((dcgm_exporter.NAME, finding))
    return notes


def with_notes(
    reports: list[summary.StateReport], notes: list[tuple[str, validate_refs.Finding]]
) -> list[summary.StateReport]:
    """A ready state with nothing else to say says its notes."""
    by_state: dict[str, list[str]] = {}
    for state, finding in notes:
        by_state.setdefault(state, []).append(finding.message)
    return [
        dataclasses.replace(r, message="; ".join(by_state[r.name]))
        if r.outcome == "ready" and not r.message and r.name in by_state
        else r
        for r in reports
    ]


DRIVER_STATE = "state-driver"


def workload(
    live: Mapping[str, Any],
    verdict: readiness.Readiness,
    pods: list[readiness.PodSummary],
    revisions: list[dict[str, Any]],
    *,
    driver: bool,
    owned: bool = False,
) -> rollout.Workload:
    """A not-ready DaemonSet as status/rollout.py judges it: whether a new spec of it is rolling
    out (it was updated, not created: generation above 1, and its controller has not caught up
    or, rolling updates, pods of the older template remain) and its pods' problems."""
    name = str(live["metadata"].get("name"))
    status = live.get("status") or {}
    generation = int(live["metadata"].get("generation") or 0)
    strategy = ((live.get("spec") or {}).get("updateStrategy") or {}).get("type", "RollingUpdate")
    lagging = int(status.get("observedGeneration") or 0) < generation or (
        strategy != "OnDelete" and int(status.get("updatedNumberScheduled") or 0) < verdict.desired
    )
    issues = tuple(
        rollout.Issue(
            node=issue.pod.node or issue.pod.name,
            text=issue.text,
            reasons=issue.pod.reasons,
            restarts=issue.pod.restarts,
            outdated=issue.outdated,
        )
        for issue in readiness.pod_issues(dict(live), pods, revisions, owned=owned)
    )
    return rollout.Workload(
        name, verdict.reason or f"{name}: not ready", updating=generation > 1 and lagging,
        issues=issues, driver=driver,
    )  # fmt: skip


def upgrades_enabled(obj: Mapping[str, Any], memo: dict[str, tuple[str, bool]]) -> bool:
    """Whether the driver upgrades of a ClusterPolicy or NVIDIADriver run (autoUpgrade on, its
    upgrade policy usable), as the upgrade planner reads it; once per resourceVersion."""
    meta = obj.get("metadata") or {}
    key = str(meta.get("uid") or meta.get("name"))
    version = str(meta.get("resourceVersion") or "")
    found = memo.get(key)
    if found is None or found[0] != version:
        policy = upgrade_snapshot.owner_from(dict(obj)).policy
        found = (version, policy.auto_upgrade and policy.error is None)
        memo[key] = found
    return found[1]


# Status passes read every node's upgrade labels several times a pass (node cache objects).
_upgrade_facts_of = facts_mod.PerNode(facts_mod.upgrade_facts)


def upgrade_view(
    nodes: Iterable[Mapping[str, Any]],
    *,
    owner: str | None,
    enabled: bool,
    every_owner: bool = False,
    cached: bool = False,
    fold: facts_mod.UpgradeFold | None = None,
) -> rollout.Upgrade:
    """Where the driver nodes of one owner stand in the upgrade, from their state labels: the
    ClusterPolicy's (`owner` None: nodes without an NVIDIADriver owner label) or one
    NVIDIADriver's; with `every_owner`, every node (the ClusterPolicy's other operands restart
    on a node whose driver is replaced, whichever owns it). Nodes labelled to skip upgrades are
    set apart (upstream's status leaves them out). `enabled`: the owner's upgrades run
    (autoUpgrade on, a usable upgrade policy). `cached`: the nodes are node cache objects
    (replaced on change, never edited in place): each is read once (`facts.PerNode`). `fold`:
    the node cache's `facts.UpgradeFold`, in step with `nodes` (only its picked nodes count)."""
    found: dict[str, str] = {}
    failures: dict[str, str] = {}
    skipped: set[str] = set()
    if fold is not None:
        read: Iterable[facts_mod.UpgradeFacts] = fold.picked.values()
    elif cached:
        read = _upgrade_facts_of(nodes)
    else:
        read = map(facts_mod.upgrade_facts, nodes)
    for node in read:
        if not every_owner and node.owner != owner:
            continue
        if node.skip:
            skipped.add(node.name)
            continue
        if not node.state:
            continue
        found[node.name] = node.state
        if node.state == upgrade_states.UPGRADE_FAILED:
            failures[node.name] = node.failure
    return rollout.Upgrade(found, failures, enabled=enabled, skipped=frozenset(skipped))


class WriteFailed(Exception):
    """Some of a pass's writes were rejected; the status already says which (retried)."""


def _gpu_present(node: dict[str, Any] | None) -> bool:
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    return bool(labels.get(keys.GPU_PRESENT) == "true")


def _facts_input(node: dict[str, Any] | None) -> tuple[Any, ...]:
    """What the cluster facts read from a node: a change elsewhere does not re-render."""
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
        labels.get(keys.DEPLOY_DRIVER),  # a preinstalled driver shows in the status
        # The status says where the driver upgrade stands, and why a node failed it.
        labels.get(keys.UPGRADE_STATE),
        labels.get(keys.UPGRADE_SKIP),
        labels.get(keys.DRIVER_OWNER),
        ((node.get("metadata") or {}).get("annotations") or {}).get(upgrade_states.FAILURE),
        labels.get(config_manager.NODE_LABEL),  # which device-plugin config nodes use
        # The status names the nodes at the readiness gate: a taint removed changes it.
        tuple((t.get("key"), t.get("effect")) for t in node.get("taints") or ()),
        (node.get("status") or {}).get("gpuAllocatable") if node.get("taints") else None,
    )


__all__ = ["ClusterPolicyReconciler", "active_policy", "index_by_owner", "policy_in_charge"]
