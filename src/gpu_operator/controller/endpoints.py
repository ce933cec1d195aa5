"""The operator's HTTP endpoints: /healthz, /readyz and /metrics."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def parse_address(address: str) -> tuple[str, int]:
    """`:8080` or `127.0.0.1:8080` to (host, port); an empty host binds every interface."""
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"expected an address like :8080 or 127.0.0.1:8080, got {address!r}")
    return host or "0.0.0.0", int(port)


def health_app(ready: Callable[[], bool]) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok") if ready() else web.Response(status=503, text="not ready")

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
