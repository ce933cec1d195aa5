"""What each validation looks at and what its marker says (pure).

Facts from upstream's `nvidia-validator` (in our words): markers live in `/run/nvidia/validations`
and are named `<component>-ready`; `driver-ready` holds five `KEY=value` lines that the toolkit and
device plugin source; a host driver is found by an executable, non-empty `nvidia-smi` in the
host's usual binary directories (or WSL's); a driver container's root has `nvidia-smi` and
`libnvidia-ml.so.1` in the usual directories, and is its own device root when it has a `/dev`;
the driver container lists extra modules to validate in `.driver-ctr-ready`; a node has GPUs when
its capacity has `nvidia.com/gpu*` or `nvidia.com/mig-*` of at least 1.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

VALIDATIONS_DIR = "/run/nvidia/validations"
COMPONENTS = (
    "driver",
    "toolkit",
    "cuda",
    "plugin",
    "nvidia-fs",
    "gdrcopy",
    "nvidia-peermem",
    "mofed",
)
# Handled by `gpu-operator agent sandbox-validator` (and the node status exporter for metrics).
OTHER_AGENTS = {
    "vfio-pci": "sandbox-validator",
    "vgpu-manager": "sandbox-validator",
    "vgpu-devices": "sandbox-validator",
    "cc-manager": "sandbox-validator",
    "metrics": "node-status-exporter",
}
MARKER_SUFFIX = "-ready"
DRIVER_CTR_READY = ".driver-ctr-ready"
# Kernel modules of the driver's optional parts, by component.
MODULES = {"nvidia-fs": "nvidia_fs", "gdrcopy": "gdrdrv", "nvidia-peermem": "nvidia_peermem"}
# Flags the driver container writes into `.driver-ctr-ready`, and the component each enables.
DRIVER_FEATURES = {
    "GDRCOPY_ENABLED": "gdrcopy",
    "GDS_ENABLED": "nvidia-fs",
    "GPU_DIRECT_RDMA_ENABLED": "nvidia-peermem",
}
HOST_ROOT_CTR_PATH = "/host"
WSL_NVIDIA_SMI = "/usr/lib/wsl/lib/nvidia-smi"
HOST_NVIDIA_SMI_PATHS = (
    "/usr/bin/nvidia-smi",
    "/usr/sbin/nvidia-smi",
    "/bin/nvidia-smi",
    "/sbin/nvidia-smi",
    WSL_NVIDIA_SMI,
    "/opt/bin/nvidia-smi",
)
DRIVER_ROOT_BIN_DIRS = ("/", "/usr/bin", "/usr/sbin", "/bin", "/sbin")
DRIVER_ROOT_LIB_DIRS = (
    "/",
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
)
NVML_LIBRARY = "libnvidia-ml.so.1"
DRIVER_ROOT_IN_CONSUMERS = "/driver-root"  # where the toolkit and plugin mount the driver root
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
MELLANOX_LABEL = "feature.node.kubernetes.io/pci-15b3.present"
MOFED_DRIVER_READY = "/run/mellanox/drivers/.driver-ready"
MOFED_MODULE = "mlx5_core"
DRIVER_COMPONENT_LABEL = "app.kubernetes.io/component"
DRIVER_COMPONENT = "nvidia-driver"
DRIVER_OWNER_KINDS = ("ClusterPolicy", "NVIDIADriver")


class ValidationFailed(Exception):
    """A validation that did not pass: the component and the first failing link, with evidence."""

    def __init__(self, component: str, message: str) -> None:
        super().__init__(f"{component}: {message}")
        self.component = component
        self.message = message


def marker(component: str) -> str:
    """The marker file a component writes on success (`driver` -> `driver-ready`)."""
    return component + MARKER_SUFFIX


def unknown_component(component: str) -> str:
    """The error for a component this agent does not validate."""
    other = OTHER_AGENTS.get(component)
    if other is not None:
        return f"component {component!r} is validated by `gpu-operator agent {other}`"
    shown = repr(component) if component else "(empty)"
    return f"unknown component {shown}; expected one of {', '.join(COMPONENTS)}"


@dataclass(frozen=True)
class DriverInfo:
    """Where the driver lives, on the host and in the containers that use it."""

    is_host_driver: bool
    host_root: str
    driver_root: str
    driver_root_ctr_path: str
    dev_root: str
    dev_root_ctr_path: str


def driver_info(
    *, is_host_driver: bool, host_root: str, install_dir: str, dev_in_driver_root: bool
) -> DriverInfo:
    """The driver's roots: the host's for a host driver; else the install dir, which is also
    the device root when the driver container exposes a `/dev` there."""
    if is_host_driver:
        return DriverInfo(
            True, host_root, host_root, HOST_ROOT_CTR_PATH, host_root, HOST_ROOT_CTR_PATH
        )
    if dev_in_driver_root:
        dev_root, dev_ctr = install_dir, DRIVER_ROOT_IN_CONSUMERS
    else:
        dev_root, dev_ctr = host_root, HOST_ROOT_CTR_PATH
    return DriverInfo(False, host_root, install_dir, DRIVER_ROOT_IN_CONSUMERS, dev_root, dev_ctr)


def driver_ready_text(info: DriverInfo) -> str:
    """The contents of `driver-ready` (sourced by shell scripts, hence `KEY=value`)."""
    return (
        f"IS_HOST_DRIVER={str(info.is_host_driver).lower()}\n"
        f"NVIDIA_DRIVER_ROOT={info.driver_root}\n"
        f"DRIVER_ROOT_CTR_PATH={info.driver_root_ctr_path}\n"
        f"NVIDIA_DEV_ROOT={info.dev_root}\n"
        f"DEV_ROOT_CTR_PATH={info.dev_root_ctr_path}\n"
    )


_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*[=:]\s*(.*?)\s*$")


def parse_flags(text: str) -> dict[str, str]:
    """`KEY=value` (or `KEY: value`) lines; comments, blanks and other lines are ignored."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        match = _ASSIGNMENT.match(line)
        if match:
            found[match.group(1)] = match.group(2).strip("'\"")
    return found


