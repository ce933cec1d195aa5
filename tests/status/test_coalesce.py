"""Status write coalescing: one write per window per object, the newest deferred, news at once."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from gpu_operator.status import coalesce, conditions, summary

WINDOW = 1.0


def status(
    *reports: summary.StateReport, gpu_nodes: int = 4, now: str = "2025-01-01T00:00:00Z"
) -> dict[str, Any]:
    return summary.build(
        list(reports),
        summary.ClusterView(has_nfd=True, gpu_nodes=gpu_nodes),
        namespace="gpu-operator",
        now=now,
        generation=1,
    )


READY = status(summary.StateReport("state-driver", "ready"))


def rolling(updated: int) -> dict[str, Any]:
    message = f"{updated} of 1000 pods updated"
    return status(summary.StateReport("state-dcgm-exporter", "notReady", message))


def failed(message: str = "writing DaemonSet x failed: forbidden") -> dict[str, Any]:
    return status(summary.StateReport("state-dcgm-exporter", "failed", message))


def test_first_status_is_written_at_once() -> None:
    writes = coalesce.StatusWrites(WINDOW)
    assert writes.decide("p", None, READY, now=100.0) == coalesce.WRITE


def test_unchanged_status_is_dropped_even_when_only_times_differ() -> None:
    writes = coalesce.StatusWrites(WINDOW)
    later = status(summary.StateReport("state-driver", "ready"), now="2025-01-01T09:00:00Z")
    assert writes.decide("p", READY, later, now=100.0) == coalesce.DROP


def test_a_second_change_inside_the_window_waits_for_the_window_to_end() -> None:
    writes = coalesce.StatusWrites(WINDOW)
    writes.wrote("p", rolling(1), now=100.0)
    decision = writes.decide("p", rolling(1), rolling(2), now=100.3)
    assert decision.action == "defer"
    assert decision.delay == pytest.approx(0.7)


def test_the_newest_status_is_written_once_the_window_has_passed() -> None:
    writes = coalesce.StatusWrites(WINDOW)
    writes.wrote("p", rolling(1), now=100.0)
    assert writes.decide("p", rolling(1), rolling(5), now=101.0) == coalesce.WRITE


def test_at_most_one_write_per_window_over_a_burst_of_changes() -> None:
    # 40 changes, 100 ms apart (4 s), as a rollout's pod events make them: 4 writes, one a
    # window, and the last status is among them once the window after the burst ends.
    writes = coalesce.StatusWrites(WINDOW)
    live: dict[str, Any] | None = None
    written_at: list[float] = []
    pending: tuple[float, dict[str, Any]] | None = None
    for step in range(40):
        now = 100.0 + step * 0.1
        new = rolling(step)
        decision = writes.decide("p", live, new, now)
        if decision.action == "write":
            writes.wrote("p", new, now)
            live, pending = new, None
            written_at.append(now)
        elif decision.action == "defer":
            pending = (now + decision.delay, new)
    assert pending is not None
    due, newest = pending
    assert writes.decide("p", live, newest, due) == coalesce.WRITE
    written_at.append(due)
    assert len(written_at) == 5
    assert all(b - a >= WINDOW - 1e-9 for a, b in itertools.pairwise(written_at))
    assert due - (100.0 + 39 * 0.1) <= WINDOW


def test_a_new_failure_is_written_at_once_inside_the_window() -> None:
    writes = coalesce.StatusWrites(WINDOW)
    writes.wrote("p", rolling(1), now=100.0)
    assert writes.decide("p", rolling(1), failed(), now=100.1) == coalesce.WRITE


def test_a_failure_for_another_reason_is_news_too() -> None:
    writes = coalesce.StatusWrites(WINDOW)
    writes.wrote("p", failed("forbidden"), now=100.0)
    assert writes.decide("p", failed("forbidden"), failed("not found"), 100.1) == coalesce.WRITE


def test_the_same_failure_with_other_details_waits() -> None:
    writes = coalesce.StatusWrites(WINDOW)
    before = status(
        summary.StateReport("state-dcgm-exporter", "failed", "forbidden"),
        summary.StateReport("state-driver", "notReady", "1 of 4 pods updated"),
    )
    after = status(
        summary.StateReport("state-dcgm-exporter", "failed", "forbidden"),
        summary.StateReport("state-driver", "notReady", "2 of 4 pods updated"),
    )
    writes.wrote("p", before, now=100.0)
    assert writes.decide("p", before, after, now=100.2).action == "defer"


def test_an_invalid_spec_is_news() -> None:
    writes = coalesce.StatusWrites(WINDOW)
    invalid = summary.invalid(
        ["spec.driver.version: bad"], namespace="ns", now="T", generation=2, previous=READY
    )
    writes.wrote("p", READY, now=100.0)
    assert writes.decide("p", READY, invalid, now=100.1) == coalesce.WRITE


def test_becoming_ready_inside_the_window_waits_at_most_the_window() -> None:
    writes = coalesce.StatusWrites(WINDOW)
    writes.wrote("p", rolling(999), now=100.0)
    decision = writes.decide("p", rolling(999), READY, now=100.05)
    assert decision.action == "defer"
    assert decision.delay <= WINDOW


def test_a_status_equal_to_our_last_write_is_looked_at_again_when_the_cache_lags() -> None:
    # The cache still shows the status before our write: deferred, then dropped once it caught up.
    writes = coalesce.StatusWrites(WINDOW)
    writes.wrote("p", failed(), now=100.0)
    assert writes.decide("p", rolling(1), failed(), now=100.1).action == "defer"
    assert writes.decide("p", failed(), failed(), now=101.0) == coalesce.DROP


def test_someone_elses_status_edit_is_overwritten_after_the_window() -> None:
    writes = coalesce.StatusWrites(WINDOW)
    writes.wrote("p", READY, now=100.0)
    edited = {**READY, "state": "notReady"}
    assert writes.decide("p", edited, READY, now=101.5) == coalesce.WRITE


def test_a_failed_write_is_not_recorded_so_its_retry_goes_out_at_once() -> None:
    writes = coalesce.StatusWrites(WINDOW)
    writes.wrote("p", rolling(1), now=100.0)
    assert writes.decide("p", rolling(1), rolling(2), now=101.0) == coalesce.WRITE
    # The patch failed: nothing recorded; the retry 100 ms later is still due.
    assert writes.decide("p", rolling(1), rolling(2), now=101.1) == coalesce.WRITE


def test_objects_have_their_own_windows() -> None:
    writes = coalesce.StatusWrites(WINDOW)
    writes.wrote("a", rolling(1), now=100.0)
    assert writes.decide("b", None, rolling(2), now=100.1) == coalesce.WRITE
    writes.forget("a")
    assert writes.decide("a", rolling(1), rolling(2), now=100.2) == coalesce.WRITE


def test_window_zero_writes_every_change() -> None:
    writes = coalesce.StatusWrites(0.0)
    writes.wrote("p", rolling(1), now=100.0)
    assert writes.decide("p", rolling(1), rolling(2), now=100.0) == coalesce.WRITE


@pytest.mark.parametrize("window", [-1.0, float("nan"), float("inf")])
def test_a_bad_window_is_refused_with_its_value(window: float) -> None:
    with pytest.raises(ValueError, match="status write interval"):
        coalesce.StatusWrites(window)


def test_a_driver_upgrade_starting_is_written_at_once_inside_the_window() -> None:
    # A small fleet's upgrade that starts right after another write and ends within the window
    # would otherwise never show as not ready.
    upgrading = status(
        summary.StateReport("state-driver", "notReady", "1 of 2 nodes upgraded", True, True)
    )
    ready_condition = next(c for c in upgrading["conditions"] if c["type"] == conditions.READY)
    assert ready_condition["reason"] == conditions.DRIVER_UPGRADE_IN_PROGRESS
    writes = coalesce.StatusWrites(WINDOW)
    writes.wrote("p", READY, now=100.0)
    assert writes.decide("p", READY, upgrading, now=100.1) == coalesce.WRITE
    # Other rollouts, and progress while upgrading, wait for the window.
    assert writes.decide("p", READY, rolling(1), now=100.1).action == "defer"
    writes.wrote("p", upgrading, now=100.1)
    later = status(
        summary.StateReport("state-driver", "notReady", "2 of 2 nodes upgraded", True, True)
    )
    assert writes.decide("p", upgrading, later, now=100.2).action == "defer"


def test_news_needs_a_failure_not_a_waiting_reason() -> None:
    waiting = rolling(1)
    assert not coalesce.is_news(READY, waiting)
    error = next(c for c in failed()["conditions"] if c["type"] == conditions.ERROR)
    assert error["reason"] == conditions.RECONCILE_FAILED
    assert coalesce.is_news(waiting, failed())
