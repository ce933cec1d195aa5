"""DaemonSet controller: one pod per eligible node, revisions, rolling updates and full status.

The controller is incremental. Each DaemonSet keeps an index of its pods by node, a cached
placement decision per node and one status/rollout record per node; totals are sums of those
records. A node or pod event marks only that node dirty for the DaemonSets concerned, and a sync
visits only dirty nodes. Every node is walked only when a DaemonSet appears, its spec changes
(a new generation) or the controller starts. Syncs are time-sliced: a DaemonSet with many dirty
nodes gives the event loop back every few milliseconds and continues on its next turn.

Upstream behaviour kept (pkg/controller/daemon in kube-controller-manager 1.35, in our words):
* a node should run a pod when it matches nodeSelector/required affinity and has no untolerated
  NoSchedule/NoExecute taint; a pod may continue on a node with an untolerated NoSchedule taint;
* failed pods are deleted with a `FailedDaemonPod` Warning, under a per-node back-off (1 s
  doubling to 15 min) so that a pod failing at once is not recreated in a hot loop; succeeded
  pods are deleted with `SucceededDaemonPod`;
* without surge, extra pods on a node are deleted, keeping the oldest; with surge, an old and a
  new pod may coexist until the new one is available;
* RollingUpdate deletes old unavailable pods at once and old available ones while fewer than
  maxUnavailable nodes are unavailable; with maxSurge it creates new pods beside old ones (up to
  maxSurge at a time) and deletes an old pod once its replacement is available;
* status counts the oldest pod of each node; old ControllerRevisions beyond
  revisionHistoryLimit are deleted unless a live pod still carries their hash;
* orphaned pods in the DaemonSet's namespace that its selector matches (no controller, not being
  deleted) are adopted before any pod is created, as the ControllerRefManager claims them (here
  on every full walk: creation, spec change, start).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable
from typing import Any, NamedTuple, cast

from kubesim import errors, selectors
from kubesim.controllers import scheduling
from kubesim.controllers.base import SLICE_SECONDS, Controller
from kubesim.store import Event, Stored, dumps, loads
from kubesim.turns import TURNS

DS_KEY = ("apps", "daemonsets")
POD_KEY = ("", "pods")
NODE_KEY = ("", "nodes")
REVISION_KEY = ("apps", "controllerrevisions")
HASH_LABEL = "controller-revision-hash"
# The failed-pod back-off of the real controller: 1 s doubling to 15 minutes, per node.
FAILED_BACKOFF_INITIAL = 1.0
FAILED_BACKOFF_MAX = 900.0
# While a pass over many nodes runs, status is published at most this often.
STATUS_INTERVAL = 0.5


class NodeRecord(NamedTuple):
    """What one node contributes to a DaemonSet's status and rollout (counts are 0 or 1)."""

    desired: int = 0
    current: int = 0
    misscheduled: int = 0
    ready: int = 0
    available: int = 0
    updated: int = 0
    # Without surge: counts toward the unavailable total that maxUnavailable bounds.
    unavailable: int = 0
    # With surge: counts toward the surge total that maxSurge bounds.
    surging: int = 0
    # Without surge: an old, unavailable pod replaced at once / an old available candidate.
    replace: str = ""
    candidate: str = ""
    # With surge: create the new pod at once (old one unavailable) / a surge candidate.
    allowed_new: bool = False
    candidate_new: bool = False
    # With surge: the new pod is available, so the old one goes.
    retire: str = ""


EMPTY = NodeRecord()
_COUNTS = ("desired", "current", "misscheduled", "ready", "available", "updated")
# The fields of a record that add up to a DaemonSet's totals: its first eight, in order.
_TOTALS = (*_COUNTS, "unavailable", "surging")
assert NodeRecord._fields[: len(_TOTALS)] == _TOTALS


class Placement:
    """A DaemonSet's scheduling rules, prepared once per spec and applied to nodes."""

    def __init__(self, pod_spec: dict[str, Any]) -> None:
        self.selection = {
            "nodeSelector": pod_spec.get("nodeSelector") or {},
            "affinity": pod_spec.get("affinity") or {},
        }
        self.tolerations = scheduling.daemon_tolerations(pod_spec)

    def decide(self, node: dict[str, Any]) -> tuple[bool, bool]:
        """(should run, should continue running) on this node."""
        if not scheduling.node_selected(node, self.selection):
            return False, False
        should_run = should_continue = True
        for taint in (node.get("spec") or {}).get("taints") or ():
            effect = taint.get("effect")
            if effect not in ("NoSchedule", "NoExecute"):
                continue
            if any(scheduling.tolerates(t, taint) for t in self.tolerations):
                continue
            should_run = False
            if effect == "NoExecute":
                should_continue = False
        return should_run, should_continue


