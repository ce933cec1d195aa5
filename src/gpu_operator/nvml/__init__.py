"""GPU access: a Protocol, a real backend on nvidia-ml-py and a mock backend with real GPU models.

Importing this package stays cheap and free of pynvml: the real backend loads the library only
when `open_backend("nvml")` is called, and `catalog` is plain data.
"""

from __future__ import annotations

from gpu_operator.nvml.errors import (
    DriverNotLoaded,
    GpuLost,
    InsufficientResources,
    InUse,
    InvalidArgument,
    LibraryNotFound,
    NoPermission,
    NotFound,
    NotSupported,
    NvmlError,
    ResetRequired,
    Timeout,
    Uninitialized,
    Unknown,
    VersionMismatch,
)
from gpu_operator.nvml.protocol import (
    ClockType,
    ComputeInstance,
    Device,
    EccCounterType,
    EccErrorType,
    EventData,
    EventSet,
    EventType,
    GpuInstance,
    MigMode,
    Nvml,
    Placement,
)

__all__ = [
    "ClockType",
    "ComputeInstance",
    "Device",
    "DriverNotLoaded",
    "EccCounterType",
    "EccErrorType",
    "EventData",
    "EventSet",
    "EventType",
    "GpuInstance",
    "GpuLost",
    "InUse",
    "InsufficientResources",
    "InvalidArgument",
    "LibraryNotFound",
    "MigMode",
    "NoPermission",
    "NotFound",
    "NotSupported",
    "Nvml",
    "NvmlError",
    "Placement",
    "ResetRequired",
    "Timeout",
    "Uninitialized",
    "Unknown",
    "VersionMismatch",
]
