"""nvidia-ml-py's module interface over a simulated machine, with the raw library's habits.

`MockPynvml(machine)` answers the pynvml calls `gpu_operator.nvml.real` makes the way the C
library does, so `RealNvml(module=MockPynvml(machine))` runs the real backend, and every agent
on it, without a GPU. Where real NVML differs from our Protocol, this module does what NVML does:

- GPU-instance profiles are addressed by NVML's internal ids (`nvidia-smi mig -lgip`'s ID
  column), and `nvmlGpuInstanceGetInfo` reports those, not the enum;
- names, UUIDs and versions come back as bytes, structs as attribute records;
- `nvmlDeviceGetMemoryInfo` v1 counts the driver's reserved memory as used, v2 (R510+) reports
  it apart;
- a field id newer than the driver comes back with a per-field INVALID_ARGUMENT (field 230,
  the recovery action, before R565; 186, instant power, before R535);
- the versioned fabric call does not exist before R550;
- the library is found on the loader path only when the machine says so
  (`machine.library_on_loader_path`); otherwise `nvmlLib` must be set to a loaded library, as
  `RealNvml` does from a driver root (`load_library` stands in for ctypes.CDLL);
- an event from a GPU that has fallen off the bus carries a handle that no longer answers.
"""

from __future__ import annotations

import ctypes
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gpu_operator.nvml import catalog, errors, mock
from gpu_operator.nvml import protocol as p

_NO_ID = 0xFFFFFFFF
_ARCHITECTURES = {
    "Kepler": 2,
    "Maxwell": 3,
    "Pascal": 4,
    "Volta": 5,
    "Turing": 6,
    "Ampere": 7,
    "Ada Lovelace": 8,
    "Hopper": 9,
    "Blackwell": 10,
    "Rubin": 13,
}
_BRAND_NVIDIA = 14
# Field ids newer than some drivers: the branch that added them (NVML change log).
FIELD_SINCE_BRANCH = {230: 565, 186: 535}
_FI_MEMORY_TEMP, _FI_POWER_INSTANT, _FI_RECOVERY_ACTION = 82, 186, 230
BRANCH_MEMORY_V2 = 510
BRANCH_FABRIC_V = 550
_STRINGS = {
    errors.ERROR_UNINITIALIZED: "Uninitialized",
    errors.ERROR_INVALID_ARGUMENT: "Invalid Argument",
    errors.ERROR_NOT_SUPPORTED: "Not Supported",
    errors.ERROR_NO_PERMISSION: "Insufficient Permissions",
    errors.ERROR_NOT_FOUND: "Not Found",
    errors.ERROR_TIMEOUT: "Timeout",
    errors.ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    errors.ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    errors.ERROR_GPU_IS_LOST: "GPU is lost",
    errors.ERROR_IN_USE: "In use by another client",
    errors.ERROR_INSUFFICIENT_RESOURCES: "Insufficient Resources",
}


class NVMLError(Exception):
    """pynvml's exception: `value` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _STRINGS.get(self.value, f"Unknown Error ({self.value})")


@dataclass(frozen=True)
class _Device:
    """A device handle; equal handles name the same GPU or MIG device (events compare them)."""

    key: tuple[int, int, int]
    inner: mock.MockDevice = field(compare=False, hash=False)


@dataclass(frozen=True)
class _GpuInstance:
    inner: mock.MockGpuInstance = field(compare=False)


@dataclass(frozen=True)
class _ComputeInstance:
    inner: mock.MockComputeInstance = field(compare=False)


@dataclass
class _Sample:
    inner: mock.MockGpmSample | None = None


class _MetricsGet:
    """Stands in for c_nvmlGpmMetricsGet_t (its samples are Python objects here)."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(98)]


def _pynvml() -> Any:
    return importlib.import_module("pynvml")


def _set_count(ref: Any, value: int) -> None:
    target = getattr(ref, "_obj", ref)
    target.value = value


def _fill_placements(found: list[catalog.Placement], placements: Any, count: Any) -> None:
    """NVML's array protocol: a NULL array asks for the count; a short one is refused."""
    if placements is None:
        _set_count(count, len(found))
        return
    room = int(getattr(count, "_obj", count).value)
    if room < len(found) or len(placements) < len(found):
        _set_count(count, len(found))
        raise NVMLError(errors.ERROR_INSUFFICIENT_SIZE)
    for i, pl in enumerate(found):
        placements[i].start, placements[i].size = pl.start, pl.size
    _set_count(count, len(found))


