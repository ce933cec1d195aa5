"""Streaming: watch-list, pod logs, exec/attach, port-forward, proxy and ephemeral containers.

Conformance over HTTP (and the WebSocket channel protocols), then the real kubectl 1.35.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from kubesim_helpers import CM, Api, configmap, daemonset
from waiting import DEADLINE, eventually, within

import kubesim
from kubesim import KubeletConfig, PodContext, list_options
from kubesim.streaming import spdy
from kubesim.streaming.runtime import ExecProcess
from kubesim.streaming.tar import tar_exec_handler

KUBECTL = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "kubectl"
PODS = "/api/v1/namespaces/default/pods"
END = "k8s.io/initial-events-end"
TIMESTAMP = re.compile(rb"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{9}Z ")

needs_kubectl = pytest.mark.skipif(
    not KUBECTL.exists(),
    reason="kubectl not installed (run scripts/setup, which runs scripts/install_tools.py)",
)
KUBECTL_WAIT = f"--timeout={DEADLINE:g}s"  # `kubectl wait`'s deadline


# ----- runners driven by the tests ----------------------------------------------------------


class Programs:
    """Runner contexts by (pod, container), so tests can write output and end containers."""

    def __init__(self, sim: kubesim.Cluster) -> None:
        self.sim = sim
        self.contexts: dict[tuple[str, str], PodContext] = {}
        self.starts: dict[tuple[str, str], int] = {}

    async def app(self, ctx: PodContext) -> int:
        """Logs a greeting, serves HTTP on 8080, answers exec, then runs until ended."""
        key = (ctx.name, ctx.container_name)
        self.contexts[key] = ctx
        self.starts[key] = self.starts.get(key, 0) + 1
        ctx.log(f"hello from {ctx.container_name} run {self.starts[key]}")
        ctx.stderr.write("a warning\n")

        async def page(request: web.Request) -> web.Response:
            return web.Response(
                text=f"{ctx.name} {request.method} {request.path_qs} {await request.text()}"
            )

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", page)
        await ctx.serve_port(8080, app)
        ctx.set_exec_handler({"echo": _echo, "fail": _fail, "cat": _cat})
        await asyncio.Event().wait()
        return 0

    async def echo_stdin(self, ctx: PodContext) -> int:
        """Echoes what attached clients type until stdin ends."""
        self.contexts[(ctx.name, ctx.container_name)] = ctx
        while line := await ctx.stdin.readline():
            ctx.stdout.write(b"echo: " + line)
        return 0

    def ctx(self, pod: str, container: str | None = None) -> PodContext:
        return self.contexts[(pod, container or pod)]

    async def started(self, pod: str, container: str | None = None, run: int = 1) -> PodContext:
        key = (pod, container or pod)
        await eventually(
            lambda: self.starts.get(key, 0) >= run,
            f"{key} run {run}",
            state=lambda: self.starts,
        )
        return self.contexts[key]


async def _echo(proc: ExecProcess) -> int:
    proc.stdout.write(" ".join(proc.argv[1:]) + "\n")
    return 0


async def _fail(proc: ExecProcess) -> int:
    proc.stderr.write("about to fail\n")
    return int(proc.argv[1])


async def _cat(proc: ExecProcess) -> int:
    proc.stdout.write(await proc.stdin.read())
    return 0


@pytest.fixture
def programs(sim: kubesim.Cluster) -> Programs:
    found = Programs(sim)
    sim.register_pod_runner(found.app, image="example/app")
    sim.register_pod_runner(found.echo_stdin, image="example/echo")
    return found


def pod(name: str, *containers: str, image: str = "example/app", **spec: Any) -> dict[str, Any]:
    """A pod with one container per name (default: one named like the pod)."""
    names = containers or (name,)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {
            "containers": [{"name": c, "image": image} for c in names],
            "nodeName": "node-1",
            **spec,
        },
    }


async def running(sim: kubesim.Cluster, name: str) -> dict[str, Any]:
    def check() -> bool:
        obj = sim.store.get("pods", name, "default")
        return bool(obj) and (obj.get("status") or {}).get("phase") == "Running"

    await eventually(
        check,
        f"pod {name} running",
        state=lambda: ((sim.store.get("pods", name, "default") or {}).get("status") or {}).get(
            "phase"
        ),
    )
    found = sim.store.get("pods", name, "default")
    assert found is not None
    return found


async def watch_lines(
    sim: kubesim.Cluster, query: str, count: int, *, then: Any = None
) -> list[dict[str, Any]]:
    """Read `count` events from a watch; `then` runs once the stream is open."""
    events: list[dict[str, Any]] = []
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{sim.url}{CM}?{query}") as resp,
    ):
        assert resp.status == 200, await resp.text()
        opened = False
        while len(events) < count:
            if not opened and then is not None and sim.store.watcher_count() > 0:
                opened = True
                then()
            line = await within(
                resp.content.readline(), f"watch event {len(events) + 1} of {count}: {events}"
            )
            events.append(json.loads(line))
    return events


# ----- watch-list ----------------------------------------------------------------------------


async def test_watch_list_streams_state_then_annotated_bookmark_then_changes(
    sim: kubesim.Cluster,
) -> None:
    sim.store.create(configmap("a"))
    sim.store.create(configmap("b"))
    list_rv = sim.store.resource_version
    query = "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
    query += "&allowWatchBookmarks=true"
    events = await watch_lines(sim, query, 4, then=lambda: sim.store.create(configmap("c")))
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in events] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("BOOKMARK", None),
        ("ADDED", "c"),
    ]
    bookmark = events[2]["object"]
    assert bookmark["kind"] == "ConfigMap"
    assert bookmark["metadata"]["annotations"] == {END: "true"}
    assert bookmark["metadata"]["resourceVersion"] == str(list_rv)


async def test_legacy_watch_with_bookmarks_is_defaulted_to_a_watch_list(
    sim: kubesim.Cluster,
) -> None:
    sim.store.create(configmap("a"))
    events = await watch_lines(sim, "watch=true&resourceVersion=0&allowWatchBookmarks=true", 2)
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    assert events[1]["object"]["metadata"]["annotations"] == {END: "true"}


async def test_watch_list_without_bookmarks_sends_no_end_marker(sim: kubesim.Cluster) -> None:
    sim.store.create(configmap("a"))
    query = "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
    events = await watch_lines(sim, query, 2, then=lambda: sim.store.create(configmap("b")))
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
    ]


async def test_send_initial_events_false_watches_from_now(sim: kubesim.Cluster) -> None:
    sim.store.create(configmap("old"))
    query = "watch=true&sendInitialEvents=false&resourceVersionMatch=NotOlderThan"
    events = await watch_lines(sim, query, 1, then=lambda: sim.store.create(configmap("new")))
    assert events[0]["type"] == "ADDED"
    assert events[0]["object"]["metadata"]["name"] == "new"


async def test_watch_list_waits_for_a_future_resource_version(sim: kubesim.Cluster) -> None:
    wanted = sim.store.resource_version + 1
    query = "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
    query += f"&allowWatchBookmarks=true&resourceVersion={wanted}"

    async def write_soon() -> None:
        await asyncio.sleep(0)
        sim.store.create(configmap("late"))

    task = asyncio.ensure_future(write_soon())
    events = await watch_lines(sim, query, 2)
    await task
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    assert int(events[1]["object"]["metadata"]["resourceVersion"]) >= wanted


async def test_watch_list_fails_like_the_cacher_when_the_version_never_comes(
    sim: kubesim.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(list_options, "FRESHNESS_TIMEOUT", 0.05)
    wanted = sim.store.resource_version + 100
    query = "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
    events = await watch_lines(sim, f"{query}&resourceVersion={wanted}", 1)
    assert events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert status["code"] == 504
    assert status["reason"] == "Timeout"
    assert status["message"].startswith(f"Too large resource version: {wanted}, current: ")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (
            "watch=true&resourceVersionMatch=NotOlderThan",
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch "
            "unless sendInitialEvents is provided",
        ),
        (
            "watch=true&sendInitialEvents=true",
            "resourceVersionMatch: Forbidden: sendInitialEvents requires setting "
            "resourceVersionMatch to NotOlderThan",
        ),
        (
            "watch=true&sendInitialEvents=true&resourceVersionMatch=Exact",
            "[resourceVersionMatch: Forbidden: sendInitialEvents requires setting "
            "resourceVersionMatch to NotOlderThan, resourceVersionMatch: Unsupported value: "
            '"Exact": supported values: "NotOlderThan"]',
        ),
        (
            "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&continue=x",
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue "
            "is provided",
        ),
        (
            "sendInitialEvents=true",
            "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list",
        ),
        (
            "resourceVersionMatch=NotOlderThan",
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless "
            "resourceVersion is provided",
        ),
        (
            "resourceVersion=0&resourceVersionMatch=Exact",
            'resourceVersionMatch: Forbidden: resourceVersionMatch "exact" is forbidden for '
            'resourceVersion "0"',
        ),
    ],
)
async def test_invalid_list_and_watch_options_are_rejected_like_the_real_server(
    api: Api, query: str, message: str
) -> None:
    status, body = await api.req("GET", f"{CM}?{query}")
    assert status == 422
    assert body["reason"] == "Invalid"
    assert body["message"] == f'ListOptions.meta.k8s.io "" is invalid: {message}'
    assert body["details"]["kind"] == "ListOptions"
    assert body["details"]["causes"][0]["field"] in ("resourceVersionMatch", "sendInitialEvents")


# ----- logs ----------------------------------------------------------------------------------


async def test_logs_are_plain_text_from_the_only_container(
    sim: kubesim.Cluster, api: Api, programs: Programs
) -> None:
    sim.store.create(pod("web"))
    await programs.started("web")
    async with api.session.get(f"{PODS}/web/log") as resp:
        assert resp.status == 200
        assert resp.content_type == "text/plain"
        assert await resp.text() == "hello from web run 1\na warning\n"


async def test_python_logging_of_a_runner_and_its_crash_reach_its_container_log(
    sim: kubesim.Cluster, api: Api
) -> None:
    logger = logging.getLogger("tests.kubesim.runner")
    handler = kubesim.ContainerLogHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False

    async def helper() -> None:
        logger.warning("from a task the runner started")

    async def crashing(ctx: PodContext) -> int:
        logger.info("starting on %s", ctx.node_name)
        await asyncio.ensure_future(helper())
        raise RuntimeError("config file missing")

    try:
        sim.register_pod_runner(crashing, image="example/crash")
        sim.store.create(pod("crash", image="example/crash", restartPolicy="Never"))
        await sim.wait_for(
            lambda: (
                (sim.store.get("pods", "crash", "default") or {}).get("status", {}).get("phase")
                == "Failed"
            ),
            DEADLINE,
        )
        logger.info("outside any runner: in no container log")
        async with api.session.get(f"{PODS}/crash/log") as resp:
            text = await resp.text()
    finally:
        logger.removeHandler(handler)
    lines = text.splitlines()
    assert lines[:2] == ["INFO starting on node-1", "WARNING from a task the runner started"]
    assert lines[2] == "Traceback (most recent call last):"
    assert lines[-1] == "RuntimeError: config file missing"
    assert "outside any runner" not in text


async def test_paths_a_runner_logs_read_as_on_its_node(sim: kubesim.Cluster, api: Api) -> None:
    """A node program logs the socket and files it opened; the log shows the node's paths, not
    the temporary tree where kubesim keeps the node's files."""
    logger = logging.getLogger("tests.kubesim.paths")
    handler = kubesim.ContainerLogHandler()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    root = sim.node_root("node-1")

    async def plugin(ctx: PodContext) -> int:
        socket = ctx.host_path("/var/lib/kubelet/device-plugins/nvidia-gpu.sock")
        logger.info("serving nvidia.com/gpu on %s", socket)
        logger.info("no %s or %s/run/cdi", ctx.host_path("/proc/driver/x"), ctx.node_root)
        logger.info("root %s; a sibling %s-0/etc stays", ctx.node_root, ctx.node_root)
        return 0

    try:
        # An image every node can pull (a real public one).
        sim.register_pod_runner(plugin, image="busybox")
        sim.store.create(pod("plugin", image="busybox", restartPolicy="Never"))
        await sim.wait_for(
            lambda: (
                (sim.store.get("pods", "plugin", "default") or {}).get("status", {}).get("phase")
                == "Succeeded"
            ),
            DEADLINE,
        )
        async with api.session.get(f"{PODS}/plugin/log") as resp:
            lines = (await resp.text()).splitlines()
    finally:
        logger.removeHandler(handler)
    assert lines == [
        "serving nvidia.com/gpu on /var/lib/kubelet/device-plugins/nvidia-gpu.sock",
        "no /proc/driver/x or /run/cdi",
        f"root /; a sibling {root}-0/etc stays",
    ]


