"""The upgrade state machine, state in and actions out: every transition, the limits, timeouts,
PDB blocks, human cordons, stale labels and restarts (reference §5, issue 15)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from upgrade_fleet import (
    NEW,
    NS,
    OLD,
    T0,
    Fleet,
    driver_pod,
    gpu_pod,
    no_patch,
    node,
    of_type,
    owner,
    patch_for,
    pdb,
    pool,
    state_after,
    validator_ds,
    validator_pod,
)

from gpu_operator.nodes import ledger
from gpu_operator.upgrade import actions, planner, states


def cordon_entry(patch: actions.PatchNode) -> str | None:
    raw = patch.annotations.get(ledger.ANNOTATION)
    return json.loads(raw).get(ledger.CORDON) if raw else None


# ----- idle nodes ------------------------------------------------------------------------------


def test_a_node_without_state_and_an_up_to_date_driver_is_marked_done() -> None:
    fleet = Fleet()
    fleet.add(node("gpu-01"), driver_pod("gpu-01", NEW))
    plan = fleet.plan()
    assert patch_for(plan, "gpu-01").labels == {states.STATE_LABEL: states.UPGRADE_DONE}
    assert state_after(plan, "gpu-01") == states.UPGRADE_DONE


def test_an_out_of_date_driver_makes_a_done_node_upgrade_required() -> None:
    fleet = Fleet.of(1)
    plan = fleet.plan()
    patch = patch_for(plan, "gpu-01")
    assert patch.labels == {states.STATE_LABEL: states.UPGRADE_REQUIRED}
    assert patch.annotations[states.FROM_REVISION] == OLD
    assert patch.resource_version == "1"  # a stale view fails with a conflict instead
    assert states.INITIAL_UNSCHEDULABLE not in patch.annotations


def test_a_node_a_human_cordoned_is_recorded_as_initially_unschedulable() -> None:
    fleet = Fleet()
    fleet.add(node("gpu-01", states.UPGRADE_DONE, unschedulable=True), driver_pod("gpu-01"))
    patch = patch_for(fleet.plan(), "gpu-01")
    assert patch.annotations[states.INITIAL_UNSCHEDULABLE] == "true"


@pytest.mark.parametrize(
    "annotation",
    [{states.REQUESTED: "true"}, {states.SAFE_LOAD: "true"}],
    ids=["requested", "safe-load"],
)
def test_an_upgrade_request_or_a_waiting_driver_starts_an_upgrade_on_a_current_node(
    annotation: dict[str, str],
) -> None:
    fleet = Fleet()
    fleet.add(
        node("gpu-01", states.UPGRADE_DONE, annotations=annotation), driver_pod("gpu-01", NEW)
    )
    assert state_after(fleet.plan(), "gpu-01") == states.UPGRADE_REQUIRED


def test_a_node_whose_driver_pod_is_not_there_yet_is_left_alone() -> None:
    fleet = Fleet()
    fleet.add(node("gpu-01"))
    plan = fleet.plan()
    assert no_patch(plan, "gpu-01")
    assert "no driver pod" in plan.nodes["gpu-01"].message


# ----- starting: slots, limits, skip, canary -------------------------------------------------


def test_upgrade_required_nodes_start_up_to_max_parallel_upgrades() -> None:
    fleet = Fleet.of(
        6, state=states.UPGRADE_REQUIRED, owner=owner(maxParallelUpgrades=2, maxUnavailable="100%")
    )
    plan = fleet.plan()
    started = [n for n, r in plan.nodes.items() if r.state == states.CORDON_REQUIRED]
    assert started == ["gpu-01", "gpu-02"]
    assert "maxParallelUpgrades 2" in plan.nodes["gpu-03"].message
    assert plan.groups["ClusterPolicy/cluster-policy"].started == 2


def test_nodes_in_progress_use_up_parallel_slots() -> None:
    fleet = Fleet.of(
        4, state=states.UPGRADE_REQUIRED, owner=owner(maxParallelUpgrades=2, maxUnavailable="100%")
    )
    fleet.add(
        node("gpu-05", states.POD_DELETION_REQUIRED, unschedulable=True, ours=True),
        driver_pod("gpu-05"),
    )
    plan = fleet.plan()
    assert [n for n, r in plan.nodes.items() if r.state == states.CORDON_REQUIRED] == ["gpu-01"]


def test_max_parallel_zero_means_no_parallel_limit_only_max_unavailable() -> None:
    fleet = Fleet.of(
        10, state=states.UPGRADE_REQUIRED, owner=owner(maxParallelUpgrades=0, maxUnavailable=4)
    )
    plan = fleet.plan()
    assert sum(r.state == states.CORDON_REQUIRED for r in plan.nodes.values()) == 4


@pytest.mark.parametrize(
    ("nodes", "max_unavailable", "expected"),
    [(10, "25%", 3), (12, "25%", 3), (4, "25%", 1), (3, "50%", 2), (10, 2, 2), (10, "0%", 0)],
)
def test_max_unavailable_percentages_round_up_like_upstream(
    nodes: int, max_unavailable: int | str, expected: int
) -> None:
    fleet = Fleet.of(
        nodes,
        state=states.UPGRADE_REQUIRED,
        owner=owner(maxParallelUpgrades=0, maxUnavailable=max_unavailable),
    )
    plan = fleet.plan()
    assert plan.groups["ClusterPolicy/cluster-policy"].max_unavailable == expected
    assert sum(r.state == states.CORDON_REQUIRED for r in plan.nodes.values()) == expected


def test_unready_and_cordoned_nodes_count_as_unavailable() -> None:
    fleet = Fleet.of(
        8, state=states.UPGRADE_REQUIRED, owner=owner(maxParallelUpgrades=0, maxUnavailable=3)
    )
    fleet.add(node("gpu-09", states.UPGRADE_DONE, ready=False), driver_pod("gpu-09", NEW))
    fleet.add(node("gpu-10", states.UPGRADE_DONE, unschedulable=True), driver_pod("gpu-10", NEW))
    plan = fleet.plan()
    assert plan.groups["ClusterPolicy/cluster-policy"].unavailable == 2
    assert sum(r.state == states.CORDON_REQUIRED for r in plan.nodes.values()) == 1
    assert "maxUnavailable 3" in plan.nodes["gpu-08"].message


def test_cordon_required_nodes_count_as_unavailable_before_they_are_cordoned() -> None:
    fleet = Fleet.of(
        4, state=states.UPGRADE_REQUIRED, owner=owner(maxParallelUpgrades=0, maxUnavailable=2)
    )
    fleet.add(node("gpu-05", states.CORDON_REQUIRED), driver_pod("gpu-05"))
    fleet.add(node("gpu-06", states.CORDON_REQUIRED), driver_pod("gpu-06"))
    plan = fleet.plan()
    assert plan.groups["ClusterPolicy/cluster-policy"].unavailable == 2
    assert not any(
        r.state == states.CORDON_REQUIRED and r.previous == states.UPGRADE_REQUIRED
        for r in plan.nodes.values()
    )


def test_a_cordoned_node_starts_without_an_unavailability_slot_but_needs_a_parallel_one() -> None:
    fleet = Fleet.of(
        3, state=states.UPGRADE_REQUIRED, owner=owner(maxParallelUpgrades=2, maxUnavailable=1)
    )
    fleet.set_node("gpu-03", unschedulable=True)
    plan = fleet.plan()
    # gpu-03 is unavailable already (1 of 1): it goes first and costs no availability; the
    # other free parallel slot cannot be used because nothing more may become unavailable.
    assert state_after(plan, "gpu-03") == states.CORDON_REQUIRED
    assert state_after(plan, "gpu-01") == states.UPGRADE_REQUIRED
    assert state_after(plan, "gpu-02") == states.UPGRADE_REQUIRED


def test_a_node_labelled_skip_never_starts() -> None:
    fleet = Fleet()
    fleet.add(
        node("gpu-01", states.UPGRADE_REQUIRED, labels={states.SKIP_LABEL: "true"}),
        driver_pod("gpu-01"),
    )
    plan = fleet.plan()
    assert no_patch(plan, "gpu-01")
    assert "skipped" in plan.nodes["gpu-01"].message


def test_starting_drops_the_upgrade_requested_annotation() -> None:
    fleet = Fleet()
    fleet.add(
        node("gpu-01", states.UPGRADE_REQUIRED, annotations={states.REQUESTED: "true"}),
        driver_pod("gpu-01", NEW),
    )
    patch = patch_for(fleet.plan(), "gpu-01")
    assert patch.labels[states.STATE_LABEL] == states.CORDON_REQUIRED
    assert patch.annotations[states.REQUESTED] is None


def test_a_config_only_change_cordons_and_restarts_the_pod_without_evictions() -> None:
    fleet = Fleet(daemonsets=[pool(digest="d1")])
    fleet.add(
        node("gpu-01", states.UPGRADE_REQUIRED),
        driver_pod("gpu-01", digest="d1"),
        gpu_pod("gpu-01", "train"),
    )
    plan = fleet.plan()
    patch = patch_for(plan, "gpu-01")
    assert patch.labels[states.STATE_LABEL] == states.POD_RESTART_REQUIRED
    assert patch.unschedulable is True
    assert cordon_entry(patch) == planner.CORDON_OWNER
    assert not of_type(plan, actions.EvictPod)


@pytest.mark.parametrize(
    ("why", "pool_digest", "pod_digest", "annotations"),
    [
        ("the digests differ", "d2", "d1", {}),
        ("the running pod has none", "d1", None, {}),
        ("the DaemonSet has none", None, "d1", {}),
        ("someone asked for the upgrade", "d1", "d1", {states.REQUESTED: "true"}),
        ("the driver waits for a safe load", "d1", "d1", {states.SAFE_LOAD: "true"}),
    ],
)
def test_without_two_equal_digests_the_node_takes_the_full_flow(
    why: str, pool_digest: str | None, pod_digest: str | None, annotations: dict[str, str]
) -> None:
    fleet = Fleet(daemonsets=[pool(digest=pool_digest)])
    fleet.add(
        node("gpu-01", states.UPGRADE_REQUIRED, annotations=annotations),
        driver_pod("gpu-01", digest=pod_digest),
        gpu_pod("gpu-01", "train"),
    )
    assert state_after(fleet.plan(), "gpu-01") == states.CORDON_REQUIRED, why


def test_an_orphaned_driver_pod_with_an_equal_digest_still_takes_the_full_flow() -> None:
    fleet = Fleet(daemonsets=[pool(digest="d1")])
    orphan = dataclasses.replace(
        driver_pod("gpu-01", digest="d1"), controller_kind=None, controller_uid=None
    )
    fleet.add(node("gpu-01", states.UPGRADE_REQUIRED), orphan, gpu_pod("gpu-01", "train"))
    assert state_after(fleet.plan(), "gpu-01") == states.CORDON_REQUIRED


def test_a_restart_in_place_uses_an_upgrade_slot_like_a_full_upgrade() -> None:
    fleet = Fleet(daemonsets=[pool(digest="d1")], owner=owner(maxParallelUpgrades=1))
    for name in ("gpu-01", "gpu-02"):
        fleet.add(node(name, states.UPGRADE_REQUIRED), driver_pod(name, digest="d1"))
    plan = fleet.plan()
    moved = [n for n in ("gpu-01", "gpu-02") if state_after(plan, n) == states.POD_RESTART_REQUIRED]
    assert len(moved) == 1


def apply_patches(fleet: Fleet, plan: actions.Plan) -> None:
    """What the executor does with the plan's node patches (enough for a walk through states)."""
    for patch in of_type(plan, actions.PatchNode):
        current = fleet.nodes[patch.node]
        labels = {**current.labels, **patch.labels}
        annotations = {**current.annotations, **patch.annotations}
        fleet.set_node(
            patch.node,
            labels={k: v for k, v in labels.items() if v is not None},
            annotations={k: v for k, v in annotations.items() if v is not None},
            unschedulable=(
                current.unschedulable if patch.unschedulable is None else patch.unschedulable
            ),
        )


