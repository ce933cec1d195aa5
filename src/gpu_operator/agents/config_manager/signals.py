"""Telling the operand to reload: a signal to the first process whose argv[0] matches.

The pod shares one process namespace (`shareProcessNamespace`), so the sidecar sees the operand's
processes in /proc. In the simulated cluster there are no processes; the demo provides its own
`Signaller` that delivers the signal to the sibling container's program.
"""

from __future__ import annotations

import logging
import os
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
        """The lowest pid whose argv[0] is exactly `process` (as upstream compares)."""
        pids = sorted(int(p.name) for p in self.proc.iterdir() if p.name.isdigit())
        for pid in pids:
            try:
                argv0 = (self.proc / str(pid) / "cmdline").read_bytes().split(b"\0", 1)[0]
            except OSError:
                continue  # the process ended while we looked
            if argv0.decode(errors="replace") == process:
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
