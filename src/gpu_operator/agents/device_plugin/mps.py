"""MPS: the files the MPS control daemon shares with the plugin, and how the plugin checks them.

Layout under the MPS root (the host's `mpsRoot`, `/mps` in both containers), as upstream:
`<resource>/pipe` (the control daemon's pipe directory, mounted into workloads), `<resource>/log`,
`<resource>/.started` (that resource's daemon is configured), `shm` (the tmpfs mounted as the
workloads' /dev/shm) and `.ready` (all daemons configured; it holds the `sharing.mps` config they
run, so the plugin serves only a configuration the daemon really applied).

A real daemon is `nvidia-cuda-mps-control -d` with a FIFO `control` in the pipe directory. Where
there is no MPS server (the mock backend) the control daemon agent serves a unix socket `control`
answering the same commands, so the plugin's readiness check talks to something real either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.device_plugin.devices import Resource

log = logging.getLogger("gpu_operator.agents.mps")

CONTROL = "control"
CONTROL_BINARY = "nvidia-cuda-mps-control"
READY = ".ready"
STARTED = ".started"
HEALTH_COMMAND = "get_default_active_thread_percentage"
COMMAND_TIMEOUT = 5.0


def pipe_dir(root: Path, resource: str) -> Path:
    return root / resource / "pipe"


def log_dir(root: Path, resource: str) -> Path:
    return root / resource / "log"


def started_file(root: Path, resource: str) -> Path:
    return root / resource / STARTED


def ready_file(root: Path) -> Path:
    return root / READY


def shm_dir(root: Path) -> Path:
    return root / "shm"


def ready_content(config: pc.PluginConfig) -> dict[str, Any]:
    """What `.ready` holds: the `sharing.mps` section the daemons run (empty without MPS)."""
    mps = config.sharing.mps
    return mps.model_dump(by_alias=True, mode="json") if mps is not None else {}


def pinned_memory_limits(resource: Resource) -> dict[str, str]:
    """Per GPU index, its memory split over its replicas (`set_default_device_pinned_mem_limit`)."""
    memory: dict[str, int] = {}
    replicas: dict[str, int] = {}
    for d in resource.devices:
        memory[d.index] = d.memory_mib
        replicas[d.index] = replicas.get(d.index, 0) + 1
    return {i: f"{memory[i] // replicas[i]}M" for i in memory if memory[i]}


def active_thread_percentage(resource: Resource) -> str:
    """100 divided by the replicas per GPU (`set_default_active_thread_percentage`)."""
    gpus = {d.uuid for d in resource.devices}
    if not gpus:
        return ""
    return str(100 // (len(resource.devices) // len(gpus)))


# -- talking to a control daemon ------------------------------------------------------------


class ControlError(RuntimeError):
    """The MPS control daemon did not answer."""


def _env(root: Path, resource: str) -> dict[str, str]:
    return {
        **os.environ,
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir(root, resource)),
        "CUDA_MPS_LOG_DIRECTORY": str(log_dir(root, resource)),
    }


# sockaddr_un holds 108 bytes; a deeper socket is reached through its directory's descriptor.
_SOCKET_PATH_MAX = 100


@contextlib.contextmanager
def _socket_path(path: Path) -> Iterator[str]:
    if len(str(path)) < _SOCKET_PATH_MAX:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


async def ask(root: Path, resource: str, command: str) -> str:
    """Send one command to the resource's control daemon (real FIFO or simulated socket)."""
    control = pipe_dir(root, resource) / CONTROL
    try:
        mode = control.stat().st_mode
    except OSError:
        raise ControlError(f"no MPS control pipe at {control}") from None
    if stat.S_ISSOCK(mode):
        try:
            with _socket_path(control) as address:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_unix_connection(address), COMMAND_TIMEOUT
                )
            writer.write(command.encode() + b"\n")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), COMMAND_TIMEOUT)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        except (OSError, TimeoutError) as err:
            raise ControlError(f"MPS control socket {control}: {err}") from None
        return line.decode().strip()
    try:
        proc = await asyncio.create_subprocess_exec(
            CONTROL_BINARY,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=_env(root, resource),
        )
        out, _ = await asyncio.wait_for(proc.communicate(command.encode()), COMMAND_TIMEOUT)
    except (OSError, TimeoutError) as err:
        raise ControlError(f"{CONTROL_BINARY}: {err}") from None
    if proc.returncode != 0:
        raise ControlError(f"{CONTROL_BINARY} {command!r} exited {proc.returncode}")
    return out.decode().strip()


