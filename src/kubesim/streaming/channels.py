"""The Kubernetes remote-command WebSocket channel protocols (exec and attach), server side.

Every binary message starts with a channel byte: 0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize;
`v5.channel.k8s.io` (what kubectl 1.35 asks for) adds 255 = close, whose one-byte payload names
the channel the client has finished writing (kubectl sends it for stdin at end of input). The
error channel carries a `metav1.Status` JSON from v4 on (exit codes as `NonZeroExitCode` with an
`ExitCode` cause); v1-v3 carry plain text and only on failure. The `base64.` variants send text
messages: the channel as an ASCII digit, then the base64 payload.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from typing import Any

from aiohttp import WSMsgType, web

from kubesim.streaming.spdy_session import (
    STREAM_CREATION_TIMEOUT,
    SpdySession,
    Stream,
    Transport,
)

STDIN, STDOUT, STDERR, ERROR, RESIZE = 0, 1, 2, 3, 4
CLOSE = 255
V5 = "v5.channel.k8s.io"
PROTOCOLS = (
    V5,
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "base64.channel.k8s.io",
)
# What a raw SPDY upgrade may negotiate through `X-Stream-Protocol-Version`.
SPDY_PROTOCOLS = (
    V5,
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
)


def success_status() -> dict[str, Any]:
    """What the error channel carries when the command or attach ended well."""
    return {"metadata": {}, "status": "Success"}


def exit_status(code: int) -> dict[str, Any]:
    """A non-zero exit, in the form kubectl turns into `command terminated with exit code N`."""
    return {
        "metadata": {},
        "status": "Failure",
        "message": (
            f"command terminated with non-zero exit code: command terminated with exit code {code}"
        ),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


def internal_error_status(message: str) -> dict[str, Any]:
    """A failure before or around the command (kubectl prints `error: <message>`)."""
    text = f"Internal error occurred: {message}"
    return {
        "metadata": {},
        "status": "Failure",
        "message": text,
        "reason": "InternalError",
        "details": {"causes": [{"message": message}]},
        "code": 500,
    }


class ChannelSession:
    """One upgraded exec/attach connection: a reader for client input, ordered output."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self.protocol = ws.ws_protocol or "channel.k8s.io"
        self.base64 = ".base64." in f".{self.protocol}"
        head = self.protocol.split(".", 1)[0]
        self.version = int(head[1:]) if head.startswith("v") and head[1:].isdigit() else 1
        self.stdin = asyncio.StreamReader()
        self.client_gone = asyncio.Event()
        self._outbox: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue()
        self._writer = asyncio.ensure_future(self._write_loop())
        self._reader = asyncio.ensure_future(self._read_loop())

    def send(self, channel: int, data: bytes) -> None:
        """Queue output on a channel (order is kept across channels)."""
        if data and not self.client_gone.is_set():
            self._outbox.put_nowait((channel, data))

    async def _write_loop(self) -> None:
        while True:
            item = await self._outbox.get()
            if item is None:
                return
            channel, data = item
            try:
                if self.base64:
                    await self.ws.send_str(str(channel) + base64.b64encode(data).decode())
                else:
                    await self.ws.send_bytes(bytes([channel]) + data)
            except (ConnectionResetError, RuntimeError):
                self.client_gone.set()
                return

    async def _read_loop(self) -> None:
        try:
            async for message in self.ws:
                if message.type == WSMsgType.BINARY:
                    payload: bytes = message.data
                elif message.type == WSMsgType.TEXT and self.base64:
                    text: str = message.data
                    if not text:
                        continue
                    payload = bytes([int(text[0])]) + base64.b64decode(text[1:])
                else:
                    continue
                if not payload:
                    continue
                channel, data = payload[0], payload[1:]
                if channel == STDIN:
                    if data and not self.stdin.at_eof():
                        self.stdin.feed_data(data)
                elif (
                    channel == CLOSE
                    and self.version >= 5
                    and data[:1] == bytes([STDIN])
                    and not self.stdin.at_eof()
                ):
                    self.stdin.feed_eof()
                # Resize events have nothing to resize in a simulated container.
        finally:
            self.client_gone.set()
            if not self.stdin.at_eof():
                self.stdin.feed_eof()

    async def finish(self, status: dict[str, Any]) -> None:
        """Flush output, report the outcome on the error channel and close normally."""
        self._outbox.put_nowait(None)
        with contextlib.suppress(Exception):
            await self._writer
        if not self.client_gone.is_set():
            if self.version >= 4:
                payload = json.dumps(status, separators=(",", ":")).encode()
            else:
                payload = (
                    str(status.get("message", "")).encode()
                    if status["status"] != "Success"
                    else b""
                )
            with contextlib.suppress(ConnectionResetError, RuntimeError):
                if payload:
                    if self.base64:
                        await self.ws.send_str(str(ERROR) + base64.b64encode(payload).decode())
                    else:
                        await self.ws.send_bytes(bytes([ERROR]) + payload)
        with contextlib.suppress(Exception):
            await self.ws.close()
        self._reader.cancel()
        with contextlib.suppress(BaseException):
            await self._reader


