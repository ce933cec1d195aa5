"""The exporter as a program: HTTP endpoints, the collection loop, counters reload, XID events,
health, and the command line's errors."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from typer.testing import CliRunner
from waiting import DEADLINE, eventually, within

from gpu_operator import nvml
from gpu_operator.agents.dcgm_exporter import collector, command, exposition, server
from gpu_operator.cli import app
from gpu_operator.nvml import mock

COUNTERS = "DCGM_FI_DEV_GPU_TEMP, gauge, temp\nDCGM_FI_DEV_XID_ERRORS, gauge, xid\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def running(
    machine: mock.MockMachine, settings: collector.Settings, port: int | None = None
) -> AsyncIterator[tuple[collector.Collector, str]]:
    """A served exporter; yields it and its base URL."""
    exporter = collector.Collector(machine.nvml, settings)
    port = port or free_port()
    stop = asyncio.Event()
    serving = asyncio.Event()
    task = asyncio.create_task(
        command.serve(exporter, f"127.0.0.1:{port}", stop, install_signals=False, serving=serving)
    )
    try:
        await within(serving.wait(), "the exporter to serve")
        yield exporter, f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        await within(task, "the exporter to stop")


async def get(url: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


async def test_metrics_health_and_index_are_served() -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    async with running(machine, collector.Settings(interval=3600)) as (_, base):
        status, ctype, body = await get(base + "/metrics")
        assert status == 200
        assert ctype == exposition.CONTENT_TYPE
        assert body.count("DCGM_FI_DEV_GPU_UTIL{") == 4
        assert await get(base + "/health") == (200, "text/plain; charset=utf-8", "OK")
        index = await get(base + "/")
        assert 'href="/metrics"' in index[2]


async def raw(port: int, request: bytes) -> bytes:
    """Send raw bytes and read until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = await within(reader.read(), "the server to answer and close")
    writer.close()
    return data


