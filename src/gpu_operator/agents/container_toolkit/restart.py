"""Making the container runtime read its new config (contract C3): signal, systemd, none.

- `signal` (containerd's and Docker's default): the runtime's PID is the peer of its control
  socket (the toolkit pod has hostPID), read from the kernel's credentials on the connection
  (SO_PEERCRED; else SO_PASSCRED and the SCM_CREDENTIALS of the first message the server sends,
  as upstream does), then SIGHUP. Six tries, five seconds apart, as upstream.
- `systemd` (CRI-O's default): `chroot <host root> systemctl restart <unit>`.
- `none`: nothing, with a warning.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import struct
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Protocol

log = logging.getLogger("gpu_operator.agents.container_toolkit")

MODES = ("signal", "systemd", "none")
ATTEMPTS = 6
BACKOFF = 5.0
_UCRED = struct.Struct("3i")  # pid, uid, gid
# SO_PEERCRED/SO_PASSCRED/SCM_CREDENTIALS are Linux's numbers; older Pythons lack some names.
SO_PEERCRED = getattr(socket, "SO_PEERCRED", 17)
SO_PASSCRED = getattr(socket, "SO_PASSCRED", 16)
SCM_CREDENTIALS = getattr(socket, "SCM_CREDENTIALS", 2)


class RestartError(Exception):
    """The runtime could not be restarted (the message says how it was tried and why not)."""


class Restarter(Protocol):
    """Makes the runtime pick up its new configuration."""

    @property
    def description(self) -> str:
        """How, for the log (e.g. "SIGHUP to containerd (pid from /run/containerd/...)")."""
        ...

    async def restart(self) -> None:
        """Restart (or reload) the runtime; RestartError when it cannot."""
        ...


def peer_pid(path: str | Path, timeout: float = 2.0) -> int:
    """The PID of the process serving a Unix socket (OSError when unreachable)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        try:
            pid, _uid, _gid = _UCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, SO_PEERCRED, _UCRED.size)
            )
            if pid > 0:
                return int(pid)
        except OSError:
            pass
        sock.setsockopt(socket.SOL_SOCKET, SO_PASSCRED, 1)
        _data, ancillary, _flags, _addr = sock.recvmsg(1024, socket.CMSG_SPACE(_UCRED.size))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == SCM_CREDENTIALS:
                pid, _uid, _gid = _UCRED.unpack(payload[: _UCRED.size])
                return int(pid)
    raise OSError(f"no credentials came with a message on {path}")


class SignalRestarter:
    """SIGHUP to the process behind the runtime's socket."""

    def __init__(
        self,
        service: str,
        socket_path: Path,
        *,
        signum: int = signal.SIGHUP,
        attempts: int = ATTEMPTS,
        backoff: float = BACKOFF,
        find_pid: Callable[[Path], int] = peer_pid,
        kill: Callable[[int, int], None] = os.kill,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.service = service
        self.socket_path = socket_path
        self.signum = signum
        self.attempts = attempts
        self.backoff = backoff
        self._find_pid = find_pid
        self._kill = kill
        self._sleep = sleep

    @property
    def description(self) -> str:
        name = signal.Signals(self.signum).name
        return f"{name} to {self.service} (its pid from the peer of {self.socket_path})"

    async def restart(self) -> None:
        last = ""
        for attempt in range(1, self.attempts + 1):
            try:
                pid = await asyncio.to_thread(self._find_pid, self.socket_path)
                self._kill(pid, self.signum)
                log.info(
                    "sent %s to %s (pid %d)", signal.Signals(self.signum).name, self.service, pid
                )
                return
            except OSError as err:
                last = f"{err}"
                if attempt < self.attempts:
                    log.warning(
                        "signalling %s failed, attempt %d/%d: %s",
                        self.service,
                        attempt,
                        self.attempts,
                        err,
                    )
                    await self._sleep(self.backoff)
        raise RestartError(
            f"could not signal {self.service} through {self.socket_path} after "
            f"{self.attempts} attempts: {last}"
        )


Runner = Callable[[Sequence[str]], Awaitable[tuple[int, str]]]


async def run_command(argv: Sequence[str]) -> tuple[int, str]:
    """Run a command; its exit status and combined output."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode(errors="replace")


class SystemdRestarter:
    """`chroot <host root> systemctl restart <unit>` (no chroot when the host root is `/`)."""

    def __init__(self, unit: str, host_root: str = "/host", run: Runner = run_command) -> None:
        self.unit = unit
        self.host_root = host_root
        self._run = run

    def argv(self) -> list[str]:
        prefix = ["chroot", self.host_root] if self.host_root not in ("", "/") else []
        return [*prefix, "systemctl", "restart", self.unit]

    @property
    def description(self) -> str:
        return " ".join(self.argv())

    async def restart(self) -> None:
        argv = self.argv()
        log.info("restarting %s with systemd: %s", self.unit, " ".join(argv))
        try:
            code, out = await self._run(argv)
        except OSError as err:
            raise RestartError(f"{' '.join(argv)}: {err}") from err
        if code != 0:
            raise RestartError(f"{' '.join(argv)} exited {code}: {out.strip()}")


class NoRestart:
    """Restart mode `none`: the runtime picks the config up whenever it next restarts."""

    def __init__(self, service: str) -> None:
        self.service = service

    @property
    def description(self) -> str:
        return f"none (RUNTIME_RESTART_MODE=none: {self.service} is not restarted)"

    async def restart(self) -> None:
        log.warning(
            "skipping the restart of %s (RUNTIME_RESTART_MODE=none): it serves the new "
            "handlers only after its next restart",
            self.service,
        )
