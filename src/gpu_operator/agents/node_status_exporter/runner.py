"""Poll the node's status on upstream's periods and serve it on `/metrics`.

Validation markers and the device plugin's devices every `interval` (upstream: 30 s), the driver
(NVML answers) and NVIDIA PCI functions every twice that (upstream: 60 s). Every poller logs a
change of its value once, not every poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from gpu_operator import http_endpoint, nvml
from gpu_operator.agents.node_status_exporter import metrics

log = logging.getLogger("gpu_operator.agents.node_status_exporter")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
NVIDIA_VENDOR = "0x10de"


@dataclass
class Probes:
    """Where the status comes from (swappable: the demo passes the node's mock GPUs)."""

    validations_dir: Path
    open_nvml: Callable[[], nvml.Nvml]
    count_devices: Callable[[], Awaitable[int]]  # the node's advertised GPU devices
    count_pci: Callable[[], int]  # NVIDIA PCI functions; raises OSError when it cannot tell


def pci_counter(sysfs: Path) -> Callable[[], int]:
    """Count PCI functions with NVIDIA's vendor id under `<sysfs>/bus/pci/devices`."""

    def count() -> int:
        devices = sysfs / "bus" / "pci" / "devices"
        return sum(
            1
            for d in devices.iterdir()
            if (d / "vendor").exists() and (d / "vendor").read_text().strip() == NVIDIA_VENDOR
        )

    return count


def check_driver(open_nvml: Callable[[], nvml.Nvml]) -> bool:
    """The driver answers: NVML initialises and enumerates its GPUs."""
    lib = open_nvml()
    try:
        lib.init()
    except nvml.NvmlError as err:
        log.debug("driver validation failed: %s", err)
        return False
    try:
        lib.device_count()
        return True
    except nvml.NvmlError as err:
        log.debug("driver validation failed: %s", err)
        return False
    finally:
        with contextlib.suppress(nvml.NvmlError):
            lib.shutdown()


class Exporter:
    """The status and the pollers that keep it current."""

    def __init__(
        self,
        node: str,
        probes: Probes,
        *,
        interval: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.probes = probes
        self.interval = interval
        self.clock = clock
        self.status = metrics.NodeStatus(node=node, started_at=clock())
        self.polls = 0
        self.polled = asyncio.Condition()

    def poll_markers(self) -> None:
        try:
            names = [p.name for p in self.probes.validations_dir.iterdir()]
        except OSError:
            names = []
        found = metrics.components(names)
        if found != self.status.markers:
            log.info("validation markers: %s", ", ".join(sorted(found)) or "none")
        self.status.markers = found

    async def poll_devices(self) -> None:
        try:
            count = await self.probes.count_devices()
        except Exception as err:  # any API failure reads as "cannot tell", as upstream
            if self.status.devices != -1:
                log.error("could not read the node's GPU devices: %s", err)
            count = -1
        if count != self.status.devices:
            log.info("GPU devices advertised on the node: %d", count)
        self.status.devices = count
        if count > 0:
            self.status.plugin_last_success = self.clock()

    async def poll_driver(self) -> None:
        ok = await asyncio.to_thread(check_driver, self.probes.open_nvml)
        if ok != self.status.driver_ok:
            log.info("driver validation %s", "passed" if ok else "failed")
        self.status.driver_ok = ok
        if ok:
            self.status.driver_last_success = self.clock()

    def poll_pci(self) -> None:
        try:
            count = self.probes.count_pci()
        except OSError as err:
            if self.status.pci_devices != -1:
                log.error("could not count NVIDIA PCI devices: %s", err)
            count = -1
        self.status.pci_devices = count

    async def poll_once(self, *, slow: bool) -> None:
        self.poll_markers()
        await self.poll_devices()
        if slow:
            await self.poll_driver()
            self.poll_pci()
        async with self.polled:
            self.polls += 1
            self.polled.notify_all()

    async def run(self, stop: asyncio.Event) -> None:
        round_ = 0
        while not stop.is_set():
            await self.poll_once(slow=round_ % 2 == 0)
            round_ += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)

    def routes(self) -> http_endpoint.Respond:
        """`/metrics` (the current status) and `/health`, for `gpu_operator.http_endpoint`."""

        def metrics_answer() -> http_endpoint.Answer:
            return 200, CONTENT_TYPE, metrics.render(self.status)

        def health() -> http_endpoint.Answer:
            return 200, http_endpoint.TEXT, b"OK"

        return http_endpoint.routes({"/metrics": metrics_answer, "/health": health})
