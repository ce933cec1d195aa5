"""The driver upgrade reconciler: caches -> upgrade planner -> a thin executor of its actions.

One work key (`driver-upgrade`) plans the whole fleet at once, because the limits
(maxParallelUpgrades, maxUnavailable) are about all nodes of a policy together; passes never
overlap. Everything the planner decides from is on the nodes, so a restarted operator resumes.
What the executor keeps in memory is only there to spare the API server: when each blocked
eviction was last tried, which pod deletions were accepted, and the nodes it has just written (so
the next pass does not plan from a cache that has not seen those writes yet).

The planner chains a node's steps within a pass (one patch per state, every label written in
order) and hands a finishing node's slot to the next node in the same pass; `execute` applies the
patches in `actions.write_order` so the limits hold after every single write.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping
from typing import Any

from gpu_operator.controller import clusterpolicy as cp
from gpu_operator.controller import runtime
from gpu_operator.kube import probe, resources
from gpu_operator.upgrade import actions, incremental, planner, rollback, snapshot, states

log = logging.getLogger(__name__)

KEY = "driver-upgrade"
RESYNC_KEY = f"{KEY}/resync"
# Upstream requeues its upgrade controller every 2 minutes whatever happens; ours is event
# driven and this periodic pass is only a safety net.
RESYNC_SECONDS = 120.0
# Events arriving together (a rollout touches nodes and pods at once) are planned in one pass.
DEBOUNCE_SECONDS = 0.05
# Event-driven passes wait at least this many times the last plan's duration (at most
# MAX_SPACING_SECONDS): a plan reads every node and pod, so at thousands of nodes a rollout's
# events asking for passes back to back would keep a core busy planning; a small cluster plans
# within DEBOUNCE_SECONDS as before.
PASS_SPACING = 2.0
# At 20,000 nodes a plan takes about a second: capped at 1 s, planning kept half a core busy
# through the first rollout (a plan of under half a second, up to ~7,000 nodes, is not affected).
MAX_SPACING_SECONDS = 5.0
# A pass whose only work was node patches, all applied, is followed at once by the next (the
# write-through cache already holds them; the planner's own chaining leaves few such passes, e.g.
# a node that became upgrade-required waits for the next pass to start). Each chained pass is
# an ordinary pass (the limits are counted afresh from the nodes as written); one with pod work,
# a refused patch or nothing to write ends the chain, as does this bound.
MAX_CHAINED_PASSES = 8
_POD_WORK = (actions.EvictPod, actions.DeletePod, actions.EnsureRollbackSet)
# Incremental passes (upgrade/incremental.py) plan only the nodes whose facts changed, so they
# cost about a millisecond whatever the fleet's size: the debounce scales with that cost, and a
# lone node's step is taken within milliseconds. Full passes (at start, on a policy, DaemonSet,
# revision, PDB or ResourceClaim change, on RESYNC_SECONDS, and whenever an incremental pass
# finds something only a full pass decides) keep the spacing above.
INCREMENTAL_DEBOUNCE_SECONDS = 0.002
_Snapshot = snapshot.Snapshot  # (the reconciler's `snapshot` method hides the module)

CACHE_NODES = "upgrade:nodes"
CACHE_PODS = runtime.ALL_PODS  # shared with the status side (a view of it: runtime.PODS)
CACHE_DAEMONSETS = "upgrade:daemonsets"
CACHE_REVISIONS = "upgrade:revisions"
CACHE_BUDGETS = "upgrade:pdbs"
CACHE_POLICIES = "upgrade:clusterpolicies"
CACHE_DRIVERS = "upgrade:nvidiadrivers"
# ResourceClaims (all namespaces), cached only where the DRA API is served: a pod holding a
# `gpu.nvidia.com` claim is a GPU pod, drained before its node's driver restarts.
CACHE_CLAIMS = "upgrade:resourceclaims"


def _rv(value: str) -> int | None:
    return int(value) if value.isdigit() else None


def _relevant(pod: snapshot.Pod | None) -> bool:
    """Pods the planner reads: driver, validator and GPU pods (others only matter on nodes
    being drained, and those nodes' own events already wake the planner)."""
    if pod is None:
        return False
    app = pod.labels.get("app")
    return (
        pod.gpu
        or app in (states.DRIVER_APP, states.VALIDATOR_APP)
        or (pod.labels.get("app.kubernetes.io/component") == states.DRIVER_COMPONENT)
    )


class UpgradeReconciler(runtime.Reconciler):
    """Rolls driver upgrades through the nodes of every ClusterPolicy and NVIDIADriver."""

    prefix = KEY

    def __init__(
        self,
        rt: runtime.Runtime,
        *,
        clock: Callable[[], float] = time.time,
        resync: float = RESYNC_SECONDS,
    ) -> None:
        self.rt = rt
        self.clock = clock
        self.resync = resync
        ns = rt.settings.namespace
        caches = rt.caches
        self.nodes = caches.add(CACHE_NODES, resources.NODE, transform=self._node)
        # GPU pods can be in any namespace; each is kept as a few hundred bytes.
        self.pods = caches.add(
            CACHE_PODS,
            resources.POD,
            namespace=resources.ALL_NAMESPACES,
            transform=snapshot.pod_from,
        )
        self.daemonsets = caches.add(
            CACHE_DAEMONSETS, resources.DAEMONSET, namespace=ns, transform=snapshot.daemonset_from
        )
        self.revisions = caches.add(
            CACHE_REVISIONS,
            resources.CONTROLLER_REVISION,
            namespace=ns,
            transform=snapshot.revision_from,
        )
        self.budgets = caches.add(
            CACHE_BUDGETS,
            resources.POD_DISRUPTION_BUDGET,
            namespace=resources.ALL_NAMESPACES,
            transform=snapshot.budget_from,
        )
        self.policies = caches.add(
            CACHE_POLICIES, resources.CLUSTER_POLICY, transform=snapshot.owner_from
        )
        self.drivers = caches.add(
            CACHE_DRIVERS, resources.NVIDIA_DRIVER, transform=snapshot.owner_from
        )
        self._lock = asyncio.Lock()
        self._written: dict[str, int] = {}  # node -> resourceVersion of our last write
        self._evicted: dict[str, tuple[str, float]] = {}  # pod key -> (node, when last asked)
        # pod key -> when its deletion was accepted: the next pass may plan it again before the
        # watch brings the pod's deletionTimestamp (asked again after EVICTION_RETRY_SECONDS)
        self._deleted: dict[str, tuple[str, float]] = {}
        self._refusals: dict[str, str] = {}  # pod key -> the API's last refusal, logged once
        self._created: set[str] = set()  # rollback DaemonSets created, not yet in the cache
        self._claims_probed = False
        self._wake: asyncio.TimerHandle | None = None
        self._wake_at: float | None = None
        self.last_plan: actions.Plan | None = None
        self.passes = 0
        self.full_passes = 0
        self.planning_seconds = 0.0  # snapshot and plan, for the figures in bench/
        # The debounce of event-driven passes (PASS_SPACING): `debounce` after node and pod
        # events (incremental passes), `full_debounce` after events that need a full pass.
        self.debounce = DEBOUNCE_SECONDS
        self.full_debounce = DEBOUNCE_SECONDS
        # Incremental planning: the fleet's per-node summaries and counters, the nodes whose
        # facts changed since the last pass, whether the next pass must be a full one, and the
        # cached pods per node (so a pass reads only its nodes' pods).
        self.fleet = incremental.Fleet()
        self._changed: set[str] = set()
        self._full = True
        # A DaemonSet, revision, budget, policy or claim changed since the last full pass: the
        # facts of any node may have changed unseen, so that pass has nothing to check against.
        self._fleet_changed = True
        self._pods_by_node: dict[str, dict[str, snapshot.Pod]] = {}
        self._reports: dict[str, actions.NodeReport] = {}
        self._groups: dict[str, actions.GroupReport] = {}
        # How many of `_reports` are in each upgrade state, kept by `_merge` so that publishing
        # after a pass costs one step per state, not one per node.
        self._state_counts: dict[str, int] = {}
        self.drifts = 0  # full passes whose counts disagreed with the incremental ones
        self._failing = False  # the last pass raised: the queue's retry backoff holds

    # ----- caches and events ------------------------------------------------------------------

    def _node(self, obj: dict[str, Any]) -> snapshot.Node:
        node = snapshot.node_from(obj)
        floor = self._written.get(node.name)
        version = _rv(node.resource_version)
        if floor is not None and version is not None:
            if version < floor:
                # An event older than our own write: keep the newer copy we already hold.
                held: snapshot.Node | None = self.nodes.objects.get(node.name)
                if held is not None:
                    return held
            else:
                del self._written[node.name]
        return node

    def watches(self) -> Iterable[runtime.Watch]:
        return [
            runtime.Watch(CACHE_NODES, self._on_node),
            runtime.Watch(CACHE_PODS, self._on_pod),
            runtime.Watch(CACHE_DAEMONSETS, self._always),
            runtime.Watch(CACHE_REVISIONS, self._always),
            runtime.Watch(CACHE_BUDGETS, self._always),
            runtime.Watch(CACHE_POLICIES, self._always),
            runtime.Watch(CACHE_DRIVERS, self._always),
        ]

    def initial(self) -> Iterable[runtime.Request]:
        return [runtime.Request(KEY), runtime.Request(RESYNC_KEY, self.resync)]

    def _request(self, delay: float) -> list[runtime.Request]:
        """A pass within `delay` seconds. A pending later pass (a chained pass's or a 409's
        follow-up) is brought forward rather than kept, so the next step after an event waits
        only for the debounce; after a failed pass the queue's retry backoff holds instead."""
        if self._failing:
            return [runtime.Request(KEY, delay)]
        self.rt.enqueue_within(KEY, delay)
        return []

    def _always(self, key: str, old: Any, new: Any) -> list[runtime.Request]:
        if old == new:
            return []
        self._full = True  # pools, revisions, budgets, policies, claims: any node may be affected
        self._fleet_changed = True
        return self._request(self.full_debounce)

    def _on_node(self, key: str, old: Any, new: Any) -> list[runtime.Request]:
        if (
            old is not None
            and new is not None
            and old == dataclasses.replace(new, resource_version=old.resource_version)
        ):
            return []  # only fields the planner does not read changed
        self._changed.add(key)
        return self._request(self.debounce)

    def _on_pod(self, key: str, old: Any, new: Any) -> list[runtime.Request]:
        self._index(key, old, new)
        if old == new or not (_relevant(old) or _relevant(new)):
            return []
        self._changed.update(p.node for p in (old, new) if p is not None and p.node)
        return self._request(self.debounce)

    def _index(self, key: str, old: snapshot.Pod | None, new: snapshot.Pod | None) -> None:
        """Keep the cached pods per node (every pod: drains read them all)."""
        if old is not None and old.node:
            held = self._pods_by_node.get(old.node)
            if held is not None:
                held.pop(key, None)
                if not held:
                    del self._pods_by_node[old.node]
        if new is not None and new.node:
            self._pods_by_node.setdefault(new.node, {})[key] = new

    # ----- planning ----------------------------------------------------------------------------

    def snapshot(self) -> snapshot.Snapshot:
        claims = self.rt.caches.informers.get(CACHE_CLAIMS)
        return snapshot.Snapshot.build(
            now=self.clock(),
            nodes=self.nodes.objects.values(),
            daemonsets=self.daemonsets.objects.values(),
            revisions=self.revisions.objects.values(),
            pods=self.pods.objects.values(),
            budgets=self.budgets.objects.values(),
            owners=[
                *_policies_in_charge(self.rt, self.policies.objects.values()),
                *self.drivers.objects.values(),
            ],
            namespace=self.rt.settings.namespace,
            claims=claims.objects.values() if claims is not None else None,
        )

    async def _watch_claims(self) -> None:
        """Cache ResourceClaims once, where `resource.k8s.io/v1` serves them (a cluster without
        DRA has no claim to count)."""
        if self._claims_probed:
            return
        why = await probe.unavailable(self.rt.client, resources.RESOURCE_CLAIM)
        self._claims_probed = True
        if why is not None:
            log.info("%s: pods are GPU pods by their nvidia.com/gpu requests only", why)
            return
        self.rt.caches.add(
            CACHE_CLAIMS, resources.RESOURCE_CLAIM, namespace=resources.ALL_NAMESPACES,
            transform=snapshot.claim_from,
        )  # fmt: skip
        self.rt.watch(CACHE_CLAIMS, self._always)
        log.info("watching resource.k8s.io/v1 ResourceClaims: pods holding %s claims are GPU pods",
                 snapshot.GPU_DRA_DRIVER)  # fmt: skip

    def _focused_snapshot(self) -> _Snapshot:
        """What an incremental pass reads: the caches as they are (the planner looks up only
        the nodes it plans, and their pods in the per-node index)."""
        claims = self.rt.caches.informers.get(CACHE_CLAIMS)
        return snapshot.Snapshot(
            now=self.clock(),
            nodes=self.nodes.objects,
            daemonsets=tuple(self.daemonsets.objects.values()),
            revisions=tuple(self.revisions.objects.values()),
            pods=(),
            budgets=tuple(self.budgets.objects.values()),
            owners=(
                *_policies_in_charge(self.rt, self.policies.objects.values()),
                *self.drivers.objects.values(),
            ),
            namespace=self.rt.settings.namespace,
            pods_by_node=_PodsByNode(
                self._pods_by_node, claims.objects.values() if claims is not None else None
            ),
        )

    async def reconcile(self, key: str) -> None:
        try:
            await self._watch_claims()
            async with self._lock:
                await self._passes(key)
        except Exception:
            self._failing = True  # retried with the queue's backoff
            raise
        self._failing = False

    async def _passes(self, key: str) -> None:
        if key == RESYNC_KEY:
            self.rt.enqueue(RESYNC_KEY, self.resync)
            self._full = True  # the safety net: every node planned, the counts checked
        for _ in range(MAX_CHAINED_PASSES):
            plan, applied = await self._pass()
            deadline = self.fleet.next_deadline()  # every node's own wait, planned or not
            if deadline is not None:
                self._wake_in(max(deadline - self.clock(), INCREMENTAL_DEBOUNCE_SECONDS))
            patched = any(isinstance(a, actions.PatchNode) for a in plan.actions)
            if not patched:
                return
            if not applied or any(isinstance(a, _POD_WORK) for a in plan.actions):
                break
        # Our own writes come back from the watch as no change (the cache already holds
        # them), so the next step is planned now rather than on someone else's event.
        self.rt.enqueue(KEY, DEBOUNCE_SECONDS)

    async def _pass(self) -> tuple[actions.Plan, bool]:
        """Plan from the caches and carry the plan out; (the plan, whether every node patch in
        it was applied)."""
        started = time.perf_counter()
        focus: set[str] | None = None
        plan: actions.Plan | None = None
        changed: set[str] = set()
        if not self._full and self.fleet.ready:
            changed, self._changed = self._changed, set()
            focus = self.fleet.focus(changed, self.clock())
            if 2 * len(focus) < len(self.fleet):  # else a full pass costs no more
                snap = self._focused_snapshot()
                plan = planner.plan(snap, chain=True, focus=focus, fleet=self.fleet)
                if plan.needs_full:
                    log.debug("full upgrade pass: %s", plan.needs_full)
                    plan = None
                else:
                    self.fleet.update(plan, focus, snap.now)
        if plan is None:
            focus = None
            self._full = False
            # The nodes whose events the fleet has not taken: those since the last pass, and
            # those of an incremental pass given up for this one (too large, or `needs_full`).
            pending, self._changed = changed | self._changed, set()
            check, self._fleet_changed = not self._fleet_changed, False
            self._reindex()
            snap = self.snapshot()
            plan = planner.plan(snap, chain=True)
            drift = self.fleet.reset(plan, snap.now, pending, check=check)
            if drift:
                # The safety net caught counts the incremental passes had wrong (none in the
                # tests but the one that corrupts them on purpose): say so; from now on the
                # counts are the full pass's.
                self.drifts += 1
                log.warning("driver upgrade counts of %s were off; corrected", ", ".join(drift))
            self.full_passes += 1
        took = time.perf_counter() - started
        self.planning_seconds += took
        spacing = max(DEBOUNCE_SECONDS, min(PASS_SPACING * took, MAX_SPACING_SECONDS))
        if focus is None:
            self.full_debounce = self.debounce = spacing
        else:
            self.debounce = max(INCREMENTAL_DEBOUNCE_SECONDS, min(PASS_SPACING * took, spacing))
        self._merge(plan, focus)
        self.passes += 1
        applied = await self.execute(plan, focus)
        self._publish()
        return plan, applied

    def _reindex(self) -> None:
        index: dict[str, dict[str, snapshot.Pod]] = {}
        for key, pod in self.pods.objects.items():
            if pod.node:
                index.setdefault(pod.node, {})[key] = pod
        self._pods_by_node = index

    def _merge(self, plan: actions.Plan, focus: set[str] | None) -> None:
        """Keep every node's latest report (an incremental plan reports its nodes only)."""
        counts = self._state_counts
        if focus is None:
            self._reports = dict(plan.nodes)
            self._groups = dict(plan.groups)
            counts.clear()
            for report in self._reports.values():
                counts[report.state] = counts.get(report.state, 0) + 1
        else:
            reports = self._reports
            for name in (*focus, *plan.nodes):
                gone = reports.pop(name, None)
                if gone is not None:
                    counts[gone.state] -= 1
            for report in plan.nodes.values():
                counts[report.state] = counts.get(report.state, 0) + 1
            reports.update(plan.nodes)
            self._groups.update(plan.groups)
        self.last_plan = actions.Plan(
            actions=plan.actions,
            nodes=self._reports,
            groups=self._groups,
            requeue_after=plan.requeue_after,
        )

    def _wake_in(self, delay: float) -> None:
        """One timer for the earliest deadline (the queue keeps the first delay it is given)."""
        loop = asyncio.get_running_loop()
        at = loop.time() + delay
        if self._wake is not None and self._wake_at is not None and self._wake_at <= at:
            return
        if self._wake is not None:
            self._wake.cancel()
        self._wake_at = at
        self._wake = loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._wake = self._wake_at = None
        self.rt.enqueue(KEY)

    def _publish(self) -> None:
        counts = self._state_counts  # of `_reports`, by state (kept by `_merge`)
        gauges = self.rt.metrics.upgrades
        failed = counts.get(states.UPGRADE_FAILED, 0)
        busy = sum(v for k, v in counts.items() if k not in states.IDLE) - failed
        gauges["in_progress"].set(busy)
        gauges["done"].set(counts.get(states.UPGRADE_DONE, 0))
        gauges["failed"].set(failed)
        gauges["pending"].set(counts.get(states.UPGRADE_REQUIRED, 0))
        gauges["available"].set(sum(g.available for g in self._groups.values()))

    # ----- executing ---------------------------------------------------------------------------

    async def execute(self, plan: actions.Plan, focus: set[str] | None = None) -> bool:
        """Carry out a plan; whether every node patch was applied.

        Node patches go in `actions.write_order`: each node's steps in order (a step's patch is
        guarded by the resourceVersion the previous one returned; the chain stops at the first
        refusal), every node that does not start first, and the nodes that start only once all
        of those were applied (their slots were counted after them). A node's pod work
        (evictions, pod deletions) follows its own patches and is skipped if one was refused;
        pod work of nodes without patches runs alongside the first wave. `focus`: the nodes an
        incremental plan covered (None: all).

        A node's Events tell what a step's patch did ("driver upgrade started"), so each is
        recorded only when that step was applied: a patch refused for a stale view (409) is
        planned again, and that pass records them (once), not this one as well."""
        now = self.clock()
        first, starts = actions.write_order(plan.actions)
        pod_work: dict[str, list[actions.EvictPod | actions.DeletePod]] = {}
        for action in plan.actions:
            if isinstance(action, actions.EvictPod):
                key = f"{action.namespace}/{action.name}"
                last = self._evicted.get(key)
                if last is None or now - last[1] >= states.EVICTION_RETRY_SECONDS:
                    self._evicted[key] = (action.node, now)
                    pod_work.setdefault(action.node, []).append(action)
            elif isinstance(action, actions.DeletePod):
                asked = self._deleted.get(f"{action.namespace}/{action.name}")
                if asked is None or now - asked[1] >= states.EVICTION_RETRY_SECONDS:
                    pod_work.setdefault(action.node, []).append(action)
        applied: dict[str, int] = {}  # node -> how many of its steps were applied

        async def node_work(chain: list[actions.PatchNode]) -> None:
            node = chain[0].node
            applied[node] = await self._chain(chain)
            if applied[node] == len(chain):
                await self._pod_work(pod_work.get(node, []))

        patched = {chain[0].node for chain in [*first, *starts]}
        unpatched = [a for node, work in pod_work.items() if node not in patched for a in work]
        errors = await self._gather(
            *(node_work(chain) for chain in first), self._pod_work(unpatched)
        )
        complete = all(applied.get(c[0].node) == len(c) for c in first)
        if starts and complete and not errors:
            errors += await self._gather(*(node_work(chain) for chain in starts))
        elif starts:
            # A node this pass counted as finished may not be: start nobody, plan again.
            self.rt.enqueue(KEY, DEBOUNCE_SECONDS)

        def told(event: actions.Event) -> bool:
            if event.node not in patched:
                return True
            return event.step < applied.get(event.node, 0)

        if errors:
            # The pass is retried; what was applied is told now (the retry will not redo it).
            await asyncio.gather(*(
                self._event(a) for a in plan.actions if isinstance(a, actions.Event) and told(a)
            ))  # fmt: skip
            raise errors[0]
        # Forget pods this pass no longer evicts, so a retried node's first eviction is at once.
        wanted = {
            f"{a.namespace}/{a.name}" for a in plan.actions if isinstance(a, actions.EvictPod)
        }
        # (An incremental plan speaks only for its own nodes.)
        self._evicted = {
            k: v
            for k, v in self._evicted.items()
            if k in wanted or (focus is not None and v[0] not in focus)
        }
        going = {
            f"{a.namespace}/{a.name}" for a in plan.actions if isinstance(a, actions.DeletePod)
        }
        self._deleted = {
            k: v
            for k, v in self._deleted.items()
            if k in going or (focus is not None and v[0] not in focus)
        }
        events = []
        for action in plan.actions:
            if isinstance(action, actions.EnsureRollbackSet):
                await self._ensure_rollback(action)
            elif isinstance(action, actions.DeleteRollbackSet):
                await self.rt.writer.delete(
                    {
                        "apiVersion": "apps/v1",
                        "kind": "DaemonSet",
                        "metadata": {"name": action.name, "namespace": action.namespace},
                    }
                )
            elif isinstance(action, actions.Event) and told(action):
                events.append(self._event(action))
        await asyncio.gather(*events)
        chains = [*first, *starts]
        return all(applied.get(c[0].node) == len(c) for c in chains)

    @staticmethod
    async def _gather(*work: Coroutine[Any, Any, Any]) -> list[Exception]:
        """Run concurrently; the errors (a cancellation is raised at once)."""
        results = await asyncio.gather(*work, return_exceptions=True)
        errors = []
        for result in results:
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result  # cancelled: stop here
                errors.append(result)
        return errors

    async def _pod_work(self, work: list[actions.EvictPod | actions.DeletePod]) -> None:
        await asyncio.gather(*(
            self._evict(a) if isinstance(a, actions.EvictPod) else self._delete_pod(a)
            for a in work
        ))  # fmt: skip

    async def _chain(self, chain: list[actions.PatchNode]) -> int:
        """Apply one node's steps in order; how many were applied."""
        version: str | None = None
        for done, action in enumerate(chain):
            if version is not None:
                # Planned from the node as the previous step leaves it: that step's result.
                action = dataclasses.replace(action, resource_version=version)
            version = await self._patch(action)
            if version is None:
                return done
            if not version:
                return done + 1  # no resourceVersion to guard the next step with: plan again
        return len(chain)

    async def _patch(self, action: actions.PatchNode) -> str | None:
        """Apply one node patch; the node's new resourceVersion, or None when it was refused
        for a stale view (planned again)."""
        async with self.rt.write_slots:
            try:
                stored = await self.rt.writer.patch_node(action.node, action.merge_patch())
            except Exception as err:
                if getattr(getattr(err, "status", None), "code", None) == 409:
                    # Planned from an older copy of the node: plan again from the newer one.
                    log.debug("node %s changed under us; replanning", action.node)
                    self.rt.enqueue(KEY, DEBOUNCE_SECONDS)
                    return None
                raise
        # Write-through: the next pass must count this node's new state, even if the watch has
        # not delivered it yet (two passes on one stale view could exceed the limits).
        raw = str((stored.get("metadata") or {}).get("resourceVersion") or "")
        version = _rv(raw)
        if version is not None:
            self._written[action.node] = version
        self.nodes.objects[action.node] = snapshot.node_from(stored)
        log.info("node %s: %s", action.node, _describe(action))
        return raw

    async def _evict(self, action: actions.EvictPod) -> None:
        key = f"{action.namespace}/{action.name}"
        refused = await self.rt.writer.evict(action.namespace, action.name)
        if refused is None:
            self._refusals.pop(key, None)
            log.info("node %s: evicting pod %s", action.node, key)
        elif self._refusals.get(key) != refused:
            self._refusals[key] = refused
            log.info("node %s: eviction of %s refused: %s", action.node, key, refused)

    async def _delete_pod(self, action: actions.DeletePod) -> None:
        log.info(
            "node %s: deleting pod %s/%s (%s)",
            action.node,
            action.namespace,
            action.name,
            action.why,
        )
        await self.rt.writer.delete(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": action.name, "namespace": action.namespace},
            }
        )
        self._deleted[f"{action.namespace}/{action.name}"] = (action.node, self.clock())

    async def _ensure_rollback(self, action: actions.EnsureRollbackSet) -> None:
        if self.daemonsets.get(action.name, action.namespace) is not None:
            self._created.discard(action.name)
            return
        if action.name in self._created:
            return  # created by an earlier pass; the watch has not brought it yet
        pool: snapshot.DaemonSet | None = self.daemonsets.get(action.pool, action.namespace)
        revision = next(
            (r for r in self.revisions.objects.values() if r.name == action.revision), None
        )
        if pool is None or revision is None or revision.template is None:
            log.warning(
                "cannot build rollback DaemonSet %s: revision %s not cached",
                action.name,
                action.revision,
            )
            return
        body = rollback.daemonset(
            name=action.name,
            namespace=action.namespace,
            pool=pool.name,
            pool_uid=pool.uid,
            revision_hash=action.revision_hash,
            template=revision.template,
        )
        log.info("creating rollback DaemonSet %s (revision %s)", action.name, action.revision)
        await self.rt.write(body)
        self._created.add(action.name)

    async def _event(self, action: actions.Event) -> None:
        node: snapshot.Node | None = self.nodes.objects.get(action.node)
        async with self.rt.write_slots:
            await self.rt.writer.event(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": action.node, "uid": node.uid if node else None},
                },
                reason=states.EVENT_REASON,
                message=action.message,
                type_="Warning" if action.warning else "Normal",
            )


