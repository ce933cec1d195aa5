"""Chained passes (issue 32): the operator plans with `chain=True`, so a node takes every step the
same facts decide (one patch per state, each label written in order) and a finishing node's slot
goes to the next node in the same pass. The limits must hold after every single node write, not
only between passes: the patches are applied in `actions.write_order` (the nodes that start only
after all the others), and a refused patch ends its node's chain and starts nobody."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping

import pytest
from upgrade_fleet import (
    NEW,
    OLD,
    T0,
    Fleet,
    driver_pod,
    gpu_pod,
    node,
    of_type,
    owner,
    pool,
    state_after,
    validator_ds,
    validator_pod,
)

from gpu_operator.nodes import ledger
from gpu_operator.upgrade import actions, incremental, planner, states
from gpu_operator.upgrade.policy import Canary
from gpu_operator.upgrade.snapshot import Node, Pod

Order = Callable[[list[actions.Action]], tuple[list[list[actions.PatchNode]], ...]]


def apply(current: Node, patch: actions.PatchNode) -> Node:
    labels = dict(current.labels)
    annotations = dict(current.annotations)
    for target, changes in ((labels, patch.labels), (annotations, patch.annotations)):
        for key, value in changes.items():
            if value is None:
                target.pop(key, None)
            else:
                target[key] = value
    return dataclasses.replace(
        current,
        labels=labels,
        annotations=annotations,
        unschedulable=current.unschedulable if patch.unschedulable is None
        else patch.unschedulable,
        resource_version=str(int(current.resource_version or "0") + 1),
    )  # fmt: skip


class Limits:
    """Checks the cluster after every node write: maxParallelUpgrades, maxUnavailable, and that
    every node cordoned by the upgrade says so in its ledger (never stranded)."""

    def __init__(self, max_parallel: int, max_unavailable: int, human: set[str]) -> None:
        self.max_parallel = max_parallel
        self.max_unavailable = max_unavailable
        self.human = human
        self.writes = 0

    def __call__(self, nodes: Mapping[str, Node]) -> None:
        self.writes += 1
        busy = sorted(n.name for n in nodes.values() if n.state not in states.IDLE)
        down = sorted(n.name for n in nodes.values() if n.unschedulable or not n.ready)
        assert len(busy) <= self.max_parallel, f"write {self.writes}: in progress {busy}"
        assert len(down) <= self.max_unavailable, f"write {self.writes}: unavailable {down}"
        for n in nodes.values():
            if n.unschedulable and n.name not in self.human:
                assert ledger.CORDON in ledger.read(n.annotations), f"{n.name} stranded"


def write(
    nodes: dict[str, Node],
    plan: actions.Plan,
    check: Limits,
    refuse: Callable[[actions.PatchNode], bool] = lambda _: False,
    order: Order = actions.write_order,
) -> set[str]:
    """Apply a plan's node patches as the controller does; the nodes whose steps all applied."""
    complete: set[str] = set()
    waves = order(plan.actions)
    for index, wave in enumerate(waves):
        if index > 0 and any(c[0].node not in complete for w in waves[:index] for c in w):
            break  # a node counted as finished may not be: nobody starts this pass
        for chain in wave:
            for patch in chain:
                if refuse(patch):
                    break
                nodes[patch.node] = apply(nodes[patch.node], patch)
                check(nodes)
            else:
                complete.add(chain[0].node)
    return complete


# ----- one pass ----------------------------------------------------------------------------------


def labels_written(plan: actions.Plan, name: str) -> list[str | None]:
    return [
        p.labels[states.STATE_LABEL]
        for p in plan.actions
        if isinstance(p, actions.PatchNode) and p.node == name and states.STATE_LABEL in p.labels
    ]