async def test_http_keeps_connections_alive_and_answers_head_404_405_and_bad_requests() -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    async with running(machine, collector.Settings(interval=3600)) as (_, base):
        port = int(base.rsplit(":", 1)[1])
        # Two requests on one connection (Prometheus keeps its connections), then a close.
        both = await raw(
            port,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /health?x=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        assert both.count(b"HTTP/1.1 200 OK") == 2
        assert b"DCGM_FI_DEV_GPU_UTIL" in both
        assert both.endswith(b"OK")
        head = await raw(port, b"HEAD /metrics HTTP/1.0\r\n\r\n")
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        assert length > 1000
        assert head.endswith(b"\r\n\r\n")
        assert (await raw(port, b"GET /nope HTTP/1.0\r\n\r\n")).startswith(b"HTTP/1.1 404")
        assert (await raw(port, b"POST /metrics HTTP/1.0\r\n\r\n")).startswith(b"HTTP/1.1 405")
        assert (await raw(port, b"nonsense\r\n\r\n")).startswith(b"HTTP/1.1 400")
        huge = b"GET / HTTP/1.1\r\nX: " + b"a" * (server.MAX_HEAD + 10) + b"\r\n\r\n"
        assert (await raw(port, huge)).startswith(b"HTTP/1.1 400")
        # The server still answers after all that.
        assert (await get(base + "/health"))[0] == 200


# The connection cap and head deadline of every endpoint of ours (docs/exporter.md, "Connections").
CAP = 128
HEAD_SECONDS = 10.0


async def test_connections_over_the_cap_close_the_longest_idle_and_scrapes_still_answer() -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    async with running(machine, collector.Settings(interval=3600)) as (_, base):
        port = int(base.rsplit(":", 1)[1])
        extra = 50
        held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            # What an idle flood leaves: kept-alive connections after one answer each.
            for _ in range(CAP + extra):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                await within(reader.readuntil(b"\r\n\r\nOK"), "the /health answer")
                held.append((reader, writer))

            def closed() -> list[bool]:
                return [r.at_eof() or r.exception() is not None for r, _ in held]

            await eventually(
                lambda: sum(closed()) >= extra, "the connections over the cap closed",
                state=lambda: sum(closed()),
            )  # fmt: skip
            assert closed() == [True] * extra + [False] * CAP  # the oldest go first
            status, _, body = await get(base + "/metrics")  # a scraper still gets in
            assert status == 200
            assert "DCGM_FI_DEV_GPU_UTIL" in body
        finally:
            for _, writer in held:
                writer.close()


@pytest.mark.parametrize(
    "opening",
    [b"", b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: "],
    ids=["silent", "slowloris"],
)
async def test_a_connection_without_a_whole_head_in_ten_seconds_is_closed(opening: bytes) -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    async with running(machine, collector.Settings(interval=3600)) as (_, base):
        reader, writer = await asyncio.open_connection("127.0.0.1", int(base.rsplit(":", 1)[1]))
        writer.write(opening)
        loop = asyncio.get_running_loop()
        opened = loop.time()

        async def trickle() -> None:  # a byte a second, for as long as the server listens
            with contextlib.suppress(ConnectionError):
                while opening and not reader.at_eof() and reader.exception() is None:
                    writer.write(b"a")
                    await writer.drain()
                    await asyncio.sleep(1)

        trickling = asyncio.create_task(trickle())
        rest = b""
        with contextlib.suppress(ConnectionError):
            rest = await within(reader.read(), "the exporter to close the connection")
        closed_after = loop.time() - opened
        await trickling
        writer.close()
        assert closed_after >= HEAD_SECONDS - 0.5, "closed before its head deadline"
        if opening:
            assert rest.startswith(b"HTTP/1.1 408 Request Timeout"), rest


async def test_a_changed_counters_file_is_adopted_and_a_broken_one_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "dcgm-metrics.csv"
    path.write_text(COUNTERS)
    machine = mock.MockMachine.from_preset("t4x4")
    exporter = collector.Collector(machine.nvml, collector.Settings(counters_path=path))
    exporter.start()
    try:
        assert [c.name for c in exporter.counters.counters] == [
            "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS",
        ]  # fmt: skip
        path.write_text("DCGM_FI_DEV_FB_USED, gauge, used\n")
        assert exporter.maybe_reload()
        assert b"DCGM_FI_DEV_FB_USED{" in exporter.render_once()
        path.write_text("DCGM_FI_DEV_FB_USED, gauge, used\nDCGM_FI_DEV_GPU_UTILS, gauge, u\n")
        with caplog.at_level(logging.ERROR, "gpu_operator.agents.dcgm_exporter"):
            assert not exporter.maybe_reload()
        assert [c.name for c in exporter.counters.counters] == ["DCGM_FI_DEV_FB_USED"]
        assert "keeping the last good set" in caplog.text
        assert "line 2: unknown DCGM field 'DCGM_FI_DEV_GPU_UTILS'" in caplog.text
    finally:
        exporter.stop()


async def test_reload_request_rereads_at_once_in_the_running_loop(tmp_path: Path) -> None:
    path = tmp_path / "dcgm-metrics.csv"
    path.write_text(COUNTERS)
    machine = mock.MockMachine.from_preset("t4x4")
    async with running(machine, collector.Settings(counters_path=path, interval=3600)) as (
        exporter,
        base,
    ):
        path.write_text("DCGM_FI_DEV_POWER_USAGE, gauge, watts\n")
        exporter.reload()
        await exporter.wait_for_collections(2, timeout=DEADLINE)
        body = (await get(base + "/metrics"))[2]
        assert "DCGM_FI_DEV_POWER_USAGE{" in body
        assert "DCGM_FI_DEV_GPU_TEMP" not in body


async def test_an_xid_event_reaches_the_metric_through_the_event_watcher(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_text(COUNTERS)
    machine = mock.MockMachine.from_preset("t4x4")
    exporter = collector.Collector(machine.nvml, collector.Settings(counters_path=path))
    exporter.start()
    try:
        assert await asyncio.to_thread(exporter.xids.watching.wait, DEADLINE)
        machine.inject_xid(2, 48)
        assert await asyncio.to_thread(exporter.xids.wait_for_count, 1, DEADLINE)
        assert exporter.xids.last(machine.gpus[2].uuid) == 48
        text = exporter.render_once().decode()
        assert 'gpu="2"' in text
        assert 'err_code="48",err_msg="Double Bit ECC Error"} 48' in text
    finally:
        exporter.stop()


async def test_health_turns_503_when_collections_keep_failing() -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    now = [1000.0]
    exporter = collector.Collector(
        machine.nvml, collector.Settings(interval=10), clock=lambda: now[0]
    )
    exporter.start()
    try:
        await exporter.collect()
        assert exporter.healthy() == (True, "OK")
        machine.fail_next("device_count", nvml.Unknown("driver wedged"), times=None)
        await exporter.collect()
        assert exporter.text  # the previous collection is still served
        now[0] += 91
        ok, reason = exporter.healthy()
        assert not ok
        assert "last good collection 91s ago" in reason
        assert "driver wedged" in reason
    finally:
        machine.clear_faults()
        exporter.stop()


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        (":9400", ("0.0.0.0", 9400)),
        ("127.0.0.1:9500", ("127.0.0.1", 9500)),
        ("[::1]:1", ("::1", 1)),
    ],
)
def test_listen_addresses_parse(address: str, expected: tuple[str, int]) -> None:
    assert server.parse_listen(address) == expected


def test_cli_bad_counters_file_exits_2_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("# custom\nDCGM_FI_DEV_GPU_UTIL, gauge\n")
    result = CliRunner().invoke(
        app,
        ["agent", "dcgm-exporter", "--backend", "mock", "--machine", "t4x4", "-f", str(path)],
    )
    assert result.exit_code == 2
    assert f"dcgm-exporter: {path}: line 2: expected 3 comma-separated fields" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-a", "9400"], "listen address '9400': expected [HOST]:PORT"),
        (["-d", "g"], "devices 'g': only the default 'f'"),
        (["-c", "0"], "collect interval 0 ms: must be positive"),
        (["--machine-file", "x.yaml"], "exactly one of --machine or --machine-file"),
    ],
)
def test_cli_usage_errors_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(
        app, ["agent", "dcgm-exporter", "--backend", "mock", "--machine", "t4x4", *args]
    )
    assert result.exit_code == 2
    assert message in result.output


