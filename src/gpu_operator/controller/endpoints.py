"""The operator's HTTP endpoints: /healthz, /readyz and /metrics."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gpu_operator import http_endpoint


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


def _answer(check: Check, failed: str) -> http_endpoint.Answer:
    result = check()
    ok, why = result if isinstance(result, tuple) else (result, "ok" if result else failed)
    return 200 if ok else 503, http_endpoint.TEXT, why.encode()


def health_routes(ready: Check, live: Check | None = None) -> http_endpoint.Respond:
    """/readyz from `ready`, /healthz from `live` (always ok without one); each check returns
    a verdict or (verdict, reason), and the reason is the response body."""

    def healthz() -> http_endpoint.Answer:
        return _answer(live, "not live") if live is not None else (200, http_endpoint.TEXT, b"ok")

    return http_endpoint.routes(
        {"/healthz": healthz, "/readyz": lambda: _answer(ready, "not ready")}
    )


def metrics_routes(registry: CollectorRegistry) -> http_endpoint.Respond:
    """/metrics: the registry in Prometheus' text format."""
    return http_endpoint.routes(
        {"/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(registry))}
    )


async def serve(respond: http_endpoint.Respond, address: str, what: str) -> http_endpoint.Endpoint:
    """Start serving `respond` on `address` (with the connection limits of every endpoint of
    ours); the caller closes the returned endpoint."""
    host, port = parse_address(address)
    return await http_endpoint.start(respond, host, port, what=what)
