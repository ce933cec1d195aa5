"""The collection loop: every interval, read NVML, attribute pods, render the text a scrape serves.

A scrape is a memory copy of the last rendered text; nothing on the scrape path touches NVML or
the kubelet. The counters file is re-read when it changes (or on `reload()`, e.g. SIGHUP): a file
that no longer parses is logged with its bad lines and the last good counters stay in use.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gpu_operator import nvml
from gpu_operator.agents.dcgm_exporter import attribution, exposition, readers
from gpu_operator.agents.dcgm_exporter import counters as counters_mod
from gpu_operator.agents.dcgm_exporter.podresources import PodMapper

log = logging.getLogger("gpu_operator.agents.dcgm_exporter")


@dataclass
class Settings:
    """What the loop needs besides NVML: where the counters come from, how often, how to label."""

    counters_path: Path | None = None  # None: the built-in default counters
    interval: float = 30.0
    options: exposition.Options = field(default_factory=exposition.Options)
    extra_resources: tuple[str, ...] = ()
    # How long the first collection waits for the first pod-resources answer (never later ones).
    first_mapping_wait: float = 2.0


class Collector:
    """Owns NVML, the counters and the rendered text; `run` collects until stopped."""

    def __init__(
        self,
        open_nvml: Callable[[], nvml.Nvml],
        settings: Settings,
        mapper: PodMapper | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.open_nvml = open_nvml
        self.settings = settings
        self.mapper = mapper
        self.clock = clock
        self.counters = self._read_counters()
        self._fingerprint = self._file_fingerprint()
        self.text = b""
        self.collected_at: float | None = None
        self.last_error: str | None = None
        self.collections = 0
        self.collected = asyncio.Condition()
        self.attempted = asyncio.Event()  # set after the first collection, good or not
        self.xids = readers.XidTracker()
        self.gpm = readers.GpmTracker()
        self._executor: ThreadPoolExecutor | None = None
        self._lib: nvml.Nvml | None = None
        self._stop_xids = threading.Event()
        self._xid_thread: threading.Thread | None = None
        self._reload = asyncio.Event()
        self._warn_unsupported(self.counters)

    # ----- counters -------------------------------------------------------------------------

    def _read_counters(self) -> counters_mod.CounterSet:
        path = self.settings.counters_path
        return counters_mod.default() if path is None else counters_mod.load(path)

    def _file_fingerprint(self) -> bytes | None:
        path = self.settings.counters_path
        if path is None:
            return None
        try:
            return hashlib.sha256(path.read_bytes()).digest()
        except OSError:
            return None

    @staticmethod
    def _warn_unsupported(counter_set: counters_mod.CounterSet) -> None:
        missing = counter_set.unsupported
        if missing:
            names = ", ".join(f"{c.name} (line {c.line_no})" for c in missing)
            log.warning(
                "%d counter(s) of %s cannot be read without DCGM and are omitted: %s "
                "(docs/exporter.md lists what each would need)",
                len(missing), counter_set.source, names,
            )  # fmt: skip

    def reload(self) -> None:
        """Re-read the counters file at the next collection (SIGHUP)."""
        self._fingerprint = b"forced"
        self._reload.set()

    def maybe_reload(self) -> bool:
        """Adopt a changed counters file if it parses; returns whether the counters changed."""
        fingerprint = self._file_fingerprint()
        if fingerprint is None or fingerprint == self._fingerprint:
            return False
        self._fingerprint = fingerprint
        try:
            fresh = self._read_counters()
        except counters_mod.CsvError as err:
            log.error("counters file changed but is invalid, keeping the last good set: %s", err)
            return False
        if fresh.counters == self.counters.counters:
            return False
        log.info("counters reloaded from %s: %d counters", fresh.source, len(fresh.counters))
        self._warn_unsupported(fresh)
        self.counters = fresh
        return True

    # ----- collection -----------------------------------------------------------------------

    def start(self) -> None:
        """Initialise NVML and start the XID watcher (raises NvmlError when NVML fails)."""
        lib = self.open_nvml()
        lib.init()
        self._lib = lib
        # GPUs are read side by side: NVML's PCIe throughput samples for 20 ms per call.
        try:
            count = lib.device_count()
        except nvml.NvmlError:
            count = 0
        if count > 1:
            self._executor = ThreadPoolExecutor(
                max_workers=min(8, count), thread_name_prefix="nvml-read"
            )
        self._stop_xids.clear()
        self._xid_thread = threading.Thread(
            target=self.xids.watch, args=(lib, self._stop_xids), name="xid-events", daemon=True
        )
        self._xid_thread.start()

    def stop(self) -> None:
        self._stop_xids.set()
        if self._xid_thread is not None:
            self._xid_thread.join(timeout=5)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self.gpm.clear()
        if self._lib is not None:
            with contextlib.suppress(nvml.NvmlError):
                self._lib.shutdown()
            self._lib = None

    def render_once(self) -> bytes:
        """Read every counter of every entity now and render the exposition (blocking)."""
        if self._lib is None:
            raise RuntimeError("Collector.start() was not called")
        counter_set = self.counters
        wanted = [c.field for c in (*counter_set.metrics, *counter_set.labels)]
        node = readers.read(self._lib, wanted, self.xids, gpm=self.gpm, executor=self._executor)
        holders: dict[str, tuple[exposition.PodRef, ...]] = {}
        if self.mapper is not None:
            topology = attribution.Topology(node.mig_keys(), node.index_keys())
            holders = attribution.holders(
                self.mapper.current, topology, self.settings.extra_resources
            )
            if not self.settings.options.virtual_gpus:
                holders = {k: attribution.one_per_container(v) for k, v in holders.items()}
        return exposition.render(counter_set, node, holders, self.settings.options).encode()

    async def collect(self) -> None:
        """One collection on a worker thread; a failure keeps the previous text and is logged."""
        try:
            text = await asyncio.to_thread(self.render_once)
        except nvml.NvmlError as err:
            if str(err) != self.last_error:
                log.error("collection failed, serving the previous one: %s", err)
            self.last_error = str(err)
            self.attempted.set()
            return
        self.text = text
        self.collected_at = self.clock()
        self.last_error = None
        self.attempted.set()
        async with self.collected:
            self.collections += 1
            self.collected.notify_all()

    def healthy(self) -> tuple[bool, str]:
        """Unhealthy only when no collection has worked for three intervals (or 90 s)."""
        if self.collected_at is None:
            return False, self.last_error or "no collection yet"
        age = self.clock() - self.collected_at
        limit = max(3 * self.settings.interval, 90.0)
        if age > limit:
            return False, f"last good collection {age:.0f}s ago: {self.last_error}"
        return True, "OK"

    async def run(self, stop: asyncio.Event) -> None:
        """Collect now and then every interval until `stop`; refresh pods alongside."""
        mapper_task = None
        if self.mapper is not None:
            mapper_task = asyncio.create_task(self.mapper.run(stop))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.mapper.refreshed.wait(), self.settings.first_mapping_wait
                )
        try:
            while not stop.is_set():
                self._reload.clear()
                self.maybe_reload()
                await self.collect()
                waiters = [
                    asyncio.ensure_future(stop.wait()),
                    asyncio.ensure_future(self._reload.wait()),
                ]
                _, pending = await asyncio.wait(
                    waiters, timeout=self.settings.interval, return_when=asyncio.FIRST_COMPLETED
                )
                for w in pending:
                    w.cancel()
        finally:
            if mapper_task is not None and self.mapper is not None:
                mapper_task.cancel()
                await asyncio.gather(mapper_task, return_exceptions=True)
                await self.mapper.close()

    async def wait_for_collections(self, count: int, timeout: float = 10.0) -> None:
        """Wait until at least `count` collections have completed (tests, the demo)."""
        async with self.collected:
            await asyncio.wait_for(
                self.collected.wait_for(lambda: self.collections >= count), timeout
            )
