"""The host as the driver manager sees it: a driver of its own, kernel modules, the driver
container's root and files under `/run/nvidia`, Mellanox devices and MOFED.

`LinuxHost` is a real node from inside the privileged `k8s-driver-manager` container (the host's
`/` at `/host`, its `/sys` and `/run/nvidia` mounted as themselves): `chroot /host nvidia-smi`,
`/sys/module`, the `delete_module` system call (what `rmmod` does), a recursive unmount of
`/run/nvidia/driver`. A simulated node's host is `simhost.driver_host.NodeRootHost` (outside
the product).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Protocol

from gpu_operator.agents.driver_manager import plan as plan_mod
from gpu_operator.agents.pci import kernel as kernel_mod
from gpu_operator.agents.pci import sysfs

DRIVER_ROOT = "/run/nvidia/driver"
PID_FILE = "/run/nvidia/nvidia-driver.pid"
STATE_FILE = "/run/nvidia/nvidia-driver.state"
MOFED_READY = "/run/mellanox/drivers/.driver-ready"
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
NVIDIA_SMI = "/usr/bin/nvidia-smi"
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
MELLANOX_VENDOR = 0x15B3
MOFED_MODULE = "mlx5_core"
# What a CUDA process holds open.
CUDA_MODULES = frozenset({"nvidia_uvm", plan_mod.NVIDIA})
# Modules whose state the plan needs.
WATCHED_MODULES = frozenset({*plan_mod.UNLOAD_ORDER, plan_mod.NOUVEAU})
VERSION_LINE = re.compile(r"Kernel Module\s+(\S+)")


class HostError(RuntimeError):
    """The host refused an action (str() is what the tool would print)."""


class Host(Protocol):
    """The host operations of the driver manager."""

    @property
    def kernel(self) -> kernel_mod.Kernel:
        """The kernel the VFIO and vGPU steps write sysfs through."""

    @property
    def pod_resources_socket(self) -> Path | None:
        """The kubelet's pod-resources socket (who holds which GPU), if reachable."""

    def host_driver_version(self) -> str | None:
        """The version `nvidia-smi` of the host itself reports (None: no working host driver)."""

    def loaded(self, module: str) -> bool:
        """The module has `/sys/module/<module>/refcnt`."""

    def refcnt(self, module: str) -> int | None:
        """The module's use count (None: not loaded or unreadable)."""

    def unload(self, module: str) -> None:
        """Remove the module from the kernel (HostError with rmmod's message when refused)."""

    def stored_digest(self) -> str | None:
        """The DRIVER_CONFIG_DIGEST the running driver was installed with, if recorded."""

    def unmount_driver_root(self) -> list[str]:
        """Unmount `/run/nvidia/driver` and everything under it; the mount points unmounted."""

    def remove_pid_file(self) -> bool:
        """Remove the driver container's pid file (False: there was none)."""

    def mellanox_present(self) -> bool:
        """A Mellanox (0x15b3) PCI device exists."""

    def mofed_ready(self, use_host_mofed: bool) -> bool:
        """MOFED is usable: `mlx5_core` loaded (host MOFED) or the MOFED container's marker."""


def observe(host: Host) -> plan_mod.HostFacts:
    """The host facts the plan needs."""
    return plan_mod.HostFacts(
        host_driver_version=host.host_driver_version(),
        loaded_modules=frozenset(m for m in WATCHED_MODULES if host.loaded(m)),
        stored_digest=host.stored_digest(),
        mellanox_present=host.mellanox_present(),
    )


def read_file(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def module_refcnt(sys_root: Path, module: str) -> int | None:
    text = read_file(sys_root / "sys" / "module" / module / "refcnt")
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def mellanox_in(sys_root: Path) -> bool:
    return any(f.vendor == MELLANOX_VENDOR for f in sysfs.scan(sys_root))


def in_root(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


# ----- a real node ------------------------------------------------------------------------

_OCTAL = re.compile(r"\\([0-7]{3})")


def mount_points_under(mountinfo: str, top: str) -> list[str]:
    """The mount points at or below `top` in a `/proc/self/mountinfo` text, deepest first (the
    order they must be unmounted in)."""
    top = top.rstrip("/") or "/"
    found: set[str] = set()
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        point = _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), fields[4])
        if point == top or point.startswith(top + "/"):
            found.add(point)
    return sorted(found, key=lambda p: (-p.count("/"), p))