def test_a_started_node_with_no_gpu_pods_writes_each_state_in_order_in_one_pass() -> None:
    fleet = Fleet.of(1, state=states.UPGRADE_REQUIRED, owner=owner(maxUnavailable="100%"))
    plan = planner.plan(fleet.snapshot(), chain=True)
    assert labels_written(plan, "gpu-01") == [
        states.CORDON_REQUIRED,
        states.POD_DELETION_REQUIRED,
        states.POD_RESTART_REQUIRED,
    ]
    patches = of_type(plan, actions.PatchNode)
    assert [p.step for p in patches] == [0, 1, 2]
    assert all(p.takes_slot for p in patches)
    assert patches[1].unschedulable is True  # cordoned before the driver pod goes
    (deleted,) = of_type(plan, actions.DeletePod)
    assert deleted.name == "driver-gpu-01"
    # The "started" Event belongs to the first step: recorded only once that patch applied.
    (started,) = [e for e in of_type(plan, actions.Event) if "started" in e.message]
    assert started.step == 0


def test_the_one_step_planner_still_moves_one_state() -> None:
    fleet = Fleet.of(1, state=states.UPGRADE_REQUIRED, owner=owner(maxUnavailable="100%"))
    assert labels_written(fleet.plan(), "gpu-01") == [states.CORDON_REQUIRED]


def test_a_node_with_gpu_pods_is_cordoned_then_evicted_and_waits() -> None:
    fleet = Fleet.of(1, state=states.UPGRADE_REQUIRED, owner=owner(maxUnavailable="100%"))
    fleet.pods.append(gpu_pod("gpu-01", "train"))
    plan = planner.plan(fleet.snapshot(), chain=True)
    assert labels_written(plan, "gpu-01") == [states.CORDON_REQUIRED, states.POD_DELETION_REQUIRED]
    assert [e.name for e in of_type(plan, actions.EvictPod)] == ["train"]
    assert state_after(plan, "gpu-01") == states.POD_DELETION_REQUIRED


def test_a_ready_driver_is_validated_uncordoned_and_done_in_one_pass() -> None:
    fleet = Fleet(daemonsets=[pool(), validator_ds()], owner=owner(maxUnavailable="100%"))
    fleet.add(
        node("gpu-01", states.POD_RESTART_REQUIRED, unschedulable=True, ours=True),
        driver_pod("gpu-01", NEW, created=T0 - 5),
        validator_pod("gpu-01", created=T0 - 4),
    )
    plan = planner.plan(fleet.snapshot(), chain=True)
    assert labels_written(plan, "gpu-01") == [
        states.VALIDATION_REQUIRED,
        states.UNCORDON_REQUIRED,
        states.UPGRADE_DONE,
    ]
    assert of_type(plan, actions.PatchNode)[-1].unschedulable is False


def test_a_finishing_node_hands_its_slot_to_the_next_in_the_same_pass() -> None:
    fleet = Fleet(owner=owner(maxParallelUpgrades=1, maxUnavailable=1))
    fleet.add(
        node("gpu-01", states.UNCORDON_REQUIRED, unschedulable=True, ours=True),
        driver_pod("gpu-01", NEW),
    )
    fleet.add(node("gpu-02", states.UPGRADE_REQUIRED), driver_pod("gpu-02", OLD))
    plan = planner.plan(fleet.snapshot(), chain=True)
    assert state_after(plan, "gpu-01") == states.UPGRADE_DONE
    assert labels_written(plan, "gpu-02")[0] == states.CORDON_REQUIRED
    first, starts = actions.write_order(plan.actions)
    assert [c[0].node for c in first] == ["gpu-01"]
    assert [c[0].node for c in starts] == ["gpu-02"]
    # Applied in that order the limits hold after every write; the other way round they do not.
    check = Limits(1, 1, set())
    write(dict(fleet.nodes), plan, check)
    with pytest.raises(AssertionError, match="in progress"):
        write(dict(fleet.nodes), plan, Limits(1, 1, set()), order=lambda a: (
            actions.write_order(a)[1], actions.write_order(a)[0]))  # fmt: skip


