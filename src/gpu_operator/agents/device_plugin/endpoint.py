"""The plugin's health endpoint: `GET /health` answers 200 `OK` once the plugins serve.

Upstream serves `/health` on port 5000 from inside every plugin; here it is opt-in
(`--health-port`), since simulated nodes run many plugins in one process. 503 while starting or
retrying, with the reason; the device health itself goes to the kubelet, not here.
"""

from __future__ import annotations

import asyncio
import contextlib

from gpu_operator.agents.device_plugin.manager import Manager


def status(m: Manager) -> tuple[int, str]:
    """The HTTP status and body for the manager's current state."""
    state = m.state
    if not state.serving.is_set():
        return 503, f"not serving: {state.last_error or 'starting'}\n"
    unhealthy = sorted(m.state.monitor.faults) if m.state.monitor is not None else []
    lines = ["OK"]
    if state.idle_reason:
        lines.append(f"idle: {state.idle_reason}")
    lines += [f"serving {s.resource.name} on {s.socket}" for s in state.servers]
    lines += [f"unhealthy {u}" for u in unhealthy]
    return 200, "\n".join(lines) + "\n"


async def serve(m: Manager, port: int, host: str = "0.0.0.0") -> asyncio.Server:
    """Listen on `host:port`; the caller closes the returned server."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            parts = request.decode(errors="replace").split()
            if len(parts) >= 2 and parts[0] == "GET" and parts[1] == "/health":
                code, body = status(m)
            else:
                code, body = 404, "not found\n"
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[code]
            data = body.encode()
            writer.write(
                f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                + data
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    return await asyncio.start_server(handle, host, port)
