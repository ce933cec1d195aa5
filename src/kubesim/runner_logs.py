"""Python logging from a pod runner into its container's log, so `kubectl logs` shows it.

The kubelet marks the context a runner runs in; records emitted there (by the runner or anything it
calls, in the same task or tasks it starts) go to that container's stderr log. Records emitted
elsewhere are ignored by this handler. Paths into the node's files read as on the node
(`/var/lib/kubelet/device-plugins/...`), not as where kubesim keeps them on this machine.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Protocol


class LogSink(Protocol):
    """What a container offers for log lines (a `PodContext`)."""

    def log(self, line: str | bytes, stream: str = "stdout") -> None:
        """Write one line to the container log."""

    def as_on_node(self, text: str) -> str:
        """The text with this machine's paths into the node's files written as on the node."""


CURRENT: contextvars.ContextVar[LogSink | None] = contextvars.ContextVar(
    "kubesim_runner", default=None
)


class ContainerLogHandler(logging.Handler):
    """A logging handler writing each record to the log of the container whose runner emitted it."""

    def emit(self, record: logging.LogRecord) -> None:
        sink = CURRENT.get()
        if sink is None:
            return
        try:
            # Node programs log the paths they opened, which kubesim keeps in a temporary tree per
            # node; the log shows them as on the node.
            for line in sink.as_on_node(self.format(record)).splitlines() or [""]:
                sink.log(line, "stderr")
        except Exception:
            self.handleError(record)