def test_nobody_starts_when_a_finishing_nodes_patch_is_refused() -> None:
    fleet = Fleet(owner=owner(maxParallelUpgrades=1, maxUnavailable=1))
    fleet.add(
        node("gpu-01", states.UNCORDON_REQUIRED, unschedulable=True, ours=True),
        driver_pod("gpu-01", NEW),
    )
    fleet.add(node("gpu-02", states.UPGRADE_REQUIRED), driver_pod("gpu-02", OLD))
    plan = planner.plan(fleet.snapshot(), chain=True)
    nodes = dict(fleet.nodes)
    applied = write(nodes, plan, Limits(1, 1, set()), refuse=lambda p: p.node == "gpu-01")
    assert applied == set()
    assert nodes == fleet.nodes  # gpu-02 was not started


# ----- whole rollouts, events in an adversarial order --------------------------------------------


class Cluster:
    """A fleet whose pods change in a random order between passes (as a real cluster's watch
    events arrive), with some node patches refused as stale."""

    def __init__(self, rng: random.Random, size: int) -> None:
        self.rng = rng
        self.now = T0
        self.fleet = Fleet(daemonsets=[pool(), validator_ds()])
        for i in range(1, size + 1):
            name = f"gpu-{i:02d}"
            self.fleet.add(
                node(name, states.UPGRADE_DONE),
                driver_pod(name, OLD),
                validator_pod(name, created=T0 - 3600),
            )
            if rng.random() < 0.7:
                self.fleet.pods.append(gpu_pod(name, f"train-{name}"))

    def pods(self) -> dict[str, Pod]:
        return {p.key: p for p in self.fleet.pods}

    def act(self, plan: actions.Plan) -> None:
        pods = self.pods()
        for action in plan.actions:
            if isinstance(action, actions.EvictPod | actions.DeletePod):
                key = f"{action.namespace}/{action.name}"
                if key in pods:
                    pods[key] = dataclasses.replace(pods[key], deleting=True)
        self.fleet.pods = list(pods.values())

    def events(self) -> None:
        """Some of what is pending happens, in a random order."""
        self.now += self.rng.choice((0.0, 0.4, 1.0, 3.0))
        pods = self.pods()
        pending = [k for k, p in pods.items() if p.deleting or not p.ready]
        self.rng.shuffle(pending)
        for key in pending[: self.rng.randint(0, len(pending))]:
            pod = pods[key]
            if not pod.deleting:
                pods[key] = dataclasses.replace(pod, ready=True, phase="Running")
                continue
            del pods[key]
            app = pod.labels.get("app")
            if app == states.DRIVER_APP:
                new = driver_pod(pod.node, NEW, ready=False, phase="Pending", created=self.now)
                pods[new.key] = new
            elif app == states.VALIDATOR_APP:
                new = validator_pod(pod.node, created=self.now, ready=False)
                pods[new.key] = new
        self.fleet.pods = list(pods.values())


@pytest.mark.parametrize("seed", range(40))
def test_random_event_orders_and_refused_patches_never_exceed_the_limits(seed: int) -> None:
    rng = random.Random(seed)
    max_parallel, max_unavailable = rng.randint(1, 3), rng.randint(1, 3)
    cluster = Cluster(rng, rng.randint(3, 8))
    fleet = cluster.fleet
    human: set[str] = set()
    if rng.random() < 0.5:
        # Cordoned by someone else: unavailable throughout (one more may go at a time besides
        # it, or the rollout could never go on), and it stays cordoned.
        human.add("gpu-02")
        fleet.set_node("gpu-02", unschedulable=True)
        max_unavailable += 1
    fleet.owner = owner(maxParallelUpgrades=max_parallel, maxUnavailable=max_unavailable)
    check = Limits(max_parallel, max_unavailable, human)
    for _ in range(400):
        fleet.now = cluster.now
        plan = planner.plan(fleet.snapshot(), chain=True)
        pod_work = [a for a in plan.actions if isinstance(a, actions.EvictPod | actions.DeletePod)]
        assert len(set(pod_work)) == len(pod_work), "a pod asked for twice in one pass"
        write(fleet.nodes, plan, check, refuse=lambda _: rng.random() < 0.1)
        cluster.act(plan)
        if all(n.state == states.UPGRADE_DONE for n in fleet.nodes.values()) and all(
            p.revision == NEW for p in fleet.pods if p.labels.get("app") == states.DRIVER_APP
        ):
            break
        cluster.events()
    else:
        pytest.fail(f"not done: { {n: x.state for n, x in fleet.nodes.items()} }")
    assert check.writes > 0
    for name, current in fleet.nodes.items():
        assert current.unschedulable == (name in human), name


