"""Waiting in tests: on a condition, with a deadline generous enough for a machine at load 10.

A test never sleeps a fixed time for something to happen and never bets on the machine's speed:
it waits for the condition it needs, and the deadline only ends a wait that would otherwise hang
(so a generous one costs nothing when the test passes). When it expires, the error names what was
awaited and the last state seen, so a failure on a loaded machine reads as a diagnosis.

TEST_DEADLINE_SCALE multiplies every deadline (for an exceptionally slow machine).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

SCALE = float(os.environ.get("TEST_DEADLINE_SCALE") or 1)
# What one wait may take on a loaded 2-core machine: most conditions hold within a second on a
# quiet one, the longest (a whole simulated cluster converging) within ten.
DEADLINE = 60.0 * SCALE
_SHOWN = 2000  # characters of the last state in a failure message


def deadline(seconds: float) -> float:
    """A specific wait's deadline, scaled like DEADLINE."""
    return seconds * SCALE


def _expired(what: str, timeout: float, seen: Any) -> AssertionError:
    shown = repr(seen)
    if len(shown) > _SHOWN:
        shown = shown[:_SHOWN] + "..."
    return AssertionError(f"timed out after {timeout:g} s waiting for {what}; last seen: {shown}")


async def eventually(
    condition: Callable[[], T | Awaitable[T]],
    what: str,
    *,
    timeout: float = DEADLINE,
    interval: float = 0.02,
    state: Callable[[], Any] | None = None,
) -> T:
    """Poll `condition` (plain or async) until it returns something truthy, and return that.

    On expiry: AssertionError naming `what` and the last state seen, `state()` when given,
    otherwise the condition's last value.
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if loop.time() >= end:
            raise _expired(what, timeout, state() if state is not None else value)
        await asyncio.sleep(interval)


def eventually_sync(
    condition: Callable[[], T],
    what: str,
    *,
    timeout: float = DEADLINE,
    interval: float = 0.02,
    state: Callable[[], Any] | None = None,
) -> T:
    """`eventually` for code that is not in an event loop (threads, subprocesses)."""
    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= end:
            raise _expired(what, timeout, state() if state is not None else value)
        time.sleep(interval)


async def within(awaitable: Awaitable[T], what: str, timeout: float = DEADLINE) -> T:
    """`await awaitable`, failing with `what` named when it takes longer than `timeout`."""
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}") from None
