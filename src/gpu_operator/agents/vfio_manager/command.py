"""The VFIO manager's container lifetime: bind, serve until stopped, unbind.

Before binding it waits until no pod holds a container-stack GPU (`nvidia.com/gpu`, MIG); before
unbinding, until no pod holds one of the devices it bound (a VM), at most `release_timeout`
seconds (the pod's grace period is what is left to it). Each wait is logged with the pods' names.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gpu_operator.agents.pci import kernel as kernel_mod
from gpu_operator.agents.pci import sysfs
from gpu_operator.agents.vfio_manager import holders as holders_mod
from gpu_operator.agents.vfio_manager import manage
from gpu_operator.agents.vfio_manager import plan as plan_mod

log = logging.getLogger("gpu_operator.agents.vfio_manager")

EXIT_OK = 0
EXIT_FAILED = 1
# Told each time the set of pods being waited for changes (for an Event on the node).
Notify = Callable[[str], Awaitable[None]]


@dataclass
class Options:
    device: str | None = None
    nvswitches: bool = False
    poll_interval: float = 2.0
    release_timeout: float = 25.0


async def _sleep(stop: asyncio.Event | None, seconds: float) -> None:
    if stop is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def wait_until_free(
    holders: holders_mod.Holders,
    predicate: holders_mod.Predicate,
    what: str,
    *,
    interval: float,
    stop: asyncio.Event | None = None,
    timeout: float | None = None,
    notify: Notify | None = None,
) -> bool:
    """Wait until no pod holds a matching device (False: stopped or timed out first)."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    reported: list[str] = []
    while True:
        pods = await holders.pods(predicate)
        if not pods:
            if reported:
                log.info("no pod holds %s any more", what)
            return True
        if pods != reported:
            message = f"waiting for {len(pods)} pod(s) holding {what}: {', '.join(pods)}"
            log.warning("%s", message)
            if notify is not None:
                await notify(message)
            reported = pods
        stopped = stop is not None and stop.is_set()
        if stopped or (deadline is not None and loop.time() >= deadline):
            return False
        await _sleep(stop, interval)


async def bind(
    kernel: kernel_mod.Kernel,
    options: Options,
    holders: holders_mod.Holders,
    stop: asyncio.Event | None = None,
    notify: Notify | None = None,
) -> int:
    """`bind`: once no pod holds a container GPU, bind (exit status 1 on failure)."""
    free = await wait_until_free(
        holders, holders_mod.container_stack, "container-stack GPUs",
        interval=options.poll_interval, stop=stop, notify=notify,
    )  # fmt: skip
    if not free:
        return EXIT_FAILED
    try:
        manage.bind_all(kernel, device=options.device, nvswitches=options.nvswitches)
    except (plan_mod.PlanError, manage.VfioError) as err:
        log.error("%s", err)
        return EXIT_FAILED
    return EXIT_OK


async def unbind(
    kernel: kernel_mod.Kernel,
    options: Options,
    holders: holders_mod.Holders,
    timeout: float | None = None,
    notify: Notify | None = None,
) -> int:
    """`unbind`: once no pod holds a device on vfio, release them. After `timeout` the devices
    still held stay bound (as the kernel would block on them) and the others are released;
    the exit status is then 1."""
    bound = [
        f.address for f in sysfs.scan(kernel.root) if f.nvidia and sysfs.is_vfio_driver(f.driver)
    ]
    held: frozenset[str] = frozenset()
    if bound:
        free = await wait_until_free(
            holders, holders_mod.vm_devices(bound), "passed-through GPUs",
            interval=options.poll_interval, timeout=timeout, notify=notify,
        )  # fmt: skip
        if not free:
            held = frozenset(
                a.device_id for a in await holders.allocations() if a.device_id in bound
            )
            log.error(
                "%s stay bound to vfio: pods still hold them; the NVIDIA driver's driver "
                "manager releases them once those pods are gone", ", ".join(sorted(held)),
            )  # fmt: skip
    try:
        manage.unbind_all(kernel, device=options.device, keep=held)
    except (plan_mod.PlanError, manage.VfioError) as err:
        log.error("%s", err)
        return EXIT_FAILED
    return EXIT_FAILED if held else EXIT_OK


async def run(
    kernel: kernel_mod.Kernel,
    options: Options,
    holders: holders_mod.Holders,
    stop: asyncio.Event,
    on_bound: Callable[[], None] | None = None,
    notify: Notify | None = None,
) -> int:
    """The DaemonSet's container: bind, report, wait for `stop`, unbind."""
    code = await bind(kernel, options, holders, stop, notify)
    if code != EXIT_OK:
        return code
    if on_bound is not None:
        on_bound()
    await stop.wait()
    log.info("stopping: releasing the GPUs from vfio")
    return await unbind(kernel, options, holders, timeout=options.release_timeout, notify=notify)