def test_a_pod_only_change_restarts_the_driver_in_place_and_never_evicts_gpu_pods() -> None:
    """Upstream's restart-only route (26.x): cordon, replace the driver pod while workloads keep
    running, validate, uncordon."""
    fleet = Fleet(daemonsets=[pool(digest="d1")])
    train = gpu_pod("gpu-01", "train")
    fleet.add(node("gpu-01"), driver_pod("gpu-01", OLD, digest="d1"), train)
    seen: list[str] = []
    for _ in range(8):
        plan = fleet.plan()
        assert not of_type(plan, actions.EvictPod)
        for deleted in of_type(plan, actions.DeletePod):
            assert deleted.name == "driver-gpu-01"
            # The DaemonSet replaces it with a pod of the new revision, same digest.
            fleet.pods = [driver_pod("gpu-01", NEW, digest="d1"), train]
        apply_patches(fleet, plan)
        state = fleet.nodes["gpu-01"].labels.get(states.STATE_LABEL, "")
        if not seen or seen[-1] != state:
            seen.append(state)
        if state == states.UPGRADE_DONE:
            break
    assert seen == [
        states.UPGRADE_REQUIRED,
        states.POD_RESTART_REQUIRED,
        states.UNCORDON_REQUIRED,
        states.UPGRADE_DONE,
    ]
    assert fleet.nodes["gpu-01"].unschedulable is False
    assert train in fleet.pods