# The delete_module system call on x86_64 and aarch64 (glibc has no wrapper for it).
_DELETE_MODULE = {"x86_64": 176, "aarch64": 106}
_O_NONBLOCK = os.O_NONBLOCK
_MNT_DETACH = 2


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def rmmod_message(module: str, code: int) -> str:
    """What `rmmod` prints when the kernel refuses with `code`."""
    if code == errno.EBUSY or code == errno.EAGAIN:
        return f"rmmod: ERROR: Module {module} is in use"
    if code == errno.ENOENT:
        return f"rmmod: ERROR: Module {module} is not currently loaded"
    return f"rmmod: ERROR: could not remove module {module}: {os.strerror(code)}"


class LinuxHost:
    """A real node, from inside the driver manager's privileged container."""

    def __init__(
        self,
        host_root: Path = Path("/host"),
        root: Path = Path("/"),
        *,
        nvidia_smi_timeout: float = 30.0,
    ) -> None:
        self._host_root = host_root
        self._root = root
        self._kernel = kernel_mod.LinuxKernel(root)
        self._smi_timeout = nvidia_smi_timeout

    @property
    def kernel(self) -> kernel_mod.Kernel:
        return self._kernel

    @property
    def pod_resources_socket(self) -> Path | None:
        return in_root(self._host_root, POD_RESOURCES_SOCKET)

    def host_driver_version(self) -> str | None:
        argv = [
            "chroot", str(self._host_root), "nvidia-smi",
            "--query-gpu=driver_version", "--format=csv,noheader",
        ]  # fmt: skip
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=self._smi_timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            return None
        return lines[0].strip()

    def loaded(self, module: str) -> bool:
        return sysfs.module_loaded(self._root, module)

    def refcnt(self, module: str) -> int | None:
        return module_refcnt(self._root, module)

    def unload(self, module: str) -> None:
        number = _DELETE_MODULE.get(platform.machine())
        if number is None:  # another architecture: the tool knows its system call
            done = subprocess.run(["rmmod", module], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise HostError((done.stderr or done.stdout).strip() or f"rmmod {module} failed")
            return
        libc = _libc()
        if libc.syscall(number, module.encode(), _O_NONBLOCK) != 0:
            raise HostError(rmmod_message(module, ctypes.get_errno()))

    def stored_digest(self) -> str | None:
        text = read_file(in_root(self._root, STATE_FILE))
        return text.strip() if text is not None else None

    def unmount_driver_root(self) -> list[str]:
        mountinfo = read_file(Path("/proc/self/mountinfo")) or ""
        points = mount_points_under(mountinfo, str(in_root(self._root, DRIVER_ROOT)))
        libc = _libc()
        for point in points:
            if libc.umount2(point.encode(), _MNT_DETACH) != 0:
                code = ctypes.get_errno()
                if code not in (errno.EINVAL, errno.ENOENT):  # not (or no longer) mounted
                    raise HostError(f"umount {point}: {os.strerror(code)}")
        return points

    def remove_pid_file(self) -> bool:
        try:
            in_root(self._root, PID_FILE).unlink()
        except FileNotFoundError:
            return False
        return True

    def mellanox_present(self) -> bool:
        return mellanox_in(self._root)

    def mofed_ready(self, use_host_mofed: bool) -> bool:
        if use_host_mofed:
            modules = read_file(Path("/proc/modules")) or ""
            return any(line.split(" ", 1)[0] == MOFED_MODULE for line in modules.splitlines())
        return in_root(self._root, MOFED_READY).exists()
