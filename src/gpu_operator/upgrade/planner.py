"""The driver upgrade state machine: a snapshot in, actions out (reference §5, upstream's states).

Every decision is made from what the nodes carry (state label, annotations, cordon, ledger) and
what the cluster shows (driver pod revisions, GPU pods, validators, PDBs), so an operator that
restarts or fails over resumes where the last one stopped. Where upstream strands nodes, this
planner does not:

* a cordon the upgrade makes is recorded in the node's label ledger, and only such a cordon is
  ever undone (a node a human cordoned stays cordoned);
* a state label is checked against the node before it is followed: a mid-upgrade label on an
  uncordoned node, or an "upgrade-done" node whose driver is out of date, starts over;
* an eviction a PodDisruptionBudget refuses is retried until the policy's timeout, then the
  node fails with the PDB named, never with a forced deletion; a node that fails before its
  driver was touched goes back into service on its current driver;
* `upgrade-failed` carries why and how to retry, and stays until a human retries.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpu_operator.nodes import ledger
from gpu_operator.upgrade import actions, incremental, states
from gpu_operator.upgrade.policy import Policy
from gpu_operator.upgrade.snapshot import DaemonSet, Node, Owner, Pod, Revision, Snapshot

CORDON_OWNER = "driver-upgrade"
# States a node may enter and act on in the same pass (see _Pass._advance).
_CHAINED = frozenset(
    {
        states.CORDON_REQUIRED,
        states.WAIT_FOR_JOBS_REQUIRED,
        states.POD_DELETION_REQUIRED,
        states.DRAIN_REQUIRED,
        states.POD_RESTART_REQUIRED,
        states.VALIDATION_REQUIRED,
        states.UNCORDON_REQUIRED,
    }
)


@dataclass
class _Node:
    """A node with everything the state machine reads about it."""

    node: Node
    pool: DaemonSet
    owner: Owner
    target: str | None
    driver: Pod | None
    orphan: Pod | None
    rollback_pod: Pod | None
    pods: tuple[Pod, ...]
    state: str
    labels: dict[str, str | None] = field(default_factory=dict)
    annotations: dict[str, str | None] = field(default_factory=dict)
    unschedulable: bool | None = None
    message: str = ""
    blocked_by: tuple[str, ...] = ()
    next_state: str | None = None
    # Patches of the steps this pass already took (each state label written in order), and
    # the node as they leave it; `original` is the node as the snapshot had it.
    steps: list[actions.PatchNode] = field(default_factory=list)
    original: Node | None = None
    started: bool = False  # this pass started the node's upgrade (it takes a slot)

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def policy(self) -> Policy:
        return self.owner.policy

    @property
    def in_sync(self) -> bool:
        """The node runs the pool's newest driver revision (unknown revisions count as in sync)."""
        if self.orphan is not None:
            return False  # an orphaned driver (from a hand-over) always goes, new pod or not
        if self.driver is None or self.target is None:
            return True
        return self.driver.revision == self.target

    @property
    def restart_only(self) -> bool:
        """Only the pod changed, not the driver install (upstream's DRIVER_CONFIG_DIGEST check)."""
        pod = self.driver
        return (
            pod is not None
            and self.orphan is None
            and bool(pod.config_digest)
            and pod.config_digest == self.pool.config_digest
            and states.REQUESTED not in self.node.annotations
            and states.SAFE_LOAD not in self.node.annotations
        )

    @property
    def needs_upgrade(self) -> bool:
        annotations = self.node.annotations
        if self.driver is None and self.orphan is None:
            return False
        return (
            not self.in_sync
            or annotations.get(states.SAFE_LOAD) is not None
            or annotations.get(states.REQUESTED) == "true"
        )

    @property
    def unavailable(self) -> bool:
        return self.node.unschedulable or not self.node.ready

    @property
    def ours(self) -> bool:
        return self.node.cordoned_by_us

    def since(self, key: str = states.STATE_SINCE) -> float | None:
        raw = self.node.annotations.get(key)
        try:
            return float(raw) if raw is not None else None
        except ValueError:
            return None

    # ----- changes (accumulated into one patch per node) ------------------------------------

    def annotate(self, key: str, value: str | None) -> None:
        if self.node.annotations.get(key) != value:
            self.annotations[key] = value
        else:
            self.annotations.pop(key, None)

    def label(self, key: str, value: str | None) -> None:
        if self.node.labels.get(key) != value:
            self.labels[key] = value
        else:
            self.labels.pop(key, None)

    def move(self, state: str, now: float, message: str) -> None:
        """Go to `state` (recording when), explaining why."""
        self.next_state = state
        self.label(states.STATE_LABEL, state or None)
        self.annotate(states.STATE_SINCE, str(int(now)))
        self.message = message

    def cordon(self) -> None:
        if self.node.unschedulable:
            if not self.ours:
                # Someone else's cordon, found when we got to it: theirs to undo, never ours.
                self.annotate(states.INITIAL_UNSCHEDULABLE, "true")
            return
        self.unschedulable = True
        owned = ledger.read(self.node.annotations)
        owned[ledger.CORDON] = CORDON_OWNER
        self.annotate(ledger.ANNOTATION, ledger.encode(owned))

    def claim_cordon(self) -> None:
        """Re-record a cordon the ledger lost (a concurrent ledger write can drop the entry)."""
        owned = ledger.read(self.node.annotations)
        owned[ledger.CORDON] = CORDON_OWNER
        self.annotate(ledger.ANNOTATION, ledger.encode(owned))

    def uncordon(self) -> None:
        """Undo our own cordon only; a human's cordon is left as it is."""
        if not self.ours:
            return
        if self.node.unschedulable:
            self.unschedulable = False
        owned = ledger.read(self.node.annotations)
        owned.pop(ledger.CORDON, None)
        self.annotate(ledger.ANNOTATION, ledger.encode(owned))

    def clear_progress(self) -> None:
        for key in states.PROGRESS_ANNOTATIONS:
            self.annotate(key, None)

    def patch(self) -> actions.PatchNode | None:
        if not self.labels and not self.annotations and self.unschedulable is None:
            return None
        return actions.PatchNode(
            node=self.name,
            labels=dict(self.labels),
            annotations=dict(self.annotations),
            unschedulable=self.unschedulable,
            resource_version=self.node.resource_version,
            step=len(self.steps),
            takes_slot=self.started,
        )

    def patches(self) -> list[actions.PatchNode]:
        last = self.patch()
        return [*self.steps, last] if last is not None else list(self.steps)

    @property
    def after(self) -> str:
        """The state the node is in once this pass's patches are applied."""
        return self.next_state if self.next_state is not None else self.state

    @property
    def unavailable_after(self) -> bool:
        cordoned = self.node.unschedulable if self.unschedulable is None else self.unschedulable
        return cordoned or not self.node.ready or self.after == states.CORDON_REQUIRED

    def commit(self) -> None:
        """Close this step: its changes become one patch, and the next step is planned from the
        node as that patch leaves it (so every state label is written, in order)."""
        patch = self.patch()
        if patch is None:
            return
        if self.original is None:
            self.original = self.node
        labels = dict(self.node.labels)
        annotations = dict(self.node.annotations)
        for target, changes in ((labels, self.labels), (annotations, self.annotations)):
            for key, value in changes.items():
                if value is None:
                    target.pop(key, None)
                else:
                    target[key] = value
        self.node = dataclasses.replace(
            self.node,
            labels=labels,
            annotations=annotations,
            unschedulable=self.node.unschedulable if self.unschedulable is None
            else self.unschedulable,
        )  # fmt: skip
        self.steps.append(patch)
        self.labels, self.annotations, self.unschedulable = {}, {}, None
        if self.next_state is not None:
            self.state = self.next_state


