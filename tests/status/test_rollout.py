"""Planned work or a failure (status/rollout.py): a not-ready state the operator's own rollout
explains is progress; a failure during it, or a problem no rollout explains, is an error."""

from __future__ import annotations

from gpu_operator.status import rollout
from gpu_operator.status.rollout import Issue, Upgrade, Workload
from gpu_operator.upgrade import states

OUTDATED = "runs an out-of-date revision (waiting to be replaced)"
DRIVER_DS = "nvidia-driver-daemonset"


def driver(*issues: Issue, updating: bool = False) -> Workload:
    problem = f"{DRIVER_DS}: {len(issues)}/4 pods not ready or not up to date"
    return Workload(DRIVER_DS, problem, updating=updating, issues=issues, driver=True)


def upgrade(**by_node: str) -> Upgrade:
    return Upgrade({n.replace("_", "-"): s for n, s in by_node.items()}, enabled=True)


def test_a_driver_upgrade_under_way_is_progress_that_says_how_far_it_got() -> None:
    view = upgrade(
        gpu_1=states.UPGRADE_DONE,
        gpu_2=states.DRAIN_REQUIRED,
        gpu_3=states.UPGRADE_REQUIRED,
        gpu_4=states.UPGRADE_REQUIRED,
    )
    verdict = rollout.judge(
        [
            driver(
                Issue("gpu-2", OUTDATED, outdated=True),
                Issue("gpu-3", OUTDATED, outdated=True),
                Issue("gpu-4", OUTDATED, outdated=True),
            )
        ],
        view,
        driver=True,
    )
    assert verdict.kind == "progress"
    assert verdict.planned
    assert verdict.upgrade
    assert verdict.message.startswith(
        "upgrading the driver on 1/4 node(s): gpu-2 (drain-required); 2 waiting for a slot; "
        f"{DRIVER_DS}: 3/4 pods"
    )


def test_a_replaced_driver_pod_starting_or_crashing_within_its_budget_is_progress() -> None:
    view = upgrade(gpu_1=states.POD_RESTART_REQUIRED)
    for issue in (
        Issue("gpu-1", "pod Pending", reasons=("ContainerCreating",)),
        Issue("gpu-1", "container nvidia-driver-ctr is not ready"),
        Issue("gpu-1", "container nvidia-driver-ctr in CrashLoopBackOff", ("CrashLoopBackOff",),
              restarts=states.MAX_DRIVER_RESTARTS),
    ):  # fmt: skip
        assert rollout.judge([driver(issue)], view, driver=True).kind == "progress", issue


def test_real_failures_during_the_rollout_are_errors_with_the_specific_reason() -> None:
    view = upgrade(gpu_1=states.POD_RESTART_REQUIRED)
    crash = Issue(
        "gpu-1", "container nvidia-driver-ctr in CrashLoopBackOff", ("CrashLoopBackOff",),
        restarts=states.MAX_DRIVER_RESTARTS + 1,
    )  # fmt: skip
    verdict = rollout.judge([driver(crash)], view, driver=True)
    assert verdict.kind == "fault"
    assert verdict.message.startswith(
        f"{DRIVER_DS}: 1/4 pods not ready or not up to date; gpu-1: container nvidia-driver-ctr "
        "in CrashLoopBackOff (more than 10 restarts); upgrading the driver on 1/1 node(s)"
    )
    pull = Issue("gpu-1", "container nvidia-driver-ctr in ImagePullBackOff: not found",
                 ("ImagePullBackOff",))  # fmt: skip
    verdict = rollout.judge([driver(pull)], view, driver=True)
    assert verdict.kind == "fault"
    assert "ImagePullBackOff: not found" in verdict.message
    unschedulable = Issue("gpu-1", "pod not scheduled (Unschedulable)", ("Unschedulable",))
    assert rollout.judge([driver(unschedulable)], view, driver=True).kind == "fault"


def test_a_node_in_upgrade_failed_fails_the_driver_even_with_every_pod_ready() -> None:
    view = Upgrade(
        {"gpu-1": states.UPGRADE_DONE, "gpu-2": states.UPGRADE_FAILED,
         "gpu-3": states.UPGRADE_FAILED},
        failures={"gpu-2": "eviction blocked by PodDisruptionBudget ml/critical"},
        enabled=True,
    )  # fmt: skip
    verdict = rollout.judge([], view, driver=True)
    assert verdict.kind == "fault"
    assert verdict.message == (
        "driver upgrade failed on gpu-2: eviction blocked by PodDisruptionBudget ml/critical "
        "(and on 1 more: gpu-3)"
    )
    # Another state is not failed by it.
    assert rollout.judge([], view).kind == "ready"


def test_an_out_of_date_driver_pod_is_planned_only_while_upgrades_run_for_its_node() -> None:
    pod = Issue("gpu-1", OUTDATED, outdated=True)
    # Upgrades on: the node is picked up on the next pass (not labelled yet).
    assert rollout.judge([driver(pod)], Upgrade(enabled=True), driver=True).planned
    # autoUpgrade off, or the node skipped: nobody replaces it; upstream's not-ready (an error).
    assert rollout.judge([driver(pod)], Upgrade(), driver=True).kind == "waiting"
    skipped = Upgrade(enabled=True, skipped=frozenset({"gpu-1"}))
    assert rollout.judge([driver(pod)], skipped, driver=True).kind == "waiting"