class DaemonState:
    """The controller's incremental view of one DaemonSet."""

    def __init__(self, uid: str) -> None:
        self.uid = uid
        self.generation = -1
        self.hash = ""
        self.placement: Placement | None = None
        self.decisions: dict[str, tuple[bool, bool]] = {}
        # node -> pod name -> latest stored version of the pod.
        self.pods: dict[str, dict[str, Stored]] = {}
        self.dirty: set[str] = set()
        self.records: dict[str, NodeRecord] = {}
        self.totals = dict.fromkeys(_TOTALS, 0)
        self.replace: dict[str, str] = {}
        self.candidates: dict[str, str] = {}
        self.allowed_new: set[str] = set()
        self.candidate_new: set[str] = set()
        self.retire: dict[str, str] = {}
        # A full pass over all nodes has finished since the last spec change: until then the
        # totals are partial and are not published.
        self.walked = False
        self.rechecks: dict[str, float] = {}
        self.backoff: dict[str, tuple[float, float]] = {}
        self.last_status = 0.0
        self.cleanup_pending = False
        # The pod of the current revision as the API server admitted it (a dry-run create), or
        # None when it is refused; node pods share its spec's subtrees (see _create_pod).
        self.prototype: dict[str, Any] | None = None
        self.template: dict[str, Any] = {}

    def record(self, node: str, new: NodeRecord) -> None:
        """Replace a node's record, keeping the totals and rollout sets in step."""
        old = self.records.get(node, EMPTY)
        if old == new:
            return
        totals = self.totals
        # The counts are the record's first fields (ints): compared by position, not by name.
        after_counts, before_counts = cast("tuple[int, ...]", new), cast("tuple[int, ...]", old)
        for field, after, before in zip(_TOTALS, after_counts, before_counts, strict=False):
            if after != before:
                totals[field] += after - before
        for mapping, attr in ((self.replace, "replace"), (self.candidates, "candidate"),
                              (self.retire, "retire")):  # fmt: skip
            value = getattr(new, attr)
            if value:
                mapping[node] = value
            else:
                mapping.pop(node, None)
        for members, flag in ((self.allowed_new, new.allowed_new),
                              (self.candidate_new, new.candidate_new)):  # fmt: skip
            if flag:
                members.add(node)
            else:
                members.discard(node)
        if new == EMPTY:
            self.records.pop(node, None)
        else:
            self.records[node] = new

    def add_pod(self, node: str, stored: Stored) -> None:
        self.pods.setdefault(node, {})[stored.obj["metadata"]["name"]] = stored

    def drop_pod(self, node: str, name: str) -> None:
        bucket = self.pods.get(node)
        if bucket is not None:
            bucket.pop(name, None)
            if not bucket:
                del self.pods[node]