# ----- incremental passes (only the nodes that changed) ------------------------------------------


class Incremental:
    """The controller's bookkeeping around incremental passes (controller/upgrade.py): the
    nodes whose node object or pods changed since the last pass are planned, with those the
    fleet says to come back to; the rest are counted from the fleet's summaries."""

    def __init__(self) -> None:
        self.fleet = incremental.Fleet()
        self.nodes: dict[str, Node] = {}
        self.pods: dict[str, Pod] = {}
        self.full_passes = 0

    def changed(self, nodes: Mapping[str, Node], pods: Mapping[str, Pod]) -> set[str]:
        changed = {n for n in {*nodes, *self.nodes} if nodes.get(n) != self.nodes.get(n)}
        for key in {*pods, *self.pods}:
            old, new = self.pods.get(key), pods.get(key)
            if old != new:
                changed.update(p.node for p in (old, new) if p is not None)
        self.nodes, self.pods = dict(nodes), dict(pods)
        return changed

    def focus(self, fleet: Fleet) -> set[str]:
        changed = self.changed(fleet.nodes, {p.key: p for p in fleet.pods})
        return self.fleet.focus(changed, fleet.now)

    def plan(self, fleet: Fleet, focus: set[str]) -> actions.Plan:
        snap = fleet.snapshot()
        if self.fleet.ready:
            plan = planner.plan(snap, chain=True, focus=focus, fleet=self.fleet)
            if not plan.needs_full:
                self.fleet.update(plan, focus, snap.now)
                return plan
        self.full_passes += 1
        plan = planner.plan(snap, chain=True)
        assert self.fleet.reset(plan, snap.now) == []
        return plan


def work(plan: actions.Plan) -> list[actions.Action]:
    return sorted(
        (a for a in plan.actions if not isinstance(a, actions.EnsureRollbackSet)), key=repr
    )


def counters(fleet: incremental.Fleet) -> tuple[object, ...]:
    return (
        {k: incremental._comparable(v) for k, v in fleet.groups.items()},
        fleet.waiting,
        fleet.busy,
        fleet.rollbacks,
    )


def random_rollout(seed: int) -> tuple[random.Random, Cluster, Limits, set[str]]:
    rng = random.Random(seed)
    max_parallel, max_unavailable = rng.randint(1, 3), rng.randint(1, 3)
    cluster = Cluster(rng, rng.randint(3, 8))
    fleet = cluster.fleet
    human: set[str] = set()
    if rng.random() < 0.5:
        human.add("gpu-02")
        fleet.set_node("gpu-02", unschedulable=True)
        max_unavailable += 1
    fleet.owner = owner(maxParallelUpgrades=max_parallel, maxUnavailable=max_unavailable)
    if rng.random() < 0.5:
        # A canary first: the others wait for it (counted from the fleet when not planned).
        canary = Canary(nodes=1)
        fleet.owner = dataclasses.replace(
            fleet.owner, policy=dataclasses.replace(fleet.owner.policy, canary=canary)
        )
    return rng, cluster, Limits(max_parallel, max_unavailable, human), human


