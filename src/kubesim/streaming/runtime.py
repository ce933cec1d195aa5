"""What a container runtime keeps for the kubelet's streaming side: per container instance, its
log, stdin, exec handler and the pod ports its program serves.

Runners reach this through `PodContext` (`ctx.stdout`, `ctx.log()`, `ctx.stdin`,
`ctx.set_exec_handler()`, `await ctx.serve_port()`); the API server reads it for `pods/log`,
`exec`, `attach`, `portforward` and `proxy`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from aiohttp import web

from kubesim.streaming.logs import STDERR, STDOUT, ContainerLog, LineWriter

log = logging.getLogger("kubesim.runtime")

# The exit code a shell uses for "command not found" inside the container, and what runc/docker
# report when the exec'd program itself cannot be started.
EXIT_NOT_FOUND = 127
EXIT_CANNOT_EXECUTE = 126


class ExecOutput:
    """A writable end of an exec or attach session (stdout or stderr)."""

    def __init__(self, send: Callable[[bytes], None]) -> None:
        self._send = send

    def write(self, data: str | bytes) -> int:
        """Send bytes (or UTF-8 text) to the client."""
        chunk = data.encode() if isinstance(data, str) else bytes(data)
        if chunk:
            self._send(chunk)
        return len(data)

    def flush(self) -> None:
        """Nothing is buffered; present for file-like use."""


@dataclass
class ExecProcess:
    """One `kubectl exec` command as a handler sees it; return its exit code from the handler."""

    argv: list[str]
    stdin: asyncio.StreamReader
    stdout: ExecOutput
    stderr: ExecOutput
    tty: bool
    container: str
    env: dict[str, str] = field(default_factory=dict)

    def not_found(self) -> int:
        """Answer like a container without this program: the runtime's message and code 126."""
        self.stderr.write(runtime_exec_failure(self.argv[0]) + "\n")
        return EXIT_CANNOT_EXECUTE


ExecFunction = Callable[[ExecProcess], Awaitable[int | None]]
# A single handler gets every command; a mapping dispatches on the program name (argv[0] or its
# basename), and anything else behaves as a program the container lacks.
ExecHandler = Union[ExecFunction, Mapping[str, ExecFunction]]  # noqa: UP007
StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
PortTarget = Union[web.Application, StreamHandler, tuple[str, int]]  # noqa: UP007


def runtime_exec_failure(program: str) -> str:
    """runc's message for an exec whose program cannot be found."""
    if "/" in program:
        reason = f'exec: "{program}": stat {program}: no such file or directory'
    else:
        reason = f'exec: "{program}": executable file not found in $PATH'
    return (
        "OCI runtime exec failed: exec failed: unable to start container process: "
        f"{reason}: unknown"
    )


class ContainerInstance:
    """One run of a container: its log, its stdin, its exec handler and the ports it serves.

    The stdin reader and line writers are made on first use (most containers never need them).
    """

    __slots__ = (
        "_servers",
        "_stderr",
        "_stdin",
        "_stdout",
        "container_id",
        "exec_handler",
        "log",
        "name",
        "ports",
        "program_lookup",
        "running",
        "spec",
        "stdin_once",
        "uid",
    )

    def __init__(self, uid: str, container: dict[str, Any], container_id: str) -> None:
        self.uid = uid
        self.spec = container
        self.name: str = container.get("name", "")
        self.container_id = container_id
        self.log = ContainerLog(container_id)
        self._stdout: LineWriter | None = None
        self._stderr: LineWriter | None = None
        self._stdin: asyncio.StreamReader | None = None
        self.stdin_once = bool(container.get("stdinOnce"))
        self.exec_handler: ExecHandler | None = None
        # Programs installed in this container (kubesim.programs), set by the kubelet.
        self.program_lookup: Callable[[list[str]], ExecFunction | None] | None = None
        self.ports: dict[int, tuple[str, int]] = {}
        self.running = True
        self._servers: list[Callable[[], Awaitable[None]]] = []

    @property
    def stdout(self) -> LineWriter:
        """The writer for the stdout log."""
        if self._stdout is None:
            self._stdout = LineWriter(self.log, STDOUT)
        return self._stdout

    @property
    def stderr(self) -> LineWriter:
        """The writer for the stderr log."""
        if self._stderr is None:
            self._stderr = LineWriter(self.log, STDERR)
        return self._stderr

    @property
    def stdin(self) -> asyncio.StreamReader:
        """The container's stdin (ended when the instance ends)."""
        if self._stdin is None:
            self._stdin = asyncio.StreamReader()
            if not self.running:
                self._stdin.feed_eof()
        return self._stdin

    def write_log(self, line: str | bytes, stream: str = STDOUT) -> None:
        """Append one line to the log (a newline is added when missing)."""
        data = line.encode() if isinstance(line, str) else bytes(line)
        if not data.endswith(b"\n"):
            data += b"\n"
        (self.stderr if stream == STDERR else self.stdout).write(data)

    def feed_stdin(self, data: bytes) -> None:
        """Deliver bytes an attached client typed."""
        if self.running and not self.stdin.at_eof():
            self.stdin.feed_data(data)

    def attached_stdin_closed(self) -> None:
        """An attached client closed its stdin: with `stdinOnce` the container's stdin ends too."""
        if self.stdin_once and not self.stdin.at_eof():
            self.stdin.feed_eof()

    def resolve_exec(self, argv: list[str]) -> ExecFunction | None:
        """The handler for a command, or None when the program is missing: the runner's entry
        for that name first, then a registered program present in the container, then the
        runner's catch-all handler."""
        if not argv:
            return None
        handler = self.exec_handler
        if isinstance(handler, Mapping):
            program = argv[0]
            found = handler.get(program) or handler.get(program.rsplit("/", 1)[-1])
            if found is not None:
                return found
        installed = self.program_lookup(argv) if self.program_lookup is not None else None
        if installed is not None:
            return installed
        return None if handler is None or isinstance(handler, Mapping) else handler

    async def serve_port(self, port: int, target: PortTarget) -> tuple[str, int]:
        """Serve a pod port from a local listener; returns the address kubesim connects to."""
        if not 0 < port < 65536:
            raise ValueError(f"port {port} is outside 1-65535")
        if isinstance(target, tuple):
            address = (str(target[0]), int(target[1]))
        elif isinstance(target, web.Application):
            runner = web.AppRunner(target, access_log=None, handle_signals=False)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            server = site._server
            sockets = getattr(server, "sockets", None) or []
            address = sockets[0].getsockname()[:2]
            self._servers.append(runner.cleanup)
        else:
            tcp = await asyncio.start_server(target, "127.0.0.1", 0)
            address = tcp.sockets[0].getsockname()[:2]

            async def close_tcp() -> None:
                tcp.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(tcp.wait_closed(), 1.0)

            self._servers.append(close_tcp)
        self.ports[port] = address
        return address

    async def run_idle(self) -> int:
        """A container without a runner: with `stdin: true` it acts like a shell reading stdin
        (exits on `exit [code]` or end of input); otherwise it runs until stopped."""
        if not self.spec.get("stdin"):
            await asyncio.Event().wait()
            return 0
        while True:
            line = await self.stdin.readline()
            if not line:
                return 0
            words = line.decode(errors="replace").split()
            if words and words[0] == "exit":
                try:
                    return int(words[1]) if len(words) > 1 else 0
                except ValueError:
                    return 2

    async def finish(self) -> None:
        """The instance ended: flush and close the log, end stdin, stop its listeners."""
        self.running = False
        for writer in (self._stdout, self._stderr):
            if writer is not None:
                writer.flush()
        self.log.close()
        if self._stdin is not None and not self._stdin.at_eof():
            self._stdin.feed_eof()
        servers, self._servers = self._servers, []
        for close in servers:
            try:
                await close()
            except Exception:
                log.warning("closing a port listener of %s failed", self.name, exc_info=True)