class DaemonSetController(Controller):
    """Keys are (namespace, name) of DaemonSets; nodes to look at are kept per DaemonSet."""

    name = "daemonset-controller"
    resources = (DS_KEY, POD_KEY, NODE_KEY)

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.states: dict[tuple[str, str], DaemonState] = {}
        self._by_uid: dict[str, tuple[str, str]] = {}
        # The (DaemonSet uid, node) being synced: our own pod writes there need no resync.
        self._syncing: tuple[str, str] | None = None
        # Work counters, for tests and benchmarks: nodes synced, full walks.
        self.node_syncs = 0
        self.full_walks = 0

    def initial_keys(self) -> list[Any]:
        return [_ident(s) for s in self.store.scan(DS_KEY)]

    # ----- events ---------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        key = event.key
        if key == POD_KEY:
            self._pod_event(event)
        elif key == NODE_KEY:
            if event.type == "MODIFIED" and event.old is not None and not _placement_changed(event):
                return
            name = event.new.obj["metadata"]["name"]
            for ds_key, state in self.states.items():
                state.decisions.pop(name, None)
                state.dirty.add(name)
                self.enqueue(ds_key)
        elif key == DS_KEY:
            ident = _ident(event.new)
            if event.type == "DELETED":
                gone = self.states.pop(ident, None)
                if gone is not None:
                    self._by_uid.pop(gone.uid, None)
                return
            # Status and metadata writes need only a status check; spec changes a full walk,
            # which reconcile notices from the generation.
            self.enqueue(ident)

    def _pod_event(self, event: Event) -> None:
        meta = event.new.obj["metadata"]
        for ref in meta.get("ownerReferences") or ():
            if ref.get("kind") == "DaemonSet" and ref.get("controller"):
                break
        else:
            return
        ds_key = self._by_uid.get(ref.get("uid", ""))
        if ds_key is None:
            return  # not indexed yet: the DaemonSet's first (full) sync will find the pod
        state = self.states[ds_key]
        new_node = _target_node(event.new.obj)
        old_node = new_node
        if event.old is not None:
            old_node = _target_node(event.old.obj)
            if old_node != new_node:
                state.drop_pod(old_node, meta["name"])
                state.dirty.add(old_node)
        if event.type == "DELETED":
            state.drop_pod(new_node, meta["name"])
        else:
            state.add_pod(new_node, event.new)
        if self._syncing == (state.uid, new_node) and old_node == new_node:
            return  # our own write during that node's sync, which accounts for it
        state.dirty.add(new_node)
        self.enqueue(ds_key)

    # ----- sync -------------------------------------------------------------------------------

    def reconcile(self, key: Any) -> None:
        namespace, name = key
        stored = self.store.peek(DS_KEY, namespace, name)
        state = self.states.get(key)
        if stored is None or stored.obj["metadata"].get("deletionTimestamp"):
            if state is not None:
                del self.states[key]
                self._by_uid.pop(state.uid, None)
            return
        ds = stored.obj
        meta = ds["metadata"]
        if state is None or state.uid != meta["uid"]:
            if state is not None:
                self._by_uid.pop(state.uid, None)
            state = self.states[key] = DaemonState(meta["uid"])
            self._by_uid[state.uid] = key
        if state.generation != meta.get("generation", 1):
            self._full_walk(state, ds)
        now = time.monotonic()
        for node, due in list(state.rechecks.items()):
            if due <= now + 0.001:
                del state.rechecks[node]
                state.dirty.add(node)
        deadline = time.perf_counter() + SLICE_SECONDS
        while state.dirty:
            node = state.dirty.pop()
            self._sync_node(ds, state, node)
            if (time.perf_counter() >= deadline or TURNS.due()) and state.dirty:
                break
        if not state.dirty:
            state.walked = True
            if _rolling(ds):
                self._roll(ds, state)
            if state.cleanup_pending:
                self._cleanup_history(ds, state)
        if state.dirty:
            self.enqueue(key)
        if state.walked:
            self._publish(stored, state, final=not state.dirty)
        if state.rechecks:
            self.enqueue_after(key, max(0.0, min(state.rechecks.values()) - now) + 0.01)

    def _full_walk(self, state: DaemonState, ds: dict[str, Any]) -> None:
        """Spec changed (or first sight): re-read the pods, forget decisions, visit every node."""
        self.full_walks += 1
        meta = ds["metadata"]
        spec = ds.get("spec") or {}
        template = spec.get("template") or {}
        state.generation = meta.get("generation", 1)
        state.hash = scheduling.template_hash(template)
        state.placement = Placement(template.get("spec") or {})
        state.decisions.clear()
        state.walked = False
        state.template = _pod_prototype(ds, template, state.hash)
        state.prototype = self._admit(state.template)
        state.pods.clear()
        self._adopt_orphans(ds)
        for key, ns, pod_name in self.store.dependents(state.uid):
            if key != POD_KEY:
                continue
            found = self.store.peek(POD_KEY, ns, pod_name)
            if found is None or not scheduling.is_controlled_by(found.obj, state.uid):
                continue
            state.add_pod(_target_node(found.obj), found)
        state.dirty.update(s.obj["metadata"]["name"] for s in self.store.scan(NODE_KEY))
        state.dirty.update(state.pods)
        state.dirty.update(state.records)
        self._ensure_revision(ds, state, template)

    def _adopt_orphans(self, ds: dict[str, Any]) -> None:
        """Give orphaned pods the selector matches a controller reference to this DaemonSet."""
        meta = ds["metadata"]
        selector = selectors.from_label_selector_object((ds.get("spec") or {}).get("selector"))
        rt = self.rt("pods")
        for stored in list(self.store.scan(POD_KEY, meta["namespace"])):
            pod_meta = stored.obj["metadata"]
            if pod_meta.get("deletionTimestamp") or any(
                r.get("controller") for r in pod_meta.get("ownerReferences") or []
            ):
                continue
            if not selector.matches(pod_meta.get("labels")):
                continue
            adopted = loads(dumps(stored.obj))
            adopted["metadata"]["ownerReferences"] = [
                *(pod_meta.get("ownerReferences") or []),
                _owner_ref(ds),
            ]
            self.store.replace(rt, adopted, namespace=meta["namespace"], name=pod_meta["name"])

    def _sync_node(self, ds: dict[str, Any], state: DaemonState, node_name: str) -> None:
        """Create or delete this DaemonSet's pods on one node, then recompute its record."""
        self.node_syncs += 1
        self._syncing = (state.uid, node_name)
        try:
            node = self.store.peek(NODE_KEY, "", node_name) if node_name else None
            if node is None:
                state.decisions.pop(node_name, None)
                for pod in _live(state.pods.get(node_name)):
                    self._delete(ds, pod)
                state.record(node_name, self._record(ds, state, node_name, False))
                return
            decision = state.decisions.get(node_name)
            if decision is None:
                assert state.placement is not None
                decision = state.decisions[node_name] = state.placement.decide(node.obj)
            should_run, should_continue = decision
            self._manage(ds, state, node_name, should_run, should_continue)
            state.record(node_name, self._record(ds, state, node_name, should_run))
            if should_run and not state.pods.get(node_name) and node_name not in state.rechecks:
                # We deleted a finished pod outright: the node needs its replacement, which a
                # look at the node (upstream: the next sync) creates.
                state.dirty.add(node_name)
        finally:
            self._syncing = None

    def _manage(
        self,
        ds: dict[str, Any],
        state: DaemonState,
        node: str,
        should_run: bool,
        should_continue: bool,
    ) -> None:
        pods = list((state.pods.get(node) or {}).values())
        if should_run and not pods:
            self._create_pod(ds, state, node)
            return
        if not should_continue:
            for pod in _live(pods):
                self._delete(ds, pod)
            return
        running: list[Stored] = []
        for stored in _live(pods):
            phase = (stored.obj.get("status") or {}).get("phase")
            if phase == "Failed":
                if self._failed_pod_backoff(ds, state, node):
                    continue
                self._event(
                    ds,
                    "Warning",
                    "FailedDaemonPod",
                    f"Found failed daemon pod {_pod_ref(stored)} on node {node}, "
                    "will try to kill it",
                )
                self._delete(ds, stored)
            elif phase == "Succeeded":
                self._event(
                    ds,
                    "Normal",
                    "SucceededDaemonPod",
                    f"Found succeeded daemon pod {_pod_ref(stored)} on node {node}, "
                    "will try to delete it",
                )
                self._delete(ds, stored)
            else:
                running.append(stored)
        if len(running) <= 1:
            if not running and should_run and _surge_allowed(ds):
                self._create_pod(ds, state, node)  # surging keeps one non-deleted pod per node
            return
        running.sort(key=lambda s: _age(s, state.hash))
        if not _surge_allowed(ds):
            for extra in running[1:]:
                self._delete(ds, extra)
            return
        # With surge: keep the oldest new and the oldest old pod; the old one goes once it is
        # not ready or the new one is available.
        newest: Stored | None = None
        oldest: Stored | None = None
        for stored in running:
            if _labels(stored).get(HASH_LABEL) == state.hash:
                if newest is None:
                    newest = stored
                    continue
            elif oldest is None:
                oldest = stored
                continue
            self._delete(ds, stored)
        if newest is not None and oldest is not None:
            min_ready = _min_ready(ds)
            if not scheduling.pod_ready(oldest.obj) or (
                scheduling.ready_for(newest.obj, min_ready) == 0
            ):
                self._delete(ds, oldest)

    def _failed_pod_backoff(self, ds: dict[str, Any], state: DaemonState, node: str) -> bool:
        """Whether deleting a failed pod on this node must wait (and requeue for then)."""
        now = time.monotonic()
        entry = state.backoff.get(node)
        if entry is not None and now - entry[1] < entry[0]:
            self.enqueue_after(_ident_of(ds), entry[0] - (now - entry[1]) + 0.01)
            state.rechecks[node] = entry[1] + entry[0]
            return True
        if entry is None or now - entry[1] > 2 * FAILED_BACKOFF_MAX:
            delay = FAILED_BACKOFF_INITIAL
        else:
            delay = min(entry[0] * 2, FAILED_BACKOFF_MAX)
        state.backoff[node] = (delay, now)
        return False

    def _record(
        self, ds: dict[str, Any], state: DaemonState, node: str, should_run: bool
    ) -> NodeRecord:
        """The node's status counts and rollout role, from the pods indexed there now."""
        # Pods that finished and are being deleted no longer count (as upstream).
        pods = [
            s
            for s in (state.pods.get(node) or {}).values()
            if not (
                s.obj["metadata"].get("deletionTimestamp")
                and (s.obj.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            )
        ]
        if not should_run and not pods:
            return EMPTY
        min_ready = _min_ready(ds)
        fields: dict[str, Any] = {}
        waits: list[float] = []
        first: Stored | None = None
        wait = -1.0
        if should_run:
            fields["desired"] = 1
            if pods:
                fields["current"] = 1
                # The oldest pod counts (upstream), but a pod still running beats one being
                # deleted: kubesim counts a terminating pod unready at once (a kubelet reports
                # it so moments later), which would make a surge rollout look like an outage.
                first = pods[0] if len(pods) == 1 else min(
                    pods,
                    key=lambda s: (
                        bool(s.obj["metadata"].get("deletionTimestamp")),
                        _age(s, state.hash),
                    ),
                )  # fmt: skip
                wait = scheduling.ready_for(first.obj, min_ready)
                waits.append(wait)
                fields["ready"] = int(wait >= 0)
                fields["available"] = int(wait == 0)
                fields["updated"] = int(_labels(first).get(HASH_LABEL) == state.hash)
        elif pods:
            fields["misscheduled"] = 1
        # The rollout's view: at most one old and one new non-deleted pod per node.
        new: Stored | None = None
        old: Stored | None = None
        excess = False
        for stored in pods:
            if stored.obj["metadata"].get("deletionTimestamp"):
                continue
            if _labels(stored).get(HASH_LABEL) == state.hash:
                excess = excess or new is not None
                new = stored
            else:
                excess = excess or old is not None
                old = stored
        # The pod that counted above is most often the node's only one: its wait is known.
        new_wait = _wait_of(new, first, wait, min_ready)
        old_wait = _wait_of(old, first, wait, min_ready)
        waits += (new_wait, old_wait)
        positive = [w for w in waits if w > 0]
        recheck = min(positive) if positive else 0.0
        if recheck > 0:
            state.rechecks[node] = time.monotonic() + recheck
        if excess:
            # The manage step prunes extra pods first; meanwhile the node counts as unavailable.
            fields["unavailable"] = fields["surging"] = 1
        elif old is None or new is not None:
            # Nothing to replace here, or a replacement under way: unavailable unless a lone
            # new pod is available.
            if new is None or old is not None or new_wait != 0:
                fields["unavailable"] = 1
            if new is not None and old is not None:
                if new_wait != 0:
                    fields["surging"] = 1
                else:
                    fields["retire"] = old.obj["metadata"]["name"]
        elif old_wait != 0:
            fields["replace"] = old.obj["metadata"]["name"]
            fields["allowed_new"] = True
        else:
            fields["candidate"] = old.obj["metadata"]["name"]
            fields["candidate_new"] = True
        return NodeRecord(**fields)

    def _roll(self, ds: dict[str, Any], state: DaemonState) -> None:
        """One RollingUpdate step over the records (all nodes are up to date here)."""
        desired = state.totals["desired"]
        max_surge, max_unavailable = _rollout_limits(ds, desired)
        if max_surge == 0:
            for node, pod_name in list(state.replace.items()):
                self._delete_named(ds, state, node, pod_name)
            budget = max_unavailable - state.totals["unavailable"]
            if budget > 0 and state.candidates:
                for node in heapq.nsmallest(budget, state.candidates):
                    self._delete_named(ds, state, node, state.candidates[node])
            return
        for node, pod_name in list(state.retire.items()):
            self._delete_named(ds, state, node, pod_name)
        for node in sorted(state.allowed_new):
            self._create_pod(ds, state, node)
        budget = max_surge - state.totals["surging"]
        if budget > 0 and state.candidate_new:
            for node in heapq.nsmallest(budget, state.candidate_new):
                self._create_pod(ds, state, node)

    def _publish(self, stored: Stored, state: DaemonState, *, final: bool) -> None:
        """Write status when it changed: at the end of a pass, or now and then during one."""
        ds = stored.obj
        totals = state.totals
        status: dict[str, Any] = {
            "currentNumberScheduled": totals["current"],
            "desiredNumberScheduled": totals["desired"],
            "numberMisscheduled": totals["misscheduled"],
            "numberReady": totals["ready"],
            "observedGeneration": ds["metadata"].get("generation", 1),
            "updatedNumberScheduled": totals["updated"],
        }
        if totals["available"]:
            status["numberAvailable"] = totals["available"]
        if totals["desired"] - totals["available"] > 0:
            status["numberUnavailable"] = totals["desired"] - totals["available"]
        if "collisionCount" in (ds.get("status") or {}):
            status["collisionCount"] = ds["status"]["collisionCount"]
        if ds.get("status") == status:
            return
        now = time.monotonic()
        if not final and now - state.last_status < STATUS_INTERVAL:
            return
        state.last_status = now
        obj = stored.copy()
        obj["status"] = status
        meta = obj["metadata"]
        self.store.replace(
            self.rt("daemonsets.apps"),
            obj,
            namespace=meta["namespace"],
            name=meta["name"],
            subresource="status",
        )

    # ----- writes -----------------------------------------------------------------------------

    def _event(self, ds: dict[str, Any], event_type: str, reason: str, message: str) -> None:
        self.events.record(ds, event_type, reason, message, component="daemonset-controller")

    def _delete_named(self, ds: dict[str, Any], state: DaemonState, node: str, name: str) -> None:
        found = (state.pods.get(node) or {}).get(name)
        if found is not None:
            self._delete(ds, found)

    def _delete(self, ds: dict[str, Any], pod: Stored) -> None:
        self.delete_pod(ds, pod.obj)

    def _admit(self, template: dict[str, Any]) -> dict[str, Any] | None:
        """The pod as the API server would store it (defaults, admission, validation), minus
        what differs per node; None when it would be refused."""
        sample = loads(dumps(template))
        _pin(sample["spec"], "prototype-node")
        try:
            admitted = self.store.insert(self.rt("pods"), sample, dry_run=True).obj
        except errors.ApiError:
            return None
        spec = dict(admitted["spec"])
        spec.pop("nodeName", None)
        for computed in ("priority", "preemptionPolicy"):  # priority admission runs per pod
            if computed not in template["spec"]:
                spec.pop(computed, None)
        meta = admitted["metadata"]
        keep = ("generateName", "namespace", "labels", "annotations", "ownerReferences")
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {k: meta[k] for k in keep if k in meta},
            "spec": spec,
        }

    def _create_pod(self, ds: dict[str, Any], state: DaemonState, node: str) -> None:
        prototype = state.prototype
        rt = self.rt("pods")
        try:
            if prototype is None:
                # Refused at the dry run: this create reports why.
                pod: dict[str, Any] = loads(dumps(state.template))
                _pin(pod["spec"], node)
                created = self.store.insert(rt, pod)
            else:
                # Node pods differ only in node name, node affinity and generated name, so
                # they share the admitted prototype's containers, volumes and the rest (stored
                # objects are never mutated) and skip decoding and validation: a copy per pod
                # was most of the cost, and memory, of rolling out to thousands of nodes.
                meta = dict(prototype["metadata"])
                meta["labels"] = dict(meta.get("labels") or {})
                spec = dict(prototype["spec"])
                _pin(spec, node)
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
                created = self.store.insert(rt, pod, trusted=True, defaulted=True)
        except errors.ApiError as exc:
            self._event(ds, "Warning", "FailedCreate", f"Error creating: {exc.message}")
            state.rechecks[node] = time.monotonic() + 1.0
            return
        self._event(
            ds, "Normal", "SuccessfulCreate", f"Created pod: {created.obj['metadata']['name']}"
        )

    # ----- revisions --------------------------------------------------------------------------

    def _revisions(self, uid: str) -> list[dict[str, Any]]:
        return [
            s.obj
            for key, ns, rev_name in self.store.dependents(uid)
            if key == REVISION_KEY and (s := self.store.peek(key, ns, rev_name)) is not None
        ]

    def _ensure_revision(
        self, ds: dict[str, Any], state: DaemonState, template: dict[str, Any]
    ) -> None:
        meta = ds["metadata"]
        rt = self.rt("controllerrevisions.apps")
        name = f"{meta['name']}-{state.hash}"
        revisions = self._revisions(meta["uid"])
        highest = max((int(r.get("revision", 0)) for r in revisions), default=0)
        limit = int((ds.get("spec") or {}).get("revisionHistoryLimit", 10))
        existing = next((r for r in revisions if r["metadata"]["name"] == name), None)
        state.cleanup_pending = len(revisions) + (existing is None) > limit + 1
        if existing is not None:
            if int(existing.get("revision", 0)) == highest:
                return
            updated = loads(dumps(existing))
            updated["revision"] = highest + 1
            self.store.replace(rt, updated, namespace=meta["namespace"], name=name)
            return
        data_template = loads(dumps(template))
        data_template["$patch"] = "replace"
        revision = {
            "apiVersion": "apps/v1",
            "kind": "ControllerRevision",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": {
                    **((template.get("metadata") or {}).get("labels") or {}),
                    HASH_LABEL: state.hash,
                },
                "ownerReferences": [_owner_ref(ds)],
            },
            "data": {"spec": {"template": data_template}},
            "revision": highest + 1,
        }
        if self.store.peek(REVISION_KEY, meta["namespace"], name) is None:
            self.store.insert(rt, revision)

    def _cleanup_history(self, ds: dict[str, Any], state: DaemonState) -> None:
        """Delete the oldest revisions beyond the limit that no live pod still uses."""
        meta = ds["metadata"]
        limit = int((ds.get("spec") or {}).get("revisionHistoryLimit", 10))
        current = f"{meta['name']}-{state.hash}"
        old = sorted(
            (r for r in self._revisions(meta["uid"]) if r["metadata"]["name"] != current),
            key=lambda r: int(r.get("revision", 0)),
        )
        excess = len(old) - limit
        if excess <= 0:
            state.cleanup_pending = False
            return
        live = {
            _labels(s).get(HASH_LABEL) for bucket in state.pods.values() for s in bucket.values()
        }
        rt = self.rt("controllerrevisions.apps")
        for revision in old:
            if excess <= 0:
                break
            if (revision["metadata"].get("labels") or {}).get(HASH_LABEL) in live:
                continue
            self.store.remove(rt, meta["namespace"], revision["metadata"]["name"])
            excess -= 1
        state.cleanup_pending = excess > 0