def test_an_upgrade_required_node_that_is_already_current_is_done() -> None:
    fleet = Fleet()
    fleet.add(node("gpu-01", states.UPGRADE_REQUIRED), driver_pod("gpu-01", NEW))
    assert state_after(fleet.plan(), "gpu-01") == states.UPGRADE_DONE


# ----- cordon and waiting for jobs ------------------------------------------------------------


def test_cordon_required_cordons_records_the_cordon_and_goes_on() -> None:
    fleet = Fleet()
    fleet.add(node("gpu-01", states.CORDON_REQUIRED), driver_pod("gpu-01"))
    patch = patch_for(fleet.plan(), "gpu-01")
    assert patch.unschedulable is True
    assert cordon_entry(patch) == planner.CORDON_OWNER
    assert patch.labels[states.STATE_LABEL] == states.POD_DELETION_REQUIRED
    assert patch.annotations[states.STATE_SINCE] == str(int(T0))


def test_a_node_already_cordoned_by_someone_else_is_not_recorded_as_ours() -> None:
    fleet = Fleet()
    fleet.add(node("gpu-01", states.CORDON_REQUIRED, unschedulable=True), driver_pod("gpu-01"))
    patch = patch_for(fleet.plan(), "gpu-01")
    assert patch.unschedulable is None
    assert ledger.ANNOTATION not in patch.annotations
    assert patch.annotations[states.INITIAL_UNSCHEDULABLE] == "true"


def test_with_a_pod_selector_the_node_waits_for_matching_jobs() -> None:
    selector = owner(waitForCompletion={"podSelector": "job=train", "timeoutSeconds": 60})
    fleet = Fleet(owner=selector)
    fleet.add(node("gpu-01", states.CORDON_REQUIRED), driver_pod("gpu-01"))
    patch = patch_for(fleet.plan(), "gpu-01")
    assert patch.labels[states.STATE_LABEL] == states.WAIT_FOR_JOBS_REQUIRED
    assert patch.annotations[states.WAIT_FOR_COMPLETION_START] == str(int(T0))


def test_waiting_for_jobs_holds_while_matching_pods_run_then_times_out() -> None:
    selector = owner(waitForCompletion={"podSelector": "job=train", "timeoutSeconds": 60})
    fleet = Fleet(owner=selector)
    annotations = {states.WAIT_FOR_COMPLETION_START: str(int(T0))}
    fleet.add(
        node(
            "gpu-01",
            states.WAIT_FOR_JOBS_REQUIRED,
            unschedulable=True,
            ours=True,
            annotations=annotations,
        ),
        driver_pod("gpu-01"),
        gpu_pod("gpu-01", "t", labels={"job": "train"}),
    )
    plan = fleet.plan()
    assert no_patch(plan, "gpu-01")
    assert plan.requeue_after == 60
    fleet.now = T0 + 60
    patch = patch_for(fleet.plan(), "gpu-01")
    assert patch.labels[states.STATE_LABEL] == states.POD_DELETION_REQUIRED
    assert patch.annotations[states.WAIT_FOR_COMPLETION_START] is None


def test_waiting_for_jobs_goes_on_when_no_matching_pod_runs() -> None:
    fleet = Fleet(owner=owner(waitForCompletion={"podSelector": "job=train"}))
    fleet.add(
        node("gpu-01", states.WAIT_FOR_JOBS_REQUIRED, unschedulable=True, ours=True),
        driver_pod("gpu-01"),
        gpu_pod("gpu-01", "serve", labels={"job": "serve"}),
    )
    assert state_after(fleet.plan(), "gpu-01") == states.POD_DELETION_REQUIRED


# ----- GPU pod deletion, PDBs and drain --------------------------------------------------------


def deleting_node(fleet: Fleet, *pods: object, since: float = T0) -> None:
    annotations = {states.STATE_SINCE: str(int(since))}
    fleet.add(
        node(
            "gpu-01",
            states.POD_DELETION_REQUIRED,
            unschedulable=True,
            ours=True,
            annotations=annotations,
        ),
        driver_pod("gpu-01"),
        *pods,  # type: ignore[arg-type]
    )


def test_pod_deletion_evicts_only_gpu_pods_that_are_not_daemonset_pods() -> None:
    fleet = Fleet()
    deleting_node(
        fleet,
        gpu_pod("gpu-01", "train"),
        gpu_pod("gpu-01", "web", gpu=False),
        gpu_pod("gpu-01", "gpu-monitor", controller="DaemonSet"),
    )
    plan = fleet.plan()
    assert [(e.namespace, e.name) for e in of_type(plan, actions.EvictPod)] == [("ml", "train")]
    assert no_patch(plan, "gpu-01")
    assert plan.requeue_after == states.EVICTION_RETRY_SECONDS


def test_pod_deletion_moves_on_once_gpu_pods_are_gone() -> None:
    fleet = Fleet()
    deleting_node(fleet, gpu_pod("gpu-01", "train", deleting=True))
    assert state_after(fleet.plan(), "gpu-01") == states.POD_DELETION_REQUIRED  # still going
    fleet.pods = [p for p in fleet.pods if p.name != "train"]
    assert state_after(fleet.plan(), "gpu-01") == states.POD_RESTART_REQUIRED


def test_pod_deletion_leads_to_drain_when_drain_is_enabled() -> None:
    fleet = Fleet(owner=owner(drain={"enable": True}))
    deleting_node(fleet)
    assert state_after(fleet.plan(), "gpu-01") == states.DRAIN_REQUIRED


