"""The driver upgrade gauges after each pass (docs/reliability.md, issue 32): the per-state node
counts are kept as passes merge their reports, not recounted over every node, and must always be
what a recount of the merged reports gives, whatever mix of full and incremental passes ran."""

from __future__ import annotations

from typing import cast

from gpu_operator.controller import runtime, upgrade
from gpu_operator.kube.client import AsyncClient
from gpu_operator.upgrade import actions, states


def reconciler() -> upgrade.UpgradeReconciler:
    # Nothing here reaches the API server: only merging plans and publishing the gauges.
    rt = runtime.Runtime(cast(AsyncClient, None), runtime.Settings(namespace="gpu-operator"))
    return upgrade.UpgradeReconciler(rt)


def report(node: str, state: str) -> actions.NodeReport:
    return actions.NodeReport(
        node=node, pool="p", owner="cluster-policy", state=state, previous="", message=""
    )


def plan(reports: dict[str, str], available: int = 0) -> actions.Plan:
    group = actions.GroupReport(
        owner="cluster-policy",
        total=len(reports),
        in_progress=0,
        unavailable=0,
        max_unavailable=1,
        max_parallel=1,
        started=0,
        failed=0,
        available=available,
    )
    return actions.Plan(
        nodes={name: report(name, state) for name, state in reports.items()},
        groups={"cluster-policy": group},
    )


def gauges(rec: upgrade.UpgradeReconciler) -> dict[str, float]:
    return {name: gauge._value.get() for name, gauge in rec.rt.metrics.upgrades.items()}


def recounted(rec: upgrade.UpgradeReconciler) -> dict[str, float]:
    """What the gauges must say: a recount of every node's merged report."""
    assert rec.last_plan is not None
    found = [r.state for r in rec.last_plan.nodes.values()]
    failed = found.count(states.UPGRADE_FAILED)
    return {
        "in_progress": sum(1 for s in found if s not in states.IDLE) - failed,
        "done": found.count(states.UPGRADE_DONE),
        "failed": failed,
        "pending": found.count(states.UPGRADE_REQUIRED),
        "available": sum(g.available for g in rec.last_plan.groups.values()),
    }


def test_the_gauges_follow_incremental_passes_as_a_recount_would() -> None:
    rec = reconciler()
    full = {f"gpu-{i}": states.UPGRADE_REQUIRED for i in range(6)}
    full["gpu-5"] = states.UPGRADE_DONE
    rec._merge(plan(full, available=4), None)
    rec._publish()
    assert gauges(rec) == recounted(rec)
    assert gauges(rec)["pending"] == 5

    # An incremental pass moves two nodes on, and one planned node no longer reports (gone).
    rec._merge(
        plan({"gpu-0": states.CORDON_REQUIRED, "gpu-1": states.DRAIN_REQUIRED}, available=3),
        {"gpu-0", "gpu-1", "gpu-2"},
    )
    rec._publish()
    assert gauges(rec) == recounted(rec)
    assert gauges(rec)["in_progress"] == 2
    assert gauges(rec)["pending"] == 2

    # A node fails, one finishes, and a report arrives for a node outside the focus.
    rec._merge(
        plan(
            {
                "gpu-0": states.UPGRADE_FAILED,
                "gpu-1": states.UPGRADE_DONE,
                "gpu-9": states.UPGRADE_REQUIRED,
            }
        ),
        {"gpu-0", "gpu-1"},
    )
    rec._publish()
    assert gauges(rec) == recounted(rec)
    assert gauges(rec)["failed"] == 1
    assert gauges(rec)["in_progress"] == 0

    # A full pass starts over from its own reports only.
    rec._merge(plan({"gpu-3": states.POD_RESTART_REQUIRED}), None)
    rec._publish()
    assert gauges(rec) == recounted(rec)
    assert gauges(rec) == {
        "in_progress": 1,
        "done": 0,
        "failed": 0,
        "pending": 0,
        "available": 0,
    }
