"""ClusterPolicy status: upstream's condition pair and reasons, plus the per-state summary."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.status import conditions, summary
from gpu_operator.status.summary import ClusterView, StateReport

NOW = "2026-11-21T10:00:00Z"
LATER = "2026-11-21T10:05:00Z"


def build(
    reports: list[StateReport], cluster: ClusterView | None = None, **kw: Any
) -> dict[str, Any]:
    return summary.build(
        reports, cluster or ClusterView(), namespace="gpu-operator", now=kw.pop("now", NOW),
        generation=3, **kw,
    )  # fmt: skip


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_all_ready() -> None:
    status = build([StateReport("state-driver", "ready"), StateReport("state-dcgm", "disabled")],
                   ClusterView(gpu_nodes=4))  # fmt: skip
    assert status["state"] == "ready"
    assert condition(status, "Ready") | {"lastTransitionTime": None} == {
        "type": "Ready", "status": "True", "reason": "Reconciled", "observedGeneration": 3,
        "message": "all operand states ready on 4 GPU node(s)", "lastTransitionTime": None,
    }  # fmt: skip
    assert condition(status, "Error")["status"] == "False"
    assert condition(status, "Error")["reason"] == "Ready"
    assert status["states"][1] == {"name": "state-dcgm", "state": "disabled"}


def test_not_ready_names_each_state_and_its_first_reason() -> None:
    status = build([
        StateReport("state-driver", "notReady",
                    "nvidia-driver-daemonset: 3/40 pods not ready; gpu-17: init container "
                    "k8s-driver-manager in CrashLoopBackOff"),
        StateReport("state-device-plugin", "notReady", "nvidia-device-plugin-daemonset: 1/40"),
    ])  # fmt: skip
    assert status["state"] == "notReady"
    error = condition(status, "Error")
    assert error["reason"] == "OperandNotReady"
    assert error["message"] == (
        "states not ready: state-driver (nvidia-driver-daemonset: 3/40 pods not ready; gpu-17: "
        "init container k8s-driver-manager in CrashLoopBackOff); state-device-plugin "
        "(nvidia-device-plugin-daemonset: 1/40)"
    )
    assert condition(status, "Ready") | {"message": ""} == {
        "type": "Ready", "status": "False", "reason": "Error", "message": "",
        "lastTransitionTime": NOW, "observedGeneration": 3,
    }  # fmt: skip


def test_only_driver_waiting_is_driver_not_ready() -> None:
    status = build([StateReport("state-driver", "notReady", "x")])
    assert condition(status, "Error")["reason"] == "DriverNotReady"


def test_failure_wins_over_waiting() -> None:
    status = build(
        [
            StateReport("state-driver", "notReady"),
            StateReport("state-dcgm-exporter", "failed", "spec.dcgmExporter: version not set"),
            StateReport("gpu-feature-discovery", "failed", "GFD_IMAGE is empty"),
        ]
    )
    error = condition(status, "Error")
    assert error["reason"] == "ReconcileFailed"
    assert error["message"] == (
        "failed to reconcile state-dcgm-exporter: spec.dcgmExporter: version not set "
        "(and 1 more: gpu-feature-discovery)"
    )


@pytest.mark.parametrize(
    ("cluster", "reason"),
    [(ClusterView(has_nfd=False), "NFDLabelsMissing"), (ClusterView(gpu_nodes=0), "NoGPUNodes")],
)
def test_ready_reasons_without_gpus(cluster: ClusterView, reason: str) -> None:
    status = build([StateReport("state-driver", "ready")], cluster)
    assert status["state"] == "ready"
    assert condition(status, "Ready")["reason"] == reason


def test_transition_time_moves_only_on_flip() -> None:
    first = build([StateReport("state-driver", "notReady", "a")])
    second = build([StateReport("state-driver", "notReady", "b")], now=LATER, previous=first)
    assert condition(second, "Ready")["lastTransitionTime"] == NOW
    third = build([StateReport("state-driver", "ready")], now=LATER, previous=second)
    assert condition(third, "Ready")["lastTransitionTime"] == LATER


def test_other_conditions_are_kept() -> None:
    previous = {"conditions": [{"type": "Custom", "status": "True"}]}
    status = build([], previous=previous)
    assert {"type": "Custom", "status": "True"} in status["conditions"]


def test_label_conflicts_are_mentioned() -> None:
    status = build([], ClusterView(label_conflicts=2))
    assert "2 node label(s) set by someone else" in condition(status, "Ready")["message"]


def test_invalid_policy_names_the_fields() -> None:
    status = summary.invalid(
        ["spec.mig.strategy: expected one of ..."], namespace="ns", now=NOW, generation=2
    )
    assert status["state"] == "notReady"
    assert condition(status, "Error")["reason"] == conditions.INVALID_SPEC
    assert "spec.mig.strategy" in condition(status, "Error")["message"]


def test_ignored_policy() -> None:
    status = summary.ignored(active="cluster-policy", namespace="ns", now=NOW, generation=1)
    assert status["state"] == "ignored"
    assert "cluster-policy is older" in condition(status, "Error")["message"]


def test_a_planned_driver_upgrade_is_not_ready_but_not_an_error() -> None:
    """Issue 30 item 5: a driver upgrade the operator rolls out is progress, not Error=True."""
    status = build([
        StateReport("state-driver", "notReady",
                    "upgrading the driver on 3/10 node(s): gpu-1 (drain-required)",
                    planned=True, driver=True),
        StateReport("state-operator-validation", "notReady", "gpu-1: init container waiting",
                    planned=True, driver=True),
        StateReport("state-device-plugin", "ready"),
    ], ClusterView(worst_node="node gpu-1: driver not ready"))  # fmt: skip
    assert status["state"] == "notReady"
    ready, error = condition(status, "Ready"), condition(status, "Error")
    assert (ready["status"], ready["reason"]) == ("False", conditions.DRIVER_UPGRADE_IN_PROGRESS)
    assert ready["message"] == (
        "planned work in progress: state-driver (upgrading the driver on 3/10 node(s): gpu-1 "
        "(drain-required)); state-operator-validation (gpu-1: init container waiting)"
    )  # nothing failed: no "first failing link"
    assert (error["status"], error["reason"]) == ("False", conditions.DRIVER_UPGRADE_IN_PROGRESS)
    assert error["message"] == conditions.PLANNED_WORK
    assert summary.in_progress([StateReport("state-driver", "notReady", planned=True)])


def test_a_failure_during_a_planned_upgrade_is_an_error_naming_it_first() -> None:
    status = build([
        StateReport("state-driver", "notReady", "driver upgrade failed on gpu-5: PDB ml/x",
                    driver=True),
        StateReport("state-operator-validation", "notReady", "gpu-1: starting", planned=True,
                    driver=True),
    ])  # fmt: skip
    error = condition(status, "Error")
    assert (error["status"], error["reason"]) == ("True", conditions.DRIVER_NOT_READY)
    assert error["message"] == (
        "states not ready: state-driver (driver upgrade failed on gpu-5: PDB ml/x); planned work "
        "in progress: state-operator-validation (gpu-1: starting)"
    )
    assert condition(status, "Ready")["reason"] == "Error"
    assert not summary.in_progress(
        [StateReport("state-driver", "notReady", planned=True), StateReport("x", "failed", "y")]
    )


def test_an_operand_rollout_alone_is_operand_rollout_progress() -> None:
    status = build([StateReport("state-device-plugin", "notReady", "3/4 updated", planned=True)])
    assert condition(status, "Ready")["reason"] == conditions.OPERAND_ROLLOUT_IN_PROGRESS
    assert condition(status, "Error")["status"] == "False"


def test_error_flips_back_when_planned_work_replaces_a_failure() -> None:
    failing = build([StateReport("state-driver", "notReady", "x")])
    planned = build([StateReport("state-driver", "notReady", "y", planned=True, driver=True)],
                    now=LATER, previous=failing)  # fmt: skip
    assert condition(planned, "Ready")["lastTransitionTime"] == NOW  # still False
    assert condition(planned, "Error")["lastTransitionTime"] == LATER  # True -> False


def test_notes_are_said_in_the_ready_message_without_holding_it_back() -> None:
    note = "dcgmExporter.serviceMonitor.enabled is true but the CRD ... is not installed"
    status = build([StateReport("state-dcgm-exporter", "ready", note)],
                   ClusterView(gpu_nodes=2, notes=(note,)))  # fmt: skip
    assert status["state"] == "ready"
    assert condition(status, "Ready")["message"] == (
        f"all operand states ready on 2 GPU node(s); {note}"
    )
    assert status["states"] == [{"name": "state-dcgm-exporter", "state": "ready", "message": note}]