# ----- helpers ------------------------------------------------------------------------------


def _pod_prototype(ds: dict[str, Any], template: dict[str, Any], revision_hash: str) -> Any:
    """The pod every node gets, before its node name and node affinity are filled in."""
    meta = ds["metadata"]
    template_meta = template.get("metadata") or {}
    spec = loads(dumps(template.get("spec") or {}))
    spec["tolerations"] = scheduling.daemon_tolerations(spec)
    labels = dict(template_meta.get("labels") or {})
    labels[HASH_LABEL] = revision_hash
    labels["pod-template-generation"] = str(meta.get("generation", 1))
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{meta['name']}-",
            "namespace": meta["namespace"],
            "labels": labels,
            "ownerReferences": [_owner_ref(ds)],
        },
        "spec": spec,
    }
    if template_meta.get("annotations"):
        pod["metadata"]["annotations"] = dict(template_meta["annotations"])
    return pod


def _target_node(pod: dict[str, Any]) -> str:
    """The node a daemon pod is for: its `nodeName`, or (not bound yet) the node its required
    affinity names, as upstream's controller finds it."""
    spec = pod.get("spec") or {}
    node = spec.get("nodeName") or ""
    if node:
        return str(node)
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {})  # fmt: skip
    for term in required.get("nodeSelectorTerms") or ():
        for field in term.get("matchFields") or ():
            if field.get("key") == "metadata.name" and field.get("operator") == "In":
                values = field.get("values") or []
                if len(values) == 1:
                    return str(values[0])
    return ""


