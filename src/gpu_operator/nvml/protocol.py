"""What node agents need from NVML, as Protocols and plain records; both backends implement it.

Method names follow nvidia-ml-py (`nvmlDeviceGetMigMode` -> `Device.mig_mode`) so a reader of the
NVML docs finds the call, and errors are always our `gpu_operator.nvml.errors` types.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gpu_operator.nvml.catalog import Placement

__all__ = [
    "ClockType",
    "ComputeInstance",
    "ComputeInstanceInfo",
    "ComputeInstanceProfileInfo",
    "Device",
    "EccCounterType",
    "EccErrorType",
    "EventData",
    "EventSet",
    "EventType",
    "FabricHealth",
    "FabricInfo",
    "GpmMetric",
    "GpmSample",
    "GpuInstance",
    "GpuInstanceInfo",
    "GpuInstanceProfileInfo",
    "MemoryInfo",
    "MigDeviceAttributes",
    "MigMode",
    "Nvml",
    "PciInfo",
    "PcieUtilCounter",
    "Placement",
    "ProcessInfo",
    "RecoveryAction",
    "RemappedRows",
    "TopologyLevel",
    "Utilization",
]


class EventType(enum.IntFlag):
    """NVML event type bits (nvmlEventType*)."""

    SINGLE_BIT_ECC = 0x1
    DOUBLE_BIT_ECC = 0x2
    PSTATE = 0x4
    XID_CRITICAL = 0x8
    CLOCK = 0x10


class ClockType(enum.IntEnum):
    GRAPHICS = 0
    SM = 1
    MEM = 2
    VIDEO = 3


class EccErrorType(enum.IntEnum):
    CORRECTED = 0
    UNCORRECTED = 1


class EccCounterType(enum.IntEnum):
    VOLATILE = 0
    AGGREGATE = 1


class RecoveryAction(enum.IntEnum):
    """What the driver says a GPU needs after a fault (nvmlGpuRecoveryAction_t, field 230)."""

    NONE = 0
    GPU_RESET = 1
    NODE_REBOOT = 2
    DRAIN_P2P = 3
    DRAIN_AND_RESET = 4
    RECOVER_IMEX_DOMAIN = 5
    BUS_RESET = 6
    SYSTEM_REBOOT = 7


class GpmMetric(enum.IntEnum):
    """GPU performance-monitoring metrics (nvmlGpmMetricId_t), percent 0..100 over an interval."""

    GRAPHICS_UTIL = 1  # any compute/graphics work active: DCGM's GR_ENGINE_ACTIVE x 100
    SM_UTIL = 2
    SM_OCCUPANCY = 3
    ANY_TENSOR_UTIL = 5
    DRAM_BW_UTIL = 10
    FP64_UTIL = 11
    FP32_UTIL = 12
    FP16_UTIL = 13


# nvmlGpuFabricState_t: the fabric manager's registration of a GPU.
FABRIC_STATE_NOT_SUPPORTED = 0
FABRIC_STATE_NOT_STARTED = 1
FABRIC_STATE_IN_PROGRESS = 2
FABRIC_STATE_COMPLETED = 3


class FabricHealth(enum.IntEnum):
    """The conditions packed into nvmlGpuFabricInfo_v2's `healthMask` (NVML_GPU_FABRIC_HEALTH_
    MASK_*), each by its bit shift. Every condition is two bits wide (0 not supported, 1 true,
    2 false) except the misconfiguration, which is four bits holding which one (1 none)."""

    DEGRADED_BANDWIDTH = 0
    ROUTE_RECOVERY = 2
    ROUTE_UNHEALTHY = 4
    ACCESS_TIMEOUT_RECOVERY = 6
    INCORRECT_CONFIGURATION = 8


FABRIC_HEALTH_TRUE = 1
FABRIC_HEALTH_FALSE = 2
# The misconfigurations NVML names (NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_*).
FABRIC_MISCONFIGURATIONS = {
    1: "None",
    2: "Incorrect SysGUID",
    3: "Incorrect Chassis Serial Number",
    4: "No Partition",
    5: "Insufficient NVLinks",
    6: "Incompatible GPU Firmware",
    7: "Invalid Location",
    8: "GPU State Invalid",
}


def fabric_health_mask(
    *,
    degraded_bandwidth: bool = False,
    route_recovery: bool = False,
    route_unhealthy: bool = False,
    access_timeout_recovery: bool = False,
    incorrect_configuration: int = 1,
) -> int:
    """The `healthMask` a driver that reports fabric health returns (0x1aa when all is well)."""
    mask = 0
    for shift, flag in (
        (FabricHealth.DEGRADED_BANDWIDTH, degraded_bandwidth),
        (FabricHealth.ROUTE_RECOVERY, route_recovery),
        (FabricHealth.ROUTE_UNHEALTHY, route_unhealthy),
        (FabricHealth.ACCESS_TIMEOUT_RECOVERY, access_timeout_recovery),
    ):
        mask |= (FABRIC_HEALTH_TRUE if flag else FABRIC_HEALTH_FALSE) << shift
    return mask | (incorrect_configuration & 0xF) << FabricHealth.INCORRECT_CONFIGURATION


HEALTHY_FABRIC_MASK = fabric_health_mask()


class PcieUtilCounter(enum.IntEnum):
    """Direction of a PCIe throughput sample (nvmlPcieUtilCounter_t)."""

    TX_BYTES = 0
    RX_BYTES = 1


class TopologyLevel(enum.IntEnum):
    """How two GPUs are connected over PCIe (nvmlGpuTopologyLevel_t)."""

    INTERNAL = 0
    SINGLE = 10
    MULTIPLE = 20
    HOSTBRIDGE = 30
    NODE = 40
    SYSTEM = 50


@dataclass(frozen=True)
class PciInfo:
    bus_id: str
    device_id: int
    subsystem_id: int = 0


@dataclass(frozen=True)
class MemoryInfo:
    """Framebuffer memory in bytes, as NVML's memory v2 reports it: `used` is what processes
    allocated, `reserved` what the driver and firmware keep (total = free + used + reserved)."""

    total: int
    free: int
    used: int
    reserved: int = 0


@dataclass(frozen=True)
class MigMode:
    current: bool
    pending: bool


@dataclass(frozen=True)
class Utilization:
    """Percent of time the GPU / memory controller was busy over the last sample period."""

    gpu: int
    memory: int


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    used_gpu_memory: int
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class RemappedRows:
    """nvmlDeviceGetRemappedRows: rows remapped after errors, and whether a remap waits/failed."""

    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


@dataclass(frozen=True)
class FabricInfo:
    """NVLink fabric membership (multi-node NVLink): cluster UUID, clique id, the probe's state
    (nvmlGpuFabricState_t) and its outcome (an NVML return code, 0 = success)."""

    cluster_uuid: str
    clique_id: int
    state: int
    status: int = 0
    # nvmlGpuFabricInfo_v2's health bits (FabricHealth); 0 where the driver reports no health
    # (the unversioned call, or a driver that leaves it unset).
    health_mask: int = 0

    @property
    def completed(self) -> bool:
        """The fabric manager finished registering the GPU, successfully."""
        return self.state == FABRIC_STATE_COMPLETED and self.status == 0

    def health(self, condition: FabricHealth) -> int:
        """One condition's field of the health mask (0 = not reported)."""
        width = 0xF if condition is FabricHealth.INCORRECT_CONFIGURATION else 0x3
        return (self.health_mask >> condition) & width

    def unhealthy(self) -> list[str]:
        """The fabric faults the health mask reports, in words (empty when healthy or unknown)."""
        faults = [
            what
            for condition, what in (
                (FabricHealth.DEGRADED_BANDWIDTH, "bandwidth degraded"),
                (FabricHealth.ROUTE_RECOVERY, "route recovery in progress"),
                (FabricHealth.ROUTE_UNHEALTHY, "route unhealthy"),
                (FabricHealth.ACCESS_TIMEOUT_RECOVERY, "access timeout recovery in progress"),
            )
            if self.health(condition) == FABRIC_HEALTH_TRUE
        ]
        config = self.health(FabricHealth.INCORRECT_CONFIGURATION)
        if config > 1:
            name = FABRIC_MISCONFIGURATIONS.get(config, f"code {config}")
            faults.append(f"incorrect configuration ({name})")
        return faults


