"""The MIG manager's loop: follow the node's `nvidia.com/mig.config` label and reconfigure to the
newest value, as upstream does (the value at start is applied too; empty values are ignored; a
value that changes back to the one last applied while a change runs is not applied twice).

Beyond upstream: a change that did not finish for a transient cause (the driver missing or being
replaced, a GPU busy) is tried again when its outcome says (`Outcome.retry_in`, a capped
exponential backoff), at once when a new label value arrives, and at once when the driver comes
back (the driver container's ready marker appears). A driver that comes back also has the current
config checked again after a success or a permanent failure: a driver reload or a reboot does not
keep the GPU instances, and checking an applied config changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from gpu_operator.agents.mig_manager import protocol as proto
from gpu_operator.agents.mig_manager import reconfigure
from gpu_operator.api import keys

log = logging.getLogger("gpu_operator.agents.mig_manager")
_UNSET = object()


@dataclass
class _Retry:
    """A config whose last try ended transiently: which try it was, and when the next is due."""

    config: str
    attempt: int
    due: float


async def run(
    reconfigurer: reconfigure.Reconfigurer,
    label_values: AsyncIterator[str | None],
    *,
    stop: asyncio.Event,
    on_idle: Callable[[], None] = lambda: None,
    retry_delay: float = 5.0,
    driver_ready: AsyncIterator[bool | None] | None = None,
) -> None:
    """Reconfigure on every change of the label until `stop` is set.

    `on_idle` is called whenever the manager has caught up with the label (the demo marks the
    container ready then). `driver_ready` yields whether the driver is ready, now and on every
    change (None: cannot be seen); its turning ready triggers a run of the current config.
    `retry_delay` is the pause after an error talking to the API.
    """
    latest: str | None = None
    changed = asyncio.Event()
    driver_back = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def follow() -> None:
        nonlocal latest
        async for value in label_values:
            latest = value
            changed.set()

    async def follow_driver() -> None:
        if driver_ready is None:
            return
        last: bool | None = None
        try:
            async for ready in driver_ready:
                if ready and last is False:
                    log.info("the NVIDIA driver is ready again")
                    driver_back.set()
                elif ready is False and last:
                    log.info("the NVIDIA driver is gone (its container is not ready)")
                last = ready
        except Exception as err:  # the label and the backoff still drive the retries
            log.warning("cannot follow the driver's readiness: %s", err)

    follower = asyncio.create_task(follow())
    driver_follower = asyncio.create_task(follow_driver())
    last_read: object = _UNSET
    pending: _Retry | None = None
    try:
        while not stop.is_set():
            waiters = [
                asyncio.ensure_future(changed.wait()),
                asyncio.ensure_future(stop.wait()),
                asyncio.ensure_future(driver_back.wait()),
            ]
            timeout = None if pending is None else max(0.0, pending.due - loop.time())
            _, waiting = await asyncio.wait(
                waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            for waiter in waiting:
                waiter.cancel()
            if stop.is_set():
                break
            if follower.done():
                follower.result()  # re-raise what ended the watch
                return
            attempt = 1
            if changed.is_set():
                changed.clear()
                wanted = proto.wanted_config(latest)
                if wanted is None:
                    log.info("waiting for a value in the %s label", keys.MIG_CONFIG)
                    pending = None
                    on_idle()
                    continue
                if pending is not None and wanted == pending.config:
                    on_idle()  # the same config, its retry still due later
                    continue
                if pending is None and wanted == last_read and not driver_back.is_set():
                    on_idle()
                    continue
            elif driver_back.is_set():
                wanted = proto.wanted_config(latest)
            elif pending is not None and loop.time() >= pending.due:
                wanted = pending.config
                attempt = pending.attempt + 1
            else:
                continue
            if driver_back.is_set():
                driver_back.clear()
                if wanted is not None:
                    log.info("checking MIG config %r again now that the driver is back", wanted)
            if wanted is None:
                on_idle()
                continue
            pending = None
            try:
                outcome = await reconfigurer.run(wanted, attempt=attempt)
                # A simulated reboot returns: the manager "starts again" and re-checks.
                while outcome.state == proto.STATE_REBOOTING and not stop.is_set():
                    outcome = await reconfigurer.run(wanted)
            except Exception as err:  # the API, say: try the same config again
                log.error(
                    "reconfiguring to %r failed: %s; retrying in %.0fs", wanted, err, retry_delay
                )
                pending = _Retry(wanted, attempt, loop.time() + retry_delay)
                continue
            last_read = wanted
            if outcome.retry_in is not None:
                pending = _Retry(wanted, attempt, loop.time() + outcome.retry_in)
                log.info(
                    "MIG config %r: %s (try %d; next in %.0fs)",
                    wanted,
                    outcome.state,
                    attempt,
                    outcome.retry_in,
                )
            else:
                log.info("MIG config %r: %s", wanted, outcome.state)
            on_idle()
    finally:
        for task in (follower, driver_follower):
            task.cancel()
        await asyncio.gather(follower, driver_follower, return_exceptions=True)