def test_an_eviction_blocked_by_a_pdb_waits_then_fails_the_node_with_the_pdb_named() -> None:
    fleet = Fleet(owner=owner(podDeletion={"timeoutSeconds": 120}))
    deleting_node(fleet, gpu_pod("gpu-01", "critical", labels={"app": "critical"}))
    fleet.budgets = [pdb("critical-pdb", {"app": "critical"})]
    plan = fleet.plan()
    assert of_type(plan, actions.EvictPod)  # the API decides; the planner only predicts
    assert plan.nodes["gpu-01"].blocked_by == ("ml/critical-pdb",)
    assert "blocked by PodDisruptionBudget ml/critical-pdb" in plan.nodes["gpu-01"].message
    fleet.now = T0 + 119
    assert state_after(fleet.plan(), "gpu-01") == states.POD_DELETION_REQUIRED
    fleet.now = T0 + 120
    plan = fleet.plan()
    patch = patch_for(plan, "gpu-01")
    assert patch.labels[states.STATE_LABEL] == states.UPGRADE_FAILED
    failure = patch.annotations[states.FAILURE]
    assert failure is not None
    assert "PodDisruptionBudget ml/critical-pdb" in failure
    assert f"kubectl label node gpu-01 {states.STATE_LABEL}-" in failure
    # Nothing of the driver was touched: the node goes back into service on its old driver.
    assert patch.unschedulable is False
    assert cordon_entry(patch) is None
    assert not of_type(plan, actions.EvictPod)
    assert any(e.warning for e in of_type(plan, actions.Event))


def test_a_pod_deletion_timeout_of_zero_waits_for_ever() -> None:
    fleet = Fleet(owner=owner(podDeletion={"timeoutSeconds": 0}))
    deleting_node(fleet, gpu_pod("gpu-01", "critical"), since=T0 - 10 * 24 * 3600)
    fleet.budgets = [pdb("critical-pdb", {"app": "critical"})]
    assert state_after(fleet.plan(), "gpu-01") == states.POD_DELETION_REQUIRED


def test_the_deletion_clock_survives_an_operator_restart() -> None:
    # The planner keeps no memory: a restarted operator measures from the node's annotation.
    fleet = Fleet(owner=owner(podDeletion={"timeoutSeconds": 300}))
    deleting_node(fleet, gpu_pod("gpu-01", "critical"), since=T0 - 301)
    fleet.budgets = [pdb("critical-pdb", {"app": "critical"})]
    assert state_after(fleet.plan(), "gpu-01") == states.UPGRADE_FAILED


def test_a_missing_state_clock_is_started_now_rather_than_never() -> None:
    fleet = Fleet()
    fleet.add(
        node("gpu-01", states.POD_DELETION_REQUIRED, unschedulable=True, ours=True),
        driver_pod("gpu-01"),
        gpu_pod("gpu-01", "train"),
    )
    patch = patch_for(fleet.plan(), "gpu-01")
    assert patch.annotations[states.STATE_SINCE] == str(int(T0))


@pytest.mark.parametrize(
    ("pod", "hint"),
    [
        (gpu_pod("gpu-01", "bare", controller=None), "podDeletion.force"),
        (gpu_pod("gpu-01", "scratch", empty_dir=True), "podDeletion.deleteEmptyDir"),
    ],
    ids=["unmanaged", "emptydir"],
)
def test_pods_that_eviction_would_lose_fail_the_node_at_once_with_the_setting_to_change(
    pod: object, hint: str
) -> None:
    fleet = Fleet()
    deleting_node(fleet, pod)
    plan = fleet.plan()
    patch = patch_for(plan, "gpu-01")
    assert patch.labels[states.STATE_LABEL] == states.UPGRADE_FAILED
    assert hint in str(patch.annotations[states.FAILURE])
    assert not of_type(plan, actions.EvictPod)


def test_force_and_delete_empty_dir_allow_those_pods() -> None:
    fleet = Fleet(owner=owner(podDeletion={"force": True, "deleteEmptyDir": True}))
    deleting_node(fleet, gpu_pod("gpu-01", "bare", controller=None, empty_dir=True))
    assert [e.name for e in of_type(fleet.plan(), actions.EvictPod)] == ["bare"]


def test_drain_evicts_selected_pods_but_not_daemonset_or_drain_skip_pods() -> None:
    fleet = Fleet(owner=owner(drain={"enable": True, "podSelector": "tier!=system"}))
    fleet.add(
        node(
            "gpu-01",
            states.DRAIN_REQUIRED,
            unschedulable=True,
            ours=True,
            annotations={states.STATE_SINCE: str(int(T0))},
        ),
        driver_pod("gpu-01"),
        gpu_pod("gpu-01", "web", gpu=False),
        gpu_pod("gpu-01", "sys", gpu=False, labels={"tier": "system"}),
        gpu_pod("gpu-01", "agent", gpu=False, controller="DaemonSet"),
        gpu_pod("gpu-01", "op", gpu=False, labels={states.DRAIN_SKIP_LABEL: "true"}),
    )
    plan = fleet.plan()
    assert [e.name for e in of_type(plan, actions.EvictPod)] == ["web"]
    fleet.pods = [p for p in fleet.pods if p.name != "web"]
    assert state_after(fleet.plan(), "gpu-01") == states.POD_RESTART_REQUIRED


def test_drain_times_out_into_upgrade_failed() -> None:
    fleet = Fleet(owner=owner(drain={"enable": True, "timeoutSeconds": 30}))
    fleet.add(
        node(
            "gpu-01",
            states.DRAIN_REQUIRED,
            unschedulable=True,
            ours=True,
            annotations={states.STATE_SINCE: str(int(T0 - 31))},
        ),
        driver_pod("gpu-01"),
        gpu_pod("gpu-01", "web", gpu=False),
    )
    patch = patch_for(fleet.plan(), "gpu-01")
    assert patch.labels[states.STATE_LABEL] == states.UPGRADE_FAILED
    assert "drain timed out after 30s" in str(patch.annotations[states.FAILURE])


def test_drain_required_with_drain_disabled_goes_straight_to_the_restart() -> None:
    fleet = Fleet()
    fleet.add(
        node("gpu-01", states.DRAIN_REQUIRED, unschedulable=True, ours=True), driver_pod("gpu-01")
    )
    assert state_after(fleet.plan(), "gpu-01") == states.POD_RESTART_REQUIRED