@dataclass(frozen=True)
class GpuInstanceProfileInfo:
    """One GPU-instance profile: `profile_id` is the enum asked for (nvmlGpuInstanceProfile*),
    `id` NVML's internal id of it (what `GpuInstanceInfo.profile_id` holds)."""

    profile_id: int
    name: str
    slice_count: int
    instance_count: int
    multiprocessor_count: int
    memory_size_mb: int
    copy_engine_count: int
    decoder_count: int
    encoder_count: int
    jpeg_count: int
    ofa_count: int
    is_p2p_supported: bool
    id: int


@dataclass(frozen=True)
class ComputeInstanceProfileInfo:
    profile_id: int
    slice_count: int
    instance_count: int
    multiprocessor_count: int


@dataclass(frozen=True)
class GpuInstanceInfo:
    """A GPU instance; `profile_id` is NVML's internal profile id (not the enum)."""

    id: int
    profile_id: int
    placement: Placement


@dataclass(frozen=True)
class ComputeInstanceInfo:
    id: int
    profile_id: int
    placement: Placement
    gpu_instance_id: int


@dataclass(frozen=True)
class MigDeviceAttributes:
    """nvmlDeviceGetAttributes for a MIG device handle."""

    multiprocessor_count: int
    shared_copy_engine_count: int
    shared_decoder_count: int
    shared_encoder_count: int
    shared_jpeg_count: int
    shared_ofa_count: int
    gpu_instance_slice_count: int
    compute_instance_slice_count: int
    memory_size_mb: int


