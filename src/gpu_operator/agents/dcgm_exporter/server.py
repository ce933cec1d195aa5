"""The exporter's HTTP endpoints on `:9400`: `/metrics`, `/health` and an index page.

`/metrics` returns the text the last collection rendered (a memory copy, no NVML or kubelet call).
`/health` answers 200 "OK" as upstream does, except that it turns 503 when no collection has
worked for three intervals, so a liveness probe restarts an exporter whose NVML is stuck.
"""

from __future__ import annotations

import functools

from gpu_operator import http_endpoint
from gpu_operator.agents.dcgm_exporter import exposition
from gpu_operator.agents.dcgm_exporter.collector import Collector

INDEX = (
    "<html><head><title>GPU metrics exporter</title></head><body>"
    '<h1>GPU metrics exporter</h1><p><a href="/metrics">Metrics</a></p>'
    '<p><a href="/health">Health</a></p></body></html>'
)
# A request head larger than this is refused (the scrapers' heads are a few hundred bytes).
MAX_HEAD = http_endpoint.MAX_HEAD


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


def handler(collector: Collector) -> http_endpoint.Handler:
    """The connection handler answering `/metrics`, `/health` and `/` from `collector`, under the
    connection limits every endpoint of ours has (`gpu_operator.http_endpoint`)."""
    return http_endpoint.Handler(functools.partial(respond, collector), what="metrics exporter")


async def start(collector: Collector, host: str, port: int) -> http_endpoint.Endpoint:
    """Listen on (host, port) with `handler(collector)`."""
    return await http_endpoint.start(
        functools.partial(respond, collector), host, port, what="metrics exporter"
    )


def parse_listen(address: str) -> tuple[str, int]:
    """`:9400`, `0.0.0.0:9400` or `[::1]:9400` -> (host, port); ValueError names the problem."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"listen address {address!r}: expected [HOST]:PORT, e.g. :9400")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)
