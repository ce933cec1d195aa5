"""The DCGM fields a counters CSV may name, and how this exporter reads each one from NVML.

Pure data (standard library only): the operator imports it to reject unknown field names in a
user's ConfigMap. Field ids are DCGM's (`dcgm_fields.h`); they order the exposition, as
dcgm-exporter's template ranges over its counters sorted by id. `source` names the reading in
`readers.SOURCES`; a field without one is known to DCGM but not readable through NVML here, and
`note` says why (and what we do instead) - docs/exporter.md lists them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.Enum):
    """DCGM's value type: integers print as `%d`, doubles as `%f`, strings raw."""

    INT = "int64"
    DOUBLE = "double"
    STRING = "string"


class Scope(enum.Enum):
    """Where a value lives: the whole GPU, or one MIG GPU instance (framebuffer fields)."""

    GPU = "gpu"
    INSTANCE = "instance"


@dataclass(frozen=True)
class Field:
    name: str
    id: int
    kind: Kind
    source: str | None = None
    scope: Scope = Scope.GPU
    note: str = ""

    @property
    def supported(self) -> bool:
        return self.source is not None

    @property
    def profiling(self) -> bool:
        """DCGM's DCP profiling fields (ids 1001-1099), read from the profiling module, not NVML."""
        return self.name.startswith("DCGM_FI_PROF_")


_I, _D, _S = Kind.INT, Kind.DOUBLE, Kind.STRING
_GI = Scope.INSTANCE
NO_NVML = "not exposed by NVML through this exporter's GPU layer; omitted"
DCP_ONLY = "DCGM profiling (DCP) metric: needs the DCGM profiling module, which NVML lacks; omitted"
EXPORTER_ONLY = "computed by dcgm-exporter's own collectors, not implemented here; omitted"


def _f(
    name: str,
    id_: int,
    kind: Kind,
    source: str | None = None,
    *,
    scope: Scope = Scope.GPU,
    note: str = "",
) -> Field:
    return Field(name, id_, kind, source, scope, note or ("" if source else NO_NVML))


