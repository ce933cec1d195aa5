"""The plugin's health endpoint: `GET /health` answers 200 `OK` once the plugins serve.

Upstream serves `/health` on port 5000 from inside every plugin; here it is opt-in
(`--health-port`), since simulated nodes run many plugins in one process. 503 while starting or
retrying, with the reason; the device health itself goes to the kubelet, not here.
"""

from __future__ import annotations

from gpu_operator import http_endpoint
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


async def serve(m: Manager, port: int, host: str = "0.0.0.0") -> http_endpoint.Endpoint:
    """Listen on `host:port` (with the connection limits of every endpoint of ours); the caller
    closes the returned endpoint."""

    def health() -> http_endpoint.Answer:
        code, body = status(m)
        return code, http_endpoint.TEXT, body.encode()

    return await http_endpoint.start(
        http_endpoint.routes({"/health": health}), host, port, what="device plugin health endpoint"
    )
