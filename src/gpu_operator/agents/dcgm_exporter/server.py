"""The exporter's HTTP endpoints on `:9400`: `/metrics`, `/health` and an index page.

`/metrics` returns the text the last collection rendered (a memory copy, no NVML or kubelet call).
`/health` answers 200 "OK" as upstream does, except that it turns 503 when no collection has
worked for three intervals, so a liveness probe restarts an exporter whose NVML is stuck.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from gpu_operator.agents.dcgm_exporter import exposition
from gpu_operator.agents.dcgm_exporter.collector import Collector

log = logging.getLogger(__name__)
INDEX = (
    "<html><head><title>GPU metrics exporter</title></head><body>"
    '<h1>GPU metrics exporter</h1><p><a href="/metrics">Metrics</a></p>'
    '<p><a href="/health">Health</a></p></body></html>'
)
# A request head larger than this is refused (the scrapers' heads are a few hundred bytes).
MAX_HEAD = 16384
# An idle keep-alive connection is closed after this long (Prometheus reconnects as needed).
IDLE_SECONDS = 120.0
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            503: "Service Unavailable"}  # fmt: skip


def respond(collector: Collector, method: str, path: str) -> tuple[int, str, bytes]:
    """(status, content type, body) for one request: the routes of dcgm-exporter."""
    if method not in ("GET", "HEAD"):
        return 405, "text/plain; charset=utf-8", b"method not allowed\n"
    path = path.split("?", 1)[0]
    if path == "/metrics":
        return 200, exposition.CONTENT_TYPE, collector.text
    if path == "/health":
        ok, reason = collector.healthy()
        return (200, "text/plain; charset=utf-8", b"OK") if ok else (
            503, "text/plain; charset=utf-8", reason.encode())  # fmt: skip
    if path == "/":
        return 200, "text/html; charset=utf-8", INDEX.encode()
    return 404, "text/plain; charset=utf-8", b"404 page not found\n"


async def _serve_connection(
    collector: Collector, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """HTTP/1.1 with keep-alive, enough for Prometheus, curl and probes. The exporter answers
    from memory, so a small server of its own replaces a web framework (about 11 MiB of RSS:
    the exporter's memory target is 60 MB)."""
    try:
        while True:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_SECONDS)
            except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                return
            except asyncio.LimitOverrunError:
                await _write(writer, 400, "text/plain", b"request head too large\n", False)
                return
            lines = head.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ")
            if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
                await _write(writer, 400, "text/plain", b"malformed request line\n", False)
                return
            method, path, version = parts
            headers = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if sep:
                    headers[name.strip().lower()] = value.strip().lower()
            if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
                await _write(writer, 400, "text/plain", b"request bodies are not accepted\n", False)
                return
            connection = headers.get("connection", "")
            keep = connection != "close" and (version == "HTTP/1.1" or connection == "keep-alive")
            status, content_type, body = respond(collector, method, path)
            await _write(writer, status, content_type, b"" if method == "HEAD" else body, keep,
                         length=len(body))  # fmt: skip
            if not keep:
                return
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _write(
    writer: asyncio.StreamWriter,
    status: int,
    content_type: str,
    body: bytes,
    keep: bool,
    length: int | None = None,
) -> None:
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\n"
        f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + body)
    with contextlib.suppress(ConnectionError):
        await writer.drain()


def handler(
    collector: Collector,
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """The connection handler answering `/metrics`, `/health` and `/` from `collector`."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _serve_connection(collector, reader, writer)

    return handle


async def start(collector: Collector, host: str, port: int) -> asyncio.Server:
    """Listen on (host, port) with `handler(collector)`."""
    return await asyncio.start_server(handler(collector), host, port, limit=MAX_HEAD)


def parse_listen(address: str) -> tuple[str, int]:
    """`:9400`, `0.0.0.0:9400` or `[::1]:9400` -> (host, port); ValueError names the problem."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"listen address {address!r}: expected [HOST]:PORT, e.g. :9400")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)