class SpdyChannelSession:
    """The same channels over a raw `Upgrade: SPDY/3.1` connection: one SPDY stream per channel,
    opened by the client with a `streamType` header (error, stdin, stdout, stderr, resize)."""

    KINDS = {"stdin": STDIN, "stdout": STDOUT, "stderr": STDERR, "error": ERROR, "resize": RESIZE}

    def __init__(self, transport: Transport, protocol: str, expected: set[int]) -> None:
        self.protocol = protocol or "channel.k8s.io"
        head = self.protocol.split(".", 1)[0]
        self.version = int(head[1:]) if head.startswith("v") and head[1:].isdigit() else 1
        self.expected = expected
        self.stdin = asyncio.StreamReader()
        self.ready = asyncio.Event()
        self.streams: dict[int, Stream] = {}
        self.session = SpdySession(transport, self._on_stream)
        self.client_gone = self.session.gone
        self._done = asyncio.Event()
        self._pumps: set[asyncio.Task[None]] = set()
        self._runner = asyncio.ensure_future(self.session.run(self._done.wait()))

    def _on_stream(self, stream: Stream) -> bool:
        channel = self.KINDS.get(stream.headers.get("streamtype", ""))
        if channel is None or channel in self.streams:
            return False
        self.streams[channel] = stream
        if channel == STDIN:
            pump = asyncio.ensure_future(self._pump_stdin(stream))
            self._pumps.add(pump)
            pump.add_done_callback(self._pumps.discard)
        if self.expected <= set(self.streams):
            self.ready.set()
        return True

    async def _pump_stdin(self, stream: Stream) -> None:
        while data := await stream.incoming.read(65536):
            self.stdin.feed_data(data)
        self.stdin.feed_eof()

    async def wait_ready(self, timeout: float = STREAM_CREATION_TIMEOUT) -> bool:
        """Wait until the client has opened every stream the request asked for."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.ready.wait(), timeout)
        return self.ready.is_set()

    def send(self, channel: int, data: bytes) -> None:
        """Write to an output channel's stream (dropped when the client did not open it)."""
        stream = self.streams.get(channel)
        if stream is not None and data:
            self.session.send_data(stream, data)

    async def finish(self, status: dict[str, Any]) -> None:
        """Report the outcome on the error stream, close every stream and the connection."""
        error = self.streams.get(ERROR)
        if error is not None:
            if self.version >= 4:
                self.session.send_data(error, json.dumps(status, separators=(",", ":")).encode())
            elif status["status"] != "Success":
                self.session.send_data(error, str(status.get("message", "")).encode())
        for stream in self.streams.values():
            self.session.close_stream(stream)
        self._done.set()
        with contextlib.suppress(BaseException):
            await self._runner
        for pump in list(self._pumps):
            pump.cancel()
