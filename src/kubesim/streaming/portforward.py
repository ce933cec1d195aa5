"""`pods/portforward`: the `portforward.k8s.io` protocol over SPDY/3.1.

kubectl 1.35 tunnels SPDY through a WebSocket (subprotocol `SPDY/3.1+portforward.k8s.io`) and
falls back to a plain `Upgrade: SPDY/3.1` when the WebSocket handshake fails; both are served.
Each forwarded connection is a pair of streams the client opens with the same `requestID`
header: `streamType: error` and `streamType: data`, both with `port`. kubesim connects the data
stream to the local listener a runner declared for that pod port (`ctx.serve_port`); when nothing
listens there the error stream carries the runtime's "connection refused" text, which kubectl
prints as `an error occurred forwarding L -> P: ...` before dropping the tunnel.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from typing import Any

from aiohttp import web

from kubesim import errors
from kubesim.streaming.runtime import ContainerRuntime
from kubesim.streaming.spdy_session import (
    SpdySession,
    Stream,
    UpgradedTransport,
    WebSocketTransport,
    negotiate,
    wants_spdy,
)

PROTOCOL = "portforward.k8s.io"
TUNNEL_PROTOCOL = f"SPDY/3.1+{PROTOCOL}"


def sandbox_id(uid: str) -> str:
    """A stable pod sandbox id (the kubelet reports sandboxes, not pods, in these errors)."""
    return hashlib.sha256(uid.encode()).hexdigest()


def refused_message(pod: dict[str, Any], port: str) -> str:
    """containerd's text for a pod port nobody listens on, wrapped as the kubelet does."""
    uid = pod["metadata"].get("uid", "")
    sandbox = sandbox_id(uid)
    return (
        f"error forwarding port {port} to pod {sandbox}, uid : failed to execute portforward in "
        f'network namespace "/var/run/netns/cni-{uid}": failed to connect to localhost:{port} '
        f'inside namespace "{sandbox}", IPv4: dial tcp4 127.0.0.1:{port}: connect: connection '
        f"refused IPv6 dial tcp6 [::1]:{port}: connect: connection refused "
    )


class PortForwarder:
    """Pairs the client's streams by request id and bridges each pair to a local listener."""

    def __init__(self, pod: dict[str, Any], runtime: ContainerRuntime) -> None:
        self.pod = pod
        self.runtime = runtime
        self.session: SpdySession | None = None
        self.pairs: dict[str, dict[str, Stream]] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    async def serve(self, session: SpdySession) -> None:
        """Run the session; forwarding tasks end with it."""
        self.session = session
        try:
            await session.run()
        finally:
            for task in list(self.tasks):
                task.cancel()
            for task in list(self.tasks):
                with contextlib.suppress(BaseException):
                    await task

    def on_stream(self, stream: Stream) -> bool:
        """Accept error/data streams and start forwarding once a pair is complete."""
        kind = stream.headers.get("streamtype", "")
        if kind not in ("error", "data"):
            return False
        request_id = stream.headers.get("requestid")
        if not request_id:
            # Old clients send no request id: pair by consecutive stream ids, as the kubelet does.
            request_id = str(stream.stream_id if kind == "error" else stream.stream_id - 2)
        pair = self.pairs.setdefault(request_id, {})
        if kind in pair:
            return False
        pair[kind] = stream
        if len(pair) == 2:
            del self.pairs[request_id]
            task = asyncio.ensure_future(self._forward(pair["data"], pair["error"]))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return True

    async def _forward(self, data: Stream, error: Stream) -> None:
        session = self.session
        assert session is not None
        port = data.headers.get("port", "")
        uid = self.pod["metadata"].get("uid", "")
        address = self.runtime.port(uid, int(port)) if port.isdigit() else None
        connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        if address is not None:
            with contextlib.suppress(OSError):
                connection = await asyncio.open_connection(*address)
        if connection is None:
            session.send_data(error, refused_message(self.pod, port).encode())
            session.close_stream(data)
            session.close_stream(error)
            return
        reader, writer = connection
        upstream = asyncio.ensure_future(_client_to_pod(data, writer))
        try:
            while chunk := await reader.read(32768):
                session.send_data(data, chunk)
        except OSError:
            pass
        finally:
            upstream.cancel()
            with contextlib.suppress(BaseException):
                await upstream
            writer.close()
            session.close_stream(data)
            session.close_stream(error)


async def _client_to_pod(data: Stream, writer: asyncio.StreamWriter) -> None:
    while chunk := await data.incoming.read(32768):
        writer.write(chunk)
        await writer.drain()
    with contextlib.suppress(OSError):
        if writer.can_write_eof():
            writer.write_eof()


async def serve_portforward(
    request: web.Request, pod: dict[str, Any], runtime: ContainerRuntime
) -> web.StreamResponse:
    """Upgrade (tunnelled or plain SPDY) and forward the client's connections."""
    if not (pod.get("spec") or {}).get("nodeName"):
        raise errors.bad_request(f"pod {pod['metadata']['name']} does not have a host assigned")
    forwarder = PortForwarder(pod, runtime)
    ws = web.WebSocketResponse(protocols=(TUNNEL_PROTOCOL,), autoping=True, max_msg_size=0)
    if ws.can_prepare(request).ok:
        await ws.prepare(request)
        if ws.ws_protocol != TUNNEL_PROTOCOL:
            await ws.close(message=f"unable to negotiate protocol; use {TUNNEL_PROTOCOL}".encode())
            return ws
        await forwarder.serve(SpdySession(WebSocketTransport(ws), forwarder.on_stream))
        return ws
    if not wants_spdy(request):
        raise errors.bad_request("Upgrade request required")
    if negotiate(request, (PROTOCOL,)) is None:
        raise errors.ApiError(
            403,
            "unable to upgrade: unable to negotiate protocol: client supports "
            f"{request.headers.getall('X-Stream-Protocol-Version', [])}, server accepts "
            f"[{PROTOCOL}]",
            reason="Forbidden",
        )
    transport = await UpgradedTransport.accept(request, {"X-Stream-Protocol-Version": PROTOCOL})
    await forwarder.serve(SpdySession(transport, forwarder.on_stream))
    return transport.response
