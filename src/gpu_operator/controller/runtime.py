"""The runtime the reconcilers share: caches, one work queue, writer, leader election, metrics.

One reconciler per kind (controller/clusterpolicy.py, nodelabels.py, nvidiadriver.py, ...), as in
cluster-api: each declares which caches it watches and how their events map to its work keys, and
reconciles one key at a time; decisions stay in the pure packages. The runtime owns everything
they share, so a cache is listed and watched once however many reconcilers read it.

Adding a reconciler (for example driver upgrades) is a new module plus one registration line in
controller/operator.py:

    class UpgradeReconciler(runtime.Reconciler):
        prefix = "driver-upgrade"                      # its keys: "driver-upgrade[/...]"

        def __init__(self, rt: runtime.Runtime) -> None:
            self.rt = rt
            rt.caches.add("gpu-pods", resources.POD, transform=...)   # a cache of its own, if any

        def watches(self) -> list[runtime.Watch]:
            return [runtime.Watch("nodes", self._on_node)]            # shared caches by name

        def _on_node(self, key, old, new) -> Iterable[runtime.Request]:
            return [runtime.Request("driver-upgrade")] if ... else []

        async def reconcile(self, key: str) -> None:
            ...  # read self.rt.caches, plan with upgrade/, write through self.rt.writer

    rt.register(UpgradeReconciler(rt))                     # in Operator.__init__

Keys are strings whose first `/`-separated part is the reconciler's prefix; the queue coalesces
them and never hands one key to two workers. A failed reconcile is retried with backoff. Events
are recorded through `rt.writer.event`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gpu_operator.api import keys
from gpu_operator.controller import facts, strip
from gpu_operator.controller.metrics import OperatorMetrics
from gpu_operator.kube import resources
from gpu_operator.kube.cache import (
    Informer,
    Select,
    StateLostHandler,
    Transform,
    View,
    current_version,
    rewound,
)
from gpu_operator.kube.client import AsyncClient
from gpu_operator.kube.errors import describe
from gpu_operator.kube.leader import LeaderElector
from gpu_operator.kube.queue import WorkQueue
from gpu_operator.kube.writer import Writer, taken_over_yet
from gpu_operator.nodes.coexist import CoexistPolicy
from gpu_operator.nodes.gate import StartupTaint

log = logging.getLogger(__name__)


@dataclass
class Settings:
    """How the operator runs (from flags and env)."""

    namespace: str
    identity: str = "gpu-operator"
    leader_elect: bool = False
    # Namespace of the leader Lease (--leader-elect-namespace); None: the operator's namespace.
    leader_namespace: str | None = None
    operator_env: Mapping[str, str] = field(default_factory=dict)
    status_debounce: float = 0.2
    # At most one status write per object per this many seconds; the newest is always written
    # when the window ends, a new failure at once (status/coalesce.py; STATUS_WRITE_INTERVAL env).
    status_write_interval: float = 1.0
    write_concurrency: int = 16
    workers: int = 8
    # How often one cheap list checks that the API server's state did not go back in time. The
    # watches notice first (bookmarks about once a minute, resourceVersions, failed watches);
    # this bounds the detection where a server sends no bookmarks.
    consistency_interval: float = 300.0
    # Liveness: a reconcile running longer than this means the work loop is stuck.
    stuck_after: float = 300.0
    # What to do where something else would fight the operator (nodes/coexist.py; COEXIST_* env).
    coexist: CoexistPolicy = field(default_factory=CoexistPolicy)
    # The readiness gate's startup taint (nodes/gate.py; STARTUP_TAINT env); None: gate off.
    startup_taint: StartupTaint | None = None


class Request(NamedTuple):
    """A work key to queue, now or after `after` seconds (an earlier pending time wins)."""

    key: str
    after: float = 0.0


Mapper = Callable[[str, Any, Any], Iterable[Request]]


@dataclass(frozen=True)
class Watch:
    """A reconciler's interest in one shared cache: `map(key, old, new)` returns the requests an
    event causes (`old` is None for additions, `new` None for deletions)."""

    cache: str
    map: Mapper


class Reconciler:
    """One kind's reconciler. Subclasses set `prefix` and implement `watches` and `reconcile`."""

    prefix: str = ""
    # Keys the queue serves ahead of the others (WorkQueue.first): a cluster-wide pass that
    # per-node keys would otherwise hold back (thousands are queued when every node is relabelled).
    first_keys: tuple[str, ...] = ()

    def watches(self) -> Iterable[Watch]:
        return ()

    def initial(self) -> Iterable[Request]:
        """What to queue when this replica starts working (after the caches synced)."""
        return ()

    async def reconcile(self, key: str) -> None:
        raise NotImplementedError

    def failed(self, key: str, err: Exception) -> None:
        """Called after a failed reconcile (it is retried); for metrics."""