def _policies_in_charge(
    rt: runtime.Runtime, policies: Iterable[snapshot.Owner]
) -> list[snapshot.Owner]:
    """The cached ClusterPolicies less any the operator does not act on (one a GPUCluster
    refuses drives nothing, its driver upgrades included), per the shared caches where the
    ClusterPolicy reconciler runs beside this one."""
    if runtime.POLICIES not in rt.caches:
        return list(policies)
    in_charge = cp.policy_in_charge(rt)
    if in_charge is None:
        return []
    uid = str((in_charge.get("metadata") or {}).get("uid") or "")
    return [p for p in policies if p.uid == uid]


def _describe(action: actions.PatchNode) -> str:
    parts = []
    state = action.labels.get(states.STATE_LABEL, "")
    if state != "":
        parts.append(f"state {state or '(removed)'}")
    if action.unschedulable is not None:
        parts.append("cordon" if action.unschedulable else "uncordon")
    others = [k for k in action.labels if k != states.STATE_LABEL]
    if others:
        parts.append("labels " + ", ".join(others))
    if action.annotations:
        parts.append(f"{len(action.annotations)} annotations")
    return "; ".join(parts)


class _PodsByNode(Mapping[str, tuple[snapshot.Pod, ...]]):
    """The per-node pod index as the planner reads it: a node's pods, counted as GPU pods by
    their ResourceClaims as `Snapshot.build` counts them."""

    def __init__(
        self,
        index: dict[str, dict[str, snapshot.Pod]],
        claims: Iterable[snapshot.Claim] | None,
    ) -> None:
        self._index = index
        self._claims = None if claims is None else tuple(claims)

    def __getitem__(self, name: str) -> tuple[snapshot.Pod, ...]:
        pods = self._index[name].values()
        if self._claims is None:
            return tuple(pods)
        built = snapshot.Snapshot.build(
            now=0.0, nodes=(), daemonsets=(), revisions=(), pods=pods, claims=self._claims
        )
        return built.pods

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)
