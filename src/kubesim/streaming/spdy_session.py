"""A server-side SPDY/3.1 session over any byte transport: a WebSocket carrying the bytes in
binary messages (kubectl 1.35's port-forward tunnel) or an HTTP connection taken over with
`101 Switching Protocols` (`Upgrade: SPDY/3.1`, what older clients and kubectl's fallback use).

Peers open streams (SYN_STREAM with headers); the session accepts them with SYN_REPLY, feeds their
data into per-stream readers, answers pings, and sends data frames back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from kubesim.streaming import spdy

log = logging.getLogger("kubesim.spdy")
# The kubelet's limit for a client to open the streams a request needs.
STREAM_CREATION_TIMEOUT = 30.0


@dataclass
class Stream:
    """One stream the peer opened: its headers and what it has sent so far."""

    stream_id: int
    headers: dict[str, str]
    incoming: asyncio.StreamReader = field(default_factory=asyncio.StreamReader)
    closed_by_us: bool = False


class Transport:
    """Bytes in and out of a session."""

    async def receive(self) -> bytes:
        """The next chunk from the peer; b"" once it is gone."""
        raise NotImplementedError

    async def send(self, data: bytes) -> None:
        """Write bytes to the peer."""
        raise NotImplementedError

    async def close(self) -> None:
        """End the connection."""


class WebSocketTransport(Transport):
    """SPDY bytes in the binary messages of a WebSocket."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws

    async def receive(self) -> bytes:
        while True:
            message = await self.ws.receive()
            if message.type == WSMsgType.BINARY:
                data: bytes = message.data
                if data:
                    return data
            elif message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                return b""
            elif message.type == WSMsgType.ERROR:
                return b""

    async def send(self, data: bytes) -> None:
        await self.ws.send_bytes(data)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.ws.close()