async def test_logs_tail_limit_timestamps_and_since(
    sim: kubesim.Cluster, api: Api, programs: Programs
) -> None:
    sim.store.create(pod("web"))
    ctx = await programs.started("web")
    for i in range(3):
        ctx.log(f"line {i}")
    assert await api.ok("GET", f"{PODS}/web/log", params={"tailLines": "2"}) == "line 1\nline 2\n"
    assert await api.ok("GET", f"{PODS}/web/log", params={"tailLines": "0"}) == ""
    assert await api.ok("GET", f"{PODS}/web/log", params={"limitBytes": "8"}) == "hello fr"
    stamped = await api.ok("GET", f"{PODS}/web/log", params={"timestamps": "true"})
    lines = stamped.encode().splitlines()
    assert len(lines) == 5
    assert all(TIMESTAMP.match(line) for line in lines)
    future = await api.ok("GET", f"{PODS}/web/log", params={"sinceTime": "2999-01-01T00:00:00Z"})
    assert future == ""
    recent = await api.ok("GET", f"{PODS}/web/log", params={"sinceSeconds": "60"})
    assert recent.startswith("hello from web")


async def test_logs_name_the_containers_when_none_is_chosen(
    sim: kubesim.Cluster, api: Api, programs: Programs
) -> None:
    sim.store.create(pod("two", "a", "b", initContainers=[{"name": "setup", "image": "busybox"}]))
    status, body = await api.req("GET", f"{PODS}/two/log")
    assert status == 400
    assert body["message"] == (
        "a container name must be specified for pod two, choose one of: [a b] "
        "or one of the init containers: [setup]"
    )
    status, body = await api.req("GET", f"{PODS}/two/log", params={"container": "zz"})
    assert (status, body["message"]) == (400, "container zz is not valid for pod two")
    await programs.started("two", "b")
    assert (await api.ok("GET", f"{PODS}/two/log", params={"container": "b"})).startswith(
        "hello from b"
    )