def test_environment_variables_are_upstreams(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[command.Options] = []
    monkeypatch.setattr(command, "execute", lambda o: seen.append(o) or 0)
    env = {
        "DCGM_EXPORTER_LISTEN": ":9500",
        "DCGM_EXPORTER_KUBERNETES": "true",
        "DCGM_EXPORTER_COLLECTORS": "/etc/dcgm-exporter/dcgm-metrics.csv",
        "DCGM_EXPORTER_INTERVAL": "5000",
        "NODE_NAME": "gpu-node-7",
        "DCGM_REMOTE_HOSTENGINE_INFO": "nvidia-dcgm:5555",
        "NVIDIA_RESOURCE_NAMES": "example.com/gpu, example.com/vgpu",
        "KUBERNETES_VIRTUAL_GPUS": "true",
    }
    result = CliRunner().invoke(app, ["agent", "dcgm-exporter"], env=env)
    assert result.exit_code == 0, result.output
    [o] = seen
    assert (o.listen, o.kubernetes, o.collectors, o.interval_ms, o.node_name) == (
        ":9500", True, "/etc/dcgm-exporter/dcgm-metrics.csv", 5000, "gpu-node-7",
    )  # fmt: skip
    assert o.remote_hostengine == "nvidia-dcgm:5555"
    assert o.resource_names == ("example.com/gpu", "example.com/vgpu")
    assert o.virtual_gpus
    settings = command.build_settings(o)
    assert settings.options.hostname == "gpu-node-7"
    assert settings.interval == 5.0


def test_upstreams_image_default_path_falls_back_to_the_builtin_counters() -> None:
    assert command.counters_path(command.Options()) is None
    assert command.counters_path(command.Options(collectors="/x.csv")) == Path("/x.csv")