def _pin(spec: dict[str, Any], node: str) -> None:
    """Pin a daemon pod spec to a node; as upstream, the required node affinity becomes one
    term naming the node (preferred terms are kept). A pod with ResourceClaims is left to the
    scheduler, as upstream leaves every daemon pod: its DRA plugin allocates the claims when it
    binds the pod (a pod created bound would run with unallocated claims, which the kubelet
    refuses). Other pods are bound at once (kubesim's shortcut: the outcome is the same)."""
    if not spec.get("resourceClaims"):
        spec["nodeName"] = node
    else:
        spec.pop("nodeName", None)
    affinity = dict(spec.get("affinity") or {})
    node_affinity = dict(affinity.get("nodeAffinity") or {})
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }
    affinity["nodeAffinity"] = node_affinity
    spec["affinity"] = affinity


def _owner_ref(ds: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "name": ds["metadata"]["name"],
        "uid": ds["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _rolling(ds: dict[str, Any]) -> bool:
    strategy = (ds.get("spec") or {}).get("updateStrategy") or {}
    return bool(strategy.get("type", "RollingUpdate") == "RollingUpdate")


def _rolling_spec(ds: dict[str, Any]) -> dict[str, Any]:
    strategy = (ds.get("spec") or {}).get("updateStrategy") or {}
    return dict(strategy.get("rollingUpdate") or {}) if _rolling(ds) else {}


def _surge_allowed(ds: dict[str, Any]) -> bool:
    """Whether maxSurge is non-zero (a percentage counts against one node, as upstream)."""
    return scheduling.scaled_value(_rolling_spec(ds).get("maxSurge", 0), 1, True) != 0


def _rollout_limits(ds: dict[str, Any], desired: int) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) against the desired count, both rounded up; when both come
    out zero for a non-empty DaemonSet, one node may be unavailable."""
    rolling = _rolling_spec(ds)
    max_surge = scheduling.scaled_value(rolling.get("maxSurge", 0), desired, True)
    max_unavailable = scheduling.scaled_value(rolling.get("maxUnavailable", 1), desired, True)
    if desired > 0 and max_surge == 0 and max_unavailable == 0:
        max_unavailable = 1
    return max_surge, max_unavailable


def _wait_of(pod: Stored | None, known: Stored | None, known_wait: float, min_ready: int) -> float:
    """`scheduling.ready_for` of a pod (-1 for none), reusing the one already found for `known`."""
    if pod is None:
        return -1
    if pod is known:
        return known_wait
    return scheduling.ready_for(pod.obj, min_ready)


def _min_ready(ds: dict[str, Any]) -> int:
    return int((ds.get("spec") or {}).get("minReadySeconds") or 0)


def _labels(stored: Stored) -> dict[str, str]:
    labels: dict[str, str] = stored.obj["metadata"].get("labels") or {}
    return labels


def _age(stored: Stored, current_hash: str) -> tuple[str, bool, str]:
    """Oldest first: by creation time, then (upstream: by name) a pod of an earlier revision
    before one of the current revision, since it was created first; timestamps have whole
    seconds, and kubesim often replaces a pod within the second it was created."""
    meta = stored.obj["metadata"]
    current = (meta.get("labels") or {}).get(HASH_LABEL) == current_hash
    return (meta.get("creationTimestamp", ""), current, meta["name"])


def _live(pods: Iterable[Stored] | dict[str, Stored] | None) -> list[Stored]:
    """The pods that are not being deleted."""
    if pods is None:
        return []
    values = pods.values() if isinstance(pods, dict) else pods
    return [s for s in values if not s.obj["metadata"].get("deletionTimestamp")]


def _pod_ref(stored: Stored) -> str:
    meta = stored.obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


def _ident(stored: Stored) -> tuple[str, str]:
    return _ident_of(stored.obj)


def _ident_of(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    return (meta.get("namespace", ""), meta["name"])


def _placement_changed(event: Event) -> bool:
    """Whether a node change can affect daemon placement (labels, taints, spec)."""
    assert event.old is not None
    new, old = event.new.obj, event.old.obj
    return bool(
        new["metadata"].get("labels") != old["metadata"].get("labels")
        or new.get("spec") != old.get("spec")
    )