# ----- driver restart, validation, uncordon ----------------------------------------------------


def restarting(
    fleet: Fleet,
    *pods: object,
    state: str = states.POD_RESTART_REQUIRED,
    ours: bool = True,
    annotations: dict[str, str] | None = None,
) -> None:
    fleet.add(
        node("gpu-01", state, unschedulable=True, ours=ours, annotations=annotations),
        *pods,  # type: ignore[arg-type]
    )


def test_pod_restart_deletes_the_out_of_date_driver_pod_once() -> None:
    fleet = Fleet()
    restarting(fleet, driver_pod("gpu-01", OLD))
    plan = fleet.plan()
    deleted = of_type(plan, actions.DeletePod)
    assert [(d.namespace, d.name) for d in deleted] == [(NS, "driver-gpu-01")]
    assert no_patch(plan, "gpu-01")
    fleet.pods = [driver_pod("gpu-01", OLD, deleting=True)]
    assert not of_type(fleet.plan(), actions.DeletePod)


def test_pod_restart_waits_for_the_new_pod_then_validates() -> None:
    fleet = Fleet(daemonsets=[pool(), validator_ds()])
    restarting(
        fleet, driver_pod("gpu-01", NEW, ready=False), annotations={states.SAFE_LOAD: "true"}
    )
    plan = fleet.plan()
    assert "to become ready" in plan.nodes["gpu-01"].message
    # The driver waits for its safe-load annotation to go before it loads.
    assert patch_for(plan, "gpu-01").annotations == {states.SAFE_LOAD: None}
    fleet.pods = [driver_pod("gpu-01", NEW)]
    patch = patch_for(fleet.plan(), "gpu-01")
    assert patch.labels[states.STATE_LABEL] == states.VALIDATION_REQUIRED
    assert patch.annotations[states.VALIDATION_START] == str(int(T0))


def test_without_a_validator_a_ready_driver_goes_to_uncordon() -> None:
    fleet = Fleet()
    restarting(fleet, driver_pod("gpu-01", NEW))
    assert state_after(fleet.plan(), "gpu-01") == states.UNCORDON_REQUIRED


def test_a_crash_looping_driver_fails_the_node_and_keeps_it_cordoned() -> None:
    fleet = Fleet()
    restarting(fleet, driver_pod("gpu-01", NEW, ready=False, restarts=11))
    patch = patch_for(fleet.plan(), "gpu-01")
    assert patch.labels[states.STATE_LABEL] == states.UPGRADE_FAILED
    assert patch.unschedulable is None
    assert "restarted 11 times" in str(patch.annotations[states.FAILURE])
    assert "stays cordoned" in str(patch.annotations[states.FAILURE])


def test_gpu_pods_found_at_restart_send_the_node_back_to_pod_deletion() -> None:
    fleet = Fleet()
    restarting(fleet, driver_pod("gpu-01", OLD), gpu_pod("gpu-01", "train"))
    plan = fleet.plan()
    assert state_after(plan, "gpu-01") == states.POD_DELETION_REQUIRED
    assert not of_type(plan, actions.DeletePod)


def test_an_orphaned_driver_pod_is_replaced() -> None:
    fleet = Fleet()
    orphan = driver_pod("gpu-01", OLD)
    orphan = dataclasses.replace(orphan, controller_kind=None, controller_uid=None)
    restarting(fleet, orphan)
    assert [d.name for d in of_type(fleet.plan(), actions.DeletePod)] == ["driver-gpu-01"]


def test_validation_restarts_a_validator_that_checked_the_old_driver() -> None:
    fleet = Fleet(daemonsets=[pool(), validator_ds()])
    started = T0 - 60
    restarting(
        fleet,
        driver_pod("gpu-01", NEW, created=started),
        validator_pod("gpu-01", created=started - 3600),
        state=states.VALIDATION_REQUIRED,
        annotations={states.VALIDATION_START: str(int(T0))},
    )
    plan = fleet.plan()
    assert [d.name for d in of_type(plan, actions.DeletePod)] == ["validator-gpu-01"]
    fleet.pods = [driver_pod("gpu-01", NEW, created=started), validator_pod("gpu-01", created=T0)]
    assert state_after(fleet.plan(), "gpu-01") == states.UNCORDON_REQUIRED


def test_validation_fails_after_its_timeout_which_an_annotation_can_change() -> None:
    fleet = Fleet(
        daemonsets=[pool(), validator_ds()],
        owner=owner({states.VALIDATION_TIMEOUT: "120"}),
    )
    restarting(
        fleet,
        driver_pod("gpu-01", NEW, created=T0 - 200),
        validator_pod("gpu-01", created=T0 - 100, ready=False),
        state=states.VALIDATION_REQUIRED,
        annotations={states.VALIDATION_START: str(int(T0 - 119))},
    )
    assert state_after(fleet.plan(), "gpu-01") == states.VALIDATION_REQUIRED
    fleet.now = T0 + 1
    patch = patch_for(fleet.plan(), "gpu-01")
    assert patch.labels[states.STATE_LABEL] == states.UPGRADE_FAILED
    assert "validator pod gpu-operator/validator-gpu-01 not ready after 120s" in str(
        patch.annotations[states.FAILURE]
    )


def test_a_driver_changed_during_validation_is_restarted_again() -> None:
    fleet = Fleet(daemonsets=[pool(), validator_ds()])
    restarting(fleet, driver_pod("gpu-01", OLD), state=states.VALIDATION_REQUIRED)
    assert state_after(fleet.plan(), "gpu-01") == states.POD_RESTART_REQUIRED


def test_uncordon_required_uncordons_our_cordon_and_clears_the_progress() -> None:
    fleet = Fleet()
    annotations = {states.FROM_REVISION: OLD, states.STATE_SINCE: "1"}
    restarting(
        fleet, driver_pod("gpu-01", NEW), state=states.UNCORDON_REQUIRED, annotations=annotations
    )
    plan = fleet.plan()
    patch = patch_for(plan, "gpu-01")
    assert patch.unschedulable is False
    assert patch.annotations[ledger.ANNOTATION] is None  # the ledger held only our cordon
    assert patch.annotations[states.FROM_REVISION] is None
    assert patch.labels == {states.STATE_LABEL: states.UPGRADE_DONE}
    assert any("driver upgraded" in e.message for e in of_type(plan, actions.Event))


