"""WorkQueue.add_within: a key queued no later than a deadline, whatever else is pending."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from waiting import eventually, within

from gpu_operator.kube.queue import WorkQueue

# Longer than any wait of these tests (DEADLINE), so a key that arrives came from the short timer.
LONG = 600.0


def due(queue: WorkQueue, key: str) -> float:
    """Seconds until a key's pending timer fires."""
    timer = queue._timers[key]
    return timer.when() - asyncio.get_running_loop().time()


async def test_add_within_brings_a_later_retry_forward() -> None:
    queue = WorkQueue(base_delay=LONG, max_delay=LONG)
    queue.retry("policy")  # a 10 min backoff
    queue.add_within("policy", 0.05)
    assert due(queue, "policy") <= 0.05
    assert await within(queue.get(), "the key, brought forward") == "policy"


async def test_add_within_keeps_an_earlier_pending_time() -> None:
    queue = WorkQueue()
    queue.add_after("policy", 0.05)
    queue.add_within("policy", LONG)
    assert due(queue, "policy") <= 0.05
    assert await within(queue.get(), "the key at its earlier time") == "policy"


async def test_add_within_does_nothing_to_a_key_already_queued() -> None:
    queue = WorkQueue()
    queue.add("policy")
    queue.add_within("policy", 30.0)
    assert len(queue) == 1
    assert "policy" not in queue._timers


async def test_add_within_while_processing_runs_the_key_again_after_done() -> None:
    queue = WorkQueue()
    queue.add("policy")
    assert await queue.get() == "policy"
    queue.add_within("policy", 0.01)
    await _until(lambda: "policy" not in queue._timers, "the timer to fire", queue)
    queue.done("policy")
    assert await within(queue.get(), "the key again after done") == "policy"


async def _until(condition: Callable[[], bool], what: str, queue: WorkQueue) -> None:
    await eventually(condition, what, interval=0.005, state=lambda: dict(queue._timers))