class ContainerRuntime:
    """Container instances by pod uid and container name (the current one and the one before)."""

    def __init__(self) -> None:
        self._pods: dict[str, dict[str, list[ContainerInstance]]] = {}

    def start(self, uid: str, container: dict[str, Any], container_id: str) -> ContainerInstance:
        """Begin a new instance; the previous one is kept for `--previous`."""
        instance = ContainerInstance(uid, container, container_id)
        history = self._pods.setdefault(uid, {}).setdefault(instance.name, [])
        history.append(instance)
        del history[:-2]
        return instance

    def instances(self, uid: str, name: str) -> list[ContainerInstance]:
        """Known instances of a container, oldest first (at most two)."""
        return list(self._pods.get(uid, {}).get(name, ()))

    def current(self, uid: str, name: str) -> ContainerInstance | None:
        """The latest instance of a container, running or not."""
        history = self._pods.get(uid, {}).get(name)
        return history[-1] if history else None

    def port(self, uid: str, port: int) -> tuple[str, int] | None:
        """The local address serving a pod port, from any running container of the pod."""
        for history in self._pods.get(uid, {}).values():
            instance = history[-1]
            if instance.running and port in instance.ports:
                return instance.ports[port]
        return None

    async def forget_pod(self, uid: str) -> None:
        """Drop everything of a pod whose containers were stopped."""
        for history in self._pods.pop(uid, {}).values():
            for instance in history:
                if instance.running:
                    await instance.finish()


class ContainerIO:
    """The runner-facing side of a container instance, mixed into `PodContext`."""

    _instance: ContainerInstance

    @property
    def stdout(self) -> LineWriter:
        """File-like: text written here becomes the container's stdout log, line by line."""
        return self._instance.stdout

    @property
    def stderr(self) -> LineWriter:
        """File-like: the container's stderr log."""
        return self._instance.stderr

    @property
    def stdin(self) -> asyncio.StreamReader:
        """What attached clients type (`kubectl attach -i`, `run -i`); EOF per `stdinOnce`."""
        return self._instance.stdin

    def log(self, line: str | bytes, stream: str = STDOUT) -> None:
        """Write one line to the container log (`stream` is "stdout" or "stderr")."""
        if stream not in (STDOUT, STDERR):
            raise ValueError(f"stream must be {STDOUT!r} or {STDERR!r}, not {stream!r}")
        self._instance.write_log(line, stream)

    def set_exec_handler(self, handler: ExecHandler | None) -> None:
        """Answer `kubectl exec` into this container: one coroutine for every command, or a
        mapping from program name to coroutine; each gets an `ExecProcess` and returns the
        exit code (None means 0)."""
        self._instance.exec_handler = handler

    async def serve_port(self, port: int, target: PortTarget) -> tuple[str, int]:
        """Serve pod port `port` (for port-forward and the proxy) from an aiohttp application, a
        `(reader, writer)` stream handler, or an existing `(host, port)` listener; listeners
        kubesim starts are closed when the container stops."""
        return await self._instance.serve_port(port, target)
