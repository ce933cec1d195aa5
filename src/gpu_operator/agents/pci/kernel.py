"""Writing sysfs attributes and loading modules: the `Kernel` the VM agents act through.

On a host, writing `0000:07:00.0` to `/sys/bus/pci/drivers/vfio-pci/bind` makes the kernel bind
the device; the write fails with an errno (`EBUSY`, `ENODEV`, ...) when the kernel refuses. The
agents do exactly these writes through `Kernel.write`, so the same code runs on a host
(`LinuxKernel`: a plain file write, and `modprobe`) and on a simulated node
(`simhost.pci.SimulatedKernel`: it edits the node's sysfs tree as the kernel
would, and raises the same errors).
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path
from typing import Protocol


class KernelError(OSError):
    """The kernel refused a write or a module could not be loaded; str() says which and why."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class Kernel(Protocol):
    """Side effects on the host, as a privileged container makes them."""

    @property
    def root(self) -> Path:
        """The host's `/` as this process sees it."""

    def write(self, path: Path, value: str) -> None:
        """Write `value` to a sysfs attribute (KernelError with the errno when refused)."""

    def modprobe(self, module: str) -> None:
        """Load a module and what it depends on (KernelError when it cannot be found)."""


def refused(path: Path, value: str, code: int) -> KernelError:
    """The error a shell's `echo value > path` reports for a refused write."""
    return KernelError(code, f"write {value.strip()!r} to {path}: write error: {os.strerror(code)}")


class LinuxKernel:
    """The real kernel: writes go to sysfs, modules load with `modprobe` in the host root."""

    def __init__(self, root: Path = Path("/")) -> None:
        self._root = root

    @property
    def root(self) -> Path:
        return self._root

    def write(self, path: Path, value: str) -> None:
        try:
            # One write() call, as `echo` does: sysfs acts on each write separately.
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, value.encode())
            finally:
                os.close(fd)
        except OSError as err:
            raise refused(path, value, err.errno or errno.EIO) from None

    def modprobe(self, module: str) -> None:
        argv = ["modprobe", module]
        if self._root != Path("/"):
            argv = ["chroot", str(self._root), *argv]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise KernelError(errno.ENOENT, f"modprobe {module}: {err}") from None
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
            raise KernelError(errno.ENOENT, detail)
