"""Termination messages: what the kubelet reports in a terminated container's `message`.

A container writes its message to `terminationMessagePath` (a runner calls
`PodContext.write_termination_message`). The kubelet reads at most the last 4 KiB of it; with
`terminationMessagePolicy: FallbackToLogsOnError` and a failed container that wrote nothing, the
message is the tail of its log instead: at most its last 80 lines and 2 KiB (the kubelet's
`MaxContainerTerminationMessageLength`, `...LogLength` and `...LogLines`).
"""

from __future__ import annotations

MAX_MESSAGE_BYTES = 4 * 1024
MAX_LOG_BYTES = 2 * 1024
MAX_LOG_LINES = 80
FALLBACK_TO_LOGS = "FallbackToLogsOnError"


def _tail_bytes(text: str, limit: int) -> str:
    data = text.encode()
    if len(data) <= limit:
        return text
    # The end is kept: the last thing a failing process printed is the one worth reading.
    return data[-limit:].decode(errors="ignore")


def log_tail(log_text: str) -> str:
    """The last `MAX_LOG_LINES` lines of a log, cut to its last `MAX_LOG_BYTES` bytes."""
    lines = log_text.splitlines(keepends=True)[-MAX_LOG_LINES:]
    return _tail_bytes("".join(lines), MAX_LOG_BYTES)


def message(policy: str | None, written: str | None, exit_code: int, log_text: str) -> str:
    """The `message` of a terminated container ("" when there is none)."""
    text = _tail_bytes(written or "", MAX_MESSAGE_BYTES)
    if not text and policy == FALLBACK_TO_LOGS and exit_code != 0:
        text = log_tail(log_text)
    return text
