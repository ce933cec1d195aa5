"""Our NVML exception hierarchy: one class per NVML return code that callers act on."""

from __future__ import annotations

# NVML return codes (nvmlReturn_t), shared by the real and the mock backend.
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_ALREADY_INITIALIZED = 5
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_RESET_REQUIRED = 16
ERROR_LIB_RM_VERSION_MISMATCH = 18
ERROR_IN_USE = 19
ERROR_INSUFFICIENT_RESOURCES = 23
ERROR_UNKNOWN = 999


class NvmlError(Exception):
    """An NVML call failed; `code` is the NVML return code."""

    code: int = ERROR_UNKNOWN
    hint: str = ""

    def __init__(self, message: str = "", code: int | None = None) -> None:
        if code is not None:
            self.code = code
        text = message or self.hint or f"NVML error {self.code}"
        super().__init__(text)
        self.message = text


class LibraryNotFound(NvmlError):
    code = ERROR_LIBRARY_NOT_FOUND
    hint = "NVML library not found: is the NVIDIA driver installed on this node?"


class DriverNotLoaded(NvmlError):
    code = ERROR_DRIVER_NOT_LOADED
    hint = "NVIDIA kernel driver not loaded: is the driver container running on this node?"


class VersionMismatch(NvmlError):
    code = ERROR_LIB_RM_VERSION_MISMATCH
    hint = (
        "NVML library and kernel driver versions differ: the node needs a driver reload or reboot"
    )


class Uninitialized(NvmlError):
    code = ERROR_UNINITIALIZED
    hint = "NVML is not initialised: call init() first"


class InvalidArgument(NvmlError):
    code = ERROR_INVALID_ARGUMENT
    hint = "invalid argument to an NVML call"


class NotSupported(NvmlError):
    code = ERROR_NOT_SUPPORTED
    hint = "operation not supported by this GPU"


class NoPermission(NvmlError):
    code = ERROR_NO_PERMISSION
    hint = (
        "insufficient permissions for this NVML call: MIG management and MIG-instance queries "
        "need a privileged user; run the agent as root (securityContext runAsUser: 0 with "
        "privileged: true), not as the image's default non-root user"
    )


class NotFound(NvmlError):
    code = ERROR_NOT_FOUND
    hint = "object not found"


class Timeout(NvmlError):
    code = ERROR_TIMEOUT
    hint = "timed out waiting for an NVML event"


class GpuLost(NvmlError):
    code = ERROR_GPU_IS_LOST
    hint = "the GPU has fallen off the bus or is otherwise inaccessible"


class ResetRequired(NvmlError):
    code = ERROR_RESET_REQUIRED
    hint = "the GPU needs a reset before this operation can succeed"


class InUse(NvmlError):
    code = ERROR_IN_USE
    hint = "the GPU or instance is in use"


class InsufficientResources(NvmlError):
    code = ERROR_INSUFFICIENT_RESOURCES
    hint = "not enough free GPU resources (slices, placements or instances) for this request"


class Unknown(NvmlError):
    code = ERROR_UNKNOWN
    hint = "unknown NVML error"


_BY_CODE: dict[int, type[NvmlError]] = {
    cls.code: cls
    for cls in (
        LibraryNotFound,
        DriverNotLoaded,
        VersionMismatch,
        Uninitialized,
        InvalidArgument,
        NotSupported,
        NoPermission,
        NotFound,
        Timeout,
        GpuLost,
        ResetRequired,
        InUse,
        InsufficientResources,
        Unknown,
    )
}


def from_code(code: int, message: str = "") -> NvmlError:
    """Build our exception for NVML return code `code` (unknown codes keep their number)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return NvmlError(message or f"NVML error {code}", code=code)
    return cls(message)


def class_for_code(code: int) -> type[NvmlError]:
    return _BY_CODE.get(code, NvmlError)
