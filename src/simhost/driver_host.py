"""A simulated node as the driver manager sees it: `NodeRootHost` is a node root directory laid
out as the simulated host driver contract says (C1 in docs/node-chain.md: `/usr/bin/nvidia-smi`
for a preinstalled driver, `/proc/driver/nvidia/version` while `nvidia` is loaded,
`/run/nvidia/driver` holding the driver container's root). It implements the driver manager's
`Host` (`gpu_operator.agents.driver_manager.host`, whose `LinuxHost` is the real node); its
modules are unloaded through `SimulatedKernel` (`simhost.pci`), which refuses a module that other
modules or users still hold, as Linux does.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from pathlib import Path

from gpu_operator.agents.driver_manager import host as host_mod
from gpu_operator.agents.driver_manager import plan as plan_mod
from gpu_operator.agents.pci import kernel as kernel_mod
from simhost import pci as simulated


class NodeRootHost:
    """A node root directory (the simulated host driver contract, C1 in docs/node-chain.md)."""

    def __init__(self, root: Path, gpu_processes: Callable[[], list[str]] | None = None) -> None:
        self._root = root
        self._kernel = simulated.SimulatedKernel(root)
        # Processes running on the node's GPUs (the demo's mock GPUs): like CUDA programs, they
        # keep nvidia_uvm and nvidia in use.
        self._gpu_processes = gpu_processes

    @property
    def root(self) -> Path:
        return self._root

    @property
    def kernel(self) -> simulated.SimulatedKernel:
        return self._kernel

    @property
    def pod_resources_socket(self) -> Path | None:
        return host_mod.in_root(self._root, host_mod.POD_RESOURCES_SOCKET)

    def host_driver_version(self) -> str | None:
        # `nvidia-smi` of the host answers only with its driver loaded.
        smi = host_mod.in_root(self._root, host_mod.NVIDIA_SMI)
        if not smi.is_file() or not self.loaded(plan_mod.NVIDIA):
            return None
        match = host_mod.VERSION_LINE.search(
            host_mod.read_file(host_mod.in_root(self._root, host_mod.DRIVER_VERSION_FILE)) or ""
        )
        return match.group(1) if match else "unknown"

    def loaded(self, module: str) -> bool:
        return self._kernel.loaded(module)

    def refcnt(self, module: str) -> int | None:
        return host_mod.module_refcnt(self._root, module)

    def unload(self, module: str) -> None:
        if module in host_mod.CUDA_MODULES and self._kernel.loaded(module) and self._gpu_processes:
            running = self._gpu_processes()
            if running:
                raise host_mod.HostError(
                    host_mod.rmmod_message(module, errno.EBUSY)
                    + f" (GPU processes: {', '.join(running)})"
                )
        try:
            self._kernel.unload(module)
        except kernel_mod.KernelError as err:
            raise host_mod.HostError(str(err)) from None

    def stored_digest(self) -> str | None:
        text = host_mod.read_file(host_mod.in_root(self._root, host_mod.STATE_FILE))
        return text.strip() if text is not None else None

    def unmount_driver_root(self) -> list[str]:
        # The driver container's root is bind-mounted there: unmounted, its files are gone.
        # Directories stay: the kubelet creates hostPath directories (the driver's firmware
        # volume) on the host below the mount point, and those outlive the mount.
        removed = False
        for directory, dirs, files in os.walk(host_mod.in_root(self._root, host_mod.DRIVER_ROOT)):
            base = Path(directory)
            links = [d for d in dirs if (base / d).is_symlink()]  # walk does not follow them
            for name in [*files, *links]:
                with contextlib.suppress(FileNotFoundError):
                    (base / name).unlink()
                    removed = True
        return [host_mod.DRIVER_ROOT] if removed else []

    def remove_pid_file(self) -> bool:
        try:
            host_mod.in_root(self._root, host_mod.PID_FILE).unlink()
        except FileNotFoundError:
            return False
        return True

    def mellanox_present(self) -> bool:
        return host_mod.mellanox_in(self._root)

    def mofed_ready(self, use_host_mofed: bool) -> bool:
        if use_host_mofed:
            modules = host_mod.read_file(host_mod.in_root(self._root, "/proc/modules")) or ""
            return any(
                line.split(" ", 1)[0] == host_mod.MOFED_MODULE for line in modules.splitlines()
            )
        return host_mod.in_root(self._root, host_mod.MOFED_READY).exists()
