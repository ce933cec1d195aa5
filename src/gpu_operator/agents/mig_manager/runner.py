"""The MIG manager's loop: follow the node's `nvidia.com/mig.config` label and reconfigure to the
newest value, as upstream does (the value at start is applied too; empty values are ignored; a
value that changes back to the one last applied while a change runs is not applied twice)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from gpu_operator.agents.mig_manager import protocol as proto
from gpu_operator.agents.mig_manager import reconfigure
from gpu_operator.api import keys

log = logging.getLogger("gpu_operator.agents.mig_manager")
_UNSET = object()


async def run(
    reconfigurer: reconfigure.Reconfigurer,
    label_values: AsyncIterator[str | None],
    *,
    stop: asyncio.Event,
    on_idle: Callable[[], None] = lambda: None,
    retry_delay: float = 5.0,
) -> None:
    """Reconfigure on every change of the label until `stop` is set.

    `on_idle` is called whenever the manager has caught up with the label (the demo marks the
    container ready then).
    """
    latest: str | None = None
    changed = asyncio.Event()

    async def follow() -> None:
        nonlocal latest
        async for value in label_values:
            latest = value
            changed.set()

    follower = asyncio.create_task(follow())
    last_read: object = _UNSET
    try:
        while not stop.is_set():
            waiters = [asyncio.ensure_future(changed.wait()), asyncio.ensure_future(stop.wait())]
            _, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for waiter in pending:
                waiter.cancel()
            if stop.is_set():
                break
            if follower.done():
                follower.result()  # re-raise what ended the watch
                return
            changed.clear()
            wanted = proto.wanted_config(latest)
            if wanted is None:
                log.info("waiting for a value in the %s label", keys.MIG_CONFIG)
                on_idle()
                continue
            if wanted == last_read:
                on_idle()
                continue
            try:
                outcome = await reconfigurer.run(wanted)
                # A simulated reboot returns: the manager "starts again" and re-checks.
                while outcome.state == proto.STATE_REBOOTING and not stop.is_set():
                    outcome = await reconfigurer.run(wanted)
            except Exception as err:
                log.error(
                    "reconfiguring to %r failed: %s; retrying in %.0fs", wanted, err, retry_delay
                )
                changed.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), retry_delay)
                continue
            last_read = wanted
            log.info("MIG config %r: %s", wanted, outcome.state)
            on_idle()
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
