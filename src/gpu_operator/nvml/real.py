"""The real backend: the `Nvml` Protocol on nvidia-ml-py (`pynvml`), NVML errors mapped to ours.

pynvml is imported when a `RealNvml` is built, so importing this module never needs the driver.
docs/gpu-layer.md ("What real NVML does") lists the NVML behaviours this module accounts for.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from gpu_operator.nvml import errors, library, pciaddr
from gpu_operator.nvml import protocol as p
from gpu_operator.nvml.catalog import Placement

log = logging.getLogger("gpu_operator.nvml")

_ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}
_BRANDS = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}
_NO_ID = 0xFFFFFFFF
_FI_MEMORY_TEMP = 82  # NVML_FI_DEV_MEMORY_TEMP: HBM boards only; others answer NotSupported
_FI_POWER_INSTANT = 186  # NVML_FI_DEV_POWER_INSTANT (R535+), milliwatts
# nvmlValueType_t -> the member of the nvmlValue_t union that holds it.
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}
_FI_GPU_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (R565+)
# What a field id the driver does not know yet comes back as, per field: drivers older than the
# field answer with one of these rather than NOT_SUPPORTED, and all of them mean "not here".
_FIELD_ABSENT = frozenset(
    {errors.ERROR_NOT_SUPPORTED, errors.ERROR_INVALID_ARGUMENT, errors.ERROR_FUNCTION_NOT_FOUND}
)
# A versioned call the driver predates (the library has the symbol or the version, not both).
_ARGUMENT_VERSION_MISMATCH = 25
# Affinity masks: 64-bit words, one bit per logical CPU (room for 4096) or NUMA node (64).
_CPU_SET_WORDS = 64
_NODE_SET_WORDS = 1
_AFFINITY_SCOPE_NODE = 0  # NVML_AFFINITY_SCOPE_NODE
_CALL_ABSENT = frozenset({errors.ERROR_FUNCTION_NOT_FOUND, _ARGUMENT_VERSION_MISMATCH})


def _bits(words: Any) -> tuple[int, ...]:
    """The set bits of an NVML affinity mask (64-bit words, lowest first) as sorted ids."""
    return tuple(
        64 * w + bit for w, word in enumerate(words) for bit in range(64) if int(word) >> bit & 1
    )


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class _Calls:
    """Runs pynvml functions and translates their exceptions into our hierarchy."""

    def __init__(self, lib: ModuleType) -> None:
        self.lib = lib

    def __call__(self, name: str, *args: Any) -> Any:
        fn: Callable[..., Any] = getattr(self.lib, name)
        try:
            return fn(*args)
        except self.lib.NVMLError as err:
            code = int(getattr(err, "value", errors.ERROR_UNKNOWN))
            cls = errors.class_for_code(code)
            # Keep our actionable hint for the codes that have one; add NVML's own text.
            detail = f"{name}: {err}"
            if code == errors.ERROR_NO_PERMISSION:
                detail += f"; this process runs as uid {os.geteuid()}"
            message = f"{cls.hint} ({detail})" if cls.hint else detail
            raise errors.from_code(code, message) from None


def _load_pynvml() -> ModuleType:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise errors.LibraryNotFound(
            "NVML library not found: is the NVIDIA driver installed on this node? "
            "(the nvidia-ml-py package is missing)"
        ) from None


def _placements(call: _Calls, name: str, handle: Any, nvml_id: int, kind: Any) -> list[Placement]:
    """A profile's possible placements, asked for twice as NVML documents: the count first
    (a NULL array), then into an array of that size. A profile can have more placements than
    instances (1g+me: one instance, seven places), so the instance count is no bound."""
    count = ctypes.c_uint(0)
    call(name, handle, nvml_id, None, ctypes.byref(count))
    arr = (kind * max(1, count.value))()
    count = ctypes.c_uint(len(arr))
    call(name, handle, nvml_id, arr, ctypes.byref(count))
    return [Placement(arr[i].start, arr[i].size) for i in range(count.value)]


class RealComputeInstance:
    def __init__(self, call: _Calls, handle: Any, gi_id: int) -> None:
        self._call = call
        self._h = handle
        self._gi_id = gi_id

    def info(self) -> p.ComputeInstanceInfo:
        info = self._call("nvmlComputeInstanceGetInfo", self._h)
        pl = Placement(info.placement.start, info.placement.size)
        return p.ComputeInstanceInfo(info.id, info.profileId, pl, self._gi_id)

    def destroy(self) -> None:
        self._call("nvmlComputeInstanceDestroy", self._h)


class RealGpuInstance:
    def __init__(self, call: _Calls, handle: Any) -> None:
        self._call = call
        self._h = handle

    def info(self) -> p.GpuInstanceInfo:
        info = self._call("nvmlGpuInstanceGetInfo", self._h)
        return p.GpuInstanceInfo(
            info.id, info.profileId, Placement(info.placement.start, info.placement.size)
        )

    def compute_instance_profile_info(
        self, profile_id: int, engine_profile: int = 0
    ) -> p.ComputeInstanceProfileInfo:
        info = self._call(
            "nvmlGpuInstanceGetComputeInstanceProfileInfo", self._h, profile_id, engine_profile
        )
        return p.ComputeInstanceProfileInfo(
            info.id, info.sliceCount, info.instanceCount, info.multiprocessorCount
        )

    def compute_instance_possible_placements(self, profile_id: int) -> list[Placement]:
        info = self.compute_instance_profile_info(profile_id)
        return _placements(
            self._call,
            "nvmlGpuInstanceGetComputeInstancePossiblePlacements",
            self._h,
            info.profile_id,  # NVML's internal id, as the profile info reports it
            self._call.lib.c_nvmlComputeInstancePlacement_t,
        )

    def compute_instance_remaining_capacity(self, profile_id: int) -> int:
        info = self._call("nvmlGpuInstanceGetComputeInstanceProfileInfo", self._h, profile_id, 0)
        return int(
            self._call("nvmlGpuInstanceGetComputeInstanceRemainingCapacity", self._h, info.id)
        )

    def create_compute_instance(
        self, profile_id: int, placement: Placement | None = None
    ) -> RealComputeInstance:
        info = self._call("nvmlGpuInstanceGetComputeInstanceProfileInfo", self._h, profile_id, 0)
        gi_id = self.info().id
        if placement is None:
            h = self._call("nvmlGpuInstanceCreateComputeInstance", self._h, info.id)
        else:
            pl = self._call.lib.c_nvmlComputeInstancePlacement_t()
            pl.start, pl.size = placement.start, placement.size
            h = self._call(
                "nvmlGpuInstanceCreateComputeInstanceWithPlacement", self._h, info.id, pl
            )
        return RealComputeInstance(self._call, h, gi_id)

    def compute_instances(self, profile_id: int) -> list[p.ComputeInstance]:
        lib = self._call.lib
        info = self._call("nvmlGpuInstanceGetComputeInstanceProfileInfo", self._h, profile_id, 0)
        arr = (lib.c_nvmlComputeInstance_t * max(1, info.instanceCount))()
        count = ctypes.c_uint(0)
        self._call("nvmlGpuInstanceGetComputeInstances", self._h, info.id, arr, ctypes.byref(count))
        gi_id = self.info().id
        return [RealComputeInstance(self._call, arr[i], gi_id) for i in range(count.value)]

    def destroy(self) -> None:
        self._call("nvmlGpuInstanceDestroy", self._h)


class RealDevice:
    """A pynvml device handle (full GPU or MIG device)."""

    def __init__(self, call: _Calls, handle: Any) -> None:
        self._call = call
        self._h = handle

    def index(self) -> int:
        return int(self._call("nvmlDeviceGetIndex", self._h))

    def name(self) -> str:
        return _text(self._call("nvmlDeviceGetName", self._h))

    def uuid(self) -> str:
        return _text(self._call("nvmlDeviceGetUUID", self._h))

    def pci_info(self) -> p.PciInfo:
        info = self._call("nvmlDeviceGetPciInfo", self._h)
        return p.PciInfo(_text(info.busId), int(info.pciDeviceId), int(info.pciSubSystemId))

    def pci_class(self) -> int:
        # NVML does not report the PCI class; sysfs does (e.g. 0x030200 for a 3D controller).
        bus = pciaddr.sysfs_name(self.pci_info().bus_id)
        try:
            return int(Path(f"/sys/bus/pci/devices/{bus}/class").read_text(), 16) >> 8
        except (OSError, ValueError) as err:
            raise errors.NotSupported(f"cannot read the PCI class of {bus}: {err}") from None

    def minor_number(self) -> int:
        return int(self._call("nvmlDeviceGetMinorNumber", self._h))

    def memory_info(self) -> p.MemoryInfo:
        # Version 1 counts the driver's reserved memory as used; version 2 (R510+) reports it
        # apart, as DCGM exports it. Allocated memory is what neither free nor reserved holds,
        # whichever way a driver splits `used` (the v2 docs changed their note on it).
        version = getattr(self._call.lib, "nvmlMemory_v2", None)
        if version is not None:
            try:
                info = self._call("nvmlDeviceGetMemoryInfo", self._h, version)
            except errors.NvmlError as err:
                if err.code not in _CALL_ABSENT:
                    raise
            else:
                total, free, reserved = int(info.total), int(info.free), int(info.reserved)
                return p.MemoryInfo(total, free, max(0, total - free - reserved), reserved)
        info = self._call("nvmlDeviceGetMemoryInfo", self._h)
        return p.MemoryInfo(int(info.total), int(info.free), int(info.used))

    def cuda_compute_capability(self) -> tuple[int, int]:
        major, minor = self._call("nvmlDeviceGetCudaComputeCapability", self._h)
        return int(major), int(minor)

    def architecture(self) -> str:
        arch = int(self._call("nvmlDeviceGetArchitecture", self._h))
        return _ARCHITECTURES.get(arch, "Unknown")

    def brand(self) -> str:
        return _BRANDS.get(int(self._call("nvmlDeviceGetBrand", self._h)), "Unknown")

    def is_mig_device(self) -> bool:
        return bool(self._call("nvmlDeviceIsMigDeviceHandle", self._h))

    def mig_mode(self) -> p.MigMode:
        current, pending = self._call("nvmlDeviceGetMigMode", self._h)
        return p.MigMode(bool(current), bool(pending))

    def set_mig_mode(self, enabled: bool) -> None:
        self._call("nvmlDeviceSetMigMode", self._h, 1 if enabled else 0)

    def max_mig_device_count(self) -> int:
        return int(self._call("nvmlDeviceGetMaxMigDeviceCount", self._h))

    def mig_device_by_index(self, index: int) -> RealDevice:
        return RealDevice(
            self._call, self._call("nvmlDeviceGetMigDeviceHandleByIndex", self._h, index)
        )

    def parent(self) -> RealDevice:
        h = self._call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", self._h)
        return RealDevice(self._call, h)

    def gpu_instance_id(self) -> int:
        return int(self._call("nvmlDeviceGetGpuInstanceId", self._h))

    def compute_instance_id(self) -> int:
        return int(self._call("nvmlDeviceGetComputeInstanceId", self._h))

    def mig_attributes(self) -> p.MigDeviceAttributes:
        a = self._call("nvmlDeviceGetAttributes_v2", self._h)
        return p.MigDeviceAttributes(
            multiprocessor_count=a.multiprocessorCount,
            shared_copy_engine_count=a.sharedCopyEngineCount,
            shared_decoder_count=a.sharedDecoderCount,
            shared_encoder_count=a.sharedEncoderCount,
            shared_jpeg_count=a.sharedJpegCount,
            shared_ofa_count=a.sharedOfaCount,
            gpu_instance_slice_count=a.gpuInstanceSliceCount,
            compute_instance_slice_count=a.computeInstanceSliceCount,
            memory_size_mb=int(a.memorySizeMB),
        )

    def gpu_instance_profile_info(self, profile_id: int) -> p.GpuInstanceProfileInfo:
        i = self._call("nvmlDeviceGetGpuInstanceProfileInfo", self._h, profile_id)
        return p.GpuInstanceProfileInfo(
            id=int(i.id),
            profile_id=profile_id,
            name=_text(i.name),
            slice_count=i.sliceCount,
            instance_count=i.instanceCount,
            multiprocessor_count=i.multiprocessorCount,
            memory_size_mb=int(i.memorySizeMB),
            copy_engine_count=i.copyEngineCount,
            decoder_count=i.decoderCount,
            encoder_count=i.encoderCount,
            jpeg_count=i.jpegCount,
            ofa_count=i.ofaCount,
            is_p2p_supported=bool(i.isP2pSupported),
        )

    def _gi_profile_id(self, profile_id: int) -> tuple[int, int]:
        # NVML addresses instances by the profile's internal id, not the enum value.
        info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", self._h, profile_id)
        return int(info.id), int(info.instanceCount)

    def gpu_instance_possible_placements(self, profile_id: int) -> list[Placement]:
        pid, _ = self._gi_profile_id(profile_id)
        return _placements(
            self._call,
            "nvmlDeviceGetGpuInstancePossiblePlacements",
            self._h,
            pid,
            self._call.lib.c_nvmlGpuInstancePlacement_t,
        )

    def gpu_instance_remaining_capacity(self, profile_id: int) -> int:
        pid, _ = self._gi_profile_id(profile_id)
        return int(self._call("nvmlDeviceGetGpuInstanceRemainingCapacity", self._h, pid))

    def create_gpu_instance(
        self, profile_id: int, placement: Placement | None = None
    ) -> RealGpuInstance:
        pid, _ = self._gi_profile_id(profile_id)
        if placement is None:
            return RealGpuInstance(
                self._call, self._call("nvmlDeviceCreateGpuInstance", self._h, pid)
            )
        pl = self._call.lib.c_nvmlGpuInstancePlacement_t()
        pl.start, pl.size = placement.start, placement.size
        h = self._call("nvmlDeviceCreateGpuInstanceWithPlacement", self._h, pid, pl)
        return RealGpuInstance(self._call, h)

    def gpu_instances(self, profile_id: int) -> list[p.GpuInstance]:
        lib = self._call.lib
        pid, n = self._gi_profile_id(profile_id)
        arr = (lib.c_nvmlGpuInstance_t * max(1, n))()
        count = ctypes.c_uint(0)
        self._call("nvmlDeviceGetGpuInstances", self._h, pid, arr, ctypes.byref(count))
        return [RealGpuInstance(self._call, arr[i]) for i in range(count.value)]

    def gpu_instance_by_id(self, gpu_instance_id: int) -> RealGpuInstance:
        h = self._call("nvmlDeviceGetGpuInstanceById", self._h, gpu_instance_id)
        return RealGpuInstance(self._call, h)

    def utilization(self) -> p.Utilization:
        u = self._call("nvmlDeviceGetUtilizationRates", self._h)
        return p.Utilization(int(u.gpu), int(u.memory))

    def temperature(self) -> int:
        return int(self._call("nvmlDeviceGetTemperature", self._h, 0))

    def power_usage(self) -> int:
        return int(self._call("nvmlDeviceGetPowerUsage", self._h))

    def power_usage_instant(self) -> int:
        # nvmlDeviceGetPowerUsage averages over a second on Ampere and later; the field is the
        # instantaneous reading DCGM_FI_DEV_POWER_USAGE_INSTANT carries.
        return int(self._field_value(_FI_POWER_INSTANT, "instantaneous power"))

    def total_energy_consumption(self) -> int:
        return int(self._call("nvmlDeviceGetTotalEnergyConsumption", self._h))

    def clock(self, clock_type: p.ClockType) -> int:
        return int(self._call("nvmlDeviceGetClockInfo", self._h, int(clock_type)))

    def encoder_utilization(self) -> int:
        return int(self._call("nvmlDeviceGetEncoderUtilization", self._h)[0])

    def decoder_utilization(self) -> int:
        return int(self._call("nvmlDeviceGetDecoderUtilization", self._h)[0])

    def memory_temperature(self) -> int:
        return int(self._field_value(_FI_MEMORY_TEMP, "memory temperature"))

    def pcie_throughput(self, counter: p.PcieUtilCounter) -> int:
        return int(self._call("nvmlDeviceGetPcieThroughput", self._h, int(counter)))

    def pcie_replay_counter(self) -> int:
        return int(self._call("nvmlDeviceGetPcieReplayCounter", self._h))

    def remapped_rows(self) -> p.RemappedRows:
        corr, unc, pending, failure = self._call("nvmlDeviceGetRemappedRows", self._h)
        return p.RemappedRows(int(corr), int(unc), bool(pending), bool(failure))

    def _field_value(self, field_id: int, what: str) -> float | int:
        value = self._call("nvmlDeviceGetFieldValues", self._h, [field_id])[0]
        code = int(value.nvmlReturn)
        if code in _FIELD_ABSENT:
            raise errors.NotSupported(
                f"nvmlDeviceGetFieldValues: {what} (field {field_id}) is not available from "
                f"this GPU or driver (NVML code {code})"
            )
        if code != errors.SUCCESS:
            raise errors.from_code(code, f"nvmlDeviceGetFieldValues: {what} (field {field_id})")
        member = _VALUE_MEMBERS.get(int(getattr(value, "valueType", 1)), "uiVal")
        number: float | int = getattr(value.value, member)
        return number

    def total_ecc_errors(self, error_type: p.EccErrorType, counter_type: p.EccCounterType) -> int:
        return int(
            self._call("nvmlDeviceGetTotalEccErrors", self._h, int(error_type), int(counter_type))
        )

    def supported_event_types(self) -> p.EventType:
        return p.EventType(int(self._call("nvmlDeviceGetSupportedEventTypes", self._h)) & 0x1F)

    def gpu_recovery_action(self) -> p.RecoveryAction:
        action = int(self._field_value(_FI_GPU_RECOVERY_ACTION, "GPU recovery action"))
        try:
            return p.RecoveryAction(action)
        except ValueError:
            # A newer driver's action we do not know yet: treat it as "needs a reset".
            return p.RecoveryAction.GPU_RESET

    def running_processes(self) -> list[p.ProcessInfo]:
        out = []
        for proc in self._call("nvmlDeviceGetComputeRunningProcesses", self._h):
            gi = getattr(proc, "gpuInstanceId", _NO_ID)
            ci = getattr(proc, "computeInstanceId", _NO_ID)
            out.append(
                p.ProcessInfo(
                    int(proc.pid),
                    int(proc.usedGpuMemory or 0),
                    None if gi == _NO_ID else int(gi),
                    None if ci == _NO_ID else int(ci),
                )
            )
        return out

    def gpm_sample(self, gpu_instance_id: int | None = None) -> RealGpmSample:
        support = self._call("nvmlGpmQueryDeviceSupport", self._h)
        if not int(support.isSupportedDevice):
            raise errors.NotSupported("this GPU has no GPU performance monitoring (Hopper+)")
        handle = self._call("nvmlGpmSampleAlloc")
        try:
            if gpu_instance_id is None:
                self._call("nvmlGpmSampleGet", self._h, handle)
            else:
                self._call("nvmlGpmMigSampleGet", self._h, gpu_instance_id, handle)
        except errors.NvmlError:
            self._call("nvmlGpmSampleFree", handle)
            raise
        return RealGpmSample(self._call, handle)

    def nvlink_state(self, link: int) -> bool:
        return bool(self._call("nvmlDeviceGetNvLinkState", self._h, link))

    def nvlink_remote_pci_bus_id(self, link: int) -> str:
        info = self._call("nvmlDeviceGetNvLinkRemotePciInfo", self._h, link)
        return _text(info.busId)

    def topology_common_ancestor(self, other: p.Device) -> p.TopologyLevel:
        if not isinstance(other, RealDevice):
            raise errors.InvalidArgument("device handle belongs to another backend")
        level = int(self._call("nvmlDeviceGetTopologyCommonAncestor", self._h, other._h))
        return p.TopologyLevel(level)

    def cpu_affinity(self) -> tuple[int, ...]:
        return _bits(self._call("nvmlDeviceGetCpuAffinity", self._h, _CPU_SET_WORDS))

    def memory_affinity(self) -> tuple[int, ...]:
        words = self._call(
            "nvmlDeviceGetMemoryAffinity", self._h, _NODE_SET_WORDS, _AFFINITY_SCOPE_NODE
        )
        return _bits(words)

    def fabric_info(self) -> p.FabricInfo:
        # The versioned call (R550+) replaces the plain one, which pynvml marks deprecated.
        lib = self._call.lib
        info: Any = None
        health = 0
        if hasattr(lib, "c_nvmlGpuFabricInfoV_t"):
            info = lib.c_nvmlGpuFabricInfoV_t()
            try:
                self._call("nvmlDeviceGetGpuFabricInfoV", self._h, ctypes.byref(info))
            except errors.NvmlError as err:
                if err.code not in _CALL_ABSENT:
                    raise
                info = None
            else:
                # nvmlGpuFabricInfo_v2 adds the health bits (degraded bandwidth, route recovery,
                # misconfiguration...); the plain struct has none.
                health = int(getattr(info, "healthMask", 0))
        if info is None:
            info = lib.c_nvmlGpuFabricInfo_t()
            self._call("nvmlDeviceGetGpuFabricInfo", self._h, ctypes.byref(info))
        text = bytes(info.clusterUuid).hex()
        cluster = f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:32]}"
        return p.FabricInfo(cluster, int(info.cliqueId), int(info.state), int(info.status), health)


class RealGpmSample:
    """An nvmlGpmSample_t; `free` returns it to NVML (idempotent)."""

    def __init__(self, call: _Calls, handle: Any) -> None:
        self._call = call
        self.handle = handle
        self._freed = False

    def free(self) -> None:
        if not self._freed:
            self._freed = True
            self._call("nvmlGpmSampleFree", self.handle)


def _handle_key(handle: Any) -> Any:
    """A stable key for a device handle: the address behind a ctypes pointer."""
    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value
    return handle


class RealEventSet:
    def __init__(self, call: _Calls, handle: Any) -> None:
        self._call = call
        self._h = handle
        # UUID by device handle, learnt at registration: an event from a GPU that has since
        # fallen off the bus must still name it, and the GPU no longer answers by then.
        self._uuids: dict[Any, str] = {}

    def register(self, device: p.Device, event_types: p.EventType) -> None:
        if not isinstance(device, RealDevice):
            raise errors.InvalidArgument("device handle belongs to another backend")
        uuid = device.uuid()
        self._call("nvmlDeviceRegisterEvents", device._h, int(event_types), self._h)
        self._uuids[_handle_key(device._h)] = uuid

    def _uuid_of(self, handle: Any) -> str:
        known = self._uuids.get(_handle_key(handle))
        if known is not None:
            return known
        try:
            return _text(self._call("nvmlDeviceGetUUID", handle))
        except errors.NvmlError as err:
            log.warning("event from a GPU that does not answer (%s)", err)
            return ""

    def wait(self, timeout_ms: int) -> p.EventData:
        data = self._call("nvmlEventSetWait_v2", self._h, timeout_ms)
        uuid = self._uuid_of(data.device)
        gi = int(data.gpuInstanceId)
        ci = int(data.computeInstanceId)
        return p.EventData(
            uuid,
            p.EventType(int(data.eventType) & 0x1F),
            int(data.eventData),
            None if gi == _NO_ID else gi,
            None if ci == _NO_ID else ci,
        )

    def free(self) -> None:
        self._call("nvmlEventSetFree", self._h)


class RealNvml:
    """NVML on this node, through nvidia-ml-py.

    `driver_root` (one or several) is where the driver lives as this container sees it; the
    library is loaded from there first, as NVIDIA's components load it, then from the loader
    path, then from the usual mount points of a driver root (`nvml.library`). `module` and
    `load_library` replace pynvml and ctypes.CDLL (tests run this class on a simulated NVML).
    """

    def __init__(
        self,
        driver_root: str | Path | Sequence[str | Path] | None = None,
        *,
        module: ModuleType | Any | None = None,
        load_library: Callable[[str], Any] | None = None,
    ) -> None:
        self._call = _Calls(module if module is not None else _load_pynvml())
        if driver_root is None:
            roots: list[str | Path] = []
        elif isinstance(driver_root, (str, Path)):
            roots = [driver_root]
        else:
            roots = list(driver_root)
        self.driver_roots = roots
        self._load_library = load_library or ctypes.CDLL

    def _bind(self, roots: Sequence[str | Path]) -> bool:
        """Load the library from the first root that has it; False when none has."""
        path = library.find(roots)
        if path is None:
            return False
        try:
            # pynvml loads the library only while `nvmlLib` is unset; set, init uses ours.
            setattr(self._call.lib, "nvmlLib", self._load_library(str(path)))  # noqa: B010
        except OSError as err:
            raise errors.LibraryNotFound(
                f"{errors.LibraryNotFound.hint} ({path} cannot be loaded: {err})"
            ) from None
        log.info("loaded %s", path)
        return True

    def init(self) -> None:
        lib = self._call.lib
        if getattr(lib, "nvmlLib", None) is None and self.driver_roots:
            self._bind(self.driver_roots)
        try:
            self._call("nvmlInit")
            return
        except errors.LibraryNotFound:
            fallback = [r for r in library.WELL_KNOWN_ROOTS if r not in self.driver_roots]
            if getattr(lib, "nvmlLib", None) is not None or not self._bind(fallback):
                searched = library.describe([*self.driver_roots, *fallback])
                raise errors.LibraryNotFound(
                    f"{errors.LibraryNotFound.hint} ({library.NVML_LIBRARY} is not on the "
                    f"loader path nor in {searched}: mount the driver root into the pod, or "
                    "run it with the NVIDIA runtime and NVIDIA_VISIBLE_DEVICES set)"
                ) from None
        self._call("nvmlInit")

    def shutdown(self) -> None:
        self._call("nvmlShutdown")

    def driver_version(self) -> str:
        return _text(self._call("nvmlSystemGetDriverVersion"))

    def cuda_driver_version(self) -> int:
        return int(self._call("nvmlSystemGetCudaDriverVersion"))

    def nvml_version(self) -> str:
        return _text(self._call("nvmlSystemGetNVMLVersion"))

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def device_by_index(self, index: int) -> RealDevice:
        return RealDevice(self._call, self._call("nvmlDeviceGetHandleByIndex", index))

    def device_by_uuid(self, uuid: str) -> RealDevice:
        return RealDevice(self._call, self._call("nvmlDeviceGetHandleByUUID", uuid))

    def event_set(self) -> RealEventSet:
        return RealEventSet(self._call, self._call("nvmlEventSetCreate"))

    def gpm_metrics(
        self, first: p.GpmSample, second: p.GpmSample, metrics: Sequence[p.GpmMetric]
    ) -> dict[p.GpmMetric, float]:
        if not isinstance(first, RealGpmSample) or not isinstance(second, RealGpmSample):
            raise errors.InvalidArgument("GPM samples belong to another backend")
        lib = self._call.lib
        query = lib.c_nvmlGpmMetricsGet_t()
        query.version = lib.NVML_GPM_METRICS_GET_VERSION
        query.numMetrics = len(metrics)
        query.sample1 = first.handle
        query.sample2 = second.handle
        for i, metric in enumerate(metrics):
            query.metrics[i].metricId = int(metric)
        self._call("nvmlGpmMetricsGet", query)
        out: dict[p.GpmMetric, float] = {}
        for i, metric in enumerate(metrics):
            if int(query.metrics[i].nvmlReturn) == errors.SUCCESS:
                out[metric] = float(query.metrics[i].value)
        return out


def opener(driver_root: str | Path | Sequence[str | Path] | None = None) -> Callable[[], RealNvml]:
    """A factory of RealNvml handles that load the library from `driver_root` first."""
    return lambda: RealNvml(driver_root)
