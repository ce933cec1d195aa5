"""What the MIG manager does to the host besides NVML: GPU resets, a reboot, host GPU-client
services, and persisting the selected config for the host's own mig-manager service.

`NodeHost` acts on a real node through the host root mounted into the pod (`chroot` for
systemctl and reboot, `nvidia-smi --gpu-reset` for resets). `MockHost` acts on a simulated
machine: resets and a reboot change the mock GPUs, services are only recorded.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from gpu_operator import nvml
from gpu_operator.nvml import errors as nvml_errors

if TYPE_CHECKING:
    from gpu_operator.nvml import mock

log = logging.getLogger("gpu_operator.agents.mig_manager")


class HostError(RuntimeError):
    """A host action failed; the message says which and why, `code` the NVML return code it
    amounts to when known (a GPU in use)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class GpuRef:
    index: int
    bus_id: str


class Host(Protocol):
    def reset_gpus(self, gpus: Sequence[GpuRef]) -> None: ...
    def reboot(self) -> None: ...
    def stop_services(self, names: Sequence[str]) -> list[str]: ...
    def start_services(self, names: Sequence[str]) -> None: ...
    def persist_selected_config(self, name: str) -> bool: ...


def persist_selected_config(root: Path | None, state_file: str, name: str) -> bool:
    """Write the systemd drop-in the host's mig-manager service reads, if that file exists."""
    if root is None or not state_file:
        return False
    target = root / state_file.lstrip("/")
    if not target.is_file():
        return False
    target.write_text(f'[Service]\nEnvironment="MIG_PARTED_SELECTED_CONFIG={name}"\n')
    return True


@dataclass
class NodeHost:
    """A real node, seen through its root filesystem mounted at `root` (HOST_ROOT_MOUNT)."""

    root: Path
    state_file: str = ""
    nvidia_smi: str = "nvidia-smi"
    timeout: float = 300.0
    reboot_wait: float = 600.0

    def _run(self, args: Sequence[str], what: str) -> None:
        try:
            proc = subprocess.run(
                list(args), capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise HostError(f"{what} failed: {err}") from None
        if proc.returncode != 0:
            output = (proc.stderr or proc.stdout).strip().splitlines()
            raise HostError(f"{what} failed: {output[-1] if output else f'exit {proc.returncode}'}")

    def reset_gpus(self, gpus: Sequence[GpuRef]) -> None:
        if shutil.which(self.nvidia_smi) is None:
            raise HostError(f"GPU reset needs {self.nvidia_smi}, which is not installed here")
        ids = ",".join(g.bus_id for g in gpus)
        try:
            self._run([self.nvidia_smi, "--gpu-reset", "-i", ids], f"resetting GPU(s) {ids}")
        except HostError as err:
            # nvidia-smi's words for a GPU a process still holds ("In use by another client",
            # "... being used by one or more other processes"): busy, which may pass.
            text = str(err).lower()
            busy = "in use" in text or "being used" in text
            raise HostError(str(err), nvml_errors.ERROR_IN_USE if busy else None) from None

    def reboot(self) -> None:
        """Reboot the node; this process ends with it, so returning means the reboot failed."""
        self._run(["chroot", str(self.root), "reboot"], "rebooting the node")
        time.sleep(self.reboot_wait)
        raise HostError(f"the node did not reboot within {self.reboot_wait:.0f}s")

    def stop_services(self, names: Sequence[str]) -> list[str]:
        stopped = []
        for name in names:
            check = subprocess.run(
                ["chroot", str(self.root), "systemctl", "-q", "is-active", name], check=False
            )
            if check.returncode == 0:
                self._run(["chroot", str(self.root), "systemctl", "stop", name], f"stopping {name}")
                stopped.append(name)
        return stopped

    def start_services(self, names: Sequence[str]) -> None:
        for name in names:
            self._run(["chroot", str(self.root), "systemctl", "start", name], f"starting {name}")

    def persist_selected_config(self, name: str) -> bool:
        if not persist_selected_config(self.root, self.state_file, name):
            return False
        self._run(["chroot", str(self.root), "systemctl", "daemon-reload"], "systemd reload")
        return True


@dataclass
class MockHost:
    """A simulated node: resets and reboots act on the mock GPUs; services are recorded."""

    machine: mock.MockMachine
    root: Path | None = None
    state_file: str = ""
    stopped: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    reboots: int = 0

    def reset_gpus(self, gpus: Sequence[GpuRef]) -> None:
        for gpu in gpus:
            try:
                self.machine.reset(gpu.index)
            except nvml.NvmlError as err:
                raise HostError(
                    f"resetting GPU {gpu.index} ({gpu.bus_id}) failed: {err}", err.code
                ) from None

    def reboot(self) -> None:
        self.reboots += 1
        self.machine.reboot()

    def stop_services(self, names: Sequence[str]) -> list[str]:
        # A simulated node runs no host GPU clients; record what a real one would stop.
        self.stopped.extend(names)
        return list(names)

    def start_services(self, names: Sequence[str]) -> None:
        self.started.extend(names)

    def persist_selected_config(self, name: str) -> bool:
        return persist_selected_config(self.root, self.state_file, name)