# Kinds the operand renderers produce; objects of these kinds carrying the state label are
# cached (and, for their owner, prunable).
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


# The caches every reconciler may read, by name: created by the runtime's owner
# (controller/operator.py), read through `Runtime.caches` and named in `Watch`es.
POLICIES = "clusterpolicies"
NODES = "nodes"
# Every pod of every namespace (snapshot.Pod, the upgrade planner's record): the operator's one
# pod list and watch. PODS is a view of it: the operator namespace's pods, as readiness summaries.
ALL_PODS = "upgrade:pods"
PODS = "pods"
REVISIONS = "revisions"
CRDS = "crds"
GPU_CLUSTERS = "gpuclusters"


def owned_name(api_version: str, kind: str) -> str:
    """The cache name of an owned kind, e.g. `owned:apps/v1/DaemonSet`."""
    return f"owned:{api_version}/{kind}"


class Caches:
    """The shared, watch-fed caches, by name. Events fan out to the runtime's dispatcher."""

    def __init__(
        self,
        client: AsyncClient,
        namespace: str,
        dispatch: Callable[..., None],
        on_state_lost: StateLostHandler | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self._dispatch = dispatch
        self._on_state_lost = on_state_lost
        self.informers: dict[str, Informer] = {}
        # Caches derived from another cache's events (no list or watch of their own).
        self.views: dict[str, View] = {}
        self._running: list[asyncio.Task[None]] | None = None

    def add(
        self,
        name: str,
        resource: Any,
        *,
        namespace: str | None = None,
        labels: dict[str, Any] | None = None,
        transform: Transform | None = None,
    ) -> Informer:
        """A cache (created once per name; later calls return the existing one). Added while the
        runtime runs, it starts at once."""
        if name in self.informers:
            return self.informers[name]
        informer = Informer(
            self.client,
            resource,
            namespace=namespace,
            labels=labels,
            transform=transform,
            on_change=functools.partial(self._dispatch, name),
            on_state_lost=self._on_state_lost,
        )
        self.informers[name] = informer
        if self._running is not None:
            self._running.append(asyncio.create_task(informer.run()))
        return informer

    def add_view(self, name: str, source: str, select: Select) -> View:
        """A cache derived from cache `source`: the objects `select` keeps (not None), as it
        returns them, fed by the source's events (one list, watch and decode for both). Its
        events dispatch under `name` right after the source's own."""
        if name in self.views:
            return self.views[name]
        if name in self.informers:
            raise ValueError(f"cache {name!r} exists already")
        informer = self.informers[source]
        view = View(informer, select, functools.partial(self._dispatch, name))
        self.views[name] = view
        feeds = [v for v in self.views.values() if v.source is informer]
        dispatch = functools.partial(self._dispatch, source)

        def fan_out(key: str, old: Any, new: Any) -> None:
            try:
                dispatch(key, old, new)
            finally:  # a failing handler must not leave a view behind its source
                for fed in feeds:
                    fed.feed(key, new)

        informer.on_change = fan_out
        return view

    def __getitem__(self, name: str) -> Informer | View:
        found = self.informers.get(name)
        return found if found is not None else self.views[name]

    def __contains__(self, name: str) -> bool:
        return name in self.informers or name in self.views

    def add_owned(self, api_version: str, kind: str) -> Informer:
        """The cache of one operand kind in the operator namespace, labelled with a state."""
        info = resources.kind_of(api_version, kind)
        # ConfigMaps are watched whole in the namespace: the driver mounts the user's ConfigMaps
        # key by key, so the renderers need their keys too. Pruning still only touches objects
        # their owner made.
        labels = None if kind == "ConfigMap" else {keys.OPERATOR_STATE_LABEL: None}
        return self.add(
            owned_name(api_version, kind),
            resources.resource(api_version, kind),
            namespace=self.namespace if info.namespaced else None,
            labels=labels,
            transform=strip.owned,
        )

    def owned(self, api_version: str, kind: str) -> Informer | None:
        return self.informers.get(owned_name(api_version, kind))

    def owned_kinds(self) -> list[tuple[str, str]]:
        """The (apiVersion, kind) of every owned-kind cache, in the order they were added."""
        prefix = "owned:"
        found = []
        for name in self.informers:
            if name.startswith(prefix):
                api_version, _, kind = name.removeprefix(prefix).rpartition("/")
                found.append((api_version, kind))
        return found

    def live(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        """The cached copy of an object the renderers produce, by kind, namespace and name."""
        informer = self.owned(str(obj.get("apiVersion")), str(obj.get("kind")))
        if informer is None:
            return None
        meta = obj.get("metadata") or {}
        found: dict[str, Any] | None = informer.get(str(meta.get("name")), meta.get("namespace"))
        return found

    def start(self) -> list[asyncio.Task[None]]:
        self._running = [asyncio.create_task(i.run()) for i in self.informers.values()]
        return self._running

    async def synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in list(self.informers.values())))


