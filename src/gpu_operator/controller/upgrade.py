"""The driver upgrade reconciler: caches -> upgrade planner -> a thin executor of its actions.

One work key (`driver-upgrade`) plans the whole fleet at once, because the limits
(maxParallelUpgrades, maxUnavailable) are about all nodes of a policy together; passes never
overlap. Everything the planner decides from is on the nodes, so a restarted operator resumes.
What the executor keeps in memory is only there to spare the API server: when each blocked
eviction was last tried, and the nodes it has just written (so the next pass does not plan from a
cache that has not seen those writes yet).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from gpu_operator.controller import runtime
from gpu_operator.kube import resources
from gpu_operator.upgrade import actions, planner, rollback, snapshot, states

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
MAX_SPACING_SECONDS = 1.0

CACHE_NODES = "upgrade:nodes"
CACHE_PODS = "upgrade:pods"
CACHE_DAEMONSETS = "upgrade:daemonsets"
CACHE_REVISIONS = "upgrade:revisions"
CACHE_BUDGETS = "upgrade:pdbs"
CACHE_POLICIES = "upgrade:clusterpolicies"
CACHE_DRIVERS = "upgrade:nvidiadrivers"


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
        self._evicted: dict[str, float] = {}  # pod key -> when we last asked
        self._refusals: dict[str, str] = {}  # pod key -> the API's last refusal, logged once
        self._created: set[str] = set()  # rollback DaemonSets created, not yet in the cache
        self._wake: asyncio.TimerHandle | None = None
        self._wake_at: float | None = None
        self.last_plan: actions.Plan | None = None
        self.passes = 0
        self.planning_seconds = 0.0  # snapshot and plan, for the figures in bench/
        # The debounce of event-driven passes (PASS_SPACING).
        self.debounce = DEBOUNCE_SECONDS

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

    def _always(self, key: str, old: Any, new: Any) -> list[runtime.Request]:
        return [runtime.Request(KEY, self.debounce)] if old != new else []

    def _on_node(self, key: str, old: Any, new: Any) -> list[runtime.Request]:
        if (
            old is not None
            and new is not None
            and old == dataclasses.replace(new, resource_version=old.resource_version)
        ):
            return []  # only fields the planner does not read changed
        return [runtime.Request(KEY, self.debounce)]

    def _on_pod(self, key: str, old: Any, new: Any) -> list[runtime.Request]:
        if old == new or not (_relevant(old) or _relevant(new)):
            return []
        return [runtime.Request(KEY, self.debounce)]

    # ----- planning ----------------------------------------------------------------------------

    def snapshot(self) -> snapshot.Snapshot:
        return snapshot.Snapshot.build(
            now=self.clock(),
            nodes=self.nodes.objects.values(),
            daemonsets=self.daemonsets.objects.values(),
            revisions=self.revisions.objects.values(),
            pods=self.pods.objects.values(),
            budgets=self.budgets.objects.values(),
            owners=[*self.policies.objects.values(), *self.drivers.objects.values()],
            namespace=self.rt.settings.namespace,
        )

    async def reconcile(self, key: str) -> None:
        async with self._lock:
            if key == RESYNC_KEY:
                self.rt.enqueue(RESYNC_KEY, self.resync)
            started = time.perf_counter()
            plan = planner.plan(self.snapshot())
            took = time.perf_counter() - started
            self.planning_seconds += took
            self.debounce = max(DEBOUNCE_SECONDS, min(PASS_SPACING * took, MAX_SPACING_SECONDS))
            self.last_plan = plan
            self.passes += 1
            await self.execute(plan)
            self._publish(plan)
            if any(isinstance(a, actions.PatchNode) for a in plan.actions):
                # Our own writes come back from the watch as no change (the cache already holds
                # them), so the next step is planned now rather than on someone else's event.
                self.rt.enqueue(KEY, DEBOUNCE_SECONDS)
            if plan.requeue_after is not None:
                self._wake_in(max(plan.requeue_after, DEBOUNCE_SECONDS))

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

    def _publish(self, plan: actions.Plan) -> None:
        counts: dict[str, int] = {}
        for report in plan.nodes.values():
            counts[report.state] = counts.get(report.state, 0) + 1
        gauges = self.rt.metrics.upgrades
        failed = counts.get(states.UPGRADE_FAILED, 0)
        busy = sum(v for k, v in counts.items() if k not in states.IDLE) - failed
        gauges["in_progress"].set(busy)
        gauges["done"].set(counts.get(states.UPGRADE_DONE, 0))
        gauges["failed"].set(failed)
        gauges["pending"].set(counts.get(states.UPGRADE_REQUIRED, 0))
        gauges["available"].set(sum(g.available for g in plan.groups.values()))

    # ----- executing ---------------------------------------------------------------------------

    async def execute(self, plan: actions.Plan) -> None:
        """Carry out a plan: node patches and pod work concurrently, then the rest.

        A node's Events tell what its patch did ("driver upgrade started"), so they are recorded
        only when that patch was applied: a patch refused for a stale view (409) is planned
        again, and that pass records them (once), not this one as well."""
        now = self.clock()
        patches = [a for a in plan.actions if isinstance(a, actions.PatchNode)]
        work: list[Coroutine[Any, Any, Any]] = []
        for action in plan.actions:
            if isinstance(action, actions.EvictPod):
                key = f"{action.namespace}/{action.name}"
                last = self._evicted.get(key)
                if last is None or now - last >= states.EVICTION_RETRY_SECONDS:
                    self._evicted[key] = now
                    work.append(self._evict(action))
            elif isinstance(action, actions.DeletePod):
                work.append(self._delete_pod(action))
        results = await asyncio.gather(
            *(self._patch(a) for a in patches), *work, return_exceptions=True
        )
        unapplied = {
            a.node for a, result in zip(patches, results, strict=False) if result is not True
        }
        errors = [r for r in results if isinstance(r, BaseException)]
        for error in errors:
            if not isinstance(error, Exception):
                raise error  # cancelled: stop here
        if errors:
            # The pass is retried; what was applied is told now (the retry will not redo it).
            await asyncio.gather(*(
                self._event(a) for a in plan.actions
                if isinstance(a, actions.Event) and a.node not in unapplied
            ))  # fmt: skip
            raise errors[0]
        # Forget pods this pass no longer evicts, so a retried node's first eviction is at once.
        wanted = {
            f"{a.namespace}/{a.name}" for a in plan.actions if isinstance(a, actions.EvictPod)
        }
        self._evicted = {k: v for k, v in self._evicted.items() if k in wanted}
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
            elif isinstance(action, actions.Event) and action.node not in unapplied:
                events.append(self._event(action))
        await asyncio.gather(*events)

    async def _patch(self, action: actions.PatchNode) -> bool:
        """Apply one node patch; False when it was refused for a stale view (planned again)."""
        async with self.rt.write_slots:
            try:
                stored = await self.rt.writer.patch_node(action.node, action.merge_patch())
            except Exception as err:
                if getattr(getattr(err, "status", None), "code", None) == 409:
                    # Planned from an older copy of the node: plan again from the newer one.
                    log.debug("node %s changed under us; replanning", action.node)
                    self.rt.enqueue(KEY, DEBOUNCE_SECONDS)
                    return False
                raise
        # Write-through: the next pass must count this node's new state, even if the watch has
        # not delivered it yet (two passes on one stale view could exceed the limits).
        version = _rv(str((stored.get("metadata") or {}).get("resourceVersion") or ""))
        if version is not None:
            self._written[action.node] = version
        self.nodes.objects[action.node] = snapshot.node_from(stored)
        log.info("node %s: %s", action.node, _describe(action))
        return True

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