async def test_previous_logs_need_a_restart_then_show_the_last_run(
    sim: kubesim.Cluster, api: Api, programs: Programs
) -> None:
    sim.store.create(pod("web"))
    ctx = await programs.started("web")
    status, body = await api.req("GET", f"{PODS}/web/log", params={"previous": "true"})
    assert (status, body["message"]) == (
        400,
        'previous terminated container "web" in pod "web" not found',
    )
    ctx.log("last words")
    ctx.exit(1)
    await programs.started("web", run=2)
    await sim.wait_for(
        lambda: "running" in _state(sim, "web"), DEADLINE, "the restarted container running"
    )
    previous = await api.ok("GET", f"{PODS}/web/log", params={"previous": "true"})
    assert previous == "hello from web run 1\na warning\nlast words\n"
    assert (await api.ok("GET", f"{PODS}/web/log")).startswith("hello from web run 2")


def _uid(sim: kubesim.Cluster, name: str) -> str:
    return str((sim.store.get("pods", name, "default") or {})["metadata"]["uid"])


def _state(sim: kubesim.Cluster, name: str) -> dict[str, Any]:
    obj = sim.store.get("pods", name, "default") or {}
    statuses = (obj.get("status") or {}).get("containerStatuses") or [{}]
    state: dict[str, Any] = statuses[0].get("state") or {}
    return state


async def test_follow_streams_until_the_container_exits(
    sim: kubesim.Cluster, api: Api, programs: Programs
) -> None:
    sim.store.create(pod("job", restartPolicy="Never"))
    ctx = await programs.started("job")
    async with api.session.get(
        f"{PODS}/job/log", params={"follow": "true", "tailLines": "1"}
    ) as resp:
        assert await within(resp.content.readline(), "the last log line") == b"a warning\n"
        ctx.log("more")
        assert await within(resp.content.readline(), "the new log line") == b"more\n"
        ctx.log("done")
        ctx.exit(0)
        assert await within(resp.content.read(), "the end of the log stream") == b"done\n"


async def test_logs_of_a_container_that_has_not_started(api: Api) -> None:
    # A start far beyond any wait here: the container is still waiting when its log is asked for.
    async with kubesim.Cluster(
        nodes=1, kubelet=KubeletConfig(start_delay=10 * DEADLINE, lease_interval=None)
    ) as slow:
        slow.store.create(pod("pending", image="nginx"))
        await slow.wait_for(
            lambda: (
                (slow.store.get("pods", "pending", "default") or {})
                .get("status", {})
                .get("containerStatuses")
                is not None
            ),
            DEADLINE,
            "container statuses",
        )
        async with aiohttp.ClientSession(base_url=slow.url) as session:
            status, body = await Api(session).req("GET", f"{PODS}/pending/log")
    assert status == 400
    assert body["message"] == (
        'container "pending" in pod "pending" is waiting to start: ContainerCreating'
    )