def _retry_hint(name: str) -> str:
    return (
        f"To retry, fix the cause and run: kubectl label node {name} {states.STATE_LABEL}- "
        "(the upgrade then starts over from the beginning)"
    )


class _Pass:
    """One planning pass over a snapshot."""

    def __init__(
        self,
        snap: Snapshot,
        *,
        chain: bool = False,
        focus: Iterable[str] | None = None,
        fleet: incremental.Fleet | None = None,
    ) -> None:
        self.snap = snap
        self.chain = chain
        # Incremental: plan only `focus` (and waiting nodes a free slot reaches), counting the
        # other nodes from `fleet`.
        self.focus = None if fleet is None else set(focus or ())
        self.fleet = fleet
        self._planned: set[str] = set()
        self.now = snap.now
        self.plan = actions.Plan()
        self.pools = [d for d in snap.daemonsets if d.driver]
        self.rollbacks = [d for d in snap.daemonsets if d.rollback]
        self.validator_sets = [d for d in snap.daemonsets if d.validator]
        self.owners = {o.uid: o for o in snap.owners if o.uid}
        self.targets = pool_targets(self.pools, snap.revisions)
        # Looked up for every node: built once per pass, not once per node.
        self._pools_by_uid = {d.uid: d for d in self.pools}
        self._pools_by_name = sorted(self.pools, key=lambda d: d.name)
        self._rollback_uids = {d.uid for d in self.rollbacks}
        self.revisions_by_owner: dict[str, list[Revision]] = {}
        for rev in snap.revisions:
            self.revisions_by_owner.setdefault(rev.owner_uid, []).append(rev)
        self.nodes: list[_Node] = []

    # ----- building the view ------------------------------------------------------------------

    def _pool_for(self, node: Node, pods: Iterable[Pod]) -> tuple[DaemonSet | None, Pod | None]:
        by_uid = self._pools_by_uid
        owned = [p for p in pods if p.controller_uid in by_uid]
        if owned:
            # The newest live pod speaks for the node (an old one may still be terminating).
            pod = max(owned, key=lambda p: (not p.deleting, p.created))
            return by_uid[str(pod.controller_uid)], pod
        for ds in self._pools_by_name:
            if _targets_node(ds, node):
                return ds, None
        return None, None

    def build(self) -> None:
        if self.focus is None:
            names = sorted(self.snap.nodes)
        else:
            names = sorted(n for n in self.focus if n in self.snap.nodes)
        for name in names:
            self._build_one(name)

    def _build_one(self, name: str) -> _Node | None:
        """Look at one node: its entry (also in self.nodes), or None when it is outside the
        pools (handled and reported here)."""
        self._planned.add(name)
        node = self.snap.nodes[name]
        pods = self.snap.pods_by_node.get(name, ())
        pool, driver = self._pool_for(node, pods)
        if pool is None:
            self._outside_pools(node)
            return None
        owner = self.owners.get(pool.owner_uid or "")
        if owner is None:
            self._report_only(
                node,
                pool.name,
                "",
                f"driver DaemonSet {pool.name} has no ClusterPolicy or NVIDIADriver owner "
                "in view; left alone",
            )
            return None
        rollback_uids = self._rollback_uids
        orphan = next(
            (
                p
                for p in pods
                if p.controller_uid is None
                and p.namespace == pool.namespace
                and p.active
                and (
                    p.labels.get("app") == states.DRIVER_APP
                    or p.labels.get("app.kubernetes.io/component") == states.DRIVER_COMPONENT
                )
            ),
            None,
        )
        rollback_pod = next(
            (p for p in pods if p.controller_uid in rollback_uids and not p.deleting), None
        )
        if driver is None and rollback_pod is not None:
            # A rolled-back node runs the rollback DaemonSet's pod: that is its driver (and
            # never the pool's newest revision, so a retry upgrades it like any other).
            driver = rollback_pod
        state = node.state
        entry = _Node(
            node=node,
            pool=pool,
            owner=owner,
            target=self.targets.get(pool.uid),
            driver=driver,
            orphan=orphan,
            rollback_pod=rollback_pod,
            pods=pods,
            state=state if state in states.KNOWN else states.UNKNOWN,
        )
        self.nodes.append(entry)
        return entry

    def _report_only(self, node: Node, pool: str, owner: str, message: str) -> None:
        self.plan.summaries[node.name] = _OUTSIDE
        self.plan.nodes[node.name] = actions.NodeReport(
            node=node.name,
            pool=pool,
            owner=owner,
            state=node.state,
            previous=node.state,
            message=message,
        )

    def _outside_pools(self, node: Node) -> None:
        """A node no driver DaemonSet targets: only undo what an earlier upgrade left on it."""
        if not node.state and not node.cordoned_by_us:
            return
        entry = _Node(
            node=node,
            pool=_NO_POOL,
            owner=_NO_OWNER,
            target=None,
            driver=None,
            orphan=None,
            rollback_pod=None,
            pods=(),
            state=node.state,
        )
        entry.uncordon()
        entry.label(states.STATE_LABEL, None)
        entry.clear_progress()
        entry.message = "no driver DaemonSet targets this node any more; upgrade state cleared"
        self._finish_node(entry)

    # ----- the pass ---------------------------------------------------------------------------

    def run(self) -> actions.Plan:
        self.build()
        groups: dict[str, list[_Node]] = {}
        for entry in self.nodes:
            groups.setdefault(entry.owner.key, []).append(entry)
        for key in sorted(groups):
            self._group(key, groups[key])
            if self.plan.needs_full:
                return self.plan
        for entry in self.nodes:
            self._finish_node(entry)
        if self.fleet is None:
            self._rollback_sets()
        elif (
            self.rollbacks
            or self.fleet.rollbacks
            or any(s.rollback for s in self.plan.summaries.values())
        ):
            # Rollback DaemonSets are kept per (pool, revision) over every node: a full pass.
            self.plan.needs_full = "a rollback is under way"
        return self.plan

    def _finish_node(self, entry: _Node) -> None:
        self.plan.actions.extend(entry.patches())
        self.plan.summaries[entry.name] = _summary(entry)
        state = entry.next_state if entry.next_state is not None else entry.node.state
        self.plan.nodes[entry.name] = actions.NodeReport(
            node=entry.name,
            pool=entry.pool.name,
            owner=entry.owner.key,
            state=state,
            previous=(entry.original or entry.node).state,
            message=entry.message,
            blocked_by=entry.blocked_by,
        )

    def _event(self, entry: _Node, message: str, *, warning: bool = False) -> None:
        self.plan.actions.append(actions.Event(entry.name, message, warning, len(entry.steps)))

    def _group(self, key: str, nodes: list[_Node]) -> None:
        policy = nodes[0].policy
        # The policy's nodes this pass does not plan (incremental passes), from their summaries.
        rest = (
            self.fleet.background(key, self._planned)
            if self.fleet is not None
            else incremental.Counts()
        )
        total = len(nodes) + rest.total
        if not policy.auto_upgrade:
            for entry in nodes:
                self._auto_upgrade_off(entry)
            self.plan.groups[key] = actions.GroupReport(
                owner=key,
                total=total,
                in_progress=0,
                unavailable=0,
                max_unavailable=0,
                max_parallel=policy.max_parallel,
                started=0,
                failed=0,
                stopped="autoUpgrade is off",
                error=policy.error,
            )
            return
        for entry in nodes:
            self._validate(entry)
        # Counts come from the states as validated, before this pass moves anyone on (the
        # group's report shows these).
        in_progress = rest.busy + sum(1 for n in nodes if n.state not in states.IDLE)
        unavailable = rest.unavailable + sum(
            1 for n in nodes if n.unavailable or n.state == states.CORDON_REQUIRED
        )
        max_unavailable = policy.max_unavailable_of(total)
        failed = [n for n in nodes if n.state == states.UPGRADE_FAILED]
        stopped = self._stopped(policy, failed, rest)
        if stopped and self.fleet is not None:
            # A stopped rollout can move failed nodes anywhere (rollbacks): a full pass decides.
            self.plan.needs_full = f"the rollout of {key} is stopped ({stopped})"
            return
        failures = len(failed) + rest.failed
        if not self.chain:
            # One step per node, starts counted from the states before the pass.
            started = self._start(nodes, policy, in_progress, unavailable, max_unavailable, stopped)
            for entry in nodes:
                if entry.next_state is None:
                    self._step(entry, stopped)
            self._report(key, total, policy, in_progress, unavailable, started, failures, stopped)
            return
        # Chained: nodes on their way take their steps first, as many as the facts allow, and
        # the slots of those that finish go to waiting nodes in this same pass. That is safe
        # because the executor applies the starting nodes' patches only after every other patch
        # of the pass was applied (actions.write_order); if one is refused, no node starts.
        for entry in nodes:
            if entry.state != states.UPGRADE_REQUIRED:
                self._advance(entry, stopped)
        started = self._start(
            nodes,
            policy,
            rest.busy + sum(1 for n in nodes if n.after not in states.IDLE),
            rest.unavailable + sum(1 for n in nodes if n.unavailable_after),
            max_unavailable,
            stopped,
            rest,
            key,
        )
        for entry in nodes:  # with the waiting nodes _start planned as well
            if entry.started:
                self._advance(entry, stopped)
            elif entry.state == states.UPGRADE_REQUIRED and entry.next_state is None:
                self._step(entry, stopped)  # still waiting: says why
        self._report(key, total, policy, in_progress, unavailable, started, failures, stopped)

    def _report(
        self,
        key: str,
        total: int,
        policy: Policy,
        in_progress: int,
        unavailable: int,
        started: int,
        failed: int,
        stopped: str | None,
    ) -> None:
        max_unavailable = policy.max_unavailable_of(total)
        parallel = policy.max_parallel - in_progress if policy.max_parallel else total
        available = (
            0 if stopped or policy.error else max(0, min(parallel, max_unavailable - unavailable))
        )
        self.plan.groups[key] = actions.GroupReport(
            owner=key,
            total=total,
            in_progress=in_progress,
            unavailable=unavailable,
            max_unavailable=max_unavailable,
            max_parallel=policy.max_parallel,
            started=started,
            failed=failed,
            available=available,
            stopped=stopped,
            error=policy.error,
        )

    # ----- checking a label against the node ---------------------------------------------------

    def _validate(self, entry: _Node) -> None:
        """Correct a state label that does not match the node (stale, copied, or from a restart
        in the middle of a write) before anything follows it."""
        raw = entry.node.state
        if raw and raw not in states.KNOWN:
            entry.message = f"unknown state {raw!r} treated as no state"
        state = entry.state
        if state in states.CORDONED_STATES and not entry.node.unschedulable:
            entry.clear_progress()
            entry.move(
                states.UPGRADE_REQUIRED,
                self.now,
                f"label said {state} but the node is not cordoned (stale label); starting over",
            )
            self._event(entry, entry.message, warning=True)
            entry.state = states.UPGRADE_REQUIRED
            entry.next_state = None  # still competes for a slot in this pass
            return
        if (
            state in states.CORDONED_STATES | {states.UNCORDON_REQUIRED}
            and entry.node.unschedulable
            and not entry.ours
            and states.INITIAL_UNSCHEDULABLE not in entry.node.annotations
        ):
            # The node was schedulable when its upgrade began, so this cordon is ours.
            entry.claim_cordon()
        if state == states.UPGRADE_DONE and entry.ours and not entry.needs_upgrade:
            entry.uncordon()
            entry.message = "upgrade-done but still cordoned by an earlier upgrade: uncordoned"

    def _auto_upgrade_off(self, entry: _Node) -> None:
        """Upstream strips the state label; we also finish or undo what is under way."""
        state = entry.state
        if state in states.DRIVER_TOUCHED:
            self._step(entry, stopped=None)
            entry.message = f"autoUpgrade is off; finishing ({entry.message})"
            return
        if state == states.UPGRADE_FAILED:
            entry.message = "autoUpgrade is off; left as it failed: " + entry.node.annotations.get(
                states.FAILURE, "no reason recorded"
            )
            return
        if state or entry.ours:
            entry.uncordon()
            entry.label(states.STATE_LABEL, None)
            entry.clear_progress()
            entry.annotate(states.REQUESTED, None)
            entry.next_state = states.UNKNOWN
            entry.message = "autoUpgrade is off; upgrade state cleared"
        else:
            entry.message = "autoUpgrade is off"

    # ----- starting nodes --------------------------------------------------------------------

    def _stopped(self, policy: Policy, failed: list[_Node], rest: incremental.Counts) -> str | None:
        for entry in failed:
            canary = entry.node.annotations.get(states.CANARY)
            if canary and canary == entry.target:
                return f"canary node {entry.name} failed"
        if rest.failed_canaries:
            return "a canary node failed"
        limit = policy.canary.max_failed
        count = len(failed) + rest.failed
        if limit is not None and count > limit:
            return f"{count} nodes failed (more than {limit} allowed)"
        return None

    def _canary_state(
        self, nodes: list[_Node], policy: Policy, rest: incremental.Counts
    ) -> dict[str, tuple[int, int]]:
        """Per pool: (canary nodes still allowed to start, canaries not yet done)."""
        result: dict[str, tuple[int, int]] = {}
        by_pool: dict[str, list[_Node]] = {}
        for entry in nodes:
            by_pool.setdefault(entry.pool.name, []).append(entry)
        for pool in {*by_pool, *rest.pools}:
            members = by_pool.get(pool, [])
            size, others, others_pending = rest.pools.get(pool, (0, 0, 0))
            wanted = policy.canary_count(len(members) + size)
            target = members[0].target if members else None
            canaries = [
                n for n in members if target and n.node.annotations.get(states.CANARY) == target
            ]
            pending = [n for n in canaries if n.state != states.UPGRADE_DONE or not n.in_sync]
            result[pool] = (
                max(0, wanted - len(canaries) - others),
                len(pending) + others_pending,
            )
        return result

    def _start(
        self,
        nodes: list[_Node],
        policy: Policy,
        in_progress: int,
        unavailable: int,
        max_unavailable: int,
        stopped: str | None,
        rest: incremental.Counts | None = None,
        key: str = "",
    ) -> int:
        """Move upgrade-required nodes on while the limits allow (upstream's slot arithmetic).

        In an incremental pass the policy's other waiting nodes (from the fleet) take their
        place in the same order, and each is planned only when a slot could still be free for
        it; one no slot reaches keeps what its last pass said."""
        rest = rest if rest is not None else incremental.Counts()
        waiting = [n for n in nodes if n.state == states.UPGRADE_REQUIRED]
        others: dict[str, tuple[bool, bool]] = {}
        if self.fleet is not None:
            others = {
                name: flags
                for name, flags in self.fleet.waiting_nodes(key).items()
                if name not in self._planned
            }
        if not waiting and not others:
            return 0
        if policy.max_parallel == 0:
            parallel_left = len(waiting) + len(others)
        else:
            parallel_left = policy.max_parallel - in_progress
        unavailable_left = max_unavailable - unavailable
        canary = self._canary_state(nodes, policy, rest)
        canary_slots = {pool: left for pool, (left, _) in canary.items()}
        canary_pending = {pool: pending for pool, (_, pending) in canary.items()}
        started = 0

        def order(entry: _Node) -> tuple[bool, bool, str]:
            is_canary = entry.node.annotations.get(states.CANARY) == entry.target
            return (not is_canary, not entry.unavailable, entry.name)

        queue: list[tuple[tuple[bool, bool, str], _Node | None]] = [(order(n), n) for n in waiting]
        queue.extend(((not first, not down, name), None) for name, (first, down) in others.items())
        queue.sort(key=lambda item: item[0])
        for (_, available, name), found in queue:
            if found is None:
                if parallel_left <= 0 or (available and unavailable_left <= 0):
                    continue  # no slot reaches it: what its last pass said stands
                built = self._build_one(name)
                if (
                    built is None
                    or built.owner.key != key
                    or built.state != states.UPGRADE_REQUIRED
                ):
                    # Its summary did not match the node: count it all again.
                    self.plan.needs_full = f"node {name} changed unseen"
                    return started
                self._validate(built)
                nodes.append(built)
                found = built
            entry = found
            if entry.driver is None and entry.orphan is None:
                entry.message = "waiting for the node's driver pod to appear"
                continue
            if not entry.needs_upgrade:
                entry.uncordon()
                entry.clear_progress()
                entry.move(states.UPGRADE_DONE, self.now, "already runs the newest driver")
                continue
            if entry.node.labels.get(states.SKIP_LABEL) == "true":
                entry.message = f"skipped: the node is labelled {states.SKIP_LABEL}=true"
                continue
            if stopped:
                entry.message = f"waiting: the rollout is stopped ({stopped})"
                continue
            if policy.error:
                entry.message = f"waiting: the upgrade policy is unusable ({policy.error})"
                continue
            pool = entry.pool.name
            is_canary = bool(entry.target) and (
                entry.node.annotations.get(states.CANARY) == entry.target
            )
            pending = canary_pending.get(pool, 0)
            becomes_canary = False
            if not is_canary and (canary_slots.get(pool, 0) > 0):
                becomes_canary = True
            elif not is_canary and pending:
                entry.message = f"waiting for the canary of pool {pool} ({pending} not done)"
                continue
            if parallel_left <= 0:
                entry.message = (
                    f"waiting for a slot: {in_progress} in progress, "
                    f"maxParallelUpgrades {policy.max_parallel}"
                )
                continue
            if not entry.unavailable and unavailable_left <= 0:
                entry.message = (
                    f"waiting for a slot: {unavailable} unavailable, "
                    f"maxUnavailable {max_unavailable}"
                )
                continue
            parallel_left -= 1
            if not entry.unavailable:
                unavailable_left -= 1
            if becomes_canary:
                canary_slots[pool] -= 1
                canary_pending[pool] = canary_pending.get(pool, 0) + 1
                entry.annotate(states.CANARY, entry.target)
            entry.annotate(states.REQUESTED, None)
            entry.started = True
            started += 1
            kind = "canary " if (becomes_canary or is_canary) else ""
            if entry.restart_only:
                entry.cordon()
                entry.move(
                    states.POD_RESTART_REQUIRED,
                    self.now,
                    f"{kind}upgrade started: only the driver pod changes, restarting it",
                )
            else:
                entry.move(states.CORDON_REQUIRED, self.now, f"{kind}upgrade started")
            self._event(entry, f"{kind}driver upgrade started (revision {entry.target})")
        return started

    # ----- steps per node ---------------------------------------------------------------------

    def _advance(self, entry: _Node, stopped: str | None) -> None:
        """Take the node's steps while each one's outcome is known from the same facts (a
        cordon, a node with no GPU pods left, a validator already ready on the new driver): one
        patch per step, so every state label is still written, in upstream's order. A step
        that waits for the cluster (evictions, the driver pod, the validator) ends the chain,
        as do the states that free or take a slot or fail."""
        for _ in range(len(states.ORDER)):
            if entry.next_state is None:
                self._step(entry, stopped)
            moved = entry.next_state
            if moved is None or moved == entry.state or moved not in _CHAINED:
                return
            entry.commit()
            entry.next_state = None

    # ----- one step per node -------------------------------------------------------------------

    def _step(self, entry: _Node, stopped: str | None) -> None:
        handler = {
            states.UNKNOWN: self._idle,
            states.UPGRADE_DONE: self._idle,
            states.UPGRADE_REQUIRED: self._required,
            states.CORDON_REQUIRED: self._cordon,
            states.WAIT_FOR_JOBS_REQUIRED: self._wait_for_jobs,
            states.POD_DELETION_REQUIRED: self._pod_deletion,
            states.DRAIN_REQUIRED: self._drain,
            states.POD_RESTART_REQUIRED: self._pod_restart,
            states.VALIDATION_REQUIRED: self._validation,
            states.UNCORDON_REQUIRED: self._uncordon,
        }.get(entry.state)
        if handler is not None:
            handler(entry)
        elif entry.state == states.UPGRADE_FAILED:
            self._failed(entry, stopped)

    def _idle(self, entry: _Node) -> None:
        if entry.driver is None and entry.orphan is None:
            entry.message = entry.message or "no driver pod on the node yet"
            return
        if entry.orphan is not None:
            # A driver pod no DaemonSet owns is a hand-over in progress (ClusterPolicy ->
            # NVIDIADriver): the NVIDIADriver reconciler adopts it when it matches its pool, or
            # labels the node upgrade-required. As upstream, the idle check leaves orphans
            # alone: cordoning here would evict GPU pods for a driver that never restarts.
            entry.message = "driver pod owned by no DaemonSet: waiting for its hand-over"
            return
        if entry.needs_upgrade:
            entry.clear_progress()
            if entry.node.unschedulable and not entry.ours:
                entry.annotate(states.INITIAL_UNSCHEDULABLE, "true")
            pod = entry.driver or entry.orphan
            running = entry.node.labels.get(states.ROLLBACK_LABEL) or (
                pod.revision if pod else None
            )
            if running:
                entry.annotate(states.FROM_REVISION, running)
            why = "driver pod is out of date" if not entry.in_sync else "upgrade requested"
            entry.move(states.UPGRADE_REQUIRED, self.now, why)
            return
        if entry.state == states.UNKNOWN:
            entry.move(states.UPGRADE_DONE, self.now, "driver is up to date")
            entry.annotate(states.STATE_SINCE, None)
        elif not entry.message:
            entry.message = "driver is up to date"

    def _required(self, entry: _Node) -> None:
        # Reached only when _start left the node waiting; its message says why.
        if not entry.message:
            entry.message = "waiting for a slot"

    def _cordon(self, entry: _Node) -> None:
        entry.cordon()
        self._enter_wait_for_jobs(entry)

    def _enter_wait_for_jobs(self, entry: _Node) -> None:
        if entry.policy.wait_selector.empty:
            entry.move(states.POD_DELETION_REQUIRED, self.now, "cordoned; evicting GPU pods")
            return
        entry.move(
            states.WAIT_FOR_JOBS_REQUIRED,
            self.now,
            f"cordoned; waiting for pods matching {entry.policy.wait_selector} to finish",
        )
        entry.annotate(states.WAIT_FOR_COMPLETION_START, str(int(self.now)))

    def _wait_for_jobs(self, entry: _Node) -> None:
        selector = entry.policy.wait_selector
        running = [p for p in entry.pods if p.active and selector.matches(p.labels)]
        if selector.empty or not running:
            entry.annotate(states.WAIT_FOR_COMPLETION_START, None)
            entry.move(states.POD_DELETION_REQUIRED, self.now, "jobs finished; evicting GPU pods")
            return
        timeout = entry.policy.wait_timeout
        start = entry.since(states.WAIT_FOR_COMPLETION_START)
        if start is None:
            entry.annotate(states.WAIT_FOR_COMPLETION_START, str(int(self.now)))
            start = self.now
        if timeout > 0 and self.now >= start + timeout:
            entry.annotate(states.WAIT_FOR_COMPLETION_START, None)
            entry.move(
                states.POD_DELETION_REQUIRED,
                self.now,
                f"waited {timeout}s for {len(running)} job pods; evicting GPU pods",
            )
            return
        if timeout > 0:
            self.plan.wake_in(start + timeout - self.now, entry.name)
        entry.message = f"waiting for {len(running)} pods matching {selector}: " + ", ".join(
            p.key for p in running[:3]
        )

    # ----- evictions (GPU pod deletion and drain) -------------------------------------------------

    def _evict(
        self,
        entry: _Node,
        pods: list[Pod],
        *,
        force: bool,
        empty_dir: bool,
        timeout: int,
        what: str,
        section: str,
    ) -> bool:
        """Evict `pods`; True when none are left. Fails the node on undeletable pods or timeout."""
        active = [p for p in pods if p.active]
        going = [p for p in pods if p.deleting]
        if not active and not going:
            return True
        for pod in active:
            if pod.controller_kind is None and not force:
                self._fail(
                    entry,
                    f"{what}: pod {pod.key} is not managed by a controller and would be lost; "
                    f"set {section}.force to delete such pods",
                )
                return False
            if pod.empty_dir and not empty_dir:
                self._fail(
                    entry,
                    f"{what}: pod {pod.key} uses emptyDir data that eviction deletes; "
                    f"set {section}.deleteEmptyDir to allow it",
                )
                return False
        blocked = {}
        for pod in active:
            budget = next((b for b in self.snap.budgets if b.covers(pod)), None)
            if budget is not None and budget.disruptions_allowed <= 0:
                blocked[pod.key] = f"{budget.namespace}/{budget.name}"
        start = entry.since()
        if start is None:
            entry.annotate(states.STATE_SINCE, str(int(self.now)))
            start = self.now
        if timeout > 0 and self.now >= start + timeout and active:
            if blocked:
                detail = "; ".join(
                    f"eviction of {pod} refused by PodDisruptionBudget {pdb} "
                    "(0 disruptions allowed)"
                    for pod, pdb in sorted(blocked.items())
                )
            else:
                detail = "pods still running: " + ", ".join(p.key for p in active[:5])
            self._fail(entry, f"{what} timed out after {timeout}s: {detail}")
            return False
        for pod in active:
            self.plan.actions.append(actions.EvictPod(pod.namespace, pod.name, entry.name))
        entry.blocked_by = tuple(sorted(set(blocked.values())))
        if active:
            self.plan.wake_in(states.EVICTION_RETRY_SECONDS, entry.name)
            if timeout > 0:
                self.plan.wake_in(start + timeout - self.now, entry.name)
        parts = []
        if active:
            parts.append(f"evicting {len(active)} pods")
        if going:
            parts.append(f"{len(going)} terminating")
        if blocked:
            parts.append(
                "blocked by PodDisruptionBudget " + ", ".join(sorted(set(blocked.values())))
            )
        entry.message = f"{what}: " + "; ".join(parts)
        return False

    def _gpu_pods(self, entry: _Node) -> list[Pod]:
        # DaemonSet pods come straight back to a cordoned node, so evicting them cannot help.
        return [
            p
            for p in entry.pods
            if p.gpu and p.controller_kind != "DaemonSet" and (p.active or p.deleting)
        ]

    def _pod_deletion(self, entry: _Node) -> None:
        policy = entry.policy
        done = self._evict(
            entry,
            self._gpu_pods(entry),
            force=policy.deletion_force,
            empty_dir=policy.deletion_empty_dir,
            timeout=policy.deletion_timeout,
            what="GPU pod deletion",
            section="podDeletion",
        )
        if done:
            if policy.drain_enable:
                entry.move(states.DRAIN_REQUIRED, self.now, "GPU pods gone; draining the node")
            else:
                entry.move(states.POD_RESTART_REQUIRED, self.now, "GPU pods gone")

    def _drain_pods(self, entry: _Node) -> list[Pod]:
        selector = entry.policy.drain_selector
        return [
            p
            for p in entry.pods
            if p.controller_kind != "DaemonSet"
            and p.labels.get(states.DRAIN_SKIP_LABEL) != "true"
            and selector.matches(p.labels)
            and (p.active or p.deleting)
        ]

    def _drain(self, entry: _Node) -> None:
        policy = entry.policy
        if not policy.drain_enable:
            entry.move(states.POD_RESTART_REQUIRED, self.now, "drain disabled")
            return
        done = self._evict(
            entry,
            self._drain_pods(entry),
            force=policy.drain_force,
            empty_dir=policy.drain_empty_dir,
            timeout=policy.drain_timeout,
            what="drain",
            section="drain",
        )
        if done:
            entry.move(states.POD_RESTART_REQUIRED, self.now, "node drained")

    # ----- the driver pod and validation ----------------------------------------------------

    def _pod_restart(self, entry: _Node) -> None:
        if entry.node.labels.get(states.ROLLBACK_LABEL) is not None:
            # A retry after a rollback: hand the node back to the pool's own DaemonSet.
            entry.label(states.ROLLBACK_LABEL, None)
            entry.label(states.DRIVER_DEPLOY_LABEL, "true")
            entry.message = "returning the node from its rollback driver to the pool's DaemonSet"
            return
        busy = [p for p in self._gpu_pods(entry) if p.active]
        if busy and not entry.restart_only:
            entry.move(
                states.POD_DELETION_REQUIRED,
                self.now,
                f"GPU pods still on the node ({busy[0].key}); evicting them before the restart",
            )
            return
        if entry.orphan is not None:
            self._delete_driver(entry, entry.orphan, "orphaned driver pod")
            return
        pod = entry.driver
        if pod is None:
            entry.message = "waiting for the driver DaemonSet to create the new pod"
            return
        if not entry.in_sync:
            self._delete_driver(entry, pod, f"revision {pod.revision} is not {entry.target}")
            self._restart_validators(entry)
            return
        entry.annotate(states.SAFE_LOAD, None)
        if pod.phase == "Running" and pod.ready:
            self._driver_ready(entry)
            return
        if pod.restarts > states.MAX_DRIVER_RESTARTS:
            self._fail(
                entry,
                f"driver pod {pod.key} restarted {pod.restarts} times without becoming ready; "
                f"see: kubectl logs -n {pod.namespace} {pod.name} --all-containers",
            )
            return
        entry.message = f"waiting for driver pod {pod.key} to become ready ({pod.phase})"

    def _delete_driver(self, entry: _Node, pod: Pod, why: str) -> None:
        if not pod.deleting:
            self.plan.actions.append(actions.DeletePod(pod.namespace, pod.name, entry.name, why))
        entry.message = f"replacing driver pod {pod.key} ({why})"

    def _restart_validators(self, entry: _Node) -> None:
        """Delete the node's validator pods with its old driver (as NVIDIA's driver manager
        pauses the operands before a driver restarts): the DaemonSet's next pod starts after the
        old driver went, so it checks the new one, and validation need not tell a same-second
        validator from a stale one (creation times have whole seconds)."""
        for pod in self._validator_pods(entry):
            if not pod.deleting:
                self.plan.actions.append(
                    actions.DeletePod(
                        pod.namespace, pod.name, entry.name, "validates the old driver"
                    )
                )

    def _validator_pods(self, entry: _Node) -> list[Pod]:
        return [
            p
            for p in entry.pods
            if p.labels.get("app") == states.VALIDATOR_APP and p.namespace == entry.pool.namespace
        ]

    def _validated_here(self, entry: _Node) -> bool:
        """Whether a validator DaemonSet runs on the node (a node where a human turned the
        validator off, or a cluster without one, is not left waiting for it)."""
        labels = entry.node.labels
        return any(
            all(labels.get(k) == v for k, v in ds.node_selector.items())
            for ds in self.validator_sets
        )

    def _driver_ready(self, entry: _Node) -> None:
        if self._validated_here(entry):
            entry.move(
                states.VALIDATION_REQUIRED, self.now, "new driver ready; validating the node"
            )
            entry.annotate(states.VALIDATION_START, str(int(self.now)))
        else:
            self._validated(entry, "new driver ready (no validator deployed)")

    def _validated(self, entry: _Node, message: str) -> None:
        if entry.ours:
            entry.move(states.UNCORDON_REQUIRED, self.now, message + "; uncordoning")
        else:
            self._done(entry, message + "; the node stays cordoned as it was before")

    def _validators(self, entry: _Node, since: float) -> tuple[list[Pod], list[Pod]]:
        """(validator pods created since `since`, older ones still around)."""
        pods = self._validator_pods(entry)
        # A validator from the driver pod's own second counts as fresh: the validators the old
        # driver had were deleted with it (_restart_validators), so one still here from that
        # second was created after them. Restarting it as well would repeat until the clock's
        # second turned (creation times have whole seconds).
        fresh = [p for p in pods if p.created >= since and not p.deleting]
        stale = [p for p in pods if p.created < since and not p.deleting]
        return fresh, stale

    def _validation(self, entry: _Node) -> None:
        entry.annotate(states.SAFE_LOAD, None)
        pod = entry.driver
        if pod is None or not entry.in_sync:
            entry.annotate(states.VALIDATION_START, None)
            entry.move(
                states.POD_RESTART_REQUIRED,
                self.now,
                "the driver changed again during validation; restarting it",
            )
            return
        if self._validate_on(entry, pod.created):
            self._validated(entry, "validation passed")

    def _validate_on(self, entry: _Node, since: float) -> bool:
        """Run the validation workload for a driver that started at `since`; True when passed."""
        fresh, stale = self._validators(entry, since)
        for old in stale:
            # The validator checked the old driver; a new pod reruns its checks on this one.
            self.plan.actions.append(
                actions.DeletePod(old.namespace, old.name, entry.name, "validates the old driver")
            )
        if fresh and not stale and all(p.phase == "Running" and p.ready for p in fresh):
            entry.annotate(states.VALIDATION_START, None)
            return True
        if not self._validated_here(entry) and not fresh and not stale:
            return True
        timeout = entry.policy.canary.validation_timeout
        start = entry.since(states.VALIDATION_START)
        if start is None:
            entry.annotate(states.VALIDATION_START, str(int(self.now)))
            start = self.now
        if self.now >= start + timeout:
            detail = f"validator pod {fresh[0].key} not ready" if fresh else "no validator pod ran"
            self._fail(entry, f"validation failed: {detail} after {timeout}s")
            return False
        self.plan.wake_in(start + timeout - self.now, entry.name)
        if stale:
            entry.message = "restarting the validator on the new driver"
        elif not fresh:
            entry.message = "waiting for the validator pod"
        else:
            entry.message = f"waiting for validator pod {fresh[0].key} to become ready"
        return False

    def _uncordon(self, entry: _Node) -> None:
        entry.uncordon()
        self._done(entry, "uncordoned")

    def _done(self, entry: _Node, message: str) -> None:
        entry.clear_progress()
        entry.move(states.UPGRADE_DONE, self.now, message)
        entry.annotate(states.STATE_SINCE, None)
        self._event(entry, f"driver upgraded to revision {entry.target}: {message}")

    # ----- failure and rollback -----------------------------------------------------------------

    def _fail(self, entry: _Node, reason: str) -> None:
        touched = entry.state in states.DRIVER_TOUCHED
        if not touched and entry.ours:
            entry.uncordon()
            reason += "; the node was uncordoned and keeps its current driver"
        elif touched:
            reason += "; the node stays cordoned (its driver may be unusable)"
        message = f"{reason}. {_retry_hint(entry.name)}"
        for key in (states.WAIT_FOR_COMPLETION_START, states.VALIDATION_START):
            entry.annotate(key, None)
        entry.annotate(states.FAILURE, message)
        entry.move(states.UPGRADE_FAILED, self.now, reason)
        self._event(entry, f"driver upgrade failed: {message}", warning=True)

    def _failed(self, entry: _Node, stopped: str | None) -> None:
        reason = entry.node.annotations.get(states.FAILURE, "no reason recorded")
        entry.message = reason
        if entry.node.labels.get(states.ROLLBACK_LABEL) is not None:
            self._rolling_back(entry)
            return
        from_revision = entry.node.annotations.get(states.FROM_REVISION)
        pod = entry.driver
        touched = pod is not None and bool(from_revision) and pod.revision != from_revision
        if not (stopped and entry.policy.canary.rollback and touched and from_revision):
            return
        revision = next(
            (r for r in self.revisions_by_owner.get(entry.pool.uid, []) if r.hash == from_revision),
            None,
        )
        if revision is None:
            entry.message = f"{reason} (cannot roll back: revision {from_revision} is gone)"
            return
        entry.label(states.ROLLBACK_LABEL, from_revision)
        entry.label(states.DRIVER_DEPLOY_LABEL, states.ROLLBACK_PAUSE)
        entry.message = f"rolling back to driver revision {from_revision} ({stopped})"
        self._event(entry, entry.message, warning=True)

    def _rolling_back(self, entry: _Node) -> None:
        pod = entry.rollback_pod
        revision = entry.node.labels.get(states.ROLLBACK_LABEL)
        if pod is None or pod.phase != "Running" or not pod.ready:
            entry.message = f"rolling back to driver revision {revision}: waiting for its pod"
            return
        if not self._validate_on(entry, pod.created):
            entry.message = f"rolled back to revision {revision}; {entry.message}"
            return
        failure = entry.node.annotations.get(states.FAILURE, "")
        if entry.ours:
            entry.uncordon()
            note = f"Rolled back to driver revision {revision} and uncordoned. "
            if not failure.startswith("Rolled back"):
                entry.annotate(states.FAILURE, note + failure)
            self._event(entry, note.strip())
        entry.message = f"rolled back to driver revision {revision}; in service"

    def _rollback_sets(self) -> None:
        """One rollback DaemonSet per (pool, revision) any node still selects; others go."""
        wanted: dict[str, actions.EnsureRollbackSet] = {}
        for entry in self.nodes:
            revision = entry.node.labels.get(states.ROLLBACK_LABEL)
            if entry.labels.get(states.ROLLBACK_LABEL, revision) is None:
                continue  # being removed in this pass
            revision = entry.labels.get(states.ROLLBACK_LABEL) or revision
            if not revision:
                continue
            found = next(
                (r for r in self.revisions_by_owner.get(entry.pool.uid, []) if r.hash == revision),
                None,
            )
            if found is None:
                continue
            name = rollback_name(entry.pool.name, revision)
            wanted[name] = actions.EnsureRollbackSet(
                entry.pool.namespace, name, entry.pool.name, found.name, revision
            )
        for name in sorted(wanted):
            self.plan.actions.append(wanted[name])
        for ds in self.rollbacks:
            if ds.name not in wanted:
                self.plan.actions.append(actions.DeleteRollbackSet(ds.namespace, ds.name))


