"""The restart modes (contract C3): SIGHUP to the socket's peer, systemd through chroot, none."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from gpu_operator.agents.container_toolkit import restart


@pytest.fixture
def listening_socket(tmp_path: Path) -> Iterator[Path]:
    """A Unix socket served by this process (its peer PID is ours)."""
    path = tmp_path / "containerd.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn, contextlib.suppress(OSError):  # the client may be gone already
                conn.sendall(b"\x00")  # a server speaks first (gRPC sends its settings)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path
    stop.set()
    thread.join(2)
    server.close()


def test_the_peer_pid_of_a_runtime_socket_is_the_serving_process(listening_socket: Path) -> None:
    assert restart.peer_pid(listening_socket) == os.getpid()


async def test_signal_mode_sends_sighup_to_the_socket_peer(listening_socket: Path) -> None:
    sent: list[tuple[int, int]] = []
    r = restart.SignalRestarter(
        "containerd", listening_socket, kill=lambda p, s: sent.append((p, s))
    )
    await r.restart()
    assert sent == [(os.getpid(), signal.SIGHUP)]
    assert "SIGHUP to containerd" in r.description


async def test_signal_mode_retries_then_fails_naming_the_socket(tmp_path: Path) -> None:
    naps: list[float] = []

    async def nap(seconds: float) -> None:
        naps.append(seconds)

    r = restart.SignalRestarter(
        "containerd", tmp_path / "missing.sock", kill=lambda p, s: None, sleep=nap
    )
    with pytest.raises(restart.RestartError, match=r"missing\.sock after 6 attempts"):
        await r.restart()
    assert naps == [5.0] * 5


async def test_systemd_mode_restarts_the_unit_inside_the_host_root() -> None:
    calls: list[list[str]] = []

    async def run(argv: Sequence[str]) -> tuple[int, str]:
        calls.append(list(argv))
        return 0, ""

    await restart.SystemdRestarter("crio", "/host", run).restart()
    assert calls == [["chroot", "/host", "systemctl", "restart", "crio"]]
    assert restart.SystemdRestarter("crio", "/").argv() == ["systemctl", "restart", "crio"]


async def test_systemd_mode_failure_carries_the_exit_status_and_output() -> None:
    async def run(argv: Sequence[str]) -> tuple[int, str]:
        return 1, "Failed to restart crio.service: Unit crio.service not found.\n"

    with pytest.raises(restart.RestartError, match=r"exited 1: Failed to restart crio\.service"):
        await restart.SystemdRestarter("crio", "/host", run).restart()


async def test_none_mode_only_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "gpu_operator.agents.container_toolkit"):
        await restart.NoRestart("containerd").restart()
    assert "RUNTIME_RESTART_MODE=none" in caplog.text