def driver_features(text: str) -> list[str]:
    """The extra components the driver container says it installed (in `.driver-ctr-ready`)."""
    flags = parse_flags(text)
    return [c for key, c in DRIVER_FEATURES.items() if flags.get(key, "").lower() == "true"]


def loaded_modules(proc_modules: str) -> frozenset[str]:
    """Module names in `/proc/modules` (what `lsmod` lists)."""
    return frozenset(line.split()[0] for line in proc_modules.splitlines() if line.split())


def _count(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _gpu_resources(resources: Mapping[str, Any]) -> Iterable[tuple[str, int]]:
    for name, value in resources.items():
        if name.startswith((GPU_RESOURCE, MIG_RESOURCE_PREFIX)):
            yield name, _count(value)


def gpu_count(resources: Mapping[str, Any]) -> int:
    """How many GPU devices (full GPUs, shared replicas and MIG devices) a node lists."""
    return sum(count for _, count in _gpu_resources(resources))


def workload_resource(allocatable: Mapping[str, Any]) -> str | None:
    """The resource a plugin workload requests: a MIG resource when one is available (as
    upstream), else a full GPU one; None when the node has none."""
    available = sorted(name for name, count in _gpu_resources(allocatable) if count >= 1)
    for name in available:
        if name.startswith(MIG_RESOURCE_PREFIX):
            return name
    return available[0] if available else None


def owned_by_operator(daemonset: Mapping[str, Any]) -> bool:
    """Whether a driver DaemonSet is the operator's (its controller is a ClusterPolicy or an
    NVIDIADriver)."""
    for ref in (daemonset.get("metadata") or {}).get("ownerReferences") or []:
        if not ref.get("controller"):
            continue
        api_version = str(ref.get("apiVersion", ""))
        if api_version.startswith("nvidia.com/") and ref.get("kind") in DRIVER_OWNER_KINDS:
            return True
    return False


def output_tail(text: str) -> str:
    """The last non-empty line a program printed (what a failure quotes)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def workload_result(log_text: str) -> str:
    """What a successful workload's log says: vectorAdd's `Test PASSED`, else its last line."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    passed = [line for line in lines if "PASSED" in line]
    return passed[-1] if passed else (lines[-1] if lines else "")