async def test_logs_of_an_unscheduled_pod_are_empty(sim: kubesim.Cluster, api: Api) -> None:
    unbound = pod("unbound", image="nginx")
    del unbound["spec"]["nodeName"]
    unbound["spec"]["schedulerName"] = "nobody"
    sim.store.create(unbound)
    assert await api.ok("GET", f"{PODS}/unbound/log") == ""


async def test_invalid_log_options_are_422(sim: kubesim.Cluster, api: Api) -> None:
    sim.store.create(pod("web", image="nginx"))
    status, body = await api.req(
        "GET", f"{PODS}/web/log", params={"tailLines": "-1", "limitBytes": "0"}
    )
    assert status == 422
    assert body["message"] == (
        'PodLogOptions "web" is invalid: [tailLines: Invalid value: -1: must be greater than '
        "or equal to 0, limitBytes: Invalid value: 0: must be greater than 0]"
    )
    status, body = await api.req(
        "GET", f"{PODS}/web/log", params={"sinceSeconds": "5", "sinceTime": "2024-01-01T00:00:00Z"}
    )
    assert status == 422
    assert body["message"].endswith(
        ": Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified"
    )


# ----- exec and attach over WebSockets -------------------------------------------------------


class Channels:
    """A minimal client of the remote-command channel protocol."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.out: dict[int, bytes] = {}

    async def send_stdin(self, data: bytes, *, close: bool = False) -> None:
        await self.ws.send_bytes(b"\x00" + data)
        if close:
            await self.ws.send_bytes(b"\xff\x00")

    async def drain(self) -> dict[int, bytes]:
        async for message in self.ws:
            if message.type == aiohttp.WSMsgType.BINARY:
                channel, data = message.data[0], message.data[1:]
                self.out[channel] = self.out.get(channel, b"") + data
            elif message.type == aiohttp.WSMsgType.TEXT:
                channel, data = int(message.data[0]), base64.b64decode(message.data[1:])
                self.out[channel] = self.out.get(channel, b"") + data
        return self.out


async def _connect(
    sim: kubesim.Cluster, path: str, protocol: str = "v5.channel.k8s.io"
) -> tuple[aiohttp.ClientSession, aiohttp.ClientWebSocketResponse]:
    session = aiohttp.ClientSession()
    ws = await session.ws_connect(f"{sim.url}{path}", protocols=(protocol,))
    return session, ws


async def _exec(
    sim: kubesim.Cluster, query: str, protocol: str = "v5.channel.k8s.io", stdin: bytes = b""
) -> tuple[str, dict[int, bytes]]:
    session, ws = await _connect(sim, f"{PODS}/web/exec?{query}", protocol)
    try:
        channels = Channels(ws)
        if stdin:
            await channels.send_stdin(stdin, close=True)
        out = await within(channels.drain(), f"the exec stream of {query}")
        return ws.protocol or "", out
    finally:
        await session.close()


async def test_exec_runs_the_handler_and_reports_success(
    sim: kubesim.Cluster, programs: Programs
) -> None:
    sim.store.create(pod("web"))
    await programs.started("web")
    protocol, out = await _exec(sim, "command=echo&command=hi&stdout=true&stderr=true")
    assert protocol == "v5.channel.k8s.io"
    assert out[1] == b"hi\n"
    assert json.loads(out[3]) == {"metadata": {}, "status": "Success"}


async def test_exec_reports_a_non_zero_exit_code_as_status_cause(
    sim: kubesim.Cluster, programs: Programs
) -> None:
    sim.store.create(pod("web"))
    await programs.started("web")
    _, out = await _exec(sim, "command=fail&command=7&stdout=true&stderr=true")
    assert out[2] == b"about to fail\n"
    status = json.loads(out[3])
    assert status["status"] == "Failure"
    assert status["reason"] == "NonZeroExitCode"
    assert status["details"]["causes"] == [{"reason": "ExitCode", "message": "7"}]


async def test_exec_of_a_missing_program_fails_like_runc(
    sim: kubesim.Cluster, programs: Programs
) -> None:
    sim.store.create(pod("web"))
    await programs.started("web")
    _, out = await _exec(sim, "command=bash&stdout=true&stderr=true")
    assert out[2] == (
        b"OCI runtime exec failed: exec failed: unable to start container process: "
        b'exec: "bash": executable file not found in $PATH: unknown\n'
    )
    assert json.loads(out[3])["details"]["causes"][0]["message"] == "126"
    _, out = await _exec(sim, "command=/bin/bash&stdout=true&stderr=true")
    assert b'exec: "/bin/bash": stat /bin/bash: no such file or directory' in out[2]


async def test_exec_reads_stdin_until_the_client_closes_it(
    sim: kubesim.Cluster, programs: Programs
) -> None:
    sim.store.create(pod("web"))
    await programs.started("web")
    _, out = await _exec(sim, "command=cat&stdin=true&stdout=true", stdin=b"typed")
    assert out[1] == b"typed"


async def test_older_channel_protocols_are_negotiated(
    sim: kubesim.Cluster, programs: Programs
) -> None:
    sim.store.create(pod("web"))
    await programs.started("web")
    protocol, out = await _exec(sim, "command=fail&command=2&stderr=true", "v4.channel.k8s.io")
    assert protocol == "v4.channel.k8s.io"
    assert json.loads(out[3])["details"]["causes"][0]["message"] == "2"
    protocol, out = await _exec(sim, "command=fail&command=2&stderr=true", "channel.k8s.io")
    assert protocol == "channel.k8s.io"
    assert out[3] == (
        b"command terminated with non-zero exit code: command terminated with exit code 2"
    )
    protocol, out = await _exec(
        sim, "command=echo&command=b64&stdout=true", "base64.channel.k8s.io"
    )
    assert (protocol, out[1], 3 in out) == ("base64.channel.k8s.io", b"b64\n", False)


async def test_exec_into_a_stopped_container_reports_container_not_found(
    sim: kubesim.Cluster, programs: Programs
) -> None:
    sim.store.create(pod("web", restartPolicy="Never"))
    ctx = await programs.started("web")
    ctx.exit(0)
    await sim.wait_for(lambda: "terminated" in _state(sim, "web"), DEADLINE, "container terminated")
    _, out = await _exec(sim, "command=echo&stdout=true")
    status = json.loads(out[3])
    assert status["reason"] == "InternalError"
    assert status["message"] == (
        'Internal error occurred: unable to upgrade connection: container not found ("web")'
    )


async def test_stream_requests_are_checked_before_the_upgrade(
    sim: kubesim.Cluster, api: Api
) -> None:
    sim.store.create(pod("web", image="nginx"))
    status, body = await api.req("POST", f"{PODS}/web/exec", params={"command": "ls"})
    assert (status, body["message"]) == (400, "Upgrade request required")
    spdy_upgrade = {"Connection": "Upgrade", "Upgrade": "SPDY/3.1"}
    status, body = await api.req("POST", f"{PODS}/web/exec", headers=spdy_upgrade)
    assert (status, body["message"]) == (
        400,
        "unable to upgrade: X-Stream-Protocol-Version is required",
    )
    status, body = await api.req(
        "POST",
        f"{PODS}/web/exec",
        headers={**spdy_upgrade, "X-Stream-Protocol-Version": "v9.channel.k8s.io"},
    )
    assert status == 403
    assert body["message"].startswith(
        "unable to upgrade: unable to negotiate protocol: client supports [v9.channel.k8s.io]"
    )
    status, body = await api.req("GET", f"{PODS}/web/attach", params={"container": "nope"})
    assert (status, body["message"]) == (400, "container nope is not valid for pod web")
    unbound = pod("unbound", image="nginx")
    del unbound["spec"]["nodeName"]
    unbound["spec"]["schedulerName"] = "nobody"
    sim.store.create(unbound)
    status, body = await api.req("GET", f"{PODS}/unbound/exec", params={"command": "ls"})
    assert (status, body["message"]) == (400, "pod unbound does not have a host assigned")
    status, body = await api.req("GET", f"{PODS}/missing/exec")
    assert (status, body["message"]) == (404, 'pods "missing" not found')


async def test_attach_streams_new_output_and_feeds_stdin_once(
    sim: kubesim.Cluster, programs: Programs
) -> None:
    spec = pod("echo", image="example/echo")
    spec["spec"]["containers"][0].update(stdin=True, stdinOnce=True)
    spec["spec"]["restartPolicy"] = "Never"
    sim.store.create(spec)
    await running(sim, "echo")
    await sim.wait_for(lambda: ("echo", "echo") in programs.contexts, DEADLINE, "runner")
    session, ws = await _connect(sim, f"{PODS}/echo/attach?stdin=true&stdout=true&stderr=true")
    try:
        channels = Channels(ws)
        await channels.send_stdin(b"one\ntwo\n", close=True)
        out = await within(channels.drain(), "the attach stream")
    finally:
        await session.close()
    assert out[1] == b"echo: one\necho: two\n"
    assert json.loads(out[3])["status"] == "Success"
    await sim.wait_for(lambda: "terminated" in _state(sim, "echo"), DEADLINE, "stdin EOF ends it")


# ----- port-forward framing and proxy --------------------------------------------------------


def test_spdy_header_blocks_round_trip_through_the_shared_dictionary() -> None:
    client, server = spdy.HeaderCodec(), spdy.HeaderCodec()
    assert len(spdy.DICTIONARY) == 1423  # the SPDY/3 dictionary's size
    for headers in ({"streamType": "error", "port": "80", "requestID": "0"}, {}):
        assert server.decode(client.encode(headers)) == {k.lower(): v for k, v in headers.items()}


def test_spdy_frames_are_reassembled_from_any_chunking() -> None:
    client, server = spdy.HeaderCodec(), spdy.HeaderCodec()
    syn = client.encode({"streamtype": "data", "port": "8080", "requestid": "1"})
    syn_frame = spdy._control(spdy.SYN_STREAM, 0, b"\x00\x00\x00\x03" + b"\x00" * 6 + syn)
    wire = syn_frame + spdy.data(3, b"payload", fin=True) + spdy.ping(7)
    reader = spdy.FrameReader(server)
    frames = [f for i in range(len(wire)) for f in reader.feed(wire[i : i + 1])]
    assert [(f.control, f.type, f.stream_id) for f in frames] == [
        (True, spdy.SYN_STREAM, 3),
        (False, 0, 3),
        (True, spdy.PING, 0),
    ]
    assert frames[0].headers == {"streamtype": "data", "port": "8080", "requestid": "1"}
    assert frames[1].payload == b"payload"
    assert frames[1].fin


async def test_pod_proxy_relays_method_path_query_and_body(
    sim: kubesim.Cluster, api: Api, programs: Programs
) -> None:
    sim.store.create(pod("web"))
    await programs.started("web")
    await running(sim, "web")
    assert await api.ok("GET", f"{PODS}/web:8080/proxy/metrics?x=1") == "web GET /metrics?x=1 "
    answer = await api.ok("POST", f"{PODS}/http:web:8080/proxy/", raw=b"body")
    assert answer == "web POST / body"
    status, body = await api.req("GET", f"{PODS}/web:9999/proxy/")
    ip = (sim.store.get("pods", "web", "default") or {})["status"]["podIP"]
    assert status == 503
    assert body["message"] == (
        f"error trying to reach service: dial tcp {ip}:9999: connect: connection refused"
    )
    status, body = await api.req("GET", f"{PODS}/a:b:c:d/proxy/")
    assert (status, body["message"]) == (400, 'invalid pod request "a:b:c:d"')


async def test_service_proxy_reaches_a_ready_endpoint_pod(
    sim: kubesim.Cluster, api: Api, programs: Programs
) -> None:
    sim.store.create(pod("web"))
    await programs.started("web")
    await sim.wait_for(
        lambda: any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in ((sim.store.get("pods", "web", "default") or {}).get("status") or {}).get(
                "conditions"
            )
            or []
        ),
        DEADLINE,
        "pod ready",
    )
    sim.store.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "svc", "namespace": "default"},
            "spec": {
                "selector": {"app": "web"},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
            },
        }
    )
    base = "/api/v1/namespaces/default/services"
    assert await api.ok("GET", f"{base}/svc:80/proxy/a") == "web GET /a "
    assert await api.ok("GET", f"{base}/svc:http/proxy/b") == "web GET /b "
    status, body = await api.req("GET", f"{base}/svc:81/proxy/")
    assert (status, body["message"]) == (503, 'no service port 81 found for service "svc"')


async def test_ephemeral_containers_can_only_be_added(
    sim: kubesim.Cluster, api: Api, programs: Programs
) -> None:
    sim.store.create(pod("web"))
    await running(sim, "web")
    path = f"{PODS}/web/ephemeralcontainers"
    smp = "application/strategic-merge-patch+json"
    debugger = {"name": "dbg", "image": "busybox", "stdin": True}
    added = await api.ok(
        "PATCH",
        path,
        {"spec": {"ephemeralContainers": [debugger], "activeDeadlineSeconds": 5}},
        ctype=smp,
    )
    assert [c["name"] for c in added["spec"]["ephemeralContainers"]] == ["dbg"]
    assert "activeDeadlineSeconds" not in added["spec"]  # only ephemeral containers change
    await sim.wait_for(
        lambda: (
            "running"
            in (
                (
                    ((sim.store.get("pods", "web", "default") or {}).get("status") or {}).get(
                        "ephemeralContainerStatuses"
                    )
                    or [{}]
                )[0].get("state")
                or {}
            )
        ),
        DEADLINE,
        "ephemeral container running",
    )
    got = await api.ok("GET", path)
    assert got["kind"] == "Pod"
    current = got["spec"]["ephemeralContainers"]
    status, body = await api.req(
        "PATCH",
        path,
        [{"op": "remove", "path": "/spec/ephemeralContainers/0"}],
        ctype="application/json-patch+json",
    )
    assert status == 422
    assert body["message"] == (
        'Pod "web" is invalid: spec.ephemeralContainers: Forbidden: existing ephemeral '
        'containers "dbg" may not be removed\n'
    )
    changed = [{**current[0], "image": "alpine"}]
    status, body = await api.req(
        "PATCH",
        path,
        {"spec": {"ephemeralContainers": changed}},
        ctype="application/merge-patch+json",
    )
    assert status == 422
    assert "may not be changed" in body["message"]
    bad = [*current, {"name": "web", "image": "busybox", "ports": [{"containerPort": 1}]}]
    status, body = await api.req(
        "PATCH",
        path,
        {"spec": {"ephemeralContainers": bad}},
        ctype="application/merge-patch+json",
    )
    assert status == 422
    assert body["message"] == (
        'Pod "web" is invalid: [spec.ephemeralContainers[1].name: Duplicate value: "web", '
        "spec.ephemeralContainers[1].ports: Forbidden: cannot be set for an Ephemeral "
        "Container]"
    )


# ----- kubectl -------------------------------------------------------------------------------


# kubectl 1.35 uses WebSockets; these make it speak SPDY/3.1 as older kubectl releases do.
SPDY_ONLY = {
    "KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false",
    "KUBECTL_PORT_FORWARD_WEBSOCKETS": "false",
}


async def kubectl(
    sim: kubesim.Cluster,
    *args: str,
    stdin: str | None = None,
    timeout: float = 2 * DEADLINE,  # longer than a `kubectl wait --timeout` (KUBECTL_WAIT)
    env: dict[str, str] | None = None,
) -> tuple[int, str, str]:
    """Run kubectl; returns (exit code, stdout, stderr)."""
    env = {**os.environ, "KUBECONFIG": str(sim.kubeconfig_path), **(env or {})}
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL),
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        out, err = await within(
            proc.communicate(stdin.encode() if stdin is not None else None),
            f"kubectl {' '.join(args)}",
            timeout,
        )
    except AssertionError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def ok(sim: kubesim.Cluster, *args: str, **kw: Any) -> str:
    code, out, err = await kubectl(sim, *args, **kw)
    assert code == 0, err
    return out


@pytest.fixture
async def background(sim: kubesim.Cluster) -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """Long-running kubectl processes, stopped at the end of the test."""
    procs: list[asyncio.subprocess.Process] = []
    yield procs
    for proc in procs:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


async def start(
    sim: kubesim.Cluster,
    procs: list[asyncio.subprocess.Process],
    *args: str,
    env: dict[str, str] | None = None,
) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL),
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "KUBECONFIG": str(sim.kubeconfig_path), **(env or {})},
    )
    procs.append(proc)
    return proc


@needs_kubectl
async def test_kubectl_wait_for_condition_jsonpath_create_and_delete(
    sim: kubesim.Cluster, background: list[asyncio.subprocess.Process]
) -> None:
    sim.store.create(pod("p", image="nginx"))
    assert "condition met" in await ok(sim, "wait", "--for=condition=Ready", "pod/p", KUBECTL_WAIT)
    sim.store.create(configmap("c"))
    out = await ok(sim, "wait", "--for=jsonpath={.data.k}=v", "configmap/c", KUBECTL_WAIT)
    assert "condition met" in out
    watches = sim.stats.count("watch", "pods")
    deleting = await start(sim, background, "wait", "--for=delete", "pod/p", KUBECTL_WAIT)
    await sim.wait_for(lambda: sim.stats.count("watch", "pods") > watches, DEADLINE, "a pod watch")
    sim.store.delete("pods", "p", "default", grace=0)
    looked = sim.stats.count("get", "configmaps")
    creating = await start(sim, background, "wait", "--for=create", "configmap/later", KUBECTL_WAIT)
    await sim.wait_for(
        lambda: sim.stats.count("get", "configmaps") > looked, DEADLINE, "kubectl looking for it"
    )
    sim.store.create(configmap("later"))
    assert await within(creating.wait(), "kubectl wait --for=create to return") == 0
    assert await within(deleting.wait(), "kubectl wait --for=delete to return") == 0


@needs_kubectl
async def test_kubectl_rollout_status_of_daemonset_and_deployment(sim: kubesim.Cluster) -> None:
    sim.store.create(daemonset("agent"))
    assert "successfully rolled out" in await ok(sim, "rollout", "status", "ds/agent")
    await ok(sim, "create", "deployment", "web", "--image=nginx:1.27", "--replicas=2")
    assert "successfully rolled out" in await ok(sim, "rollout", "status", "deploy/web")


@needs_kubectl
async def test_kubectl_delete_pod_returns_promptly_and_cascades_in_the_foreground(
    sim: kubesim.Cluster,
) -> None:
    sim.store.create(pod("p", image="nginx"))
    await running(sim, "p")
    # Promptly: well within the pod's 30 s grace period (generous for kubectl on a loaded
    # machine, yet failing a delete that waited out the grace period).
    code, out, err = await kubectl(sim, "delete", "pod", "p", timeout=20)
    assert code == 0, err
    assert 'pod "p" deleted' in out
    await ok(sim, "create", "deployment", "web", "--image=nginx:1.27", "--replicas=2")
    await sim.wait_for(lambda: len(sim.store.list("pods", "default")) == 2, DEADLINE, "2 pods")
    out = await ok(sim, "delete", "deployment", "web", "--cascade=foreground")
    assert 'deployment.apps "web" deleted' in out
    assert sim.store.get("deployments.apps", "web", "default") is None
    assert sim.store.list("replicasets.apps", "default") == []


@needs_kubectl
async def test_kubectl_run_interactive_attaches_and_removes_the_pod(
    sim: kubesim.Cluster, programs: Programs
) -> None:
    code, out, err = await kubectl(
        sim,
        "run",
        "-i",
        "--rm",
        "talk",
        "--image=example/echo",
        "--restart=Never",
        stdin="hello\nworld\n",
    )
    assert code == 0, err
    assert "echo: hello\necho: world\n" in out
    assert 'pod "talk" deleted' in out
    assert sim.store.get("pods", "talk", "default") is None


@needs_kubectl
async def test_kubectl_logs_plain_tail_timestamps_selector_previous_and_follow(
    sim: kubesim.Cluster, programs: Programs, background: list[asyncio.subprocess.Process]
) -> None:
    sim.store.create(pod("web"))
    ctx = await programs.started("web")
    ctx.log("second")
    assert await ok(sim, "logs", "web") == "hello from web run 1\na warning\nsecond\n"
    assert await ok(sim, "logs", "web", "--tail=1") == "second\n"
    stamped = (await ok(sim, "logs", "web", "--timestamps")).encode().splitlines()
    assert all(TIMESTAMP.match(line) for line in stamped)
    assert await ok(sim, "logs", "-l", "app=web", "--tail=1") == "second\n"
    code, _, err = await kubectl(sim, "logs", "web", "--previous")
    assert code == 1
    assert 'previous terminated container "web" in pod "web" not found' in err
    ctx.exit(2)
    restarted = await programs.started("web", run=2)
    await sim.wait_for(lambda: "running" in _state(sim, "web"), DEADLINE, "restarted")
    assert (await ok(sim, "logs", "web", "-p")).endswith("second\n")
    follower = await start(sim, background, "logs", "-f", "web")
    assert follower.stdout is not None
    assert await within(follower.stdout.readline(), "the first log line") == (
        b"hello from web run 2\n"
    )
    log = sim.kubelet.runtime.instances(_uid(sim, "web"), "web")[-1].log
    await sim.wait_for(lambda: log.followers > 0, DEADLINE, "kubectl following the log")
    restarted.log("live line")
    lines = [await within(follower.stdout.readline(), "a followed log line") for _ in range(2)]
    assert lines == [b"a warning\n", b"live line\n"]
    restarted.exit(0)
    assert await within(follower.wait(), "kubectl logs -f to end with the container") == 0


@needs_kubectl
@pytest.mark.parametrize("env", [{}, SPDY_ONLY], ids=["websocket", "spdy-upgrade"])
async def test_kubectl_exec_answers_from_the_handler_and_reports_missing_programs(
    sim: kubesim.Cluster, programs: Programs, env: dict[str, str]
) -> None:
    sim.store.create(pod("web"))
    await programs.started("web")
    assert await ok(sim, "exec", "web", "--", "echo", "hi", "there", env=env) == "hi there\n"
    assert await ok(sim, "exec", "-i", "web", "--", "cat", stdin="piped", env=env) == "piped"
    code, _, err = await kubectl(sim, "exec", "web", "--", "fail", "5", env=env)
    assert code == 5
    assert "command terminated with exit code 5" in err
    code, _, err = await kubectl(sim, "exec", "web", "--", "nvidia-smi", env=env)
    assert code == 126
    assert (
        "OCI runtime exec failed: exec failed: unable to start container process: exec: "
        '"nvidia-smi": executable file not found in $PATH: unknown'
    ) in err
    assert "command terminated with exit code 126" in err
    code, out, err = await kubectl(
        sim, "cp", "web:/etc/hostname", "/tmp/kubesim-never-written", env=env
    )
    assert code == 126
    assert '"tar": executable file not found' in out + err


@needs_kubectl
async def test_kubectl_cp_both_ways_through_a_runners_tar_handler(
    sim: kubesim.Cluster, tmp_path: Path
) -> None:
    async def files(ctx: PodContext) -> int:
        ctx.set_exec_handler({"tar": tar_exec_handler(ctx.path)})
        await asyncio.Event().wait()
        return 0

    sim.register_pod_runner(files, image="example/files")
    spec = pod("files", image="example/files", volumes=[{"name": "data", "emptyDir": {}}])
    spec["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    sim.store.create(spec)
    await running(sim, "files")
    local = tmp_path / "in.txt"
    local.write_text("copied through tar\n")
    await ok(sim, "cp", str(local), "files:/data/copy.txt")
    await ok(sim, "cp", "files:/data/copy.txt", str(tmp_path / "back.txt"))
    assert (tmp_path / "back.txt").read_text() == "copied through tar\n"
    code, out, err = await kubectl(sim, "cp", str(local), "files:/etc/outside.txt")
    assert code != 0
    assert "/etc/outside.txt: Cannot open" in out + err


@needs_kubectl
@pytest.mark.parametrize("env", [{}, SPDY_ONLY], ids=["websocket-tunnel", "spdy-upgrade"])
async def test_kubectl_port_forward_then_http_get(
    sim: kubesim.Cluster,
    programs: Programs,
    background: list[asyncio.subprocess.Process],
    env: dict[str, str],
) -> None:
    sim.store.create(pod("web"))
    await programs.started("web")
    await running(sim, "web")
    forward = await start(sim, background, "port-forward", "pod/web", ":8080", env=env)
    assert forward.stdout is not None
    line = (await within(forward.stdout.readline(), "the Forwarding line")).decode()
    found = re.match(r"Forwarding from 127\.0\.0\.1:(\d+) -> 8080", line)
    assert found, line
    async with aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{found.group(1)}/through/tunnel?q=1"
        for _ in range(2):  # two connections over the same tunnel
            async with session.get(url) as resp:
                assert await resp.text() == "web GET /through/tunnel?q=1 "


@needs_kubectl
async def test_kubectl_port_forward_to_an_unserved_port_reports_the_refusal(
    sim: kubesim.Cluster, programs: Programs, background: list[asyncio.subprocess.Process]
) -> None:
    sim.store.create(pod("web"))
    await programs.started("web")
    await running(sim, "web")
    forward = await start(sim, background, "port-forward", "pod/web", ":9999")
    assert forward.stdout is not None
    assert forward.stderr is not None
    line = (await within(forward.stdout.readline(), "the Forwarding line")).decode()
    found = re.match(r"Forwarding from 127\.0\.0\.1:(\d+) -> 9999", line)
    assert found, line
    with pytest.raises(aiohttp.ClientError):
        async with aiohttp.ClientSession() as session:
            await session.get(f"http://127.0.0.1:{found.group(1)}/")
    await within(forward.wait(), "kubectl port-forward to give up")
    err = (await forward.stderr.read()).decode()
    assert "an error occurred forwarding" in err
    assert "connect: connection refused" in err


@needs_kubectl
async def test_kubectl_proxy_and_get_raw_reach_pod_and_service_proxies(
    sim: kubesim.Cluster, programs: Programs, background: list[asyncio.subprocess.Process]
) -> None:
    sim.store.create(pod("web"))
    await programs.started("web")
    await running(sim, "web")
    raw = await ok(sim, "get", "--raw", "/api/v1/namespaces/default/pods/web:8080/proxy/raw")
    assert raw == "web GET /raw "
    proxy = await start(sim, background, "proxy", "--port=0")
    assert proxy.stdout is not None
    line = (await within(proxy.stdout.readline(), "the proxy's address")).decode()
    found = re.search(r"127\.0\.0\.1:(\d+)", line)
    assert found, line
    async with aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{found.group(1)}{PODS}/web:8080/proxy/via/kubectl"
        async with session.get(url) as resp:
            assert await resp.text() == "web GET /via/kubectl "


@needs_kubectl
@pytest.mark.parametrize("env", [{}, SPDY_ONLY], ids=["websocket", "spdy-upgrade"])
async def test_kubectl_attach_prints_the_containers_output(
    sim: kubesim.Cluster,
    programs: Programs,
    background: list[asyncio.subprocess.Process],
    env: dict[str, str],
) -> None:
    sim.store.create(pod("web"))
    ctx = await programs.started("web")
    await running(sim, "web")
    attached = await start(sim, background, "attach", "web", env=env)
    assert attached.stdout is not None
    log = sim.kubelet.runtime.instances(_uid(sim, "web"), "web")[-1].log
    await sim.wait_for(lambda: log.followers > 0, DEADLINE, "kubectl attached")
    ctx.log("attached line")
    assert await within(attached.stdout.readline(), "the attached line") == b"attached line\n"
    ctx.exit(0)
    assert await within(attached.wait(), "kubectl attach to end with the container") == 0


@needs_kubectl
async def test_kubectl_debug_adds_an_ephemeral_container_and_a_node_debug_pod(
    sim: kubesim.Cluster, programs: Programs
) -> None:
    sim.store.create(pod("web"))
    await running(sim, "web")
    code, out, err = await kubectl(
        sim,
        "debug",
        "web",
        "-i",
        "--image=busybox",
        "-c",
        "dbg",
        "--profile=general",
        stdin="exit 4\n",
    )
    assert code == 0, err
    status = (sim.store.get("pods", "web", "default") or {})["status"]
    [debugger] = status["ephemeralContainerStatuses"]
    assert debugger["name"] == "dbg"
    assert debugger["state"]["terminated"]["exitCode"] == 4
    code, out, err = await kubectl(
        sim, "debug", "node/node-1", "-i", "--image=busybox", "--profile=general", stdin="exit\n"
    )
    assert code == 0, err
    assert "Creating debugging pod node-debugger-node-1-" in out
    [debug_pod] = [p for p in sim.store.list("pods", "default") if p["metadata"]["name"] != "web"]
    assert debug_pod["spec"]["nodeName"] == "node-1"
    await sim.wait_for(
        lambda: (
            (sim.store.get("pods", debug_pod["metadata"]["name"], "default") or {})
            .get("status", {})
            .get("phase")
            == "Succeeded"
        ),
        DEADLINE,
        "the debug pod ends with its shell",
    )