def _summary(entry: _Node) -> actions.NodeSummary:
    """The node as this pass leaves it (its patches applied), for incremental passes."""
    if entry.owner is _NO_OWNER:
        return _OUTSIDE

    def annotation(key: str) -> str | None:
        if key in entry.annotations:
            return entry.annotations[key]
        return entry.node.annotations.get(key)

    after = entry.after
    first = annotation(states.CANARY) == entry.target
    canary = bool(entry.target) and first
    failed = after == states.UPGRADE_FAILED
    rollback = entry.labels.get(states.ROLLBACK_LABEL, entry.node.labels.get(states.ROLLBACK_LABEL))
    return actions.NodeSummary(
        owner=entry.owner.key,
        pool=entry.pool.name,
        busy=after not in states.IDLE,
        unavailable=entry.unavailable_after,
        failed=failed,
        failed_canary=failed and canary,
        canary=canary,
        canary_pending=canary and (after != states.UPGRADE_DONE or not entry.in_sync),
        waiting=after == states.UPGRADE_REQUIRED,
        rollback=rollback is not None,
        first=first,
    )


def _targets_node(ds: DaemonSet, node: Node) -> bool:
    """Whether the DaemonSet's nodeSelector picks the node, its driver deploy label paused or not
    (a node being rolled back, or paused by the driver manager, still belongs to its pool)."""
    deploy = states.DRIVER_DEPLOY_LABEL
    if deploy in ds.node_selector and deploy not in node.labels:
        return False
    terms = {k: v for k, v in ds.node_selector.items() if k != deploy}
    if not terms and deploy not in ds.node_selector:
        return False  # a DaemonSet for every node is not a driver pool we can place nodes in
    return all(node.labels.get(k) == v for k, v in terms.items())


