"""The small HTTP/1.1 server behind every endpoint our programs open to the network: the metrics
exporter's `:9400`, the node status exporter's `:8000`, the operator's metrics and health ports
and the device plugin's health port.

Their answers are ready-made texts (a render, a verdict), so a web framework buys nothing; what
matters is that no client can make the program hold memory or shut its scrapers out. Every
listener has `Limits`:

- at most `connections` open at once. A newcomer at the cap closes the connection longest on an
  unfinished head, else the oldest one that has not sent a byte, else the one kept alive longest:
  real clients send a head in one packet, so a flood churns among its own connections, and a
  client that was answered (Prometheus between scrapes) is closed last. When every connection is
  being answered, the newcomer is closed instead. (Connections are counted once accepted: the
  kernel's queue and one accept batch may add up to the listen backlog for a moment.)
- a request head complete within `head_seconds` of its first byte, and a new connection's first
  head within `head_seconds` of connecting, however slowly it trickles in (slowloris);
- a kept-alive connection closed after `idle_seconds` without a request;
- an answer the client must take within `write_seconds`.

A closed connection leaves nothing behind: its buffers go with its transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

# A request head larger than this is refused (the scrapers' and probes' are a few hundred bytes).
MAX_HEAD = 16384
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 500: "Internal Server Error",
           503: "Service Unavailable"}  # fmt: skip
TEXT = "text/plain; charset=utf-8"
# (status, content type, body) of one answer.
Answer = tuple[int, str, bytes]
Respond = Callable[[str, str], Answer]


@dataclass(frozen=True)
class Limits:
    """What one listener grants its clients (see the module's docstring)."""

    # Prometheus (two replicas in HA), the kubelet's probes and a few people with curl need a
    # handful; the rest of the 128 is headroom.
    connections: int = 128
    # Above Prometheus' default one-minute scrape interval, so its connection is reused between
    # scrapes (nginx and aiohttp keep idle connections as long).
    idle_seconds: float = 75.0
    head_seconds: float = 10.0
    write_seconds: float = 10.0

    def __post_init__(self) -> None:
        if self.connections < 1:
            raise ValueError(f"connections {self.connections}: at least 1")
        for name in ("idle_seconds", "head_seconds", "write_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} {getattr(self, name)}: must be positive")


LIMITS = Limits()


class _Connection:
    __slots__ = ("writer",)

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer


class Connections:
    """The connections one listener holds, by state; within a state the oldest comes first (dicts
    keep insertion order, and a connection is re-inserted whenever it changes state)."""

    def __init__(self, limits: Limits, what: str) -> None:
        self.limits = limits
        self.what = what
        self.fresh: dict[_Connection, None] = {}  # no byte of a first request yet
        self.reading: dict[_Connection, None] = {}  # part of a head received
        self.kept: dict[_Connection, None] = {}  # answered, kept alive for the next request
        self.busy: dict[_Connection, None] = {}  # being answered
        self.displaced = 0  # connections closed to make room, since start
        self.refused = 0  # newcomers closed because every connection was being answered
        self.closing = False  # set by close_all: a connection accepted after it is closed at once
        self._warned_at = -1e9

    @property
    def states(self) -> tuple[dict[_Connection, None], ...]:
        return self.fresh, self.reading, self.kept, self.busy

    def __len__(self) -> int:
        return sum(len(state) for state in self.states)

    def admit(self, writer: asyncio.StreamWriter) -> _Connection | None:
        """Register a new connection, closing another at the cap; None when it must be closed
        (also once the endpoint is closing).

        The one closed is the one longest on an unfinished head, else the oldest that has not
        sent a byte, else the one kept alive longest: a client that was answered (a scraper
        between scrapes) goes last, so a flood of idle connections never displaces it."""
        if self.closing:
            return None
        if len(self) >= self.limits.connections:
            victims = self.reading or self.fresh or self.kept
            if not victims:
                self.refused += 1
                self._warn()
                return None
            victim = next(iter(victims))
            self.forget(victim)
            victim.writer.transport.abort()
            self.displaced += 1
            self._warn()
        conn = _Connection(writer)
        self.fresh[conn] = None
        return conn

    def _warn(self) -> None:
        now = time.monotonic()
        if now - self._warned_at >= 60:
            self._warned_at = now
            log.warning(
                "%s: %d connections open, the limit: closing the idle ones to make room "
                "(%d closed, %d refused while all were being answered, since start)",
                self.what, self.limits.connections, self.displaced, self.refused,
            )  # fmt: skip

    def move(self, conn: _Connection, to: dict[_Connection, None]) -> bool:
        """Put `conn` last in state `to`; False when it was displaced meanwhile."""
        for state in self.states:
            if conn in state:
                del state[conn]
                to[conn] = None
                return True
        return False

    def forget(self, conn: _Connection) -> None:
        for state in self.states:
            state.pop(conn, None)

    def close_all(self) -> None:
        """Close every connection (at shutdown: Python 3.12's `wait_closed` waits for them)."""
        self.closing = True
        for state in self.states:
            for conn in list(state):
                conn.writer.transport.abort()
            state.clear()


def routes(table: Mapping[str, Callable[[], Answer]]) -> Respond:
    """A `Respond` answering GET and HEAD on the paths of `table` (query strings ignored)."""

    def respond(method: str, path: str) -> Answer:
        if method not in ("GET", "HEAD"):
            return 405, TEXT, b"method not allowed\n"
        route = table.get(path.split("?", 1)[0])
        return route() if route is not None else (404, TEXT, b"404 page not found\n")

    return respond


class Handler:
    """The stream handler of one listener: serves `respond` under `limits`. Every listener
    needs its own, since the cap counts the connections of the listener it serves."""

    def __init__(self, respond: Respond, limits: Limits = LIMITS, what: str = "HTTP endpoint"):
        self.respond = respond
        self.connections = Connections(limits, what)

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = self.connections.admit(writer)
        if conn is None:
            writer.transport.abort()
            return
        try:
            await _serve(self.respond, self.connections, conn, reader, writer)
        finally:
            self.connections.forget(conn)
            writer.close()


async def _serve(
    respond: Respond,
    connections: Connections,
    conn: _Connection,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    """HTTP/1.1 with keep-alive: enough for Prometheus, curl and the kubelet's probes."""
    limits = connections.limits
    loop = asyncio.get_running_loop()
    # A new connection's first head is due `head_seconds` after connecting; later ones get
    # `idle_seconds` for their first byte and then `head_seconds` for the rest.
    deadline: float | None = loop.time() + limits.head_seconds
    while True:
        try:
            idle_until = loop.time() + limits.idle_seconds if deadline is None else deadline
            async with asyncio.timeout_at(idle_until):
                first = await reader.readexactly(1)
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
            return
        if not connections.move(conn, connections.reading):
            return
        try:
            head_until = loop.time() + limits.head_seconds if deadline is None else deadline
            async with asyncio.timeout_at(head_until):
                head = first + await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            await _write(writer, limits, 408, TEXT, b"request head not received in time\n", False)
            return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        except asyncio.LimitOverrunError:
            await _write(writer, limits, 400, TEXT, b"request head too large\n", False)
            return
        deadline = None
        if not connections.move(conn, connections.busy):
            return
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await _write(writer, limits, 400, TEXT, b"malformed request line\n", False)
            return
        method, path, version = parts
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip().lower()
        if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
            await _write(writer, limits, 400, TEXT, b"request bodies are not accepted\n", False)
            return
        connection = headers.get("connection", "")
        keep = connection != "close" and (version == "HTTP/1.1" or connection == "keep-alive")
        try:
            status, content_type, body = respond(method, path)
        except Exception:  # a failing route answers 500 and the server keeps serving
            log.exception("%s: %s %s failed", connections.what, method, path)
            status, content_type, body = 500, TEXT, b"internal error\n"
        sent = await _write(writer, limits, status, content_type,
                            b"" if method == "HEAD" else body, keep, length=len(body))  # fmt: skip
        if not (sent and keep and connections.move(conn, connections.kept)):
            return


async def _write(
    writer: asyncio.StreamWriter,
    limits: Limits,
    status: int,
    content_type: str,
    body: bytes,
    keep: bool,
    length: int | None = None,
) -> bool:
    """Send one answer; False when the client did not take it within `write_seconds` (the
    connection is then dropped with whatever was still buffered for it)."""
    head = (
        f"HTTP/1.1 {status} {REASONS.get(status, '')}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\n"
        f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + body)
    try:
        async with asyncio.timeout(limits.write_seconds):
            await writer.drain()
    except TimeoutError:
        writer.transport.abort()
        return False
    except ConnectionError:
        return False
    return True


class Endpoint:
    """A listening endpoint: the server and the connections it holds."""

    def __init__(self, server: asyncio.Server, connections: Connections) -> None:
        self.server = server
        self.connections = connections

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self.server.sockets)

    @property
    def port(self) -> int:
        return int(self.server.sockets[0].getsockname()[1])

    def close(self) -> None:
        """Stop listening and close every connection."""
        self.server.close()
        self.connections.close_all()

    async def wait_closed(self) -> None:
        with contextlib.suppress(Exception):
            await self.server.wait_closed()

    async def aclose(self) -> None:
        self.close()
        await self.wait_closed()


async def start(
    respond: Respond,
    host: str,
    port: int,
    limits: Limits = LIMITS,
    what: str = "HTTP endpoint",
) -> Endpoint:
    """Listen on (host, port) serving `respond` under `limits`; `what` names it in logs."""
    handle = Handler(respond, limits, what)
    server = await asyncio.start_server(handle, host, port, limit=MAX_HEAD)
    return Endpoint(server, handle.connections)