def test_a_node_a_human_cordoned_stays_cordoned_after_its_upgrade() -> None:
    fleet = Fleet()
    restarting(
        fleet,
        driver_pod("gpu-01", NEW),
        ours=False,
        annotations={states.INITIAL_UNSCHEDULABLE: "true"},
    )
    patch = patch_for(fleet.plan(), "gpu-01")
    assert patch.labels[states.STATE_LABEL] == states.UPGRADE_DONE
    assert patch.unschedulable is None
    assert patch.annotations[states.INITIAL_UNSCHEDULABLE] is None


def test_uncordon_required_never_uncordons_a_cordon_that_is_not_ours() -> None:
    fleet = Fleet()
    restarting(
        fleet,
        driver_pod("gpu-01", NEW),
        state=states.UNCORDON_REQUIRED,
        ours=False,
        annotations={states.INITIAL_UNSCHEDULABLE: "true"},
    )
    patch = patch_for(fleet.plan(), "gpu-01")
    assert patch.unschedulable is None
    assert patch.labels[states.STATE_LABEL] == states.UPGRADE_DONE


# ----- failed nodes -----------------------------------------------------------------------------


def test_upgrade_failed_stays_failed_even_when_the_driver_looks_fine() -> None:
    fleet = Fleet()
    restarting(
        fleet,
        driver_pod("gpu-01", NEW),
        state=states.UPGRADE_FAILED,
        annotations={states.FAILURE: "validation failed"},
    )
    plan = fleet.plan()
    assert no_patch(plan, "gpu-01")
    assert plan.nodes["gpu-01"].message == "validation failed"


def test_removing_the_state_label_retries_a_failed_node_from_the_start() -> None:
    fleet = Fleet()
    fleet.add(
        node("gpu-01", "", unschedulable=True, ours=True, annotations={states.FAILURE: "x"}),
        driver_pod("gpu-01", OLD),
    )
    patch = patch_for(fleet.plan(), "gpu-01")
    assert patch.labels[states.STATE_LABEL] == states.UPGRADE_REQUIRED
    assert patch.annotations[states.FAILURE] is None


def test_failed_nodes_keep_their_parallel_slot_like_upstream() -> None:
    fleet = Fleet.of(
        3, state=states.UPGRADE_REQUIRED, owner=owner(maxParallelUpgrades=1, maxUnavailable="100%")
    )
    fleet.add(node("gpu-04", states.UPGRADE_FAILED), driver_pod("gpu-04"))
    plan = fleet.plan()
    assert plan.groups["ClusterPolicy/cluster-policy"].in_progress == 1
    assert plan.groups["ClusterPolicy/cluster-policy"].started == 0


# ----- stale labels -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "state",
    [
        states.WAIT_FOR_JOBS_REQUIRED,
        states.POD_DELETION_REQUIRED,
        states.DRAIN_REQUIRED,
        states.POD_RESTART_REQUIRED,
        states.VALIDATION_REQUIRED,
    ],
)
def test_a_mid_upgrade_label_on_an_uncordoned_node_starts_over_instead_of_skipping_steps(
    state: str,
) -> None:
    fleet = Fleet()
    fleet.add(node("gpu-01", state), driver_pod("gpu-01", OLD), gpu_pod("gpu-01", "train"))
    plan = fleet.plan()
    patch = patch_for(plan, "gpu-01")
    # Back to the start and, a slot being free, straight on to the cordon: never a deletion
    # of the driver under running GPU pods.
    assert patch.labels[states.STATE_LABEL] == states.CORDON_REQUIRED
    assert not of_type(plan, actions.DeletePod)
    assert not of_type(plan, actions.EvictPod)
    assert any(e.warning and "stale" in e.message for e in of_type(plan, actions.Event))


def test_an_old_upgrade_done_label_does_not_hide_an_out_of_date_driver() -> None:
    # GO#2166/GO#782: an earlier run's "upgrade-done" must not make the new driver roll in
    # without the state machine.
    fleet = Fleet()
    fleet.add(node("gpu-01", states.UPGRADE_DONE), driver_pod("gpu-01", OLD))
    assert state_after(fleet.plan(), "gpu-01") == states.UPGRADE_REQUIRED


def test_an_unknown_state_value_is_treated_as_no_state() -> None:
    fleet = Fleet()
    fleet.add(node("gpu-01", "upgrade-halfway"), driver_pod("gpu-01", NEW))
    assert state_after(fleet.plan(), "gpu-01") == states.UPGRADE_DONE


def test_a_done_node_still_carrying_our_cordon_is_uncordoned() -> None:
    fleet = Fleet()
    fleet.add(
        node("gpu-01", states.UPGRADE_DONE, unschedulable=True, ours=True),
        driver_pod("gpu-01", NEW),
    )
    patch = patch_for(fleet.plan(), "gpu-01")
    assert patch.unschedulable is False


def test_a_cordon_the_ledger_lost_is_claimed_back_unless_a_human_had_it() -> None:
    fleet = Fleet()
    restarting(fleet, driver_pod("gpu-01", NEW, ready=False), ours=False)
    assert cordon_entry(patch_for(fleet.plan(), "gpu-01")) == planner.CORDON_OWNER
    fleet = Fleet()
    restarting(
        fleet,
        driver_pod("gpu-01", NEW, ready=False),
        ours=False,
        annotations={states.INITIAL_UNSCHEDULABLE: "true"},
    )
    assert no_patch(fleet.plan(), "gpu-01")


def test_a_node_no_driver_pool_targets_gets_our_cordon_and_label_back() -> None:
    fleet = Fleet()
    fleet.add(
        node(
            "gpu-01",
            states.POD_DELETION_REQUIRED,
            unschedulable=True,
            ours=True,
            labels={states.DRIVER_DEPLOY_LABEL: "true"},
        )
    )
    fleet.daemonsets = [pool(**{"node-pool": "a"})]
    patch = patch_for(fleet.plan(), "gpu-01")
    assert patch.unschedulable is False
    assert patch.labels == {states.STATE_LABEL: None}


def test_the_planner_keeps_no_memory_between_passes() -> None:
    fleet = Fleet.of(5, state=states.UPGRADE_REQUIRED)
    assert fleet.plan() == fleet.plan()


