"""The NVIDIADriver reconciler: per-pool driver DaemonSets, node ownership, the hand-over from the
ClusterPolicy, and each NVIDIADriver's status.

One work key, `nvidiadrivers`: ownership conflicts and the default driver make every driver's
answer depend on the others, and there are few of them, so one pass plans them all
(operands/nvidiadriver.py). Node owner labels are written by the node labelling reconciler, which
asks `owner_label` for each node.

The hand-over: with `spec.driver.useNvidiaDriverCRD` the ClusterPolicy deletes its driver
DaemonSet with orphan propagation, so the driver pods keep running. Once a node carries its owner
label and its pool's DaemonSet has a revision, an orphaned driver pod whose pod is the pool's pod
(same fingerprint, placement aside) is adopted: its labels, revision hash and controller reference
are patched to the pool DaemonSet's, and the DaemonSet controller counts it as its up-to-date pod
(and deletes the surplus pod it may have created meanwhile, which upstream's anti-affinity keeps
Pending). The driver never restarts. Any other orphan is marked `upgrade-required` for the upgrade
flow to replace, as upstream does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from gpu_operator import api
from gpu_operator.api import keys
from gpu_operator.controller import clusterpolicy as cp
from gpu_operator.controller import runtime
from gpu_operator.controller.nodelabels import NodeLabels
from gpu_operator.controller.runtime import Reconciler, Request, Runtime, Watch, owned_name
from gpu_operator.kube import resources
from gpu_operator.kube.writer import needs_write
from gpu_operator.nodes import labelling, ownership
from gpu_operator.operands import nvidiadriver as plan_mod
from gpu_operator.operands import readiness
from gpu_operator.status import coalesce, conditions, rollout
from gpu_operator.status import nvidiadriver as nvd_status

log = logging.getLogger(__name__)

KEY = "nvidiadrivers"
CACHE = "nvidiadrivers"
DAEMONSETS = owned_name("apps/v1", "DaemonSet")
_RBAC_CACHES = tuple(
    owned_name(v, k)
    for v, k in (
        ("v1", "ServiceAccount"),
        ("rbac.authorization.k8s.io/v1", "Role"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding"),
        ("rbac.authorization.k8s.io/v1", "ClusterRole"),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    )
)
# Upgrade states after which a node's driver is settled: an orphan there needs an upgrade.
_SETTLED_UPGRADE_STATES = ("", "upgrade-done")


def _driver_owner(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the NVIDIADriver that controls an object, if one does."""
    for owner in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if owner.get("kind") == plan_mod.KIND and owner.get("controller"):
            return str(owner.get("name")), str(owner.get("uid"))
    return None


def selectable(node: Mapping[str, Any]) -> dict[str, str]:
    """A cached node's labels as node selectors see them (see strip.node)."""
    labels: dict[str, str] = (node.get("metadata") or {}).get("labels") or {}
    other = node.get("selectable")
    return {**other, **labels} if other else labels