def rollback_name(pool: str, revision: str) -> str:
    """The rollback DaemonSet of a pool and revision (at most 63 characters)."""
    return f"{pool[:40].rstrip('-.')}-rollback-{revision[:16]}"


def pool_targets(pools: list[DaemonSet], revisions: Iterable[Revision]) -> dict[str, str]:
    """Each pool's newest ControllerRevision hash (the revision its pods should run)."""
    newest: dict[str, Revision] = {}
    for rev in revisions:
        current = newest.get(rev.owner_uid)
        if current is None or rev.number > current.number:
            newest[rev.owner_uid] = rev
    return {d.uid: newest[d.uid].hash for d in pools if d.uid in newest}


_NO_POOL = DaemonSet(
    namespace="",
    name="",
    uid="",
    labels={},
    owner_kind=None,
    owner_name=None,
    owner_uid=None,
    node_selector={},
    on_delete=True,
    config_digest=None,
    image="",
    precompiled=False,
)
_NO_OWNER = Owner(kind="", name="", uid="", policy=Policy())
# A node outside every policy: counted nowhere.
_OUTSIDE = actions.NodeSummary(
    owner="",
    pool="",
    busy=False,
    unavailable=False,
    failed=False,
    failed_canary=False,
    canary=False,
    canary_pending=False,
    waiting=False,
    rollback=False,
    first=False,
)


