"""Whole rollouts of the real planner against the modelled cluster: the limits hold at every
step, every node ends done (or failed with a reason), and the dry run's batches and durations
are what the policy implies."""

from __future__ import annotations

from upgrade_fleet import Fleet, gpu_pod, owner, pdb, pool, validator_ds, validator_pod

from gpu_operator.upgrade import actions, simulate, states
from gpu_operator.upgrade.snapshot import Snapshot

TIMING = simulate.Timing(eviction=10, driver_start=100, driver_start_precompiled=20, validation=30)


def limits_checker(max_parallel: int, max_unavailable: int) -> simulate.Check:
    def check(snap: Snapshot, plan: actions.Plan) -> None:
        unavailable = sum(1 for n in snap.nodes.values() if n.unschedulable or not n.ready)
        busy = sum(1 for n in snap.nodes.values() if n.state not in states.IDLE)
        assert unavailable <= max_unavailable, f"{unavailable} unavailable at {snap.now}"
        assert busy <= max_parallel, f"{busy} in progress at {snap.now}"

    return check


def test_twelve_nodes_roll_within_the_limits_and_only_the_pdb_blocked_one_fails() -> None:
    fleet = Fleet.of(
        12,
        owner=owner(
            maxParallelUpgrades=3, maxUnavailable="25%", podDeletion={"timeoutSeconds": 120}
        ),
        daemonsets=[pool(), validator_ds()],
    )
    fleet.set_node("gpu-03", unschedulable=True)  # cordoned by a human before the upgrade
    for name in fleet.nodes:
        fleet.pods.append(gpu_pod(name, f"train-{name}"))
        fleet.pods.append(validator_pod(name, created=fleet.now - 7200))
    fleet.pods.append(gpu_pod("gpu-05", "critical", labels={"app": "critical"}))
    fleet.budgets = [pdb("critical", {"app": "critical"})]
    outcome = simulate.run(fleet.snapshot(), TIMING, check=limits_checker(3, 3))
    assert outcome.finished
    final = {name: run.state for name, run in outcome.nodes.items()}
    assert final.pop("gpu-05") == states.UPGRADE_FAILED
    assert set(final.values()) == {states.UPGRADE_DONE}
    assert "critical" in outcome.nodes["gpu-05"].message
    assert outcome.nodes["gpu-05"].blocked_by == {"ml/critical"}
    assert outcome.peak_in_progress <= 3


def test_the_dry_run_reports_batches_and_a_duration_near_the_ideal() -> None:
    fleet = Fleet.of(6, owner=owner(maxParallelUpgrades=2, maxUnavailable="100%"))
    outcome = simulate.run(fleet.snapshot(), TIMING)
    assert outcome.batches[0] == ["gpu-01", "gpu-02"]
    assert [len(b) for b in outcome.batches] == [2, 2, 2]
    per_node = TIMING.driver_start
    # Three batches of driver restarts; the state hops between them take no modelled time.
    assert 3 * per_node <= outcome.duration <= 3 * per_node + 30


def test_a_canary_runs_first_and_alone_in_the_dry_run() -> None:
    fleet = Fleet.of(
        5, owner=owner({states.CANARY_NODES: "1"}, maxParallelUpgrades=4, maxUnavailable="100%")
    )
    outcome = simulate.run(fleet.snapshot(), TIMING)
    assert outcome.batches[0] == ["gpu-01"]
    assert outcome.nodes["gpu-01"].canary
    assert outcome.batches[1] == ["gpu-02", "gpu-03", "gpu-04", "gpu-05"]
    assert all(run.state == states.UPGRADE_DONE for run in outcome.nodes.values())


def test_evicted_pods_are_listed_per_node() -> None:
    fleet = Fleet.of(1)
    fleet.pods.append(gpu_pod("gpu-01", "train"))
    outcome = simulate.run(fleet.snapshot(), TIMING)
    assert outcome.nodes["gpu-01"].evicted == ["ml/train"]
    assert outcome.nodes["gpu-01"].state == states.UPGRADE_DONE
