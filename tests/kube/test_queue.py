"""WorkQueue.add_within: a key queued no later than a deadline, whatever else is pending."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gpu_operator.kube.queue import WorkQueue


def due(queue: WorkQueue, key: str) -> float:
    """Seconds until a key's pending timer fires."""
    timer = queue._timers[key]
    return timer.when() - asyncio.get_running_loop().time()


async def test_add_within_brings_a_later_retry_forward() -> None:
    queue = WorkQueue(base_delay=30.0, max_delay=30.0)
    queue.retry("policy")  # a 30 s backoff
    queue.add_within("policy", 0.05)
    assert due(queue, "policy") <= 0.05
    assert await asyncio.wait_for(queue.get(), 2) == "policy"


async def test_add_within_keeps_an_earlier_pending_time() -> None:
    queue = WorkQueue()
    queue.add_after("policy", 0.05)
    queue.add_within("policy", 30.0)
    assert due(queue, "policy") <= 0.05
    assert await asyncio.wait_for(queue.get(), 2) == "policy"


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
    await asyncio.wait_for(_until(lambda: "policy" not in queue._timers), 2)
    queue.done("policy")
    assert await asyncio.wait_for(queue.get(), 2) == "policy"


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.005)
