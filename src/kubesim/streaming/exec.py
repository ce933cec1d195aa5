"""`pods/exec` and `pods/attach` over WebSockets (the channel protocols kubectl 1.35 speaks)
and over raw SPDY/3.1 upgrades (kubectl's fallback, older clients, client-go's SPDY executor).

Checks that fail before the upgrade answer with a Status (kubectl then retries over SPDY, gets the
same Status and prints `Error from server (BadRequest): ...`). Once upgraded, a container that is
not running is reported on the error channel the way the API server relays the kubelet's refusal:
`Internal error occurred: unable to upgrade connection: container not found ("<name>")`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiohttp import web

from kubesim import errors
from kubesim.streaming import channels, pod_containers
from kubesim.streaming.logs import STDERR
from kubesim.streaming.runtime import (
    ContainerInstance,
    ContainerRuntime,
    ExecOutput,
    ExecProcess,
)
from kubesim.streaming.spdy_session import UpgradedTransport, negotiate, wants_spdy

log = logging.getLogger("kubesim.exec")
# What a process killed by the container's stop (SIGKILL) exits with.
EXIT_KILLED = 137


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "").lower() in ("1", "true", "t")


Session = channels.ChannelSession | channels.SpdyChannelSession


async def open_session(
    request: web.Request, *, stdin: bool, stdout: bool, stderr: bool, tty: bool
) -> tuple[Session | None, web.StreamResponse]:
    """Upgrade to a WebSocket channel protocol or a raw SPDY/3.1 connection (no session when
    the SPDY client never opened the streams it asked for)."""
    ws = web.WebSocketResponse(protocols=channels.PROTOCOLS, autoping=True, max_msg_size=0)
    if ws.can_prepare(request).ok:
        await ws.prepare(request)
        return channels.ChannelSession(ws), ws
    if not wants_spdy(request):
        raise errors.bad_request("Upgrade request required")
    offered = request.headers.getall("X-Stream-Protocol-Version", [])
    if not offered:
        raise errors.bad_request("unable to upgrade: X-Stream-Protocol-Version is required")
    protocol = negotiate(request, channels.SPDY_PROTOCOLS)
    if protocol is None:
        raise errors.ApiError(
            403,
            "unable to upgrade: unable to negotiate protocol: client supports "
            f"[{' '.join(offered)}], server accepts [{' '.join(channels.SPDY_PROTOCOLS)}]",
            reason="Forbidden",
        )
    expected = {channels.ERROR}
    if stdin:
        expected.add(channels.STDIN)
    if stdout:
        expected.add(channels.STDOUT)
    if stderr and not tty:  # a TTY merges stderr into stdout; the client opens no stream for it
        expected.add(channels.STDERR)
    transport = await UpgradedTransport.accept(request, {"X-Stream-Protocol-Version": protocol})
    session = channels.SpdyChannelSession(transport, protocol, expected)
    if not await session.wait_ready():
        log.warning("timed out waiting for the client to create streams")
        await session.finish(channels.internal_error_status("timed out waiting for streams"))
        return None, transport.response
    return session, transport.response


def resolve(store_pod: dict[str, Any], request: web.Request) -> tuple[str, dict[str, Any]]:
    """The container a stream request targets, after the API server's own checks."""
    name = pod_containers.choose(store_pod, request.query.get("container"))
    found = pod_containers.find(store_pod, name)
    assert found is not None
    if not (store_pod.get("spec") or {}).get("nodeName"):
        raise errors.bad_request(
            f"pod {store_pod['metadata']['name']} does not have a host assigned"
        )
    return name, found[1]


def _running(runtime: ContainerRuntime, pod: dict[str, Any], name: str) -> ContainerInstance | None:
    instance = runtime.current(pod["metadata"].get("uid", ""), name)
    return instance if instance is not None and instance.running else None


def _not_found(name: str) -> dict[str, Any]:
    return channels.internal_error_status(
        f'unable to upgrade connection: container not found ("{name}")'
    )


