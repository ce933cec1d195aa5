"""The API server's streaming subresources: pods log/exec/attach/portforward/proxy/
ephemeralcontainers, services proxy and nodes proxy."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web

from kubesim import errors, patch
from kubesim.resources import ResourceType
from kubesim.store import Store, dumps
from kubesim.streaming import ephemeral, pod_containers, proxy
from kubesim.streaming.exec import serve_attach, serve_exec
from kubesim.streaming.logs import ContainerLog, LogOptions, parse_options
from kubesim.streaming.portforward import serve_portforward
from kubesim.streaming.runtime import ContainerInstance, ContainerRuntime

POD_SUBRESOURCES = frozenset(
    {"log", "exec", "attach", "portforward", "proxy", "ephemeralcontainers"}
)
JSON_TYPE = "application/json"
_WAITING_TEXT = {
    "ErrImagePull": "image can't be pulled",
    "ImagePullBackOff": "trying and failing to pull image",
}


def handles(rt: ResourceType, name: str | None, subresource: str | None) -> bool:
    """Whether a request belongs here rather than to the generic object handlers."""
    if not name or subresource is None or rt.group:
        return False
    if rt.plural == "pods":
        return subresource in POD_SUBRESOURCES
    return rt.plural in ("services", "nodes") and subresource == "proxy"


def verb_for(method: str) -> str:
    """The request verb a streaming request counts as (for stats and faults)."""
    return {
        "GET": "get",
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete",
    }.get(method, method.lower())


class StreamingApi:
    """Answers the streaming subresources from the store and the kubelet's container runtime."""

    def __init__(self, store: Store, runtime: ContainerRuntime | None = None) -> None:
        self.store = store
        self.runtime = runtime or ContainerRuntime()

    async def handle(
        self,
        request: web.Request,
        rt: ResourceType,
        namespace: str,
        name: str,
        subresource: str,
        manager: str,
    ) -> web.StreamResponse:
        """Dispatch one request (name and subresource are set; see `handles`)."""
        if rt.plural == "services":
            scheme, address, ip, port = proxy.service_target(
                self.store, self.runtime, namespace, name
            )
            return await proxy.relay(request, scheme, address, ip, port)
        if rt.plural == "nodes":
            return self._node_proxy(name)
        if subresource == "proxy":
            scheme, address, ip, port = proxy.pod_target(self.store, self.runtime, namespace, name)
            return await proxy.relay(request, scheme, address, ip, port)
        if subresource == "ephemeralcontainers":
            return await self._ephemeral(request, rt, namespace, name, manager)
        method = request.method
        pod = pod_containers.get_pod(self.store, namespace, name)
        if subresource == "log":
            if method != "GET":
                raise _not_allowed(method, "pods/log")
            return await self._log(request, pod)
        if method not in ("GET", "POST"):
            raise _not_allowed(method, f"pods/{subresource}")
        if subresource == "exec":
            return await serve_exec(request, pod, self.runtime)
        if subresource == "attach":
            return await serve_attach(request, pod, self.runtime)
        return await serve_portforward(request, pod, self.runtime)

    def _node_proxy(self, name: str) -> web.StreamResponse:
        node = self.store.peek(("", "nodes"), "", name)
        if node is None:
            raise errors.not_found("nodes", "", name)
        addresses = (node.obj.get("status") or {}).get("addresses") or []
        ip = next((a.get("address") for a in addresses if a.get("type") == "InternalIP"), name)
        # kubesim runs no kubelet HTTP server, so the node's kubelet port refuses connections.
        raise errors.ApiError(
            503, f"error trying to reach service: dial tcp {ip}:10250: connect: connection refused"
        )

    async def _ephemeral(
        self, request: web.Request, rt: ResourceType, namespace: str, name: str, manager: str
    ) -> web.StreamResponse:
        method = request.method
        if method == "GET":
            pod = pod_containers.get_pod(self.store, namespace, name)
            return web.Response(body=dumps(pod), content_type=JSON_TYPE)
        if method not in ("PUT", "PATCH"):
            raise _not_allowed(method, "pods/ephemeralcontainers")
        body = patch.decode_body(await request.read(), request.content_type)
        stored = ephemeral.write(
            self.store,
            rt,
            namespace,
            name,
            method,
            request.content_type,
            body,
            manager=manager,
            dry_run=request.query.get("dryRun") == "All",
        )
        return web.Response(body=stored.raw, content_type=JSON_TYPE)

    # ----- logs ----------------------------------------------------------------------------

    def _instance_for(
        self, pod: dict[str, Any], container: str, previous: bool
    ) -> ContainerInstance | None:
        """The container instance whose log a request reads, by the kubelet's status rules."""
        name = pod["metadata"]["name"]
        status = pod_containers.status_of(pod, container)
        if status is None:
            raise errors.bad_request(f'container "{container}" in pod "{name}" is not available')
        history = self.runtime.instances(pod["metadata"].get("uid", ""), container)
        state = status.get("state") or {}
        last = status.get("lastState") or {}
        if previous:
            if not last.get("terminated"):
                raise errors.bad_request(
                    f'previous terminated container "{container}" in pod "{name}" not found'
                )
            # While a restart is pending the last run is still the newest instance.
            wanted = -1 if "waiting" in state else -2
            return history[wanted] if len(history) >= -wanted else None
        if "running" in state or "terminated" in state or last.get("terminated"):
            return history[-1] if history else None
        reason = (state.get("waiting") or {}).get("reason")
        if reason:
            text = _WAITING_TEXT.get(reason, reason)
            raise errors.bad_request(
                f'container "{container}" in pod "{name}" is waiting to start: {text}'
            )
        raise errors.bad_request(
            f'container "{container}" in pod "{name}" is waiting to start - no logs yet'
        )

    async def _log(self, request: web.Request, pod: dict[str, Any]) -> web.StreamResponse:
        name = pod["metadata"]["name"]
        container = pod_containers.choose(pod, request.query.get("container"))
        options = parse_options(request.query, name, container)
        if not (pod.get("spec") or {}).get("nodeName"):
            # An unscheduled pod has no kubelet to ask: the server answers with an empty body.
            return web.Response(body=b"", content_type="text/plain")
        instance = self._instance_for(pod, container, options.previous)
        if instance is None:
            return web.Response(body=b"", content_type="text/plain")
        log = instance.log
        chunks = [options.render(e) for e in options.select(log.entries())]
        last_seq = log.next_seq - 1
        body, remaining = _limited(b"".join(chunks), options.limit_bytes)
        if not options.follow or remaining == 0:
            return web.Response(body=body, content_type="text/plain")
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        with contextlib.suppress(ConnectionResetError, asyncio.CancelledError):
            if body:
                await response.write(body)
            await _follow(response, log, options, last_seq, remaining)
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await response.write_eof()
        return response


async def _follow(
    response: web.StreamResponse,
    log: ContainerLog,
    options: LogOptions,
    seq: int,
    remaining: int | None,
) -> None:
    log.followers += 1
    try:
        while True:
            fresh = log.entries(seq)
            if fresh:
                seq = fresh[-1].seq
                chunk, remaining = _limited(
                    b"".join(options.render(e) for e in fresh if _after_since(e.nanos, options)),
                    remaining,
                )
                if chunk:
                    await response.write(chunk)
                if remaining == 0:
                    return
            elif log.closed:
                return
            else:
                await log.wait_after(seq)
    finally:
        log.followers -= 1


def _after_since(nanos: int, options: LogOptions) -> bool:
    return options.since_nanos is None or nanos >= options.since_nanos


def _limited(data: bytes, remaining: int | None) -> tuple[bytes, int | None]:
    if remaining is None:
        return data, None
    return data[:remaining], max(0, remaining - len(data))


def _not_allowed(method: str, resource: str) -> errors.ApiError:
    return errors.ApiError(
        405,
        f"the server does not allow this method on the requested resource ({method} {resource})",
        reason="MethodNotAllowed",
    )
