"""Requests go first: background work (controllers, kubelets) yields to requests in flight."""

from __future__ import annotations

import asyncio
import sys
import time

import kubesim
from kubesim.controllers.base import Controller, ItemKey
from kubesim.store import Store
from kubesim.turns import SLICE_SECONDS, TURNS

CONTROLLERS = 40
KEYS = 10  # each controller: two slices of work
ITEM_SECONDS = SLICE_SECONDS / 5


class Busy(Controller):
    """A controller whose every reconcile takes `ITEM_SECONDS` of CPU."""

    def __init__(self, store: Store, index: int, done: list[int]) -> None:
        super().__init__(store)
        self.name = f"busy-{index}"
        self.done = done

    def initial_keys(self) -> list[ItemKey]:
        return [(self.name, key) for key in range(KEYS)]

    def reconcile(self, key: ItemKey) -> None:
        until = time.perf_counter() + ITEM_SECONDS
        while time.perf_counter() < until:
            pass
        self.done[0] += 1


async def test_a_request_is_answered_before_a_long_backlog_drains(
    sim: kubesim.Cluster,
) -> None:
    """Forty controllers with two slices of work each: asyncio runs every ready task once per
    loop iteration, so a request read mid-backlog used to wait for a whole round of them (then
    another, for its handler to start) and was answered only once the backlog had drained. With
    the shared budget it waits about one slice."""
    done = [0]
    total = CONTROLLERS * KEYS
    url = f"{sim.url}/api/v1/namespaces/default/configmaps"
    # The client is another process, as kubectl is: a thread of this one would wait for the GIL
    # (held by the busy controllers) rather than for the server. It sends once told to.
    client = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import sys, urllib.request; sys.stdin.readline();"
        f" urllib.request.urlopen({url!r}, timeout=60).read(); print('answered')",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    answered_at: list[int] = []

    async def answered() -> None:
        assert client.stdout is not None
        line = await client.stdout.readline()
        if line.strip() == b"answered":
            answered_at.append(done[0])

    reader = asyncio.create_task(answered())
    busy = [Busy(sim.store, index, done) for index in range(CONTROLLERS)]
    for controller in busy:
        controller.start()
    assert client.stdin is not None
    client.stdin.write(b"go\n")
    try:
        while done[0] < total:
            await asyncio.sleep(0.01)
        await asyncio.wait_for(reader, 60)
        await asyncio.wait_for(client.wait(), 60)
    finally:
        for controller in busy:
            await controller.stop()
    assert answered_at, "the request was never answered"
    assert answered_at[0] < total // 2, (
        f"the request was answered after {answered_at[0]} of {total} reconciles"
    )
    assert TURNS.pending == 0  # every request left the count when it finished


TASKS = 2000
STEPS = 2  # each task: two steps of background work, a yield point before each
STEP_SECONDS = SLICE_SECONDS / 50


async def test_a_turn_wakes_only_the_tasks_that_run_in_it() -> None:
    """Two thousand pod workers parked on the spent slice: a turn used to wake every one of them,
    and all but the few that fit in the new slice parked again, so each turn cost a wake-up per
    parked task (thousands of turns at 5,000 nodes: more CPU than the work). Now a turn wakes the
    tasks that run in it plus one, so wake-ups stay a small multiple of the steps run."""
    steps = [0]

    async def worker() -> None:
        for _ in range(STEPS):
            await TURNS.pause()
            until = time.perf_counter() + STEP_SECONDS
            while time.perf_counter() < until:
                pass
            steps[0] += 1

    parks = TURNS.parks
    await asyncio.gather(*(worker() for _ in range(TASKS)))
    assert steps[0] == TASKS * STEPS
    parked = TURNS.parks - parks
    assert parked <= 2 * steps[0], f"{parked} parks for {steps[0]} steps: parked tasks all woke"


async def test_a_cancelled_waiter_does_not_stall_the_queue() -> None:
    """A parked task cancelled before or after its wake-up leaves the queue moving: the others
    still get their turns."""
    ran = [0]

    async def worker() -> None:
        await TURNS.pause()
        until = time.perf_counter() + SLICE_SECONDS / 2
        while time.perf_counter() < until:
            pass
        ran[0] += 1

    tasks = [asyncio.create_task(worker()) for _ in range(40)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # all have passed their yield point: most are parked now
    for task in tasks[1::3]:
        task.cancel()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    cancelled = sum(task.cancelled() for task in tasks)
    assert ran[0] + cancelled == len(tasks)
    assert not TURNS._waiting()
