"""ClusterPolicy status with GPU nodes whose host runs its own driver while driver.enabled=true:
which nodes, and the two ways out (seed documents 000/001), whatever the readiness."""

from __future__ import annotations

from typing import Any

from gpu_operator.status import summary
from gpu_operator.status.summary import ClusterView, StateReport

ADVICE = "create the node pool with --gpu-driver none, or set driver.enabled=false"


def ready_message(status: dict[str, Any]) -> str:
    return str(next(c for c in status["conditions"] if c["type"] == "Ready")["message"])


def build(reports: list[StateReport], cluster: ClusterView) -> dict[str, Any]:
    return summary.build(reports, cluster, namespace="ns", now="T", generation=1)


def test_the_message_names_the_nodes_and_what_to_do() -> None:
    assert summary.preinstalled_message(["aks-t4-1", "aks-t4-2"]) == (
        "2 GPU node(s) already run a preinstalled NVIDIA driver (aks-t4-1, aks-t4-2): the "
        "operator's driver does not run there while driver.enabled=true; " + ADVICE
    )


def test_many_nodes_are_counted_not_all_listed() -> None:
    message = summary.preinstalled_message([f"n{i}" for i in range(8)])
    assert message.startswith("8 GPU node(s) already run a preinstalled NVIDIA driver ")
    assert "(n0, n1, n2, n3, n4 and 3 more)" in message


def test_no_preinstalled_node_says_nothing() -> None:
    assert summary.preinstalled_message([]) == ""
    status = build([StateReport("state-driver", "ready")], ClusterView(gpu_nodes=2))
    assert "preinstalled" not in ready_message(status)


def test_a_ready_policy_still_reports_preinstalled_drivers() -> None:
    cluster = ClusterView(gpu_nodes=2, preinstalled_drivers=("a", "b"))
    status = build([StateReport("state-driver", "ready")], cluster)
    assert status["state"] == "ready"
    assert ready_message(status).startswith("all operand states ready on 2 GPU node(s); ")
    assert ready_message(status).endswith(ADVICE)


def test_a_waiting_policy_reports_them_after_what_it_waits_for() -> None:
    cluster = ClusterView(gpu_nodes=3, preinstalled_drivers=("a",))
    status = build([StateReport("state-driver", "notReady", "pod on c Pending")], cluster)
    message = ready_message(status)
    assert message.startswith("states not ready: state-driver (pod on c Pending); 1 GPU node(s)")
    assert message.endswith(ADVICE)
