"""Telling the operand to reload: a signal to the first process whose argv[0] matches.

The pod shares one process namespace (`shareProcessNamespace`), so the sidecar sees the operand's
processes in /proc. In the simulated cluster there are no processes; the demo provides its own
`Signaller` that delivers the signal to the sibling container's program.
"""

from __future__ import annotations

import logging
import os
import posixpath
from pathlib import Path
from typing import Protocol

log = logging.getLogger("gpu_operator.agents.config_manager")


class Signaller(Protocol):
    """Sends `signum` to the process named `process`; False when no such process runs."""

    def signal(self, process: str, signum: int) -> bool: ...


class ProcSignaller:
    """Finds the process in /proc by its argv[0] and sends it the signal with kill(2)."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc

    def find(self, process: str) -> int | None:
        """The lowest pid whose argv[0] is exactly `process` (as upstream compares), or that is
        a Python interpreter running a script of that name: our image's NVIDIA-named entry
        points are scripts, which the kernel starts as `python /path/<name> ...`."""
        pids = sorted(int(p.name) for p in self.proc.iterdir() if p.name.isdigit())
        for pid in pids:
            try:
                argv = (self.proc / str(pid) / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue  # the process ended while we looked
            if matches([a.decode(errors="replace") for a in argv], process):
                return pid
        return None

    def signal(self, process: str, signum: int) -> bool:
        pid = self.find(process)
        if pid is None:
            return False
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            return False
        return True


def matches(argv: list[str], process: str) -> bool:
    """Whether a process with this command line is `process` (see `ProcSignaller.find`)."""
    if not argv:
        return False
    if argv[0] == process:
        return True
    interpreter = posixpath.basename(argv[0])
    return (
        interpreter.startswith("python")
        and len(argv) > 1
        and "/" not in process
        and posixpath.basename(argv[1]) == process
    )