@dataclass(frozen=True)
class EventData:
    """One event from an event set; GI/CI ids are None for whole-GPU events."""

    device_uuid: str
    event_type: EventType
    event_data: int
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


class GpmSample(Protocol):
    """An opaque GPU performance-monitoring snapshot; free it when no longer needed."""

    def free(self) -> None: ...


class ComputeInstance(Protocol):
    def info(self) -> ComputeInstanceInfo: ...
    def destroy(self) -> None: ...


class GpuInstance(Protocol):
    def info(self) -> GpuInstanceInfo: ...
    def compute_instance_profile_info(
        self, profile_id: int, engine_profile: int = 0
    ) -> ComputeInstanceProfileInfo: ...
    def compute_instance_possible_placements(self, profile_id: int) -> list[Placement]: ...
    def compute_instance_remaining_capacity(self, profile_id: int) -> int: ...
    def create_compute_instance(
        self, profile_id: int, placement: Placement | None = None
    ) -> ComputeInstance: ...
    def compute_instances(self, profile_id: int) -> list[ComputeInstance]: ...
    def destroy(self) -> None: ...


class Device(Protocol):
    """A full GPU or a MIG device handle; MIG-only calls raise NotSupported on full GPUs."""

    # Identity
    def index(self) -> int: ...
    def name(self) -> str: ...
    def uuid(self) -> str: ...
    def pci_info(self) -> PciInfo: ...
    def pci_class(self) -> int: ...
    def minor_number(self) -> int: ...
    def memory_info(self) -> MemoryInfo: ...
    def cuda_compute_capability(self) -> tuple[int, int]: ...
    def architecture(self) -> str: ...
    def brand(self) -> str: ...

    # MIG
    def is_mig_device(self) -> bool: ...
    def mig_mode(self) -> MigMode: ...
    def set_mig_mode(self, enabled: bool) -> None: ...
    def max_mig_device_count(self) -> int: ...
    def mig_device_by_index(self, index: int) -> Device: ...
    def parent(self) -> Device: ...
    def gpu_instance_id(self) -> int: ...
    def compute_instance_id(self) -> int: ...
    def mig_attributes(self) -> MigDeviceAttributes: ...
    def gpu_instance_profile_info(self, profile_id: int) -> GpuInstanceProfileInfo: ...
    def gpu_instance_possible_placements(self, profile_id: int) -> list[Placement]: ...
    def gpu_instance_remaining_capacity(self, profile_id: int) -> int: ...
    def create_gpu_instance(
        self, profile_id: int, placement: Placement | None = None
    ) -> GpuInstance: ...
    def gpu_instances(self, profile_id: int) -> list[GpuInstance]: ...
    def gpu_instance_by_id(self, gpu_instance_id: int) -> GpuInstance: ...

    # Telemetry and health
    def utilization(self) -> Utilization: ...
    def temperature(self) -> int: ...
    def power_usage(self) -> int: ...
    def power_usage_instant(self) -> int: ...
    def total_energy_consumption(self) -> int: ...
    def clock(self, clock_type: ClockType) -> int: ...
    def encoder_utilization(self) -> int: ...
    def decoder_utilization(self) -> int: ...
    def memory_temperature(self) -> int: ...
    def pcie_throughput(self, counter: PcieUtilCounter) -> int: ...
    def pcie_replay_counter(self) -> int: ...
    def remapped_rows(self) -> RemappedRows: ...
    def total_ecc_errors(self, error_type: EccErrorType, counter_type: EccCounterType) -> int: ...
    def supported_event_types(self) -> EventType: ...
    def gpu_recovery_action(self) -> RecoveryAction: ...
    def running_processes(self) -> list[ProcessInfo]: ...
    def gpm_sample(self, gpu_instance_id: int | None = None) -> GpmSample: ...

    # Interconnect
    def nvlink_state(self, link: int) -> bool: ...
    def nvlink_remote_pci_bus_id(self, link: int) -> str: ...
    def topology_common_ancestor(self, other: Device) -> TopologyLevel: ...
    def fabric_info(self) -> FabricInfo: ...

    # Host affinity: the logical CPUs and NUMA nodes nearest the GPU (sorted ids)
    def cpu_affinity(self) -> tuple[int, ...]: ...
    def memory_affinity(self) -> tuple[int, ...]: ...


class EventSet(Protocol):
    def register(self, device: Device, event_types: EventType) -> None: ...
    def wait(self, timeout_ms: int) -> EventData: ...
    def free(self) -> None: ...


class Nvml(Protocol):
    """The library: versions, device enumeration and event sets."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def cuda_driver_version(self) -> int: ...
    def nvml_version(self) -> str: ...
    def device_count(self) -> int: ...
    def device_by_index(self, index: int) -> Device: ...
    def device_by_uuid(self, uuid: str) -> Device: ...
    def event_set(self) -> EventSet: ...
    def gpm_metrics(
        self, first: GpmSample, second: GpmSample, metrics: Sequence[GpmMetric]
    ) -> dict[GpmMetric, float]: ...