def plan(
    snapshot: Snapshot,
    *,
    chain: bool = False,
    focus: Iterable[str] | None = None,
    fleet: incremental.Fleet | None = None,
) -> actions.Plan:
    """The actions that move every node on, and a report per node and policy.

    By default each node takes one step (one state) per pass, as upstream's state machine does.
    With `chain`, as the operator plans, a node takes every step whose outcome the same facts
    already decide, one patch per state (so each state label is still written, in order), and
    slots freed by finishing nodes are taken in the same pass (actions.write_order says how the
    patches must be applied for that to stay within the limits).

    With a `fleet` (incremental, chained only), only the `focus` nodes are planned, plus the
    waiting nodes a free slot reaches; the other nodes are counted from the fleet's summaries
    (upgrade/incremental.py). Such a plan's `summaries` update the fleet; where it finds
    something only a full pass decides (a stopped rollout, a rollback) it says so in
    `needs_full` and is to be discarded for a full pass."""
    if fleet is not None and not chain:
        raise ValueError("incremental planning plans chained passes only")
    return _Pass(snapshot, chain=chain, focus=focus, fleet=fleet).run()


def summarize(plan_: actions.Plan) -> Mapping[str, int]:
    """Nodes per state after the pass (for logs and metrics)."""
    counts: dict[str, int] = {}
    for report in plan_.nodes.values():
        counts[report.state or "none"] = counts.get(report.state or "none", 0) + 1
    return counts