def _same_spec(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether an update left spec and deletion alone (our own status writes come back so)."""
    return bool(
        old.get("spec") == new.get("spec")
        and (old.get("metadata") or {}).get("deletionTimestamp")
        == (new.get("metadata") or {}).get("deletionTimestamp")
    )


class NVIDIADriverReconciler(Reconciler):
    """Plans and applies every NVIDIADriver in one pass; answers node labelling's owner question."""

    prefix = KEY

    def __init__(self, rt: Runtime, nodes: NodeLabels) -> None:
        self.rt = rt
        self.caches = rt.caches
        self.nodes = nodes
        self.drivers_cache = rt.caches.add(CACHE, resources.NVIDIA_DRIVER)
        nodes.owner_of = self.owner_label
        self._inputs: dict[str, tuple[str, plan_mod.DriverInput]] = {}
        self._drivers: ownership.Drivers | None = None
        self._mode_memo: tuple[str, api.ClusterPolicy | None] | None = None
        self._active = False
        self._reported: dict[str, str] = {}
        self._upgrades_enabled: dict[str, tuple[str, bool]] = {}
        self._debounced = (Request(KEY, rt.settings.status_debounce),)
        self._no_policy_message = plan_mod.NO_POLICY_MESSAGE
        self._status_writes = coalesce.StatusWrites(rt.settings.status_write_interval)

    # ----- events ------------------------------------------------------------------------------

    def watches(self) -> list[Watch]:
        return [
            Watch(CACHE, self._on_driver),
            Watch(runtime.POLICIES, self._on_policy),
            # A GPUCluster refuses a newer ClusterPolicy (cp.policy_in_charge).
            *(
                [Watch(runtime.GPU_CLUSTERS, self._on_cluster)]
                if runtime.GPU_CLUSTERS in self.caches
                else []
            ),
            Watch(runtime.CRDS, self._on_crd),
            Watch(runtime.NODES, self._on_node),
            Watch(runtime.PODS, self._on_pod),
            Watch(runtime.REVISIONS, self._on_revision),
            Watch(DAEMONSETS, self._on_daemonset),
        ]

    def initial(self) -> list[Request]:
        return [Request(KEY)]

    def _on_driver(self, key: str, old: Any, new: Any) -> list[Request]:
        if old is not None and new is not None and _same_spec(old, new):
            return []  # our own status writes
        before = self._drivers
        self._drivers = None
        if before is None or before != self.drivers():
            self.nodes.relabel_all()
        return [Request(KEY)]

    def _on_policy(self, key: str, old: Any, new: Any) -> list[Request]:
        if old is not None and new is not None and _same_spec(old, new):
            return []  # a status write
        self._mode_memo = None
        return [Request(KEY)]

    def _on_cluster(self, key: str, old: Any, new: Any) -> list[Request]:
        self._mode_memo = None  # its status may settle a tie (status/gpucluster.py)
        return [Request(KEY)]

    def _on_crd(self, key: str, old: Any, new: Any) -> list[Request]:
        if key not in cp.OUR_CRDS:
            return []
        self._mode_memo = None
        return [Request(KEY)]

    def _on_node(self, key: str, old: Any, new: Any) -> tuple[Request, ...]:
        return self._debounced if self._active and old != new else ()

    def _on_pod(self, key: str, old: Any, new: Any) -> tuple[Request, ...]:
        if not self._active or old == new:
            return ()
        if any(p is not None and p.component == plan_mod.COMPONENT for p in (old, new)):
            return self._debounced
        return ()

    def _on_revision(self, key: str, old: Any, new: Any) -> tuple[Request, ...]:
        if self._active and any(r is not None and "fingerprint" in r for r in (old, new)):
            return self._debounced
        return ()

    def _on_daemonset(self, key: str, old: Any, new: Any) -> tuple[Request, ...]:
        if old == new or not any(o is not None and _driver_owner(o) for o in (old, new)):
            return ()
        if new is None and not self._active and not self._pool_daemonsets():
            # The last pool DaemonSet is gone: owner labels can go now.
            self.nodes.relabel_all()
        return self._debounced

    # ----- reading the caches ------------------------------------------------------------------

    def _driver_inputs(self) -> list[plan_mod.DriverInput]:
        """Every NVIDIADriver, read and checked once per resourceVersion."""
        found: list[plan_mod.DriverInput] = []
        seen: set[str] = set()
        for name, obj in self.drivers_cache.objects.items():
            version = str((obj.get("metadata") or {}).get("resourceVersion"))
            memo = self._inputs.get(name)
            if memo is None or memo[0] != version:
                memo = (version, plan_mod.DriverInput.from_object(obj))
                self._inputs[name] = memo
            found.append(memo[1])
            seen.add(name)
        for name in [n for n in self._inputs if n not in seen]:
            del self._inputs[name]
        return sorted(found, key=lambda d: d.name)

    def drivers(self) -> ownership.Drivers:
        if self._drivers is None:
            self._drivers = plan_mod.drivers_of(self._driver_inputs())
        return self._drivers

    def _mode(self) -> tuple[str, api.ClusterPolicy | None]:
        """("active" | "disabled" | "no-policy" | "unknown", the validated active policy).

        "unknown": a ClusterPolicy exists but cannot be acted on (invalid, or our CRDs are older
        than the operator): nothing is changed until it can.
        """
        # Node labelling asks once per node: the answer is kept until a policy or CRD event.
        if self._mode_memo is None:
            self._mode_memo = self._read_mode()
        return self._mode_memo

    def _read_mode(self) -> tuple[str, api.ClusterPolicy | None]:
        # A ClusterPolicy a GPUCluster refuses is no policy here either (it deploys nothing).
        active = cp.policy_in_charge(self.rt)
        candidate = cp.active_policy(self.caches[runtime.POLICIES].objects.values())
        self._no_policy_message = plan_mod.NO_POLICY_MESSAGE
        if active is None and candidate is not None:
            self._no_policy_message = plan_mod.refused_policy_message(
                str(candidate["metadata"]["name"])
            )
        if active is None:
            return "no-policy", None
        if cp.outdated_crds(self.caches[runtime.CRDS].objects):
            return "unknown", None
        checked = api.check_document(active)
        if not checked.ok or not isinstance(checked.obj, api.ClusterPolicy):
            return "unknown", None
        return plan_mod.mode_of(True, checked.obj), checked.obj

    def _pool_daemonsets(self) -> list[dict[str, Any]]:
        return [d for d in self.caches[DAEMONSETS].objects.values() if _driver_owner(d)]

    def owner_label(self, node: Mapping[str, Any]) -> labelling.OwnerLabel | None:
        """The owner label node labelling should write on a (cached) node; None when the node
        has none and should have none (the ClusterPolicy keeps the driver)."""
        mode, _ = self._mode()
        if mode == "active":
            drivers = self.drivers()
            decision = ownership.owner_of(selectable(node), drivers)
            return ownership.label_for(decision, drivers)
        labels: Mapping[str, str] = (node.get("metadata") or {}).get("labels") or {}
        current = labels.get(keys.DRIVER_OWNER)
        if not current:
            return None
        if mode == "unknown" or self._pool_daemonsets():
            # Pool DaemonSets still select nodes by this label: removing it first would delete
            # their driver pods before the DaemonSets are retired.
            return labelling.OwnerLabel(current, keep=True)
        return labelling.OwnerLabel(None)

    # ----- reconcile ---------------------------------------------------------------------------

    async def reconcile(self, key: str) -> None:
        mode, policy = self._mode()
        self._active = mode == "active"
        if mode == "unknown":
            return
        items = self._driver_inputs()
        namespace = self.rt.settings.namespace
        if mode != "active" or policy is None:
            await self._retire(mode)
            for item in items:
                if item.deleting:
                    continue
                state, reason, message = (
                    (nvd_status.DISABLED, conditions.RECONCILED, plan_mod.DISABLED_MESSAGE)
                    if mode == "disabled"
                    else (nvd_status.NOT_READY, nvd_status.NO_POLICY, self._no_policy_message)
                )
                obj = self.drivers_cache.get(item.name)
                status = nvd_status.inactive(
                    message, state=state, reason=reason, namespace=namespace, now=cp.now(),
                    generation=item.generation, previous=(obj or {}).get("status"),
                )  # fmt: skip
                await self._write_status(item.name, status)
            return
        facts = cp.cluster_facts(self.rt)
        node_cache = self.caches[runtime.NODES].objects
        nodes: list[tuple[str, Mapping[str, str]]] = [
            (name, selectable(n)) for name, n in node_cache.items()
        ]
        result = plan_mod.plan("active", items, nodes, policy, facts)
        desired = [*result.accounts, *(d for p in result.drivers.values() for d in p.daemonsets)]
        to_write = [obj for obj in desired if needs_write(obj, self.caches.live(obj))]
        # Written over an existing object: a new spec rolling out, not an install.
        updated = {cp.ref(obj) for obj in to_write if self.caches.live(obj) is not None}
        await asyncio.gather(*(self.rt.write(obj) for obj in to_write))
        written = {cp.ref(obj) for obj in to_write}
        await self._prune(result)
        orphans = [
            plan_mod.DriverPod(p.name, p.node, p.app, p.revision_hash, owned=False)
            for p in self.caches[runtime.PODS].objects.values()
            if p.component == plan_mod.COMPONENT and not p.owner_uids
        ]
        adopted = await self._hand_over(result, nodes, written, orphans)
        # Nodes that still run a driver pod no pool DaemonSet controls: the ClusterPolicy's
        # (until it deletes its DaemonSet) or an orphan waiting for adoption or replacement.
        pools = {str(d["metadata"].get("uid")) for d in self._pool_daemonsets()}
        left = {
            p.node
            for p in self.caches[runtime.PODS].objects.values()
            if p.component == plan_mod.COMPONENT
            and p.name not in adopted
            and not pools.intersection(p.owner_uids)
        }
        by_owner = cp.index_by_owner(
            self.caches[runtime.PODS].objects.values(),
            self.caches[runtime.REVISIONS].objects.values(),
        )
        for item in items:
            if item.deleting or item.name not in result.drivers:
                continue
            entry = result.drivers[item.name]
            obj = self.drivers_cache.get(item.name)
            report = self._report(entry, written, updated, by_owner, left, obj)
            status = nvd_status.build(
                report, namespace=namespace, now=cp.now(), generation=item.generation,
                previous=(obj or {}).get("status"),
            )  # fmt: skip
            await self._write_status(item.name, status)
            await self._report_problems(obj, report)

    async def _write_status(self, name: str, status: dict[str, Any]) -> None:
        obj = self.drivers_cache.get(name)
        if obj is None:
            self._status_writes.forget(name)
            return
        # At most one write per window per NVIDIADriver; the pass repeats when it ends.
        decision = self._status_writes.decide(name, obj.get("status"), status, time.monotonic())
        if decision.action == "defer":
            self.rt.enqueue_within(KEY, decision.delay)
        elif decision.action == "write":
            await self.rt.writer.patch_status(resources.NVIDIA_DRIVER, name, status)
            self._status_writes.wrote(name, status, time.monotonic())

    async def _report_problems(
        self, obj: dict[str, Any] | None, report: nvd_status.DriverReport
    ) -> None:
        """A Warning Event each time a driver's problems change (never twice for the same)."""
        if obj is None:
            return
        name = obj["metadata"]["name"]
        text = "; ".join(message for _, message in report.problems)
        if text and self._reported.get(name) != text:
            await self.rt.writer.event(
                obj, reason=report.problems[0][0], type_="Warning", message=text
            )
        self._reported[name] = text

    def _report(
        self,
        entry: plan_mod.DriverPlan,
        written: set[tuple[str, str, str, str]],
        updated: set[tuple[str, str, str, str]],
        by_owner: dict[str, tuple[list[readiness.PodSummary], list[dict[str, Any]]]],
        orphaned: set[str],
        obj: dict[str, Any] | None,
    ) -> nvd_status.DriverReport:
        """How a driver stands; what keeps it from ready is judged against planned work
        (status/rollout.py): its nodes' driver upgrade, a new spec rolling out, the hand-over."""
        enabled = obj is not None and cp.upgrades_enabled(obj, self._upgrades_enabled)
        upgrade = cp.upgrade_view(
            (), owner=entry.name, enabled=enabled, fold=cp.upgrade_fold(self.rt)
        )
        waiting: list[rollout.Workload] = []
        handing_over = sorted(set(entry.nodes) & orphaned)
        if handing_over:
            shown = ", ".join(handing_over[:3])
            # Planned while upgrades run: a pod that is not adopted is replaced by them.
            waiting.append(rollout.Workload(
                "hand-over",
                f"{len(handing_over)} node(s) still run a driver pod of the ClusterPolicy "
                "(adopted when it is this driver's pod, else replaced by the upgrade flow): "
                f"{shown}",
                updating=upgrade.enabled, driver=True,
            ))  # fmt: skip
        desired = {d["metadata"]["name"]: d for d in entry.daemonsets}
        for pool in entry.pools:
            ds = desired.get(pool.daemonset)
            if ds is None:
                continue  # held back: already a problem
            label = f"pool {pool.pool.label}"
            if cp.ref(ds) in written:
                waiting.append(rollout.Workload(
                    label, f"{label}: rolling out the new spec", updating=cp.ref(ds) in updated,
                    driver=True,
                ))  # fmt: skip
                continue
            live = self.caches.live(ds)
            if live is None:
                waiting.append(
                    rollout.Workload(label, f"{label}: DaemonSet not created yet", driver=True)
                )
                continue
            pods, revisions = by_owner.get(str(live["metadata"].get("uid")), ([], []))
            verdict = readiness.daemonset_readiness(live, pods, revisions)
            if not verdict.ready:
                found = cp.workload(live, verdict, pods, revisions, driver=True)
                waiting.append(dataclasses.replace(
                    found, name=label, problem=f"{label}: {found.problem}"
                ))  # fmt: skip
            elif verdict.desired < len(pool.pool.nodes):
                # The DaemonSet selects a node only once its owner label is written.
                missing = len(pool.pool.nodes) - verdict.desired
                waiting.append(rollout.Workload(
                    label, f"{label}: {missing} node(s) not selected yet", driver=True
                ))  # fmt: skip
        if entry.skipped:
            shown = ", ".join(entry.skipped[:3])
            waiting.append(rollout.Workload(
                "nfd",
                f"{len(entry.skipped)} node(s) lack the NFD OS labels a pool needs "
                f"({keys.NFD_OS_ID}, {keys.NFD_OS_VERSION_ID}): {shown}",
            ))  # fmt: skip
        judged = rollout.judge(waiting, upgrade, driver=True)
        return nvd_status.DriverReport(
            problems=entry.problems,
            waiting=[judged.message] if judged.kind != "ready" else [],
            nodes=len(entry.nodes),
            pools=[f"{p.pool.label} ({len(p.pool.nodes)})" for p in entry.pools],
            unchecked=sum(p.unchecked for p in entry.pools),
            planned=judged.planned,
        )

    async def _prune(self, result: plan_mod.Plan) -> None:
        """Delete pool DaemonSets no pool wants any more (a pool held back keeps its own)."""
        by_uid = {p.uid: p for p in result.drivers.values()}
        wanted = {d["metadata"]["name"] for p in result.drivers.values() for d in p.daemonsets}
        for ds in self._pool_daemonsets():
            owner = _driver_owner(ds)
            assert owner is not None
            entry = by_uid.get(owner[1])
            if entry is None:
                continue  # its NVIDIADriver is gone: the garbage collector removes it
            name = ds["metadata"]["name"]
            if entry.keep_all or name in entry.keep or name in wanted:
                continue
            log.info("deleting DaemonSet %s of NVIDIADriver %s (no pool wants it)", name, owner[0])
            await self.rt.writer.delete(ds)

    async def _retire(self, mode: str) -> None:
        """The ClusterPolicy took the driver back: pool DaemonSets go, their pods keep running
        until the ClusterPolicy's own replace them."""
        if mode != "disabled":
            return
        for ds in self._pool_daemonsets():
            log.info("deleting DaemonSet %s, orphaning its pods (driver back to the ClusterPolicy)",
                     ds["metadata"]["name"])  # fmt: skip
            await self.rt.writer.delete(ds, orphan=True)

    # ----- the hand-over -----------------------------------------------------------------------

    async def _hand_over(
        self,
        result: plan_mod.Plan,
        nodes: list[tuple[str, Mapping[str, str]]],
        written: set[tuple[str, str, str, str]],
        orphans: list[plan_mod.DriverPod],
    ) -> set[str]:
        """Adopt or mark the orphaned driver pods; returns the names of the pods adopted."""
        if not orphans:
            return set()
        labels_of = dict(nodes)
        revisions = list(self._revisions())
        newest: dict[str, plan_mod.Revision] = {}
        for revision in revisions:
            uid = revision.owner_uid
            if uid and (uid not in newest or newest[uid].number < revision.number):
                newest[uid] = revision
        pool_of_node: dict[str, plan_mod.LivePool | None] = {}
        for entry in result.drivers.values():
            for ds in entry.daemonsets:
                live = self.caches.live(ds)
                current = (
                    live is not None
                    and cp.ref(ds) not in written
                    and not needs_write(ds, live)
                    and int((live.get("status") or {}).get("observedGeneration") or 0)
                    >= int(live["metadata"].get("generation") or 0)
                )
                pool = None
                if current and live is not None:
                    uid = str(live["metadata"]["uid"])
                    pool = plan_mod.LivePool(
                        name=ds["metadata"]["name"],
                        uid=uid,
                        generation=int(live["metadata"].get("generation") or 1),
                        template_labels=ds["spec"]["template"]["metadata"]["labels"],
                        revision=newest.get(uid),
                    )
                pool_plan = next(p for p in entry.pools if p.daemonset == ds["metadata"]["name"])
                for node in pool_plan.pool.nodes:
                    # Only once the node carries its owner label: before that the DaemonSet
                    # does not select it and would delete an adopted pod at once.
                    if labels_of.get(node, {}).get(keys.DRIVER_OWNER) == entry.name:
                        pool_of_node[node] = pool
        plan = plan_mod.plan_hand_over(orphans, pool_of_node, revisions)
        namespace = self.rt.settings.namespace
        adopted: dict[str, list[str]] = {}
        for adoption in plan.adopt:
            log.info("adopting driver pod %s on %s into %s (same pod: no restart)",
                     adoption.pod, adoption.node, adoption.daemonset)  # fmt: skip
            await self.rt.writer.patch_pod(namespace, adoption.pod, adoption.patch)
            adopted.setdefault(adoption.daemonset, []).append(adoption.node)
        for node in plan.replace:
            state = labels_of.get(node, {}).get(keys.UPGRADE_STATE, "")
            if state in _SETTLED_UPGRADE_STATES:
                await self.rt.writer.patch_node(
                    node, {"metadata": {"labels": {keys.UPGRADE_STATE: "upgrade-required"}}}
                )
        for entry in result.drivers.values():
            obj = self.drivers_cache.get(entry.name)
            names = [n for ds in entry.daemonsets for n in adopted.get(ds["metadata"]["name"], [])]
            if obj is not None and names:
                shown = ", ".join(sorted(names)[:5]) + (
                    f" and {len(names) - 5} more" if len(names) > 5 else ""
                )
                await self.rt.writer.event(
                    obj,
                    reason="DriverPodsAdopted",
                    message=f"took over the running driver pods on {len(names)} node(s) without "
                    f"a restart (their pod is this NVIDIADriver's): {shown}",
                )
        return {a.pod for a in plan.adopt}

    def _revisions(self) -> Iterable[plan_mod.Revision]:
        for revision in self.caches[runtime.REVISIONS].objects.values():
            fingerprint = revision.get("fingerprint")
            if fingerprint is None:
                continue
            meta = revision.get("metadata") or {}
            labels = meta.get("labels") or {}
            owners = meta.get("ownerReferences") or []
            yield plan_mod.Revision(
                app=labels.get("app"),
                hash=labels.get(plan_mod.REVISION_HASH_LABEL),
                number=int(revision.get("revision") or 0),
                fingerprint=fingerprint,
                owner_uid=str(owners[0].get("uid")) if owners else None,
            )


__all__ = ["NVIDIADriverReconciler"]