class MockPynvml:
    """The pynvml functions `RealNvml` calls, answered from `machine` like the C library."""

    NVMLError = NVMLError
    NVML_GPM_METRICS_GET_VERSION = 1
    c_nvmlGpuInstance_t = ctypes.py_object
    c_nvmlComputeInstance_t = ctypes.py_object
    c_nvmlGpmMetricsGet_t = _MetricsGet

    def __init__(self, machine: mock.MockMachine, *, privileged: bool = True) -> None:
        real = _pynvml()
        self.machine = machine
        self.nvmlLib: Any = None
        self.nvmlMemory_v2 = real.nvmlMemory_v2
        self.c_nvmlGpuInstancePlacement_t = real.c_nvmlGpuInstancePlacement_t
        self.c_nvmlComputeInstancePlacement_t = real.c_nvmlComputeInstancePlacement_t
        self.c_nvmlGpuFabricInfo_t = real.c_nvmlGpuFabricInfo_t
        self.c_nvmlGpuFabricInfoV_t = real.c_nvmlGpuFabricInfoV_t
        self._lib = machine.nvml(privileged=privileged)
        self._lib._library_loaded = True

    # ----- plumbing -------------------------------------------------------------------------

    def load_library(self, path: str) -> object:
        """ctypes.CDLL for `RealNvml(load_library=...)`: any existing file loads."""
        if not Path(path).exists():
            raise OSError(f"{path}: cannot open shared object file: No such file or directory")
        return SimpleNamespace(path=path)

    @staticmethod
    def _do(fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except errors.NvmlError as err:
            raise NVMLError(err.code) from None

    @property
    def _branch(self) -> int:
        return self.machine.driver_branch

    def _wrap(self, device: mock.MockDevice) -> _Device:
        if isinstance(device, mock.MockMigDevice):
            return _Device((device._g.index, device._gi.id, device._ci.id), device)
        return _Device((device._g.index, -1, -1), device)

    def _gpu(self, handle: _Device) -> Any:
        return handle.inner._g

    def _gi_enum(self, handle: _Device, nvml_id: int) -> int:
        """The enum behind NVML's internal GPU-instance profile id on this GPU."""
        profile = self._do(self.machine._gi_profile_by_nvml_id, self._gpu(handle), nvml_id)
        return int(profile.profile_id)

    def _ci_enum(self, gi: _GpuInstance, nvml_id: int) -> int:
        for profile in gi.inner._gi.profile.compute_profiles:
            if profile.nvml_id == nvml_id:
                return profile.profile_id
        raise NVMLError(errors.ERROR_INVALID_ARGUMENT)

    # ----- library --------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.nvmlLib is None and not self.machine.library_on_loader_path:
            raise NVMLError(errors.ERROR_LIBRARY_NOT_FOUND)
        self._do(self._lib.init)

    def nvmlShutdown(self) -> None:
        self._do(self._lib.shutdown)

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return str(self._do(self._lib.driver_version)).encode()

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return int(self._do(self._lib.cuda_driver_version))

    def nvmlSystemGetNVMLVersion(self) -> bytes:
        return str(self._do(self._lib.nvml_version)).encode()

    def nvmlDeviceGetCount(self) -> int:
        return int(self._do(self._lib.device_count))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Device:
        return self._wrap(self._do(self._lib.device_by_index, index))

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> _Device:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        return self._wrap(self._do(self._lib.device_by_uuid, text))

    # ----- identity -------------------------------------------------------------------------

    def nvmlDeviceGetIndex(self, h: _Device) -> int:
        return int(self._do(h.inner.index))

    def nvmlDeviceGetName(self, h: _Device) -> bytes:
        return str(self._do(h.inner.name)).encode()

    def nvmlDeviceGetUUID(self, h: _Device) -> bytes:
        return str(self._do(h.inner.uuid)).encode()

    def nvmlDeviceGetPciInfo(self, h: _Device) -> SimpleNamespace:
        info = self._do(h.inner.pci_info)
        return SimpleNamespace(
            busId=info.bus_id.encode(),
            pciDeviceId=info.device_id,
            pciSubSystemId=info.subsystem_id,
        )

    def nvmlDeviceGetMinorNumber(self, h: _Device) -> int:
        return int(self._do(h.inner.minor_number))

    def nvmlDeviceGetMemoryInfo(self, h: _Device, version: int | None = None) -> SimpleNamespace:
        info = self._do(h.inner.memory_info)
        if not version:
            # Version 1: the reserved memory counts as used.
            return SimpleNamespace(total=info.total, free=info.free, used=info.used + info.reserved)
        if self._branch and self._branch < BRANCH_MEMORY_V2:
            raise NVMLError(errors.ERROR_FUNCTION_NOT_FOUND)
        return SimpleNamespace(
            version=version,
            total=info.total,
            reserved=info.reserved,
            free=info.free,
            used=info.used,
        )

    def nvmlDeviceGetCudaComputeCapability(self, h: _Device) -> tuple[int, int]:
        major, minor = self._do(h.inner.cuda_compute_capability)
        return int(major), int(minor)

    def nvmlDeviceGetArchitecture(self, h: _Device) -> int:
        return _ARCHITECTURES.get(str(self._do(h.inner.architecture)), 0)

    def nvmlDeviceGetBrand(self, h: _Device) -> int:
        self._do(h.inner.brand)
        return _BRAND_NVIDIA

    # ----- MIG ------------------------------------------------------------------------------

    def nvmlDeviceIsMigDeviceHandle(self, h: _Device) -> int:
        return 1 if self._do(h.inner.is_mig_device) else 0

    def nvmlDeviceGetMigMode(self, h: _Device) -> list[int]:
        mode = self._do(h.inner.mig_mode)
        return [int(mode.current), int(mode.pending)]

    def nvmlDeviceSetMigMode(self, h: _Device, mode: int) -> list[int]:
        self._do(h.inner.set_mig_mode, bool(mode))
        return [0]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: _Device) -> int:
        return int(self._do(h.inner.max_mig_device_count))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: _Device, index: int) -> _Device:
        return self._wrap(self._do(h.inner.mig_device_by_index, index))

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h: _Device) -> _Device:
        return self._wrap(self._do(h.inner.parent))

    def nvmlDeviceGetGpuInstanceId(self, h: _Device) -> int:
        return int(self._do(h.inner.gpu_instance_id))

    def nvmlDeviceGetComputeInstanceId(self, h: _Device) -> int:
        return int(self._do(h.inner.compute_instance_id))

    def nvmlDeviceGetAttributes_v2(self, h: _Device) -> SimpleNamespace:
        a = self._do(h.inner.mig_attributes)
        return SimpleNamespace(
            multiprocessorCount=a.multiprocessor_count,
            sharedCopyEngineCount=a.shared_copy_engine_count,
            sharedDecoderCount=a.shared_decoder_count,
            sharedEncoderCount=a.shared_encoder_count,
            sharedJpegCount=a.shared_jpeg_count,
            sharedOfaCount=a.shared_ofa_count,
            gpuInstanceSliceCount=a.gpu_instance_slice_count,
            computeInstanceSliceCount=a.compute_instance_slice_count,
            memorySizeMB=a.memory_size_mb,
        )

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, h: _Device, profile: int, version: int = 2
    ) -> SimpleNamespace:
        i = self._do(h.inner.gpu_instance_profile_info, profile)
        return SimpleNamespace(
            version=version,
            id=i.id,  # NVML's internal id, not `profile`
            isP2pSupported=int(i.is_p2p_supported),
            sliceCount=i.slice_count,
            instanceCount=i.instance_count,
            multiprocessorCount=i.multiprocessor_count,
            copyEngineCount=i.copy_engine_count,
            decoderCount=i.decoder_count,
            encoderCount=i.encoder_count,
            jpegCount=i.jpeg_count,
            ofaCount=i.ofa_count,
            memorySizeMB=i.memory_size_mb,
            name=i.name.encode(),
        )

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, h: _Device, nvml_id: int, placements: Any, count: Any
    ) -> None:
        found = self._do(h.inner.gpu_instance_possible_placements, self._gi_enum(h, nvml_id))
        _fill_placements(found, placements, count)

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, h: _Device, nvml_id: int) -> int:
        return int(self._do(h.inner.gpu_instance_remaining_capacity, self._gi_enum(h, nvml_id)))

    def nvmlDeviceCreateGpuInstance(self, h: _Device, nvml_id: int) -> _GpuInstance:
        return _GpuInstance(self._do(h.inner.create_gpu_instance, self._gi_enum(h, nvml_id)))

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, h: _Device, nvml_id: int, placement: Any
    ) -> _GpuInstance:
        pl = catalog.Placement(int(placement.start), int(placement.size))
        return _GpuInstance(self._do(h.inner.create_gpu_instance, self._gi_enum(h, nvml_id), pl))

    def nvmlDeviceGetGpuInstances(self, h: _Device, nvml_id: int, arr: Any, count: Any) -> None:
        found = self._do(h.inner.gpu_instances, self._gi_enum(h, nvml_id))
        for i, gi in enumerate(found):
            arr[i] = _GpuInstance(gi)
        _set_count(count, len(found))

    def nvmlDeviceGetGpuInstanceById(self, h: _Device, gi_id: int) -> _GpuInstance:
        return _GpuInstance(self._do(h.inner.gpu_instance_by_id, gi_id))

    def nvmlGpuInstanceGetInfo(self, gi: _GpuInstance) -> SimpleNamespace:
        info = self._do(gi.inner.info)
        pl = SimpleNamespace(start=info.placement.start, size=info.placement.size)
        return SimpleNamespace(id=info.id, profileId=info.profile_id, placement=pl)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gi: _GpuInstance, profile: int, engine: int
    ) -> SimpleNamespace:
        i = self._do(gi.inner.compute_instance_profile_info, profile, engine)
        ci = gi.inner._gi.profile.compute_profile(profile)
        return SimpleNamespace(
            id=ci.nvml_id if ci is not None else i.profile_id,
            sliceCount=i.slice_count,
            instanceCount=i.instance_count,
            multiprocessorCount=i.multiprocessor_count,
        )

    def nvmlGpuInstanceGetComputeInstancePossiblePlacements(
        self, gi: _GpuInstance, nvml_id: int, placements: Any, count: Any
    ) -> None:
        found = self._do(gi.inner.compute_instance_possible_placements, self._ci_enum(gi, nvml_id))
        _fill_placements(found, placements, count)

    def nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
        self, gi: _GpuInstance, nvml_id: int
    ) -> int:
        return int(
            self._do(gi.inner.compute_instance_remaining_capacity, self._ci_enum(gi, nvml_id))
        )

    def nvmlGpuInstanceCreateComputeInstance(
        self, gi: _GpuInstance, nvml_id: int
    ) -> _ComputeInstance:
        return _ComputeInstance(
            self._do(gi.inner.create_compute_instance, self._ci_enum(gi, nvml_id))
        )

    def nvmlGpuInstanceCreateComputeInstanceWithPlacement(
        self, gi: _GpuInstance, nvml_id: int, placement: Any
    ) -> _ComputeInstance:
        pl = catalog.Placement(int(placement.start), int(placement.size))
        return _ComputeInstance(
            self._do(gi.inner.create_compute_instance, self._ci_enum(gi, nvml_id), pl)
        )

    def nvmlGpuInstanceGetComputeInstances(
        self, gi: _GpuInstance, nvml_id: int, arr: Any, count: Any
    ) -> None:
        found = self._do(gi.inner.compute_instances, self._ci_enum(gi, nvml_id))
        for i, ci in enumerate(found):
            arr[i] = _ComputeInstance(ci)
        _set_count(count, len(found))

    def nvmlGpuInstanceDestroy(self, gi: _GpuInstance) -> None:
        self._do(gi.inner.destroy)

    def nvmlComputeInstanceGetInfo(self, ci: _ComputeInstance) -> SimpleNamespace:
        info = self._do(ci.inner.info)
        pl = SimpleNamespace(start=info.placement.start, size=info.placement.size)
        return SimpleNamespace(id=info.id, profileId=info.profile_id, placement=pl)

    def nvmlComputeInstanceDestroy(self, ci: _ComputeInstance) -> None:
        self._do(ci.inner.destroy)

    # ----- telemetry ------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, h: _Device) -> SimpleNamespace:
        u = self._do(h.inner.utilization)
        return SimpleNamespace(gpu=u.gpu, memory=u.memory)

    def nvmlDeviceGetTemperature(self, h: _Device, sensor: int) -> int:
        return int(self._do(h.inner.temperature))

    def nvmlDeviceGetPowerUsage(self, h: _Device) -> int:
        return int(self._do(h.inner.power_usage))

    def nvmlDeviceGetTotalEnergyConsumption(self, h: _Device) -> int:
        return int(self._do(h.inner.total_energy_consumption))

    def nvmlDeviceGetClockInfo(self, h: _Device, clock: int) -> int:
        return int(self._do(h.inner.clock, p.ClockType(clock)))

    def nvmlDeviceGetEncoderUtilization(self, h: _Device) -> list[int]:
        return [int(self._do(h.inner.encoder_utilization)), 167000]

    def nvmlDeviceGetDecoderUtilization(self, h: _Device) -> list[int]:
        return [int(self._do(h.inner.decoder_utilization)), 167000]

    def _field(self, h: _Device, field_id: int) -> SimpleNamespace:
        since = FIELD_SINCE_BRANCH.get(field_id, 0)
        value = SimpleNamespace(uiVal=0, dVal=0.0, ulVal=0, ullVal=0, sllVal=0, siVal=0)
        out = SimpleNamespace(fieldId=field_id, nvmlReturn=0, valueType=1, value=value)
        if self._branch and self._branch < since:
            out.nvmlReturn = errors.ERROR_INVALID_ARGUMENT  # the driver does not know the id
            return out
        readers: dict[int, Callable[[], int]] = {
            _FI_MEMORY_TEMP: h.inner.memory_temperature,
            _FI_POWER_INSTANT: h.inner.power_usage_instant,
            _FI_RECOVERY_ACTION: lambda: int(h.inner.gpu_recovery_action()),
        }
        reader = readers.get(field_id)
        if reader is None:
            out.nvmlReturn = errors.ERROR_NOT_SUPPORTED
            return out
        try:
            value.uiVal = int(reader())
        except errors.NvmlError as err:
            out.nvmlReturn = err.code
        return out

    def nvmlDeviceGetFieldValues(self, h: _Device, field_ids: list[int]) -> list[SimpleNamespace]:
        return [self._field(h, int(f)) for f in field_ids]

    def nvmlDeviceGetPcieThroughput(self, h: _Device, counter: int) -> int:
        return int(self._do(h.inner.pcie_throughput, p.PcieUtilCounter(counter)))

    def nvmlDeviceGetPcieReplayCounter(self, h: _Device) -> int:
        return int(self._do(h.inner.pcie_replay_counter))

    def nvmlDeviceGetRemappedRows(self, h: _Device) -> tuple[int, int, int, int]:
        r = self._do(h.inner.remapped_rows)
        return r.correctable, r.uncorrectable, int(r.pending), int(r.failure)

    def nvmlDeviceGetTotalEccErrors(self, h: _Device, kind: int, counter: int) -> int:
        return int(
            self._do(h.inner.total_ecc_errors, p.EccErrorType(kind), p.EccCounterType(counter))
        )

    def nvmlDeviceGetSupportedEventTypes(self, h: _Device) -> int:
        return int(self._do(h.inner.supported_event_types))

    def nvmlDeviceGetComputeRunningProcesses(self, h: _Device) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(
                pid=x.pid,
                usedGpuMemory=x.used_gpu_memory,
                gpuInstanceId=_NO_ID if x.gpu_instance_id is None else x.gpu_instance_id,
                computeInstanceId=_NO_ID
                if x.compute_instance_id is None
                else x.compute_instance_id,
            )
            for x in self._do(h.inner.running_processes)
        ]

    # ----- interconnect ---------------------------------------------------------------------

    def nvmlDeviceGetNvLinkState(self, h: _Device, link: int) -> int:
        return int(self._do(h.inner.nvlink_state, link))

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: _Device, link: int) -> SimpleNamespace:
        return SimpleNamespace(busId=str(self._do(h.inner.nvlink_remote_pci_bus_id, link)).encode())

    def nvmlDeviceGetTopologyCommonAncestor(self, a: _Device, b: _Device) -> int:
        return int(self._do(a.inner.topology_common_ancestor, b.inner))

    @staticmethod
    def _mask(ids: tuple[int, ...], words: int) -> list[int]:
        """An affinity bitmask of `words` 64-bit words (ids beyond them do not fit, as in C)."""
        mask = [0] * words
        for i in ids:
            if i < 64 * words:
                mask[i // 64] |= 1 << (i % 64)
        return mask

    def nvmlDeviceGetCpuAffinity(self, h: _Device, size: int) -> list[int]:
        return self._mask(self._do(h.inner.cpu_affinity), size)

    def nvmlDeviceGetMemoryAffinity(self, h: _Device, size: int, scope: int) -> list[int]:
        if scope not in (0, 1):  # NVML_AFFINITY_SCOPE_NODE, _SOCKET (one node per socket here)
            raise NVMLError(errors.ERROR_INVALID_ARGUMENT)
        return self._mask(self._do(h.inner.memory_affinity), size)

    def _fill_fabric(self, h: _Device, ref: Any) -> None:
        info = self._do(h.inner.fabric_info)
        target = getattr(ref, "_obj", ref)
        raw = bytes.fromhex(info.cluster_uuid.replace("-", ""))
        ctypes.memmove(target.clusterUuid, raw, len(raw))
        target.cliqueId = info.clique_id
        target.state = info.state
        target.status = info.status
        # Only the versioned struct (nvmlGpuFabricInfo_v2 and later) carries the health bits.
        if any(name == "healthMask" for name, *_ in type(target)._fields_):
            target.healthMask = info.health_mask

    def nvmlDeviceGetGpuFabricInfo(self, h: _Device, ref: Any) -> int:
        self._fill_fabric(h, ref)
        return 0

    def nvmlDeviceGetGpuFabricInfoV(self, h: _Device, ref: Any) -> int:
        if self._branch and self._branch < BRANCH_FABRIC_V:
            raise NVMLError(errors.ERROR_FUNCTION_NOT_FOUND)
        self._fill_fabric(h, ref)
        return 0

    # ----- events ---------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> mock.MockEventSet:
        return self._do(self._lib.event_set)  # type: ignore[no-any-return]

    def nvmlDeviceRegisterEvents(self, h: _Device, types: int, event_set: Any) -> None:
        self._do(event_set.register, h.inner, p.EventType(types))

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> SimpleNamespace:
        event = self._do(event_set.wait, timeout_ms)
        machine = self.machine
        g = next(g for g in machine.gpus if g.uuid == event.device_uuid)
        # The handle NVML puts in the event: a GPU that fell off the bus no longer answers it.
        handle = _Device((g.index, -1, -1), mock.MockDevice(self._lib, g))
        return SimpleNamespace(
            device=handle,
            eventType=int(event.event_type),
            eventData=event.event_data,
            gpuInstanceId=_NO_ID if event.gpu_instance_id is None else event.gpu_instance_id,
            computeInstanceId=(
                _NO_ID if event.compute_instance_id is None else event.compute_instance_id
            ),
        )

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._do(event_set.free)

    # ----- GPU performance monitoring -------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, h: _Device) -> SimpleNamespace:
        try:
            sample = h.inner.gpm_sample()
        except errors.NotSupported:
            return SimpleNamespace(version=1, isSupportedDevice=0)
        except errors.NvmlError as err:
            raise NVMLError(err.code) from None
        sample.free()
        return SimpleNamespace(version=1, isSupportedDevice=1)

    def nvmlGpmSampleAlloc(self) -> _Sample:
        return _Sample()

    def nvmlGpmSampleFree(self, sample: _Sample) -> None:
        if sample.inner is not None:
            sample.inner.free()

    def nvmlGpmSampleGet(self, h: _Device, sample: _Sample) -> _Sample:
        sample.inner = self._do(h.inner.gpm_sample)
        return sample

    def nvmlGpmMigSampleGet(self, h: _Device, gpu_instance_id: int, sample: _Sample) -> _Sample:
        sample.inner = self._do(h.inner.gpm_sample, gpu_instance_id)
        return sample

    def nvmlGpmMetricsGet(self, query: _MetricsGet) -> _MetricsGet:
        first, second = query.sample1, query.sample2
        if first is None or second is None or first.inner is None or second.inner is None:
            raise NVMLError(errors.ERROR_INVALID_ARGUMENT)
        wanted = [p.GpmMetric(query.metrics[i].metricId) for i in range(query.numMetrics)]
        values = self._do(self._lib.gpm_metrics, first.inner, second.inner, wanted)
        for i, metric in enumerate(wanted):
            query.metrics[i].value = values.get(metric, 0.0)
            query.metrics[i].nvmlReturn = 0 if metric in values else errors.ERROR_NOT_SUPPORTED
        return query