def test_other_operands_on_a_node_whose_driver_is_replaced_are_progress() -> None:
    view = upgrade(gpu_1=states.VALIDATION_REQUIRED, gpu_2=states.UPGRADE_DONE)
    validator = Workload(
        "nvidia-operator-validator", "nvidia-operator-validator: 1/4 pods not ready",
        issues=(Issue("gpu-1", "init container driver-validation is running"),),
    )  # fmt: skip
    verdict = rollout.judge([validator], view)
    assert (verdict.kind, verdict.upgrade) == ("progress", True)
    # The same problem on a node the upgrade does not hold is upstream's not-ready.
    elsewhere = Workload(
        "nvidia-operator-validator", "nvidia-operator-validator: 1/4 pods not ready",
        issues=(Issue("gpu-2", "init container driver-validation is running"),),
    )  # fmt: skip
    assert rollout.judge([elsewhere], view).kind == "waiting"
    # Crashing while the node's driver is down: the driver's budget applies.
    crashing = Workload(
        "gpu-feature-discovery", "gpu-feature-discovery: 1/4 pods not ready",
        issues=(Issue("gpu-1", "container gfd in CrashLoopBackOff", ("CrashLoopBackOff",),
                      restarts=6),),
    )  # fmt: skip
    assert rollout.judge([crashing], view).planned


def test_a_new_spec_rolling_out_is_progress_until_a_pod_fails_past_a_few_restarts() -> None:
    rolling = Workload(
        "nvidia-device-plugin-daemonset", "nvidia-device-plugin-daemonset: 3/4 pods updated",
        updating=True,
        issues=(Issue("gpu-1", "pod Pending", ("ContainerCreating",)),),
    )  # fmt: skip
    assert rollout.judge([rolling], Upgrade()).planned
    crash = Issue("gpu-1", "container plugin in CrashLoopBackOff", ("CrashLoopBackOff",),
                  restarts=rollout.OPERAND_RESTART_BUDGET + 1)  # fmt: skip
    broken = Workload(rolling.name, rolling.problem, updating=True, issues=(crash,))
    assert rollout.judge([broken], Upgrade()).kind == "fault"
    # The same pods starting on a fresh install (no older spec): upstream's not-ready.
    install = Workload(rolling.name, rolling.problem, issues=rolling.issues)
    assert rollout.judge([install], Upgrade()).kind == "waiting"


def test_a_waiting_problem_outweighs_planned_work_and_both_are_named() -> None:
    view = upgrade(gpu_1=states.DRAIN_REQUIRED)
    stuck = Workload(
        "nvidia-container-toolkit-daemonset", "nvidia-container-toolkit-daemonset: 1/4",
        issues=(Issue("gpu-3", "container toolkit is not ready"),),
    )  # fmt: skip
    verdict = rollout.judge([driver(Issue("gpu-1", OUTDATED, outdated=True)), stuck], view,
                            driver=True)  # fmt: skip
    assert verdict.kind == "waiting"
    assert verdict.message.index("toolkit") < verdict.message.index("upgrading the driver")


def test_labelling_a_node_the_upgrade_changed_is_part_of_it() -> None:
    relabel = Workload(
        "node-labelling", "labelling gpu-1", labelling=True, issues=(Issue("gpu-1", "labelling"),)
    )
    done = Upgrade({"gpu-1": states.UPGRADE_DONE}, enabled=True)
    assert rollout.judge([relabel], done).planned
    # A new node (no upgrade state yet) being labelled is upstream's not-ready.
    assert rollout.judge([relabel], Upgrade(enabled=True)).kind == "waiting"


def test_nothing_to_report_is_ready() -> None:
    assert rollout.judge([Workload("x")], Upgrade(enabled=True), driver=True).kind == "ready"


def test_an_upgrade_view_works_out_its_node_lists_once() -> None:
    """A status pass asks a view for its nodes under way and queued once per pod issue
    (thousands while a rollout goes on, issue 32): each list is sorted once per view."""
    upgrade = Upgrade(
        {f"gpu-{i}": states.DRAIN_REQUIRED if i % 2 else states.UPGRADE_REQUIRED
         for i in range(1000)},
        enabled=True,
    )  # fmt: skip
    assert upgrade.under_way is upgrade.under_way
    assert upgrade.queued is upgrade.queued
    assert upgrade.failed is upgrade.failed
    assert upgrade.moving == frozenset(upgrade.under_way)
    assert upgrade.waiting == frozenset(upgrade.queued)
    issues = tuple(Issue(f"gpu-{i}", "driver pod restarting", outdated=True) for i in range(1000))
    verdict = rollout.judge([Workload("nvidia-driver-daemonset", "not ready", issues=issues,
                                      driver=True)], upgrade, driver=True)  # fmt: skip
    assert verdict.kind == "progress"
