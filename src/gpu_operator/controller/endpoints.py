"""The operator's HTTP endpoints: /healthz, /readyz and /metrics."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def parse_address(address: str) -> tuple[str, int]:
    """`:8080`, `127.0.0.1:8080` or `[fd00::1]:8080` to (host, port); an empty host binds every
    interface. Brackets are accepted around any host, so the chart can write `[$(POD_IP)]:8081`
    for IPv4 and IPv6 pod IPs alike."""
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit() or "[" in host or "]" in host:
        raise ValueError(
            f"expected an address like :8080, 127.0.0.1:8080 or [fd00::1]:8080, got {address!r}"
        )
    return host or "0.0.0.0", int(port)


Check = Callable[[], "bool | tuple[bool, str]"]


def _answer(check: Check, failed: str) -> web.Response:
    result = check()
    ok, why = result if isinstance(result, tuple) else (result, "ok" if result else failed)
    return web.Response(text=why) if ok else web.Response(status=503, text=why)


def health_app(ready: Check, live: Check | None = None) -> web.Application:
    """/readyz from `ready`, /healthz from `live` (always ok without one); each check returns
    a verdict or (verdict, reason), and the reason is the response body."""

    async def healthz(_: web.Request) -> web.Response:
        return _answer(live, "not live") if live is not None else web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        return _answer(ready, "not ready")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


def metrics_app(registry: CollectorRegistry) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


async def serve(app: web.Application, address: str) -> web.AppRunner:
    """Start serving `app` on `address`; the caller cleans the runner up."""
    host, port = parse_address(address)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