# ----- autoUpgrade off --------------------------------------------------------------------------


def test_auto_upgrade_off_clears_idle_labels_and_undoes_unstarted_work() -> None:
    fleet = Fleet(owner=owner(auto_upgrade=False))
    fleet.add(node("gpu-01", states.UPGRADE_REQUIRED), driver_pod("gpu-01"))
    fleet.add(
        node("gpu-02", states.POD_DELETION_REQUIRED, unschedulable=True, ours=True),
        driver_pod("gpu-02"),
        gpu_pod("gpu-02", "train"),
    )
    fleet.add(
        node("gpu-03", states.POD_RESTART_REQUIRED, unschedulable=True, ours=True),
        driver_pod("gpu-03", OLD),
    )
    plan = fleet.plan()
    assert patch_for(plan, "gpu-01").labels == {states.STATE_LABEL: None}
    second = patch_for(plan, "gpu-02")
    assert (second.labels, second.unschedulable) == ({states.STATE_LABEL: None}, False)
    assert not of_type(plan, actions.EvictPod)
    # The third node's driver is already on its way out: finish rather than strand it.
    assert [d.name for d in of_type(plan, actions.DeletePod)] == ["driver-gpu-03"]


# ----- canary, stop, rollback ---------------------------------------------------------------------


def test_a_canary_goes_first_and_alone_then_the_rest_follows() -> None:
    fleet = Fleet.of(
        6,
        state=states.UPGRADE_REQUIRED,
        owner=owner({states.CANARY_NODES: "1"}, maxParallelUpgrades=3, maxUnavailable="100%"),
    )
    plan = fleet.plan()
    started = [n for n, r in plan.nodes.items() if r.state == states.CORDON_REQUIRED]
    assert started == ["gpu-01"]
    assert patch_for(plan, "gpu-01").annotations[states.CANARY] == NEW
    assert "canary" in plan.nodes["gpu-02"].message
    # The canary passes (done on the new driver); the rest now goes three at a time.
    fleet.set_node(
        "gpu-01",
        labels={**fleet.nodes["gpu-01"].labels, states.STATE_LABEL: states.UPGRADE_DONE},
        annotations={states.CANARY: NEW},
    )
    fleet.pods = [p if p.node != "gpu-01" else driver_pod("gpu-01", NEW) for p in fleet.pods]
    plan = fleet.plan()
    assert [n for n, r in plan.nodes.items() if r.state == states.CORDON_REQUIRED] == [
        "gpu-02",
        "gpu-03",
        "gpu-04",
    ]


def test_a_failed_canary_stops_the_rollout() -> None:
    fleet = Fleet.of(4, state=states.UPGRADE_REQUIRED, owner=owner({states.CANARY_NODES: "1"}))
    fleet.add(
        node("gpu-05", states.UPGRADE_FAILED, annotations={states.CANARY: NEW}),
        driver_pod("gpu-05", NEW),
    )
    plan = fleet.plan()
    assert plan.groups["ClusterPolicy/cluster-policy"].stopped == "canary node gpu-05 failed"
    assert all(r.state != states.CORDON_REQUIRED for r in plan.nodes.values())
    assert "rollout is stopped" in plan.nodes["gpu-01"].message


def test_more_failed_nodes_than_allowed_stop_the_rollout() -> None:
    fleet = Fleet.of(
        4,
        state=states.UPGRADE_REQUIRED,
        owner=owner({states.MAX_FAILED_NODES: "1"}, maxParallelUpgrades=0),
    )
    fleet.add(node("gpu-05", states.UPGRADE_FAILED), driver_pod("gpu-05"))
    assert fleet.plan().groups["ClusterPolicy/cluster-policy"].stopped is None
    fleet.add(node("gpu-06", states.UPGRADE_FAILED), driver_pod("gpu-06"))
    stopped = fleet.plan().groups["ClusterPolicy/cluster-policy"].stopped
    assert stopped == "2 nodes failed (more than 1 allowed)"


def test_a_stopped_rollout_rolls_failed_nodes_back_to_their_previous_driver() -> None:
    annotations = {states.CANARY_NODES: "1", states.ROLLBACK: "true"}
    fleet = Fleet(owner=owner(annotations))
    fleet.add(
        node(
            "gpu-01",
            states.UPGRADE_FAILED,
            unschedulable=True,
            ours=True,
            annotations={states.CANARY: NEW, states.FROM_REVISION: OLD, states.FAILURE: "bad"},
        ),
        driver_pod("gpu-01", NEW, ready=False, restarts=12),
    )
    plan = fleet.plan()
    patch = patch_for(plan, "gpu-01")
    assert patch.labels == {
        states.ROLLBACK_LABEL: OLD,
        states.DRIVER_DEPLOY_LABEL: states.ROLLBACK_PAUSE,
    }
    [ensure] = of_type(plan, actions.EnsureRollbackSet)
    assert (ensure.pool, ensure.revision, ensure.revision_hash) == (
        "nvidia-driver-daemonset",
        f"nvidia-driver-daemonset-{OLD}",
        OLD,
    )
    assert ensure.name == planner.rollback_name("nvidia-driver-daemonset", OLD)


def test_a_rolled_back_node_is_validated_then_uncordoned_and_stays_failed() -> None:
    rollback_ds = pool(planner.rollback_name("nvidia-driver-daemonset", OLD), "uid-rollback")
    rollback_ds = dataclasses.replace(rollback_ds, labels={states.ROLLBACK_LABEL: OLD})
    fleet = Fleet(
        owner=owner({states.ROLLBACK: "true", states.CANARY_NODES: "1"}),
        daemonsets=[pool(), rollback_ds, validator_ds()],
    )
    labels = {states.ROLLBACK_LABEL: OLD, states.DRIVER_DEPLOY_LABEL: states.ROLLBACK_PAUSE}
    fleet.add(
        node(
            "gpu-01",
            states.UPGRADE_FAILED,
            unschedulable=True,
            ours=True,
            labels=labels,
            annotations={states.CANARY: NEW, states.FROM_REVISION: OLD, states.FAILURE: "bad"},
        ),
        driver_pod("gpu-01", OLD, uid="uid-rollback", created=T0 - 30),
        validator_pod("gpu-01", created=T0 - 20),
    )
    plan = fleet.plan()
    patch = patch_for(plan, "gpu-01")
    assert patch.unschedulable is False
    assert str(patch.annotations[states.FAILURE]).startswith("Rolled back to driver revision")
    assert "labels" not in patch.merge_patch()["metadata"]  # still upgrade-failed
    assert [a.name for a in of_type(plan, actions.EnsureRollbackSet)] == [rollback_ds.name]