@pytest.mark.parametrize("seed", range(40))
def test_incremental_passes_plan_what_a_full_pass_plans(seed: int) -> None:
    """After every random sequence of events, a pass over only the changed nodes (and those the
    fleet says to come back to) asks for exactly the writes a full pass asks for, reports its
    nodes and policy alike, and leaves the fleet's counters as a full pass would."""
    rng, cluster, check, human = random_rollout(seed)
    fleet = cluster.fleet
    keeper = Incremental()
    planned = 0
    for _ in range(400):
        fleet.now = cluster.now
        focus = keeper.focus(fleet)
        full = planner.plan(fleet.snapshot(), chain=True)
        before = keeper.full_passes
        plan = keeper.plan(fleet, focus)
        if keeper.full_passes == before:
            planned += 1
            assert work(plan) == work(full)
            for name, report in plan.nodes.items():
                assert report == full.nodes[name], name
            assert plan.groups == full.groups
            fresh = incremental.Fleet()
            fresh.reset(full, fleet.now)
            assert counters(keeper.fleet) == counters(fresh)
            assert len(plan.summaries) <= len(full.summaries)
        write(fleet.nodes, plan, check, refuse=lambda _: rng.random() < 0.1)
        cluster.act(plan)
        if all(n.state == states.UPGRADE_DONE for n in fleet.nodes.values()) and all(
            p.revision == NEW for p in fleet.pods if p.labels.get("app") == states.DRIVER_APP
        ):
            break
        cluster.events()
    else:
        pytest.fail(f"not done: { {n: x.state for n, x in fleet.nodes.items()} }")
    assert planned > 0
    assert keeper.full_passes == 1
    for name, current in fleet.nodes.items():
        assert current.unschedulable == (name in human), name


@pytest.mark.parametrize("seed", range(40))
def test_incremental_passes_never_exceed_the_limits(seed: int) -> None:
    """The randomized limit check above, planned as the operator plans: incremental passes
    after a first full one."""
    rng, cluster, check, human = random_rollout(seed)
    fleet = cluster.fleet
    keeper = Incremental()
    for _ in range(400):
        fleet.now = cluster.now
        plan = keeper.plan(fleet, keeper.focus(fleet))
        pod_work = [a for a in plan.actions if isinstance(a, actions.EvictPod | actions.DeletePod)]
        assert len(set(pod_work)) == len(pod_work), "a pod asked for twice in one pass"
        write(fleet.nodes, plan, check, refuse=lambda _: rng.random() < 0.1)
        cluster.act(plan)
        if all(n.state == states.UPGRADE_DONE for n in fleet.nodes.values()) and all(
            p.revision == NEW for p in fleet.pods if p.labels.get("app") == states.DRIVER_APP
        ):
            break
        cluster.events()
    else:
        pytest.fail(f"not done: { {n: x.state for n, x in fleet.nodes.items()} }")
    assert check.writes > 0
    assert keeper.full_passes == 1
    for name, current in fleet.nodes.items():
        assert current.unschedulable == (name in human), name


@pytest.mark.parametrize("seed", range(40))
def test_full_passes_between_incremental_ones_find_their_counters_right(seed: int) -> None:
    """The controller's safety net: a full pass now and then (the periodic resync), with the
    events since the last pass not yet taken by the fleet, compares the counters of the nodes
    those events did not touch with its own. Through a whole random rollout it finds them equal
    every time, although such a pass often starts waiting nodes (a pending node finished and
    freed their slot): a node this very pass starts has not drifted."""
    rng, cluster, check, _ = random_rollout(seed)
    fleet = cluster.fleet
    keeper = Incremental()
    checked = 0
    for _ in range(400):
        fleet.now = cluster.now
        changed = keeper.changed(fleet.nodes, {p.key: p for p in fleet.pods})
        snap = fleet.snapshot()
        if keeper.fleet.ready and rng.random() < 0.3:
            plan = planner.plan(snap, chain=True)
            assert keeper.fleet.reset(plan, snap.now, changed) == [], f"pass {checked}"
            checked += 1
        else:
            plan = keeper.plan(fleet, keeper.fleet.focus(changed, fleet.now))
        write(fleet.nodes, plan, check, refuse=lambda _: rng.random() < 0.1)
        cluster.act(plan)
        if all(n.state == states.UPGRADE_DONE for n in fleet.nodes.values()) and all(
            p.revision == NEW for p in fleet.pods if p.labels.get("app") == states.DRIVER_APP
        ):
            break
        cluster.events()
    else:
        pytest.fail(f"not done: { {n: x.state for n, x in fleet.nodes.items()} }")
    assert checked > 0