class Runtime:
    """Runs registered reconcilers over shared caches, one queue and several workers."""

    def __init__(self, client: AsyncClient, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self.writer = Writer(client, namespace=settings.namespace)
        self.queue = WorkQueue()
        self.metrics = OperatorMetrics()
        self.elector = (
            LeaderElector(
                client,
                namespace=settings.leader_namespace or settings.namespace,
                identity=settings.identity,
            )
            if settings.leader_elect
            else None
        )
        self.caches = Caches(client, settings.namespace, self._dispatch, self._state_lost)
        self.reconcilers: dict[str, Reconciler] = {}
        self._watches: dict[str, list[Mapper]] = {}
        # What the status passes fold over every node (cluster facts, upgrade states), kept from
        # the node cache's events rather than walked again each pass (controller/facts.py).
        self.node_facts = facts.FactsFold()
        self.upgrade_nodes = facts.UpgradeFold()
        self.node_labels = facts.LabelFold()
        self._watches[NODES] = [self._fold_node]
        self.ready = asyncio.Event()
        self.write_slots = asyncio.Semaphore(settings.write_concurrency)
        self._tasks: list[asyncio.Task[None]] = []
        # Work keys being reconciled, with when they started (liveness reads it).
        self.busy: dict[str, float] = {}
        self.consistency_error: str | None = None
        # How many times a cache or the periodic check saw the API server go back in time.
        self.state_losses = 0

    # ----- wiring ------------------------------------------------------------------------------

    def register(self, reconciler: Reconciler) -> None:
        """Add a reconciler: its keys start with its prefix; its watches name shared caches."""
        if not reconciler.prefix or reconciler.prefix in self.reconcilers:
            raise ValueError(f"reconciler prefix {reconciler.prefix!r} is empty or taken")
        self.reconcilers[reconciler.prefix] = reconciler
        self.queue.first.update(reconciler.first_keys)
        for watch in reconciler.watches():
            if watch.cache not in self.caches:
                raise KeyError(f"{reconciler.prefix} watches unknown cache {watch.cache!r}")
            self._watches.setdefault(watch.cache, []).append(watch.map)

    def _fold_node(self, key: str, old: Any, new: Any) -> tuple[()]:
        self.node_facts.changed(key, old, new)
        self.upgrade_nodes.changed(key, old, new)
        self.node_labels.changed(key, old, new)
        return ()

    def watch(self, cache: str, mapper: Mapper) -> None:
        """Subscribe to a cache added after registration (for example an optional CRD's kind)."""
        self._watches.setdefault(cache, []).append(mapper)

    def enqueue(self, key: str, after: float = 0.0) -> None:
        if after > 0:
            self.queue.add_after(key, after)
        else:
            self.queue.add(key)

    def enqueue_within(self, key: str, delay: float) -> None:
        """Queue a key no later than `delay` seconds from now (a later retry is brought forward)."""
        self.queue.add_within(key, delay)

    def _dispatch(self, cache: str, key: str, old: Any, new: Any) -> None:
        # Every watch event of every cache passes here: kept to plain loops.
        mappers = self._watches.get(cache)
        if not mappers:
            return
        queue = self.queue
        for mapper in mappers:
            for request_key, after in mapper(key, old, new):
                if after > 0:
                    queue.add_after(request_key, after)
                else:
                    queue.add(request_key)

    # ----- running -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Start caches, wait for them, then (as leader when electing) work until cancelled."""
        self._tasks = self.caches.start()
        try:
            await self.caches.synced()
            self.ready.set()
            self._tasks.append(asyncio.create_task(self._check_consistency()))
            if self.elector is not None:
                self._tasks.append(asyncio.create_task(self.elector.run()))
                await self.elector.is_leader.wait()
            for reconciler in self.reconcilers.values():
                for request in reconciler.initial():
                    self.enqueue(request.key, request.after)
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

    def _owner(self, key: str) -> Reconciler | None:
        return self.reconcilers.get(key.split("/", 1)[0])

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
            reconciler = self._owner(key)
            self.busy[key] = time.monotonic()
            try:
                if reconciler is None:
                    log.error("no reconciler for work key %s; dropped", key)
                else:
                    await reconciler.reconcile(key)
                self.queue.forget(key)
            except Exception as err:
                delay = self.queue.retry(key)
                log.warning(
                    "reconcile of %s failed: %s; retrying in %.1fs", key, describe(err), delay
                )
                if reconciler is not None:
                    reconciler.failed(key, err)
            finally:
                self.busy.pop(key, None)
                self.queue.done(key)

    async def _check_consistency(self) -> None:
        """Relist every cache when the API server's resourceVersion is older than one a cache
        has seen: after an etcd restore or a restart that lost data, watches resumed from a
        future version would wait forever and 410 never comes."""
        informers = self.caches.informers
        while True:
            await asyncio.sleep(self.settings.consistency_interval)
            # What the caches had seen before asking: watch events arriving while the list is in
            # flight carry newer versions than its answer and are no sign of lost state.
            seen = [(informer, informer.newest) for informer in list(informers.values())]
            try:
                version = await current_version(self.client, resources.CLUSTER_POLICY)
                self.consistency_error = None
            except Exception as err:
                self.consistency_error = describe(err)
                continue
            behind = rewound(seen, version)
            if behind:
                newest = max(int(str(seen_version)) for _, seen_version in behind)
                log.warning(
                    "the API server's resourceVersion went back (%s, we saw %d): it lost or "
                    "restored state; relisting every cache", version, newest,
                )  # fmt: skip
                self.state_losses += 1
                for informer in list(informers.values()):
                    informer.relist("the API server's state went back in time")

    def _state_lost(self, seen_by: Informer, how: str) -> None:
        """A cache saw the API server go back in time (a bookmark or event older than what it
        had seen, or a relist answered at an older version): it relists already; every other
        cache's watch may be waiting at a version the server no longer has, so all relist."""
        self.state_losses += 1
        for informer in list(self.caches.informers.values()):
            if informer is not seen_by:
                informer.relist(f"the API server's state went back in time ({how})")

    async def write(self, obj: dict[str, Any]) -> None:
        """Server-side apply through the writer, at most `write_concurrency` at a time. An object
        a previous writer (NVIDIA's operator) still owns fields of is taken over; one the caches
        do not hold (not created yet, or NVIDIA's, which lacks our state label) is read first to
        know which."""
        live = self.caches.live(obj)
        async with self.write_slots:
            if live is None or not taken_over_yet(live):
                await self.writer.take_over(obj)
            else:
                await self.writer.apply(obj)