class _Feeder:
    """Takes the place of aiohttp's payload parser after a raw upgrade."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        self._reader.feed_data(data)
        return False, b""

    def feed_eof(self) -> None:
        self._reader.feed_eof()


class UpgradedTransport(Transport):
    """The raw bytes of an HTTP/1.1 connection after `101 Switching Protocols`."""

    def __init__(
        self, request: web.Request, response: web.StreamResponse, reader: asyncio.StreamReader
    ) -> None:
        self._request = request
        self.response = response
        self._reader = reader

    @classmethod
    async def accept(cls, request: web.Request, headers: dict[str, str]) -> UpgradedTransport:
        """Answer 101 with `Upgrade: SPDY/3.1` and take over the connection."""
        response = web.StreamResponse(
            status=101, headers={"Connection": "Upgrade", "Upgrade": "SPDY/3.1", **headers}
        )
        response.force_close()
        await response.prepare(request)
        reader = asyncio.StreamReader()
        # aiohttp keeps bytes after an upgrade until a payload parser is set (as for WebSockets).
        request.protocol.set_parser(_Feeder(reader))  # type: ignore[arg-type]
        request.protocol.keep_alive(False)
        return cls(request, response, reader)

    async def receive(self) -> bytes:
        try:
            return await self._reader.read(65536)
        except (ConnectionResetError, asyncio.IncompleteReadError):
            return b""

    async def send(self, data: bytes) -> None:
        transport = self._request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the SPDY connection is closed")
        transport.write(data)

    async def close(self) -> None:
        transport = self._request.transport
        if transport is not None:
            transport.close()


StreamHandler = Callable[[Stream], bool]


class SpdySession:
    """Frames in, frames out; `on_stream` decides whether a new stream is accepted."""

    def __init__(self, transport: Transport, on_stream: StreamHandler) -> None:
        self.transport = transport
        self.on_stream = on_stream
        self.codec = spdy.HeaderCodec()
        self.reader = spdy.FrameReader(self.codec)
        self.streams: dict[int, Stream] = {}
        self.gone = asyncio.Event()
        self._outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._last_stream = 0

    def send_frame(self, frame: bytes) -> None:
        """Queue a frame (frames leave in order)."""
        if not self.gone.is_set():
            self._outbox.put_nowait(frame)

    def send_data(self, stream: Stream, data: bytes) -> None:
        """Data on a stream."""
        if data and not stream.closed_by_us:
            self.send_frame(spdy.data(stream.stream_id, data))

    def close_stream(self, stream: Stream) -> None:
        """Half-close a stream from this side (an empty data frame with FIN)."""
        if not stream.closed_by_us:
            stream.closed_by_us = True
            self.send_frame(spdy.data(stream.stream_id, b"", fin=True))

    async def _write_loop(self) -> None:
        while True:
            frame = await self._outbox.get()
            if frame is None:
                return
            try:
                await self.transport.send(frame)
            except (ConnectionResetError, RuntimeError):
                self.gone.set()
                return

    async def run(self, work: Awaitable[object] | None = None) -> None:
        """Serve frames until the peer leaves (or `work` finishes, then flush and close)."""
        writer = asyncio.ensure_future(self._write_loop())
        reading = asyncio.ensure_future(self._read_loop())
        waits: set[asyncio.Future[Any]] = {reading}
        task = asyncio.ensure_future(work) if work is not None else None
        if task is not None:
            waits.add(task)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in (reading, task):
                if future is not None and not future.done():
                    future.cancel()
                    with contextlib.suppress(BaseException):
                        await future
            self._outbox.put_nowait(None)
            with contextlib.suppress(BaseException):
                await writer
            self.gone.set()
            for stream in self.streams.values():
                stream.incoming.feed_eof()
            await self.transport.close()

    async def _read_loop(self) -> None:
        while True:
            chunk = await self.transport.receive()
            if not chunk:
                return
            try:
                frames = self.reader.feed(chunk)
            except spdy.ProtocolError as exc:
                log.warning("SPDY protocol error from the client: %s", exc)
                self.send_frame(spdy.goaway(self._last_stream, 1))
                return
            for frame in frames:
                if not self._handle(frame):
                    return

    def _handle(self, frame: spdy.Frame) -> bool:
        if not frame.control:
            stream = self.streams.get(frame.stream_id)
            if stream is not None:
                if frame.payload:
                    stream.incoming.feed_data(frame.payload)
                if frame.fin:
                    stream.incoming.feed_eof()
            return True
        if frame.type == spdy.SYN_STREAM:
            self._open(frame)
        elif frame.type == spdy.PING:
            self.send_frame(spdy.ping(int.from_bytes(frame.payload[:4], "big")))
        elif frame.type == spdy.RST_STREAM:
            stream = self.streams.get(frame.stream_id)
            if stream is not None:
                stream.closed_by_us = True  # a reset stream takes no more frames
                stream.incoming.feed_eof()
        elif frame.type == spdy.GOAWAY:
            return False
        # SETTINGS, WINDOW_UPDATE and HEADERS need no answer: spdystream does no flow control.
        return True

    def _open(self, frame: spdy.Frame) -> None:
        stream_id = frame.stream_id
        self._last_stream = max(self._last_stream, stream_id)
        if stream_id in self.streams:
            self.send_frame(spdy.rst_stream(stream_id, spdy.PROTOCOL_ERROR))
            return
        stream = Stream(stream_id, frame.headers)
        if not self.on_stream(stream):
            self.send_frame(spdy.rst_stream(stream_id, spdy.REFUSED_STREAM))
            return
        self.streams[stream_id] = stream
        self.send_frame(spdy.syn_reply(self.codec, stream_id))
        if frame.fin:
            stream.incoming.feed_eof()


def negotiate(request: web.Request, supported: tuple[str, ...]) -> str | None:
    """The first protocol in the client's `X-Stream-Protocol-Version` list that we speak."""
    offered: list[str] = []
    for value in request.headers.getall("X-Stream-Protocol-Version", []):
        offered.extend(p.strip() for p in value.split(",") if p.strip())
    return next((p for p in offered if p in supported), None)


def wants_spdy(request: web.Request) -> bool:
    """Whether the request asks for a raw SPDY/3.1 upgrade."""
    return request.headers.get("Upgrade", "").lower().startswith("spdy/3.1")
