"""Container logs: a bounded, timestamped line buffer per container instance, read like the kubelet.

The kubelet applies `tailLines` first, then drops lines older than `sinceSeconds`/`sinceTime`,
prefixes RFC 3339 timestamps with nine fractional digits, and stops after `limitBytes` (even in
the middle of a line, even while following).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

from kubesim import errors
from kubesim.validation import field

# Per instance; the kubelet rotates at 10 MiB by default, a simulation needs far less.
DEFAULT_LIMIT_BYTES = 1024 * 1024
STDOUT = "stdout"
STDERR = "stderr"


@dataclass(frozen=True)
class LogEntry:
    """One line of container output (with its newline, except a final partial line)."""

    seq: int
    nanos: int
    stream: str
    data: bytes


def format_timestamp(nanos: int) -> str:
    """RFC 3339 in UTC with nanoseconds, as the kubelet prints with `timestamps=true`."""
    seconds, fraction = divmod(nanos, 1_000_000_000)
    stamp = dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{fraction:09d}Z"


class ContainerLog:
    """The output of one container instance; followers are woken on every append and on close.

    Kept small (slots, lazily created parts): a 5,000-node cluster has tens of thousands.
    """

    __slots__ = (
        "_changed",
        "_entries",
        "_first",
        "_next_seq",
        "_size",
        "closed",
        "container_id",
        "followers",
        "limit_bytes",
    )

    def __init__(self, container_id: str = "", limit_bytes: int = DEFAULT_LIMIT_BYTES) -> None:
        self.container_id = container_id
        self.limit_bytes = limit_bytes
        self.closed = False
        # Open `logs -f` and attach streams reading this instance (observable by tests).
        self.followers = 0
        self._entries: list[LogEntry] = []
        self._first = 0  # index of the oldest retained entry (trimmed in batches)
        self._size = 0
        self._next_seq = 0
        self._changed: asyncio.Event | None = None

    def append(self, data: bytes, stream: str = STDOUT) -> None:
        """Record one line (already split by the writer); ignored once the instance ended."""
        if self.closed or not data:
            return
        entry = LogEntry(self._next_seq, time.time_ns(), stream, data)
        self._next_seq += 1
        self._entries.append(entry)
        self._size += len(data)
        while self._size > self.limit_bytes and len(self._entries) - self._first > 1:
            self._size -= len(self._entries[self._first].data)
            self._first += 1
        if self._first > len(self._entries) // 2:
            del self._entries[: self._first]
            self._first = 0
        self._notify()

    def close(self) -> None:
        """The instance ended: followers drain what is left and stop."""
        if not self.closed:
            self.closed = True
            self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    async def _wait_change(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        await self._changed.wait()

    @property
    def next_seq(self) -> int:
        """The sequence number the next line will get."""
        return self._next_seq

    def entries(self, after: int = -1) -> list[LogEntry]:
        """Retained lines with a sequence number above `after`."""
        retained = self._entries[self._first :]
        if after < 0:
            return retained
        return [e for e in retained if e.seq > after]

    def text(self) -> str:
        """Everything retained, decoded (a convenience for tests and runners)."""
        return b"".join(e.data for e in self.entries()).decode(errors="replace")

    async def wait_closed(self) -> None:
        """Return once the instance has ended."""
        while not self.closed:
            await self._wait_change()

    async def wait_after(self, seq: int) -> None:
        """Return once a line above `seq` exists or the instance has ended."""
        while not self.closed and self._next_seq <= seq + 1:
            await self._wait_change()


class LineWriter:
    """A file-like text/bytes sink that turns writes into log lines on newline boundaries."""

    __slots__ = ("_log", "_pending", "stream")

    def __init__(self, log: ContainerLog, stream: str) -> None:
        self._log = log
        self.stream = stream
        self._pending = b""

    def write(self, data: str | bytes) -> int:
        """Buffer output; each completed line becomes one log entry."""
        chunk = data.encode() if isinstance(data, str) else bytes(data)
        self._pending += chunk
        while b"\n" in self._pending:
            line, self._pending = self._pending.split(b"\n", 1)
            self._log.append(line + b"\n", self.stream)
        return len(data)

    def writelines(self, lines: list[str] | list[bytes]) -> None:
        """Write several chunks."""
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        """Emit a pending partial line as its own entry (what a runtime does at exit)."""
        if self._pending:
            self._log.append(self._pending, self.stream)
            self._pending = b""


@dataclass(frozen=True)
class LogOptions:
    """The `pods/log` query options, validated."""

    container: str
    follow: bool = False
    previous: bool = False
    timestamps: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None
    since_nanos: int | None = None

    def select(self, entries: list[LogEntry]) -> list[LogEntry]:
        """Tail first, then the since filter (the kubelet's order)."""
        if self.tail_lines is not None:
            entries = entries[len(entries) - self.tail_lines :] if self.tail_lines else []
        if self.since_nanos is not None:
            since = self.since_nanos
            entries = [e for e in entries if e.nanos >= since]
        return entries

    def render(self, entry: LogEntry) -> bytes:
        """One line as printed, with the timestamp prefix when asked for."""
        if self.timestamps:
            return format_timestamp(entry.nanos).encode() + b" " + entry.data
        return entry.data


_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def _bool(query: Mapping[str, str], name: str) -> bool:
    raw = query.get(name)
    if raw is None:
        return False
    value = raw.lower()
    if value in ("true", "1", "t"):
        return True
    if value in ("false", "0", "f", ""):
        return False
    raise errors.bad_request(f'strconv.ParseBool: parsing "{raw}": invalid syntax')


def _int(query: Mapping[str, str], name: str) -> int | None:
    raw = query.get(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise errors.bad_request(f'strconv.ParseInt: parsing "{raw}": invalid syntax') from None


def _since_time(raw: str | None) -> int | None:
    if raw is None:
        return None
    if not _RFC3339.match(raw):
        raise errors.bad_request(
            f'parsing time "{raw}" as "2006-01-02T15:04:05Z07:00": cannot parse "{raw}" as "2006"'
        )
    moment = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


def parse_options(query: Mapping[str, str], pod_name: str, container: str) -> LogOptions:
    """Read and validate log options (422 `PodLogOptions "<pod>" is invalid` like the server)."""
    tail = _int(query, "tailLines")
    limit = _int(query, "limitBytes")
    since_seconds = _int(query, "sinceSeconds")
    since_time = _since_time(query.get("sinceTime"))
    problems: list[field.FieldError] = []
    if tail is not None and tail < 0:
        problems.append(field.invalid("tailLines", tail, "must be greater than or equal to 0"))
    if limit is not None and limit < 1:
        problems.append(field.invalid("limitBytes", limit, "must be greater than 0"))
    if since_seconds is not None and since_time is not None:
        problems.append(
            field.forbidden("", "at most one of `sinceTime` or `sinceSeconds` may be specified")
        )
    elif since_seconds is not None and since_seconds < 1:
        problems.append(field.invalid("sinceSeconds", since_seconds, "must be greater than 0"))
    if problems:
        field.raise_invalid("PodLogOptions", "", pod_name, problems)
    since = since_time
    if since_seconds is not None:
        since = time.time_ns() - since_seconds * 1_000_000_000
    return LogOptions(
        container=container,
        follow=_bool(query, "follow"),
        previous=_bool(query, "previous"),
        timestamps=_bool(query, "timestamps"),
        tail_lines=tail,
        limit_bytes=limit,
        since_nanos=since,
    )
