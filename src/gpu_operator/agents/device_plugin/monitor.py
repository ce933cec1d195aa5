"""The health monitor: one NVML event set on a thread of its own, faults in, recoveries out.

NVML's event wait blocks, so it runs on a daemon thread; every health change is handed to a
callback at once (the plugin forwards it to the event loop, which wakes ListAndWatch), so a fault
reaches the kubelet within milliseconds of the NVML event. Faulted devices are probed every
`recheck_interval` seconds until `health.recovered` says they are fine again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpu_operator import nvml
from gpu_operator.agents.device_plugin import health
from gpu_operator.agents.device_plugin.devices import Device
from gpu_operator.agents.device_plugin.health import Fault, FaultKind, Probe

log = logging.getLogger("gpu_operator.agents.device_plugin")

WAIT_MS = 500


@dataclass(frozen=True)
class HealthChange:
    """A physical device (GPU or MIG UUID) turned unhealthy or healthy, and why."""

    uuid: str
    healthy: bool
    reason: str


class HealthMonitor:
    """Watches the GPUs behind `devices`; call `start()` once and `stop()` to end the thread."""

    def __init__(
        self,
        open_nvml: Callable[[], nvml.Nvml],
        devices: Sequence[Device],
        policy: health.XidPolicy,
        on_change: Callable[[list[HealthChange]], None],
        *,
        recheck_interval: float = 1.0,
        recovery: bool = True,
    ) -> None:
        self._open = open_nvml
        # One record per physical device: replicas share the health of what they replicate.
        self._devices = list({d.uuid: d for d in devices}.values())
        self._policy = policy
        self._on_change = on_change
        self._interval = recheck_interval
        self._recovery = recovery
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.faults: dict[str, Fault] = {}
        self.started = threading.Event()

    def start(self) -> None:
        if self._policy.checks_off:
            log.info("health checks are disabled (%s)", health.DISABLE_ENV)
            self.started.set()
            return
        self._thread = threading.Thread(target=self._run, name="nvml-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the thread ------------------------------------------------------------------------

    def _fault(self, devices: Sequence[Device], fault: Fault) -> None:
        changes = []
        for d in devices:
            if d.uuid in self.faults:
                continue
            self.faults[d.uuid] = fault
            log.warning("device %s (index %s) is unhealthy: %s", d.uuid, d.index, fault.reason)
            changes.append(HealthChange(d.uuid, False, fault.reason))
        if changes:
            self._on_change(changes)

    def _action(self, lib: nvml.Nvml, device: Device) -> nvml.protocol.RecoveryAction | None:
        try:
            return lib.device_by_uuid(device.parent_uuid).gpu_recovery_action()
        except nvml.NvmlError:
            return None

    def _register(self, lib: nvml.Nvml, event_set: nvml.EventSet) -> None:
        by_parent: dict[str, list[Device]] = {}
        for d in self._devices:
            by_parent.setdefault(d.parent_uuid, []).append(d)
        for parent, devices in by_parent.items():
            try:
                gpu = lib.device_by_uuid(parent)
                mask = health.EVENT_MASK & gpu.supported_event_types()
                event_set.register(gpu, mask)
            except nvml.NotSupported:
                log.warning("GPU %s is too old for health checks", parent)
            except nvml.GpuLost as err:
                self._fault(devices, Fault(FaultKind.LOST, f"GPU lost ({err})"))
            except nvml.NvmlError as err:
                self._fault(devices, Fault(FaultKind.MONITOR, f"cannot watch the GPU: {err}"))

    def _handle(self, lib: nvml.Nvml, event: nvml.EventData) -> None:
        found = health.classify(event, self._devices, self._policy)
        if found is None:
            return
        kind, reason, hit = found
        action = self._action(lib, hit[0])
        if kind is FaultKind.XID and action is None and self._lost(lib, hit[0]):
            kind = FaultKind.LOST
        self._fault(hit, Fault(kind, reason, action))

    @staticmethod
    def _lost(lib: nvml.Nvml, device: Device) -> bool:
        try:
            lib.device_by_uuid(device.parent_uuid).uuid()
        except nvml.GpuLost:
            return True
        except nvml.NvmlError:
            return False
        return False

    def _probe(self, lib: nvml.Nvml, device: Device) -> Probe:
        try:
            handle = lib.device_by_uuid(device.uuid)
            handle.uuid()
            handle.memory_info()
        except nvml.NvmlError:
            return Probe(False)
        try:
            action = lib.device_by_uuid(device.parent_uuid).gpu_recovery_action()
        except nvml.GpuLost:
            return Probe(False)
        except nvml.NvmlError as err:
            # The device answered above; a driver without the recovery-action field (before
            # R565) or one that cannot read it says nothing about its health.
            log.debug("no recovery action for %s: %s", device.parent_uuid, err)
            return Probe(True, None)
        return Probe(True, action)

    def _recheck(self, lib: nvml.Nvml, event_set: nvml.EventSet) -> None:
        changes = []
        reregister = False
        for d in self._devices:
            fault = self.faults.get(d.uuid)
            if fault is None:
                continue
            probe = self._probe(lib, d)
            if not health.recovered(fault, probe):
                continue
            del self.faults[d.uuid]
            reregister = reregister or fault.kind in (FaultKind.LOST, FaultKind.MONITOR)
            why = health.recovery_explanation(fault, probe)
            log.info("device %s (index %s) is healthy again: %s", d.uuid, d.index, why)
            changes.append(HealthChange(d.uuid, True, why))
        if reregister:
            # A GPU that was lost or unwatched needs its events registered again.
            self._register(lib, event_set)
        if changes:
            self._on_change(changes)

    def _run(self) -> None:
        try:
            lib = self._open()
            lib.init()
        except nvml.NvmlError as err:
            log.warning("NVML init failed (%s); health checks are disabled", err)
            self.started.set()
            return
        event_set: nvml.EventSet | None = None
        try:
            event_set = lib.event_set()
            self._register(lib, event_set)
            self.started.set()
            next_check = time.monotonic() + self._interval
            while not self._stop.is_set():
                timeout = WAIT_MS
                if self.faults and self._recovery:
                    timeout = max(1, min(WAIT_MS, int(self._interval * 1000)))
                try:
                    event = event_set.wait(timeout)
                except nvml.Timeout:
                    event = None
                except nvml.NvmlError as err:
                    # Upstream marks everything unhealthy when the wait fails; so do we, and
                    # start over with a fresh event set once NVML answers again.
                    self._fault(self._devices, Fault(FaultKind.MONITOR, f"event wait: {err}"))
                    if self._stop.wait(self._interval):
                        break
                    with contextlib.suppress(nvml.NvmlError):
                        event_set.free()
                    event_set = lib.event_set()
                    self._register(lib, event_set)
                    event = None
                if event is not None:
                    self._handle(lib, event)
                if self._recovery and self.faults and time.monotonic() >= next_check:
                    self._recheck(lib, event_set)
                    next_check = time.monotonic() + self._interval
                elif not self.faults:
                    next_check = time.monotonic() + self._interval
        except nvml.NvmlError as err:
            log.error("health monitor stopped: %s", err)
        finally:
            self.started.set()
            if event_set is not None:
                with contextlib.suppress(nvml.NvmlError):
                    event_set.free()
            with contextlib.suppress(nvml.NvmlError):
                lib.shutdown()
