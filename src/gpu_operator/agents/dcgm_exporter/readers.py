"""Read the counters' fields from NVML into per-entity values (the exporter's DCGM stand-in).

Entities follow dcgm-exporter's default device selection: a GPU without MIG is one entity; a
MIG-enabled GPU with GPU instances is one entity per GPU instance (labels `GPU_I_PROFILE`,
`GPU_I_ID`), whose framebuffer fields are the instance's and whose other fields are the GPU's.
A value NVML cannot give for an entity (NotSupported, e.g. utilization in MIG mode) is left out,
as DCGM leaves blank values out. Each GPU's calls are made once per collection and shared by its
instances; GPUs are read in parallel when an executor is given (NVML's PCIe throughput alone
samples for 20 ms per call). DCGM_FI_PROF_GR_ENGINE_ACTIVE comes from GPU performance monitoring
(Hopper and later, per GPU instance too) as the activity since the previous collection.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from gpu_operator import nvml
from gpu_operator.agents.dcgm_exporter import fields
from gpu_operator.nvml import protocol as p

log = logging.getLogger("gpu_operator.agents.dcgm_exporter")

Value = int | float | str
_MIG_PROFILE = re.compile(r" MIG (?:\d+c\.)?(\S+)$")


@dataclass(frozen=True)
class Entity:
    """One exported entity: a whole GPU, or one GPU instance of a MIG-enabled GPU."""

    gpu: int
    uuid: str
    pci_bus_id: str
    model: str
    mig_profile: str | None = None
    gpu_instance_id: int | None = None
    mig_uuids: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """How pod attribution finds it: the GPU UUID, or `<gpu>-<instance>` (upstream's keys)."""
        if self.gpu_instance_id is None:
            return self.uuid
        return f"{self.gpu}-{self.gpu_instance_id}"


@dataclass
class Reading:
    entity: Entity
    values: dict[str, Value] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeReading:
    """One collection: the entities in GPU order with their values by field name."""

    readings: tuple[Reading, ...]

    def mig_keys(self) -> dict[str, str]:
        """MIG device UUID -> entity key, for attributing `MIG-...` device ids without NVML."""
        return {u: r.entity.key for r in self.readings for u in r.entity.mig_uuids}

    def index_keys(self) -> dict[int, str]:
        """GPU index -> entity key of the whole GPU (for `nvidiaN` device ids)."""
        return {r.entity.gpu: r.entity.key for r in self.readings if r.entity.mig_profile is None}


class _NoValueYet(nvml.NvmlError):
    """A rate needs two samples; the first collection has one."""


class GpmTracker:
    """The last GPU performance-monitoring sample per GPU and GPU instance, so each collection
    reports the activity since the previous one (as DCGM's watches do)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[tuple[str, int | None], p.GpmSample] = {}
        self._unsupported: set[str] = set()

    def activity(
        self, lib: nvml.Nvml, device: p.Device, uuid: str, gpu_instance_id: int | None
    ) -> float:
        """GR_ENGINE_ACTIVE (0..1) since the last call for this GPU (instance)."""
        if uuid in self._unsupported:
            raise nvml.NotSupported("no GPU performance monitoring on this GPU")
        try:
            sample = device.gpm_sample(gpu_instance_id)
        except nvml.NotSupported:
            self._unsupported.add(uuid)
            raise
        key = (uuid, gpu_instance_id)
        with self._lock:
            previous = self._last.get(key)
            self._last[key] = sample
        if previous is None:
            raise _NoValueYet("first GPU performance-monitoring sample")
        try:
            values = lib.gpm_metrics(previous, sample, [p.GpmMetric.GRAPHICS_UTIL])
        finally:
            previous.free()
        if p.GpmMetric.GRAPHICS_UTIL not in values:
            raise nvml.NotSupported("NVML gave no graphics activity")
        return values[p.GpmMetric.GRAPHICS_UTIL] / 100.0

    def keep_only(self, keys: Iterable[tuple[str, int | None]]) -> None:
        """Free the samples of entities that are gone (a destroyed GPU instance)."""
        wanted = set(keys)
        with self._lock:
            stale = [k for k in self._last if k not in wanted]
            dropped = [self._last.pop(k) for k in stale]
        for sample in dropped:
            _free(sample)

    def clear(self) -> None:
        with self._lock:
            dropped = list(self._last.values())
            self._last.clear()
        for sample in dropped:
            _free(sample)


def _free(sample: p.GpmSample) -> None:
    try:
        sample.free()
    except nvml.NvmlError as err:
        log.debug("freeing a GPM sample: %s", err)


class _Gpu:
    """One GPU's NVML calls, each made at most once per collection (errors remembered too)."""

    def __init__(
        self,
        lib: nvml.Nvml,
        device: p.Device,
        instance: p.Device | None = None,
        *,
        gpm: GpmTracker | None = None,
        uuid: str = "",
        gpu_instance_id: int | None = None,
    ):
        self.lib = lib
        self.device = device
        self.instance = instance
        self.gpm = gpm
        self.uuid = uuid
        self.gpu_instance_id = gpu_instance_id
        self._memo: dict[str, Any] = {}

    def call(self, name: str, fn: Callable[[], Any]) -> Any:
        if name not in self._memo:
            try:
                self._memo[name] = fn()
            except nvml.NvmlError as err:
                self._memo[name] = err
        result = self._memo[name]
        if isinstance(result, nvml.NvmlError):
            raise result
        return result

    def for_instance(self, instance: p.Device, gpu_instance_id: int) -> _Gpu:
        """A view reading instance-scoped fields from `instance`, sharing this GPU's memo."""
        view = _Gpu(
            self.lib,
            self.device,
            instance,
            gpm=self.gpm,
            uuid=self.uuid,
            gpu_instance_id=gpu_instance_id,
        )
        view._memo = self._memo
        return view

    def gr_engine_active(self) -> float:
        """Graphics-engine activity (0..1): GPM where the GPU has it (per GPU instance too);
        else, on a whole GPU, NVML's utilization (the time a kernel ran) / 100."""
        if self.gpm is not None:
            try:
                return self.gpm.activity(self.lib, self.device, self.uuid, self.gpu_instance_id)
            except nvml.NotSupported:
                pass
        if self.gpu_instance_id is not None:
            raise nvml.NotSupported("no graphics activity for a GPU instance without GPM")
        return self.util().gpu / 100.0

    def memory(self) -> p.MemoryInfo:
        if self.instance is not None:
            inst = self.instance
            key = f"memory:{id(inst)}"
            result: p.MemoryInfo = self.call(key, inst.memory_info)
            return result
        whole: p.MemoryInfo = self.call("memory", self.device.memory_info)
        return whole

    def util(self) -> p.Utilization:
        result: p.Utilization = self.call("util", self.device.utilization)
        return result

    def remap(self) -> p.RemappedRows:
        result: p.RemappedRows = self.call("remap", self.device.remapped_rows)
        return result

    def pcie(self, counter: p.PcieUtilCounter) -> int:
        result: int = self.call(
            f"pcie:{int(counter)}", lambda: self.device.pcie_throughput(counter)
        )
        return result


def _mib(n: int) -> int:
    return n >> 20


def _used_percent(m: p.MemoryInfo) -> float:
    # Of the memory processes can have: the driver's reserved part is neither used nor free.
    usable = _mib(m.total) - _mib(m.reserved)
    return 100.0 * _mib(m.used) / usable if usable > 0 else 0.0


def _ecc(kind: p.EccErrorType, counter: p.EccCounterType) -> Callable[[_Gpu], Value]:
    return lambda g: g.call(
        f"ecc:{int(kind)}:{int(counter)}", lambda: g.device.total_ecc_errors(kind, counter)
    )


def _clock(kind: p.ClockType) -> Callable[[_Gpu], Value]:
    return lambda g: g.call(f"clock:{int(kind)}", lambda: g.device.clock(kind))


_UNC, _COR = p.EccErrorType.UNCORRECTED, p.EccErrorType.CORRECTED
_VOL, _AGG = p.EccCounterType.VOLATILE, p.EccCounterType.AGGREGATE
_TX, _RX = p.PcieUtilCounter.TX_BYTES, p.PcieUtilCounter.RX_BYTES

# How each `fields.Field.source` is read for one entity. XIDs come from the event watcher.
SOURCES: dict[str, Callable[[_Gpu], Value]] = {
    "driver_version": lambda g: g.call("driver", g.lib.driver_version),
    "nvml_version": lambda g: g.call("nvml", g.lib.nvml_version),
    "device_count": lambda g: g.call("count", g.lib.device_count),
    "cuda_driver_version": lambda g: g.call("cuda", g.lib.cuda_driver_version),
    "name": lambda g: g.call("name", g.device.name),
    "brand": lambda g: g.call("brand", g.device.brand),
    "index": lambda g: g.call("index", g.device.index),
    "uuid": lambda g: g.call("uuid", g.device.uuid),
    "minor_number": lambda g: g.call("minor", g.device.minor_number),
    "pci_bus_id": lambda g: g.call("pci", g.device.pci_info).bus_id,
    "pci_combined_id": lambda g: g.call("pci", g.device.pci_info).device_id,
    "pci_subsystem_id": lambda g: g.call("pci", g.device.pci_info).subsystem_id,
    "mig_mode": lambda g: int(g.call("mig", g.device.mig_mode).current),
    "sm_clock": _clock(p.ClockType.SM),
    "mem_clock": _clock(p.ClockType.MEM),
    "video_clock": _clock(p.ClockType.VIDEO),
    "memory_temp": lambda g: g.call("memtemp", g.device.memory_temperature),
    "gpu_temp": lambda g: g.call("temp", g.device.temperature),
    "power_usage": lambda g: g.call("power", g.device.power_usage) / 1000.0,
    "power_usage_instant": lambda g: g.call("power_now", g.device.power_usage_instant) / 1000.0,
    "total_energy": lambda g: g.call("energy", g.device.total_energy_consumption),
    "pcie_tx_kb": lambda g: g.pcie(_TX),
    "pcie_rx_kb": lambda g: g.pcie(_RX),
    "pcie_tx_bytes": lambda g: float(g.pcie(_TX) * 1024),
    "pcie_rx_bytes": lambda g: float(g.pcie(_RX) * 1024),
    "pcie_replay": lambda g: g.call("replay", g.device.pcie_replay_counter),
    "gpu_util": lambda g: g.util().gpu,
    "mem_copy_util": lambda g: g.util().memory,
    "gr_engine_active": lambda g: g.gr_engine_active(),
    "enc_util": lambda g: g.call("enc", g.device.encoder_utilization),
    "dec_util": lambda g: g.call("dec", g.device.decoder_utilization),
    "fb_total": lambda g: _mib(g.memory().total),
    "fb_free": lambda g: _mib(g.memory().free),
    "fb_used": lambda g: _mib(g.memory().used),
    "fb_reserved": lambda g: _mib(g.memory().reserved),
    "fb_used_percent": lambda g: _used_percent(g.memory()),
    "ecc_sbe_vol": _ecc(_COR, _VOL),
    "ecc_dbe_vol": _ecc(_UNC, _VOL),
    "ecc_sbe_agg": _ecc(_COR, _AGG),
    "ecc_dbe_agg": _ecc(_UNC, _AGG),
    "remap_correctable": lambda g: g.remap().correctable,
    "remap_uncorrectable": lambda g: g.remap().uncorrectable,
    "remap_pending": lambda g: int(g.remap().pending),
    "remap_failure": lambda g: int(g.remap().failure),
}


class XidTracker:
    """The last XID per GPU and per GPU instance, fed by an NVML event set on a thread.

    DCGM's `DCGM_FI_DEV_XID_ERRORS` is the value of the last XID; it reads 0 until one happens.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._serial = 0
        self._gpu: dict[str, tuple[int, int]] = {}
        self._instance: dict[tuple[str, int], tuple[int, int]] = {}
        # The MIG devices each GPU instance had when last seen: a GPU instance id reused by a
        # MIG reconfiguration is a new instance and starts without the old one's XID.
        self._members: dict[tuple[str, int], frozenset[str]] = {}
        self.watching = threading.Event()  # set once every GPU is registered for events

    def record(self, uuid: str, xid: int, gpu_instance_id: int | None = None) -> None:
        with self._lock:
            self._serial += 1
            entry = (self._serial, xid)
            if gpu_instance_id is None:
                self._gpu[uuid] = entry
            else:
                self._instance[(uuid, gpu_instance_id)] = entry
            self._lock.notify_all()

    def observe(self, uuid: str, gpu_instance_id: int, mig_uuids: Iterable[str]) -> None:
        """Note the MIG devices GPU instance `gpu_instance_id` has now; forget its XID when
        they changed (the instance was destroyed and its id reused)."""
        members = frozenset(mig_uuids)
        key = (uuid, gpu_instance_id)
        with self._lock:
            before = self._members.get(key)
            self._members[key] = members
            if before is not None and before != members:
                self._instance.pop(key, None)

    def wait_for_count(self, count: int, timeout: float) -> bool:
        """Block until `count` XIDs have been recorded (tests); False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: self._serial >= count, timeout)

    def last(self, uuid: str, gpu_instance_id: int | None = None) -> int:
        """The latest XID that concerns this entity (a GPU's own or any of its instances')."""
        with self._lock:
            seen = [self._gpu.get(uuid, (0, 0))]
            if gpu_instance_id is None:
                seen += [v for (u, _), v in self._instance.items() if u == uuid]
            else:
                seen.append(self._instance.get((uuid, gpu_instance_id), (0, 0)))
            return max(seen)[1]

    def watch(self, lib: nvml.Nvml, stop: threading.Event, *, timeout_ms: int = 500) -> None:
        """Record XID events until `stop` is set (blocking: run it on a thread)."""
        try:
            events = lib.event_set()
        except nvml.NvmlError as err:
            log.warning("XID events unavailable (%s); DCGM_FI_DEV_XID_ERRORS stays 0", err)
            return
        try:
            for i in range(lib.device_count()):
                try:
                    device = lib.device_by_index(i)
                    mask = p.EventType.XID_CRITICAL & device.supported_event_types()
                    if not mask:
                        log.warning("GPU %d does not report XID events", i)
                        continue
                    events.register(device, mask)
                except nvml.NvmlError as err:
                    log.warning("GPU %d: no XID events (%s)", i, err)
            self.watching.set()
            while not stop.is_set():
                try:
                    event = events.wait(timeout_ms)
                except nvml.Timeout:
                    continue
                except nvml.NvmlError as err:
                    log.warning("waiting for XID events failed: %s", err)
                    stop.wait(timeout_ms / 1000.0)
                    continue
                if event.event_type & p.EventType.XID_CRITICAL:
                    log.info("XID %d on %s", event.event_data, event.device_uuid)
                    self.record(event.device_uuid, event.event_data, event.gpu_instance_id)
        finally:
            events.free()


