"""NVIDIADriver status: state and the Ready/Error pair from a driver's report."""

from __future__ import annotations

from typing import Any

from gpu_operator.status import nvidiadriver as nvd
from gpu_operator.status.nvidiadriver import DriverReport


def by_type(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def build(report: DriverReport, previous: dict[str, Any] | None = None) -> dict[str, Any]:
    return nvd.build(report, namespace="ns", now="T1", generation=3, previous=previous)


def test_a_driver_ready_everywhere_says_where() -> None:
    status = build(DriverReport(nodes=3, pools=["ubuntu22.04 (2)", "rhel9 (1)"]))
    assert status["state"] == "ready"
    ready = by_type(status)["Ready"]
    assert ready["status"] == "True"
    assert ready["reason"] == "Reconciled"
    assert ready["message"] == "driver ready on 3 node(s) in 2 pool(s): ubuntu22.04 (2), rhel9 (1)"
    assert ready["observedGeneration"] == 3
    assert by_type(status)["Error"]["status"] == "False"


def test_waiting_pools_make_the_driver_not_ready_with_the_first_reason() -> None:
    status = build(DriverReport(waiting=["pool ubuntu22.04: gpu-1: pod Pending"], nodes=1))
    assert status["state"] == "notReady"
    error = by_type(status)["Error"]
    assert error["reason"] == "DriverNotReady"
    assert "gpu-1: pod Pending" in error["message"]


def test_a_problem_decides_the_reason_and_keeps_the_waiting_pools_in_the_message() -> None:
    status = build(
        DriverReport(
            problems=[("ConflictingNodeSelector", "1 node(s) ... gpu-3"), ("Other", "second")],
            waiting=["pool rhel9: rolling out the new spec"],
        )
    )
    error = by_type(status)["Error"]
    assert error["reason"] == "ConflictingNodeSelector"
    assert "gpu-3" in error["message"]
    assert "second" in error["message"]
    assert "rolling out" in error["message"]


def test_unchecked_nodes_are_mentioned_when_ready() -> None:
    status = build(DriverReport(nodes=2, pools=["ubuntu22.04 (2)"], unchecked=2))
    assert "not checked on 2 node(s)" in by_type(status)["Ready"]["message"]


def test_a_driver_with_no_nodes_is_ready_and_says_so() -> None:
    status = build(DriverReport())
    assert status["state"] == "ready"
    assert "no GPU node" in by_type(status)["Ready"]["message"]


def test_transition_time_moves_only_when_the_status_flips() -> None:
    first = build(DriverReport(nodes=1, pools=["p (1)"]))
    again = nvd.build(
        DriverReport(nodes=2, pools=["p (2)"]), namespace="ns", now="T2", generation=3,
        previous=first,
    )  # fmt: skip
    assert by_type(again)["Ready"]["lastTransitionTime"] == "T1"
    flipped = nvd.build(
        DriverReport(waiting=["x"]), namespace="ns", now="T3", generation=3, previous=again
    )
    assert by_type(flipped)["Ready"]["lastTransitionTime"] == "T3"


def test_an_inactive_driver_is_disabled_with_upstreams_message() -> None:
    status = nvd.inactive(
        "useNvidiaDriverCRD is not enabled in ClusterPolicy", state="disabled",
        reason="Reconciled", namespace="ns", now="T", generation=1,
    )  # fmt: skip
    assert status["state"] == "disabled"
    error = by_type(status)["Error"]
    assert error["status"] == "True"
    assert error["reason"] == "Reconciled"


def test_a_planned_upgrade_of_the_driver_is_progress_not_an_error() -> None:
    status = build(
        DriverReport(
            waiting=["upgrading the driver on 1/2 node(s): gpu-1 (pod-restart-required)"],
            nodes=2, planned=True,
        )
    )  # fmt: skip
    assert status["state"] == "notReady"
    ready, error = by_type(status)["Ready"], by_type(status)["Error"]
    assert (ready["status"], ready["reason"]) == ("False", "DriverUpgradeInProgress")
    assert "gpu-1 (pod-restart-required)" in ready["message"]
    assert (error["status"], error["reason"]) == ("False", "DriverUpgradeInProgress")
    # A spec problem still wins, planned or not.
    problem = build(DriverReport(problems=[("ConflictingNodeSelector", "x")], waiting=["y"],
                                 planned=True))  # fmt: skip
    assert by_type(problem)["Error"]["status"] == "True"