def _summary(owner: str = "ClusterPolicy/cluster-policy", **flags: bool) -> actions.NodeSummary:
    fields = dict.fromkeys(
        ("busy", "unavailable", "failed", "failed_canary", "canary", "canary_pending", "waiting",
         "rollback", "first"),
        False,
    )  # fmt: skip
    return actions.NodeSummary(owner=owner, pool="driver" if owner else "", **{**fields, **flags})


def test_the_full_pass_check_reports_drift_only_where_the_counters_were_wrong() -> None:
    """`Fleet.reset` compares the counters of the nodes without pending events with the full
    pass's; what the full pass changed itself, or what events explain, is no drift."""
    key = "ClusterPolicy/cluster-policy"
    fleet = incremental.Fleet()
    done = _summary()
    # Start-up: the nodes are outside every policy (its DaemonSet not there yet).
    assert fleet.reset(actions.Plan(summaries={"a": _summary(""), "b": _summary("")}), T0) == []
    # Both nodes' events (now in the policy) are pending: nothing is left to compare, and a
    # policy with no counters before is not one whose counters were off.
    owned = actions.Plan(summaries={"a": done, "b": done})
    assert fleet.reset(owned, T0, pending={"a", "b"}) == []
    # A waiting node the full pass starts because the pending node `a` finished: no drift.
    fleet.reset(actions.Plan(summaries={"a": _summary(busy=True), "b": _summary(waiting=True)}), T0)
    start = actions.PatchNode("b", {states.STATE_LABEL: states.CORDON_REQUIRED}, {}, True, "7")
    started = actions.Plan(
        actions=[start], summaries={"a": done, "b": _summary(busy=True, unavailable=True)}
    )
    assert fleet.reset(started, T0, pending={"a"}) == []
    # Counters an incremental pass left wrong (`b` counted unavailable, with no event since
    # then to explain why it is not) are reported, and corrected.
    fleet.reset(owned, T0)
    fleet._put("b", _summary(unavailable=True))
    assert fleet.groups[key].unavailable == 1
    assert fleet.reset(owned, T0) == [key]
    assert fleet.groups[key].unavailable == 0
    # After a fleet-wide change (a new DaemonSet revision, a policy edit) nothing is compared.
    fleet._put("b", _summary(unavailable=True))
    assert fleet.reset(owned, T0, check=False) == []


def test_an_incremental_pass_plans_only_the_changed_nodes_and_a_slot_reaches_the_next() -> None:
    fleet = Fleet.of(6, daemonsets=[pool()])
    fleet.owner = owner(maxParallelUpgrades=1, maxUnavailable=6)
    for name in list(fleet.nodes):
        fleet.set_node(
            name, labels={**fleet.nodes[name].labels, states.STATE_LABEL: states.UPGRADE_REQUIRED}
        )
    keeper = Incremental()
    plan = keeper.plan(fleet, keeper.focus(fleet))
    assert len(plan.summaries) == 6
    assert state_after(plan, "gpu-01") != states.UPGRADE_REQUIRED
    check = Limits(1, 6, set())
    write(fleet.nodes, plan, check)
    # Nothing else changed: only the started node is planned again (its next step).
    plan = keeper.plan(fleet, keeper.focus(fleet))
    assert set(plan.summaries) == {"gpu-01"}
    assert keeper.full_passes == 1