def _profile(mig_device: p.Device) -> str:
    found = _MIG_PROFILE.search(mig_device.name())
    return found.group(1) if found else "unknown"


def _instances(device: p.Device) -> list[tuple[int, str, list[p.Device]]]:
    """(GPU instance id, profile, its MIG devices) of a MIG-enabled GPU, by instance id."""
    groups: dict[int, tuple[str, list[p.Device]]] = {}
    for j in range(device.max_mig_device_count()):
        try:
            mig = device.mig_device_by_index(j)
        except nvml.NotFound:
            continue
        gi = mig.gpu_instance_id()
        groups.setdefault(gi, (_profile(mig), []))[1].append(mig)
    return [(gi, prof, devs) for gi, (prof, devs) in sorted(groups.items())]


def _mig_enabled(device: p.Device) -> bool:
    try:
        return device.mig_mode().current
    except nvml.NotSupported:
        return False


def _entities(lib: nvml.Nvml, i: int, gpm: GpmTracker | None) -> list[tuple[Entity, _Gpu]]:
    device = lib.device_by_index(i)
    uuid = device.uuid()
    gpu = _Gpu(lib, device, gpm=gpm, uuid=uuid)
    bus = device.pci_info().bus_id
    model = device.name()
    if _mig_enabled(device):
        instances = _instances(device)
        if instances:
            return [
                (
                    Entity(i, uuid, bus, model, prof, gi, tuple(m.uuid() for m in migs)),
                    gpu.for_instance(migs[0], gi),
                )
                for gi, prof, migs in instances
            ]
    return [(Entity(i, uuid, bus, model), gpu)]