async def not_ready(root: Path, resource: str, config: pc.PluginConfig) -> str | None:
    """Why the plugin must not serve `resource` with MPS yet; None when the daemon is ready."""
    path = ready_file(root)
    try:
        content = json.loads(path.read_text() or "{}")
    except OSError:
        return "MPS daemon has not signalled readiness"
    except ValueError:
        return f"{path} is not valid JSON"
    if content != ready_content(config):
        return "MPS daemon runs another sharing.mps configuration"
    try:
        await ask(root, resource, HEALTH_COMMAND)
    except ControlError as err:
        return f"MPS daemon is not healthy: {err}"
    return None


async def wait_ready(
    root: Path, resource: str, config: pc.PluginConfig, *, timeout: float, interval: float
) -> None:
    """Wait until the daemon for `resource` is ready (ControlError after `timeout`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        reason = await not_ready(root, resource, config)
        if reason is None:
            log.info("MPS daemon is ready resource=%s", resource)
            return
        if loop.time() >= deadline:
            raise ControlError(f"timed out waiting for MPS daemon for {resource}: {reason}")
        log.info("waiting for MPS daemon resource=%s reason=%r", resource, reason)
        await asyncio.sleep(interval)


class SimulatedControl:
    """A stand-in for `nvidia-cuda-mps-control -d` where no MPS server exists (mock GPUs).

    It keeps the defaults the real daemon would apply and answers `get_*`/`set_*` and `quit` on a
    unix socket named `control` in the pipe directory; it runs no CUDA clients.
    """

    def __init__(self, root: Path, resource: str) -> None:
        self.root = root
        self.resource = resource
        self.settings: dict[str, str] = {}
        self._server: asyncio.AbstractServer | None = None

    @property
    def socket(self) -> Path:
        return pipe_dir(self.root, self.resource) / CONTROL

    async def start(self) -> None:
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        with _socket_path(self.socket) as address:
            self._server = await asyncio.start_unix_server(self._serve, path=address)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    def answer(self, command: str) -> str:
        words = command.split()
        if not words:
            return ""
        verb, args = words[0], words[1:]
        if verb.startswith("set_") and args:
            self.settings[" ".join([verb.removeprefix("set_"), *args[:-1]])] = args[-1]
            self._log(command)
            return ""
        if verb.startswith("get_"):
            return self.settings.get(" ".join([verb.removeprefix("get_"), *args]), "100")
        if verb == "quit":
            self._log(command)
            return ""
        return f"Unknown command: {verb}"

    def _log(self, line: str) -> None:
        folder = log_dir(self.root, self.resource)
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / "control.log").open("a") as f:
            f.write(f"[simulated] {line}\n")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            writer.write(self.answer(line.decode().strip()).encode() + b"\n")
            await writer.drain()
        finally:
            writer.close()


def configure_commands(resource: Resource) -> list[str]:
    """The defaults a daemon gets after it starts: pinned memory per GPU, active threads."""
    commands = [
        f"set_default_device_pinned_mem_limit {index} {limit}"
        for index, limit in sorted(pinned_memory_limits(resource).items())
    ]
    threads = active_thread_percentage(resource)
    if threads:
        commands.append(f"set_default_active_thread_percentage {threads}")
    return commands


def write_ready(root: Path, config: pc.PluginConfig) -> None:
    path = ready_file(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(READY + ".tmp")
    tmp.write_text(json.dumps(ready_content(config)) + "\n")
    os.replace(tmp, path)


def remove_ready(root: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        ready_file(root).unlink()