FIELDS: tuple[Field, ...] = (
    # Static and system information (usually `label` counters).
    _f("DCGM_FI_DRIVER_VERSION", 1, _S, "driver_version"),
    _f("DCGM_FI_NVML_VERSION", 2, _S, "nvml_version"),
    _f("DCGM_FI_PROCESS_NAME", 3, _S),
    _f("DCGM_FI_DEV_COUNT", 4, _I, "device_count"),
    _f("DCGM_FI_CUDA_DRIVER_VERSION", 5, _I, "cuda_driver_version"),
    _f("DCGM_FI_DEV_NAME", 50, _S, "name"),
    _f("DCGM_FI_DEV_BRAND", 51, _S, "brand"),
    _f("DCGM_FI_DEV_NVML_INDEX", 52, _I, "index"),
    _f("DCGM_FI_DEV_SERIAL", 53, _S),
    _f("DCGM_FI_DEV_UUID", 54, _S, "uuid"),
    _f("DCGM_FI_DEV_MINOR_NUMBER", 55, _I, "minor_number"),
    _f("DCGM_FI_DEV_OEM_INFOROM_VER", 56, _S),
    _f("DCGM_FI_DEV_PCI_BUSID", 57, _S, "pci_bus_id"),
    _f("DCGM_FI_DEV_PCI_COMBINED_ID", 58, _I, "pci_combined_id"),
    _f("DCGM_FI_DEV_PCI_SUBSYS_ID", 59, _I, "pci_subsystem_id"),
    _f("DCGM_FI_DEV_CUDA_COMPUTE_CAPABILITY", 63, _I),
    _f("DCGM_FI_DEV_COMPUTE_MODE", 65, _I),
    _f("DCGM_FI_DEV_PERSISTENCE_MODE", 66, _I),
    _f("DCGM_FI_DEV_MIG_MODE", 67, _I, "mig_mode"),
    _f("DCGM_FI_DEV_MIG_MAX_SLICES", 69, _I),
    _f("DCGM_FI_DEV_ECC_INFOROM_VER", 80, _S),
    _f("DCGM_FI_DEV_POWER_INFOROM_VER", 81, _S),
    _f("DCGM_FI_DEV_INFOROM_IMAGE_VER", 82, _S),
    _f("DCGM_FI_DEV_VBIOS_VERSION", 85, _S),
    _f("DCGM_FI_DEV_BAR1_TOTAL", 90, _I),
    _f("DCGM_FI_DEV_BAR1_USED", 92, _I),
    _f("DCGM_FI_DEV_BAR1_FREE", 93, _I),
    # Clocks, temperature, power.
    _f("DCGM_FI_DEV_SM_CLOCK", 100, _I, "sm_clock"),
    _f("DCGM_FI_DEV_MEM_CLOCK", 101, _I, "mem_clock"),
    _f("DCGM_FI_DEV_VIDEO_CLOCK", 102, _I, "video_clock"),
    _f("DCGM_FI_DEV_APP_SM_CLOCK", 110, _I),
    _f("DCGM_FI_DEV_APP_MEM_CLOCK", 111, _I),
    _f("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 112, _I),
    _f("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 112, _I),
    _f("DCGM_FI_DEV_MAX_SM_CLOCK", 113, _I),
    _f("DCGM_FI_DEV_MAX_MEM_CLOCK", 114, _I),
    _f("DCGM_FI_DEV_MAX_VIDEO_CLOCK", 115, _I),
    _f("DCGM_FI_DEV_MEMORY_TEMP", 140, _I, "memory_temp"),
    _f("DCGM_FI_DEV_GPU_TEMP", 150, _I, "gpu_temp"),
    _f("DCGM_FI_DEV_MEM_MAX_OP_TEMP", 151, _I),
    _f("DCGM_FI_DEV_GPU_MAX_OP_TEMP", 152, _I),
    _f("DCGM_FI_DEV_POWER_USAGE", 155, _D, "power_usage"),
    _f("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 156, _I, "total_energy"),
    _f("DCGM_FI_DEV_POWER_USAGE_INSTANT", 157, _D, "power_usage_instant"),
    _f("DCGM_FI_DEV_SLOWDOWN_TEMP", 158, _I),
    _f("DCGM_FI_DEV_SHUTDOWN_TEMP", 159, _I),
    _f("DCGM_FI_DEV_POWER_MGMT_LIMIT", 160, _D),
    _f("DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN", 161, _D),
    _f("DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX", 162, _D),
    _f("DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF", 163, _D),
    _f("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 164, _D),
    _f("DCGM_FI_DEV_PSTATE", 190, _I),
    _f("DCGM_FI_DEV_FAN_SPEED", 191, _I),
    # Utilization and PCIe.
    _f("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", 200, _I, "pcie_tx_kb"),
    _f("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", 201, _I, "pcie_rx_kb"),
    _f("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 202, _I, "pcie_replay"),
    _f("DCGM_FI_DEV_GPU_UTIL", 203, _I, "gpu_util"),
    _f("DCGM_FI_DEV_MEM_COPY_UTIL", 204, _I, "mem_copy_util"),
    _f("DCGM_FI_DEV_ENC_UTIL", 206, _I, "enc_util"),
    _f("DCGM_FI_DEV_DEC_UTIL", 207, _I, "dec_util"),
    _f("DCGM_FI_DEV_XID_ERRORS", 230, _I, "xid", scope=_GI),
    _f("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", 235, _I),
    _f("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", 236, _I),
    _f("DCGM_FI_DEV_PCIE_LINK_GEN", 237, _I),
    _f("DCGM_FI_DEV_PCIE_LINK_WIDTH", 238, _I),
    _f("DCGM_FI_DEV_POWER_VIOLATION", 240, _I),
    _f("DCGM_FI_DEV_THERMAL_VIOLATION", 241, _I),
    _f("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", 242, _I),
    _f("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", 243, _I),
    _f("DCGM_FI_DEV_LOW_UTIL_VIOLATION", 244, _I),
    _f("DCGM_FI_DEV_RELIABILITY_VIOLATION", 245, _I),
    # Framebuffer: per GPU instance on MIG GPUs.
    _f("DCGM_FI_DEV_FB_TOTAL", 250, _I, "fb_total", scope=_GI),
    _f("DCGM_FI_DEV_FB_FREE", 251, _I, "fb_free", scope=_GI),
    _f("DCGM_FI_DEV_FB_USED", 252, _I, "fb_used", scope=_GI),
    _f("DCGM_FI_DEV_FB_RESERVED", 253, _I, "fb_reserved", scope=_GI),
    _f("DCGM_FI_DEV_FB_USED_PERCENT", 254, _D, "fb_used_percent", scope=_GI),
    # ECC, retired pages, remapped rows.
    _f("DCGM_FI_DEV_ECC_CURRENT", 300, _I),
    _f("DCGM_FI_DEV_ECC_PENDING", 301, _I),
    _f("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 310, _I, "ecc_sbe_vol"),
    _f("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 311, _I, "ecc_dbe_vol"),
    _f("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", 312, _I, "ecc_sbe_agg"),
    _f("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 313, _I, "ecc_dbe_agg"),
    _f("DCGM_FI_DEV_RETIRED_SBE", 390, _I),
    _f("DCGM_FI_DEV_RETIRED_DBE", 391, _I),
    _f("DCGM_FI_DEV_RETIRED_PENDING", 392, _I),
    _f("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 393, _I, "remap_uncorrectable"),
    _f("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 394, _I, "remap_correctable"),
    _f("DCGM_FI_DEV_ROW_REMAP_FAILURE", 395, _I, "remap_failure"),
    _f("DCGM_FI_DEV_ROW_REMAP_PENDING", 396, _I, "remap_pending"),
    # NVLink.
    _f("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 409, _I),
    _f("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", 419, _I),
    _f("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 429, _I),
    _f("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", 439, _I),
    _f("DCGM_FI_DEV_NVLINK_BANDWIDTH_L0", 440, _I),
    _f("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", 449, _I),
    # Virtualization.
    _f("DCGM_FI_DEV_VIRTUAL_MODE", 500, _I),
    _f(
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        526,
        _I,
        note="reported by DCGM only inside vGPU guests (blank on bare metal); omitted",
    ),
    # DCP profiling metrics.
    _f(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        1001,
        _D,
        "gr_engine_active",
        note="NVML GPU performance monitoring (graphics activity / 100) on Hopper and later, "
        "per MIG GPU instance too; elsewhere derived from NVML GPU utilization / 100 (both "
        "measure the time a kernel ran), and absent on Ampere MIG GPU instances",
    ),
    _f("DCGM_FI_PROF_SM_ACTIVE", 1002, _D, note=DCP_ONLY),
    _f("DCGM_FI_PROF_SM_OCCUPANCY", 1003, _D, note=DCP_ONLY),
    _f("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1004, _D, note=DCP_ONLY),
    _f("DCGM_FI_PROF_DRAM_ACTIVE", 1005, _D, note=DCP_ONLY),
    _f("DCGM_FI_PROF_PIPE_FP64_ACTIVE", 1006, _D, note=DCP_ONLY),
    _f("DCGM_FI_PROF_PIPE_FP32_ACTIVE", 1007, _D, note=DCP_ONLY),
    _f("DCGM_FI_PROF_PIPE_FP16_ACTIVE", 1008, _D, note=DCP_ONLY),
    _f(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        1009,
        _D,
        "pcie_tx_bytes",
        note="derived: NVML PCIe TX throughput (KB/s over a 20 ms sample) x 1024",
    ),
    _f(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        1010,
        _D,
        "pcie_rx_bytes",
        note="derived: NVML PCIe RX throughput (KB/s over a 20 ms sample) x 1024",
    ),
    _f("DCGM_FI_PROF_NVLINK_TX_BYTES", 1011, _D, note=DCP_ONLY),
    _f("DCGM_FI_PROF_NVLINK_RX_BYTES", 1012, _D, note=DCP_ONLY),
    # dcgm-exporter's own counters (ids above DCGM's range, as upstream numbers them).
    _f("DCGM_EXP_XID_ERRORS_COUNT", 9001, _I, note=EXPORTER_ONLY),
    _f("DCGM_EXP_CLOCK_EVENTS_COUNT", 9002, _I, note=EXPORTER_ONLY),
    _f("DCGM_EXP_GPU_HEALTH_STATUS", 9003, _I, note=EXPORTER_ONLY),
    _f("DCGM_EXP_P2P_STATUS", 9004, _I, note=EXPORTER_ONLY),
)

_BY_NAME = {f.name: f for f in FIELDS}


def by_name(name: str) -> Field | None:
    """The field called `name`, or None when DCGM has no such field."""
    return _BY_NAME.get(name)


def unsupported() -> tuple[Field, ...]:
    """Fields a CSV may name that this exporter cannot read (each with its note)."""
    return tuple(f for f in FIELDS if not f.supported)