def _read_gpu(
    lib: nvml.Nvml,
    i: int,
    wanted: Sequence[fields.Field],
    xids: XidTracker | None,
    gpm: GpmTracker | None,
) -> list[Reading]:
    try:
        entities = _entities(lib, i, gpm)
    except nvml.NvmlError as err:
        log.warning("GPU %d skipped: %s", i, err)
        return []
    readings = []
    for entity, gpu in entities:
        if xids is not None and entity.gpu_instance_id is not None:
            xids.observe(entity.uuid, entity.gpu_instance_id, entity.mig_uuids)
        reading = Reading(entity)
        for f in wanted:
            if f.source == "xid":
                xid = xids.last(entity.uuid, entity.gpu_instance_id) if xids else 0
                reading.values[f.name] = xid
                continue
            try:
                reading.values[f.name] = SOURCES[f.source or ""](gpu)
            except nvml.NvmlError:
                continue  # DCGM leaves blank values out too
        readings.append(reading)
    return readings


def read(
    lib: nvml.Nvml,
    wanted: Iterable[fields.Field],
    xids: XidTracker | None = None,
    *,
    gpm: GpmTracker | None = None,
    executor: Executor | None = None,
) -> NodeReading:
    """Every wanted field of every entity; a GPU that fails (e.g. fell off the bus) is skipped.

    With an `executor` the GPUs are read concurrently (NVML is thread-safe), so slow calls such
    as the PCIe throughput sample cost one window per collection rather than one per GPU.
    """
    fields_wanted = [f for f in wanted if f.source is not None]
    indices = range(lib.device_count())

    def one(i: int) -> list[Reading]:
        return _read_gpu(lib, i, fields_wanted, xids, gpm)

    per_gpu = (
        list(executor.map(one, indices)) if executor is not None else [one(i) for i in indices]
    )
    readings = [r for gpu in per_gpu for r in gpu]
    if gpm is not None:
        gpm.keep_only((r.entity.uuid, r.entity.gpu_instance_id) for r in readings)
    return NodeReading(tuple(readings))
