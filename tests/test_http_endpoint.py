"""The HTTP server behind every endpoint our programs open to the network: the connection cap
(who is displaced, who is refused), the head, idle and write deadlines, and shutdown; then the
cap on each real endpoint (metrics exporter, node status exporter, operator health and metrics,
device plugin health)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from waiting import eventually, within

from gpu_operator import http_endpoint
from gpu_operator.agents.dcgm_exporter import collector, server
from gpu_operator.agents.device_plugin import endpoint as plugin_endpoint
from gpu_operator.agents.device_plugin import manager
from gpu_operator.agents.device_plugin import settings as dp_settings
from gpu_operator.agents.node_status_exporter import command as status_command
from gpu_operator.agents.node_status_exporter import runner as status_runner
from gpu_operator.controller import endpoints
from gpu_operator.nvml import mock

# Long enough never to matter where a test is about something else.
NEVER = 3600.0
BIG = b"x" * (32 << 20)  # more than any socket buffers hold: its writer blocks on a non-reader


def answers() -> http_endpoint.Respond:
    return http_endpoint.routes(
        {"/": lambda: (200, http_endpoint.TEXT, b"hello\n"),
         "/big": lambda: (200, http_endpoint.TEXT, BIG)}
    )  # fmt: skip


@contextlib.asynccontextmanager
async def listening(**limits: float) -> AsyncIterator[http_endpoint.Endpoint]:
    given = {"idle_seconds": NEVER, "head_seconds": NEVER, "write_seconds": NEVER, **limits}
    ep = await http_endpoint.start(
        answers(),
        "127.0.0.1",
        0,
        http_endpoint.Limits(
            connections=int(given.pop("connections", 128)),
            idle_seconds=given["idle_seconds"],
            head_seconds=given["head_seconds"],
            write_seconds=given["write_seconds"],
        ),
    )
    try:
        yield ep
    finally:
        await within(ep.aclose(), "the endpoint to close")


class Client:
    """One connection, seen from the client."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int, rcvbuf: int | None = None) -> Client:
        if rcvbuf is None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        else:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
            reader, writer = await asyncio.open_connection(sock=sock)
        return cls(reader, writer)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def answer(self) -> bytes:
        """One whole answer (head and body)."""
        head = await within(self.reader.readuntil(b"\r\n\r\n"), "an answer's head")
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        return head + await within(self.reader.readexactly(length), "an answer's body")

    @property
    def closed(self) -> bool:
        """The server closed or reset the connection (nothing unread is left before that)."""
        return self.reader.at_eof() or self.reader.exception() is not None

    async def rest(self) -> bytes:
        """Everything until the server closes the connection."""
        with contextlib.suppress(ConnectionError):
            return await within(self.reader.read(), "the server to close the connection")
        return b""

    def close(self) -> None:
        self.writer.close()


async def test_at_the_cap_a_newcomer_closes_a_slow_then_a_silent_then_an_answered_one() -> None:
    async with listening(connections=3) as ep:
        conns = ep.connections
        get = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
        answered = await Client.open(ep.port)  # the oldest: a scraper between scrapes
        answered.send(get)
        await answered.answer()
        silent = await Client.open(ep.port)  # no byte yet
        await eventually(lambda: len(conns.fresh) == 1, "a connection without a request")
        slow = await Client.open(ep.port)  # the youngest, on part of a head
        slow.send(b"GET / HT")
        await eventually(lambda: len(conns.reading) == 1, "a connection reading its head")

        fourth = await Client.open(ep.port)
        await eventually(lambda: slow.closed, "the connection on an unfinished head closed")
        assert not silent.closed
        await eventually(lambda: len(conns.fresh) == 2, "two connections without a request")
        fifth = await Client.open(ep.port)
        await eventually(lambda: silent.closed, "the oldest connection without a byte closed")
        assert not fourth.closed
        assert not answered.closed  # the oldest of all, but it was answered

        # Once every other connection was answered, the one kept alive longest makes room.
        for client in (fourth, fifth):
            client.send(get)
            assert (await client.answer()).endswith(b"hello\n")
        sixth = await Client.open(ep.port)
        await eventually(lambda: answered.closed, "the connection kept alive longest closed")
        assert conns.displaced == 3
        for client in (fourth, fifth, sixth):
            assert not client.closed
        sixth.send(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await sixth.rest()).startswith(b"HTTP/1.1 200 OK")
        for client in (answered, slow, silent, fourth, fifth, sixth):
            client.close()


