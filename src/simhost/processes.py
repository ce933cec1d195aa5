"""The demo's stand-in for processes and signals inside pods.

Real operand pods that run a config-manager sidecar share one process namespace
(`shareProcessNamespace: true`), so the sidecar finds the operand by its argv[0] in /proc and sends
it SIGHUP. kubesim runs no processes; instead each demo program that would be such a process
registers its argv[0] in its pod's table with what to do on a signal (for example: reload the
config), and the sidecar's `Signaller` looks it up in its own pod. Without a shared namespace
(and without `hostPID`) a sidecar sees no sibling processes, exactly as in a real pod.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("gpu_operator.demo")

SignalHandler = Callable[[int], None]


@dataclass
class ProcessTable:
    """Simulated processes by pod uid: argv[0] -> what a signal does to that process."""

    pods: dict[str, dict[str, SignalHandler]] = field(default_factory=dict)

    @contextlib.contextmanager
    def running(self, pod: dict[str, Any], argv0: str, on_signal: SignalHandler) -> Iterator[None]:
        """`argv0` runs in `pod` for the duration of the block."""
        uid = pod["metadata"]["uid"]
        self.pods.setdefault(uid, {})[argv0] = on_signal
        try:
            yield
        finally:
            table = self.pods.get(uid, {})
            if table.get(argv0) is on_signal:
                del table[argv0]
            if not table:
                self.pods.pop(uid, None)

    def signaller(self, pod: dict[str, Any]) -> PodSignaller:
        """The view of processes a container of `pod` has."""
        spec = pod.get("spec") or {}
        shared = bool(spec.get("shareProcessNamespace") or spec.get("hostPID"))
        return PodSignaller(self, pod["metadata"]["uid"], shared)


@dataclass
class PodSignaller:
    """A config-manager `Signaller` for one pod (see module docstring)."""

    table: ProcessTable
    uid: str
    shared: bool

    def signal(self, process: str, signum: int) -> bool:
        if not self.shared:
            return False  # its own PID namespace: no sibling is visible
        handler = self.table.pods.get(self.uid, {}).get(process)
        if handler is None:
            return False
        handler(signum)
        return True