async def _open(
    request: web.Request, pod: dict[str, Any], runtime: ContainerRuntime
) -> (
    tuple[Session, web.StreamResponse, ContainerInstance, tuple[bool, bool, bool, bool]]
    | web.StreamResponse
):
    """The session of an exec or attach to a running container, with its (tty, stdin, stdout,
    stderr) flags; or the response already sent when there is no session or no container."""
    name, _ = resolve(pod, request)
    tty, wants_stdin = _flag(request, "tty"), _flag(request, "stdin")
    wants_stdout, wants_stderr = _flag(request, "stdout"), _flag(request, "stderr")
    session, response = await open_session(
        request, stdin=wants_stdin, stdout=wants_stdout, stderr=wants_stderr, tty=tty
    )
    if session is None:
        return response
    instance = _running(runtime, pod, name)
    if instance is None:
        await session.finish(_not_found(name))
        return response
    return session, response, instance, (tty, wants_stdin, wants_stdout, wants_stderr)


async def serve_exec(
    request: web.Request, pod: dict[str, Any], runtime: ContainerRuntime
) -> web.StreamResponse:
    """Run a command through the container's exec handler and report its exit code."""
    argv = request.query.getall("command", [])
    opening = await _open(request, pod, runtime)
    if isinstance(opening, web.StreamResponse):
        return opening
    session, response, instance, (tty, wants_stdin, wants_stdout, wants_stderr) = opening
    name = instance.name
    opened = session  # narrowed for the closures below
    # Output nobody asked for is dropped; with a TTY the runtime merges stderr into stdout.
    stderr_channel = channels.STDOUT if tty else channels.STDERR
    stderr_wanted = wants_stdout if tty else wants_stderr
    stdout = ExecOutput(lambda data: opened.send(channels.STDOUT, data) if wants_stdout else None)
    stderr = ExecOutput(lambda data: opened.send(stderr_channel, data) if stderr_wanted else None)
    stdin = session.stdin
    if not wants_stdin:
        stdin = asyncio.StreamReader()
        stdin.feed_eof()
    process = ExecProcess(argv, stdin, stdout, stderr, tty, name)
    handler = instance.resolve_exec(argv)
    if handler is None:
        code = process.not_found() if argv else 1
    else:
        code = await _run_handler(handler(process), instance, session)
    await session.finish(channels.success_status() if code == 0 else channels.exit_status(code))
    return response


async def _run_handler(work: Any, instance: ContainerInstance, session: Session) -> int:
    task = asyncio.ensure_future(work)
    ended = asyncio.ensure_future(instance.log.wait_closed())
    gone = asyncio.ensure_future(session.client_gone.wait())
    try:
        done, _ = await asyncio.wait({task, ended, gone}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            try:
                result = task.result()
            except Exception:
                log.exception("exec handler in container %s failed", instance.name)
                return 1
            return int(result or 0)
        # The container stopped (its processes are killed) or the client went away.
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        return EXIT_KILLED
    finally:
        ended.cancel()
        gone.cancel()


async def serve_attach(
    request: web.Request, pod: dict[str, Any], runtime: ContainerRuntime
) -> web.StreamResponse:
    """Stream the container's output from now on and feed it what the client types."""
    opening = await _open(request, pod, runtime)
    if isinstance(opening, web.StreamResponse):
        return opening
    session, response, instance, (tty, wants_stdin, wants_stdout, wants_stderr) = opening
    pump = asyncio.ensure_future(_pump_stdin(session, instance)) if wants_stdin else None
    seq = instance.log.next_seq - 1
    instance.log.followers += 1
    try:
        while True:
            for entry in instance.log.entries(seq):
                seq = entry.seq
                if entry.stream == STDERR and not tty:
                    if wants_stderr:
                        session.send(channels.STDERR, entry.data)
                elif wants_stdout:  # with a TTY both streams arrive here, merged
                    session.send(channels.STDOUT, entry.data)
            if instance.log.closed or session.client_gone.is_set():
                break
            waiter = asyncio.ensure_future(instance.log.wait_after(seq))
            gone = asyncio.ensure_future(session.client_gone.wait())
            await asyncio.wait({waiter, gone}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            gone.cancel()
    finally:
        instance.log.followers -= 1
        if pump is not None:
            pump.cancel()
            with contextlib.suppress(BaseException):
                await pump
    await session.finish(channels.success_status())
    return response


async def _pump_stdin(session: Session, instance: ContainerInstance) -> None:
    while True:
        data = await session.stdin.read(65536)
        if not data:
            instance.attached_stdin_closed()
            return
        instance.feed_stdin(data)