async def test_a_newcomer_is_refused_when_every_connection_is_being_answered() -> None:
    async with listening(connections=1) as ep:
        reader_less = await Client.open(ep.port, rcvbuf=4096)
        reader_less.send(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")  # and never read
        await eventually(lambda: len(ep.connections.busy) == 1, "an answer stuck on its client")
        newcomer = await Client.open(ep.port)
        assert await newcomer.rest() == b""
        assert ep.connections.refused == 1
        assert len(ep.connections.busy) == 1
        reader_less.close()
        newcomer.close()


async def test_a_client_that_does_not_read_its_answer_is_dropped_after_write_seconds() -> None:
    async with listening(write_seconds=0.3) as ep:
        reader_less = await Client.open(ep.port, rcvbuf=4096)
        reader_less.send(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        await eventually(lambda: len(ep.connections.busy) == 1, "an answer being written")
        await eventually(lambda: len(ep.connections) == 0, "the connection dropped")
        assert len(await reader_less.rest()) < len(BIG)
        reader_less.close()


@pytest.mark.parametrize(
    "opening",
    [b"", b"G", b"GET / HTTP/1.1\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: "],
    ids=["silent", "one-byte", "request-line", "half-a-header"],
)
async def test_a_first_head_not_complete_in_head_seconds_is_cut_even_while_bytes_trickle(
    opening: bytes,
) -> None:
    async with listening(head_seconds=0.5) as ep:
        client = await Client.open(ep.port)
        client.send(opening)

        async def trickle() -> None:  # a byte every 50 ms: never a gap of head_seconds
            with contextlib.suppress(ConnectionError):
                while not client.closed:
                    await asyncio.sleep(0.05)
                    if opening:
                        client.send(b"a")

        trickling = asyncio.create_task(trickle())
        rest = await client.rest()
        await trickling
        # A connection that sent part of a head is told why; a silent one is just closed.
        if opening:
            assert rest.startswith(b"HTTP/1.1 408 Request Timeout"), rest
            assert b"request head not received in time" in rest
        else:
            assert rest == b""
        await eventually(lambda: len(ep.connections) == 0, "the connection forgotten")
        client.close()


async def test_a_kept_alive_connection_is_closed_after_idle_seconds_without_a_request() -> None:
    async with listening(idle_seconds=0.3) as ep:
        client = await Client.open(ep.port)
        for _ in range(2):  # keep-alive: two requests on one connection
            client.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await client.answer()).endswith(b"hello\n")
        assert await client.rest() == b""
        await eventually(lambda: len(ep.connections) == 0, "the connection forgotten")
        client.close()


async def test_closing_the_endpoint_closes_its_kept_alive_connections() -> None:
    ep = await http_endpoint.start(answers(), "127.0.0.1", 0)
    client = await Client.open(ep.port)
    client.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await client.answer()
    await within(ep.aclose(), "the endpoint to close")
    assert await client.rest() == b""
    client.close()


async def test_a_failing_route_answers_500_and_the_connection_keeps_serving(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken() -> http_endpoint.Answer:
        raise RuntimeError("registry collector failed")

    routes = http_endpoint.routes({"/": lambda: (200, http_endpoint.TEXT, b"ok\n"), "/x": broken})
    ep = await http_endpoint.start(routes, "127.0.0.1", 0, what="test endpoint")
    try:
        client = await Client.open(ep.port)
        client.send(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await client.answer()).startswith(b"HTTP/1.1 500 Internal Server Error")
        assert (await client.answer()).endswith(b"ok\n")
        assert "test endpoint: GET /x failed" in caplog.text
        assert "registry collector failed" in caplog.text
        client.close()
    finally:
        await ep.aclose()


def test_a_connection_accepted_while_the_endpoint_closes_is_not_admitted() -> None:
    connections = http_endpoint.Connections(http_endpoint.LIMITS, "test endpoint")
    connections.close_all()
    assert connections.admit(None) is None  # type: ignore[arg-type]
    assert len(connections) == 0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("connections", 0, "connections 0: at least 1"),
        ("idle_seconds", 0, "idle_seconds 0: must be positive"),
        ("head_seconds", -1, "head_seconds -1: must be positive"),
        ("write_seconds", 0, "write_seconds 0: must be positive"),
    ],
)
def test_limits_refuse_values_that_would_turn_a_limit_off(
    field: str, value: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        http_endpoint.Limits(**{field: value})  # type: ignore[arg-type]


# ----- every endpoint that faces the network ----------------------------------------------------

Started = tuple[int, Callable[[], Awaitable[None]]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def metrics_exporter(_: Path) -> Started:
    c = collector.Collector(mock.MockMachine.from_preset("t4x4").nvml, collector.Settings())
    c.start()
    await c.collect()
    ep = await server.start(c, "127.0.0.1", 0)

    async def close() -> None:
        await ep.aclose()
        c.stop()

    return ep.port, close


async def node_status_exporter(tmp_path: Path) -> Started:
    async def devices() -> int:
        return 0

    probes = status_runner.Probes(
        tmp_path, mock.MockMachine.from_preset("t4x4").nvml, devices, lambda: 0
    )
    exporter = status_runner.Exporter("node-1", probes, interval=NEVER)
    port, stop = free_port(), asyncio.Event()
    task = asyncio.create_task(status_command.serve(exporter, port, stop))

    async def serves() -> bool:
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return True
        return False

    await eventually(serves, "the node status exporter to listen")

    async def close() -> None:
        stop.set()
        await within(task, "the node status exporter to stop")

    return port, close


async def operator_health(_: Path) -> Started:
    ep = await endpoints.serve(endpoints.health_routes(lambda: True), "127.0.0.1:0", "health")
    return ep.port, ep.aclose


async def operator_metrics(_: Path) -> Started:
    routes = endpoints.metrics_routes(CollectorRegistry())
    ep = await endpoints.serve(routes, "127.0.0.1:0", "metrics")
    return ep.port, ep.aclose


async def device_plugin_health(tmp_path: Path) -> Started:
    settings = dp_settings.build(None, {}, kubelet_socket=tmp_path / "k.sock", plugin_dir=tmp_path)
    m = manager.Manager(settings, mock.MockMachine.from_preset("t4x4").nvml)
    ep = await plugin_endpoint.serve(m, 0, "127.0.0.1")
    return ep.port, ep.aclose


@pytest.mark.parametrize(
    ("start", "path"),
    [
        (metrics_exporter, "/metrics"),
        (node_status_exporter, "/metrics"),
        (operator_health, "/readyz"),
        (operator_metrics, "/metrics"),
        (device_plugin_health, "/health"),
    ],
    ids=lambda v: getattr(v, "__name__", v),
)
async def test_every_network_endpoint_holds_at_most_the_cap_and_still_answers(
    start: Callable[[Path], Awaitable[Started]], path: str, tmp_path: Path
) -> None:
    port, close = await start(tmp_path)
    extra = 20
    clients: list[Client] = []
    try:
        # Kept-alive connections after one answer each: what an idle flood leaves behind.
        for _ in range(http_endpoint.LIMITS.connections + extra):
            client = await Client.open(port)
            client.send(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            await client.answer()
            clients.append(client)
        await eventually(
            lambda: sum(c.closed for c in clients) >= extra,
            "the connections over the cap closed",
            state=lambda: sum(c.closed for c in clients),
        )
        # The oldest were closed, the newest kept.
        assert [c.closed for c in clients] == [True] * extra + [False] * (len(clients) - extra)
        last = await Client.open(port)
        last.send(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        assert (await last.rest()).split(b" ", 2)[1] in (b"200", b"503")
        clients.append(last)
    finally:
        for c in clients:
            c.close()
        await close()