def test_a_rollback_daemonset_no_node_selects_is_deleted() -> None:
    rollback_ds = pool("old-rollback", "uid-rollback")
    rollback_ds = dataclasses.replace(rollback_ds, labels={states.ROLLBACK_LABEL: OLD})
    fleet = Fleet.of(1, daemonsets=[pool(), rollback_ds])
    assert [a.name for a in of_type(fleet.plan(), actions.DeleteRollbackSet)] == ["old-rollback"]


def test_an_unusable_extension_annotation_starts_nothing_and_says_why() -> None:
    fleet = Fleet.of(2, state=states.UPGRADE_REQUIRED, owner=owner({states.CANARY_NODES: "two"}))
    plan = fleet.plan()
    assert all(r.state == states.UPGRADE_REQUIRED for r in plan.nodes.values())
    assert states.CANARY_NODES in plan.nodes["gpu-01"].message


def test_a_retried_rolled_back_node_upgrades_again_and_returns_to_its_pool() -> None:
    rollback_ds = pool(planner.rollback_name("nvidia-driver-daemonset", OLD), "uid-rollback")
    rollback_ds = dataclasses.replace(rollback_ds, labels={states.ROLLBACK_LABEL: OLD})
    labels = {states.ROLLBACK_LABEL: OLD, states.DRIVER_DEPLOY_LABEL: states.ROLLBACK_PAUSE}
    fleet = Fleet(daemonsets=[pool(), rollback_ds])
    fleet.add(node("gpu-01", "", labels=labels), driver_pod("gpu-01", "rb", uid="uid-rollback"))
    patch = patch_for(fleet.plan(), "gpu-01")
    assert patch.labels[states.STATE_LABEL] == states.UPGRADE_REQUIRED
    # What it runs is the pool's old revision, whatever the rollback DaemonSet's own hash.
    assert patch.annotations[states.FROM_REVISION] == OLD
    fleet = Fleet(daemonsets=[pool(), rollback_ds])
    restarting(fleet, driver_pod("gpu-01", "rb", uid="uid-rollback"))
    fleet.set_node("gpu-01", labels={**fleet.nodes["gpu-01"].labels, **labels})
    plan = fleet.plan()
    assert patch_for(plan, "gpu-01").labels == {
        states.ROLLBACK_LABEL: None,
        states.DRIVER_DEPLOY_LABEL: "true",
    }
    # No node selects the rollback DaemonSet any more: it goes.
    assert [a.name for a in of_type(plan, actions.DeleteRollbackSet)] == [rollback_ds.name]


def test_an_orphan_beside_a_current_pool_pod_still_needs_the_upgrade_flow() -> None:
    # After a hand-over the pool's own pod may wait beside the old, orphaned one.
    fleet = Fleet()
    orphan = dataclasses.replace(
        driver_pod("gpu-01", OLD), name="orphan", controller_kind=None, controller_uid=None
    )
    fleet.add(
        node("gpu-01", states.UPGRADE_REQUIRED),
        driver_pod("gpu-01", NEW, phase="Pending", ready=False),
        orphan,
    )
    assert state_after(fleet.plan(), "gpu-01") == states.CORDON_REQUIRED


@pytest.mark.parametrize("state", [states.UNKNOWN, states.UPGRADE_DONE])
def test_an_idle_node_whose_driver_pod_is_orphaned_waits_for_the_hand_over(state: str) -> None:
    # ClusterPolicy -> NVIDIADriver: the old pod is orphaned until the NVIDIADriver reconciler
    # adopts it (no restart) or labels the node upgrade-required. Cordoning it meanwhile would
    # evict GPU pods for nothing.
    fleet = Fleet()
    orphan = dataclasses.replace(
        driver_pod("gpu-01", OLD), name="orphan", controller_kind=None, controller_uid=None
    )
    fleet.add(node("gpu-01", state), orphan)
    plan = fleet.plan()
    assert state_after(plan, "gpu-01") == state
    assert not of_type(plan, actions.DeletePod)


def test_a_node_the_validator_does_not_run_on_is_not_left_waiting_for_it() -> None:
    validator = dataclasses.replace(
        validator_ds(), node_selector={"nvidia.com/gpu.deploy.operator-validator": "true"}
    )
    fleet = Fleet(daemonsets=[pool(), validator])
    restarting(fleet, driver_pod("gpu-01", NEW))
    assert state_after(fleet.plan(), "gpu-01") == states.UNCORDON_REQUIRED
    fleet.set_node(
        "gpu-01",
        labels={**fleet.nodes["gpu-01"].labels, "nvidia.com/gpu.deploy.operator-validator": "true"},
    )
    assert state_after(fleet.plan(), "gpu-01") == states.VALIDATION_REQUIRED


def test_the_driver_restart_also_restarts_the_validators_that_checked_the_old_driver() -> None:
    fleet = Fleet(daemonsets=[pool(), validator_ds()])
    restarting(fleet, driver_pod("gpu-01", OLD), validator_pod("gpu-01", created=T0 - 3600))
    deleted = {d.name: d.why for d in of_type(fleet.plan(), actions.DeletePod)}
    assert deleted == {
        "driver-gpu-01": f"revision {OLD} is not {NEW}",
        "validator-gpu-01": "validates the old driver",
    }


def test_a_validator_from_the_new_driver_pods_own_second_passes_validation() -> None:
    # Creation times have whole seconds: a validator the DaemonSet recreated right after the
    # restart shares the new driver pod's second. Restarting it again would repeat until the
    # clock's second turned.
    fleet = Fleet(daemonsets=[pool(), validator_ds()])
    restarting(
        fleet,
        driver_pod("gpu-01", NEW, created=T0),
        validator_pod("gpu-01", created=T0),
        state=states.VALIDATION_REQUIRED,
        annotations={states.VALIDATION_START: str(int(T0))},
    )
    plan = fleet.plan()
    assert not of_type(plan, actions.DeletePod)
    assert state_after(plan, "gpu-01") == states.UNCORDON_REQUIRED
