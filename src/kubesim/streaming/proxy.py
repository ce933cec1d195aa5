"""`pods/{name}/proxy` and `services/{name}/proxy`: HTTP relayed to what a runner serves.

The name part may carry a scheme and port: `name`, `name:port` or `scheme:name:port` (scheme
`http` or `https`). A pod without a port goes to port 80 (the first declared container port if
any). A service port is matched by name or number and its target resolved against the chosen
endpoint; endpoints come from the Service's Endpoints object when there is one, else from the
ready pods its selector matches. Unreachable targets answer 503 `error trying to reach service:
dial tcp <ip>:<port>: connect: connection refused`, as the API server's proxy transport does.
"""

from __future__ import annotations

import json
import ssl
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from kubesim import errors, selectors
from kubesim.store import Store
from kubesim.streaming.runtime import ContainerRuntime

POD_KEY = ("", "pods")
SERVICE_KEY = ("", "services")
ENDPOINTS_KEY = ("", "endpoints")
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "authorization",
}


def split_scheme_name_port(raw: str) -> tuple[str, str, str] | None:
    """`name`, `name:port` or `scheme:name:port` (scheme http/https) into parts, else None."""
    parts = raw.split(":")
    if len(parts) == 1:
        scheme, name, port = "", parts[0], ""
    elif len(parts) == 2:
        scheme, name, port = "", parts[0], parts[1]
    elif len(parts) == 3:
        scheme, name, port = parts
    else:
        return None
    if not name or scheme not in ("", "http", "https"):
        return None
    return scheme, name, port


def proxied_path(request: web.Request) -> str:
    """The part of the request path after `/proxy` (raw, with its trailing slash kept)."""
    raw = request.rel_url.raw_path
    marker = raw.find("/proxy")
    rest = raw[marker + len("/proxy") :] if marker >= 0 else ""
    return rest or "/"


def _unreachable(ip: str, port: int) -> errors.ApiError:
    return errors.ApiError(
        503,
        f"error trying to reach service: dial tcp {ip}:{port}: connect: connection refused",
    )


async def relay(
    request: web.Request, scheme: str, address: tuple[str, int] | None, ip: str, port: int
) -> web.StreamResponse:
    """Forward the request to a local listener and stream its answer back."""
    if address is None:
        raise _unreachable(ip, port)
    host, local_port = address
    url = f"{scheme or 'http'}://{host}:{local_port}{proxied_path(request)}"
    if request.rel_url.raw_query_string:
        url += "?" + request.rel_url.raw_query_string
    headers = CIMultiDict(
        (k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP
    )
    # The real proxy does not verify the backend's certificate either.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    body = await request.read()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
    session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
    try:
        upstream = await session.request(
            request.method,
            url,
            headers=headers,
            data=body or None,
            allow_redirects=False,
            ssl=context if scheme == "https" else False,
        )
    except (aiohttp.ClientConnectionError, OSError):
        await session.close()
        raise _unreachable(ip, port) from None
    try:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for key, value in upstream.headers.items():
            if key.lower() not in _HOP_BY_HOP:
                response.headers.add(key, value)
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response
    finally:
        upstream.release()
        await session.close()


def pod_target(
    store: Store, runtime: ContainerRuntime, namespace: str, raw_name: str
) -> tuple[str, tuple[str, int] | None, str, int]:
    """(scheme, local address, pod IP, port) for a pod proxy name."""
    parts = split_scheme_name_port(raw_name)
    if parts is None:
        raise errors.bad_request(f'invalid pod request "{raw_name}"')
    scheme, name, port_text = parts
    stored = store.peek(POD_KEY, namespace, name)
    if stored is None:
        raise errors.not_found("pods", "", name)
    pod = stored.obj
    if not port_text:
        for container in (pod.get("spec") or {}).get("containers") or []:
            ports = container.get("ports") or []
            if ports:
                port_text = str(ports[0].get("containerPort", ""))
                break
    ip = (pod.get("status") or {}).get("podIP") or ""
    if not ip:
        raise errors.bad_request("address not allowed")
    port = int(port_text) if port_text.isdigit() else 80
    if port_text and not port_text.isdigit():
        # A named port reaches the dialer as-is and fails there, as upstream does.
        raise errors.ApiError(
            503, f"error trying to reach service: dial tcp: lookup {ip}:{port_text}: unknown port"
        )
    address = runtime.port(pod["metadata"].get("uid", ""), port)
    return scheme, address, ip, port


def _ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _container_port(pod: dict[str, Any], target: Any) -> int | None:
    if isinstance(target, int) or (isinstance(target, str) and target.isdigit()):
        return int(target)
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == target:
                return int(port.get("containerPort", 0))
    return None


def service_target(
    store: Store, runtime: ContainerRuntime, namespace: str, raw_name: str
) -> tuple[str, tuple[str, int] | None, str, int]:
    """(scheme, local address, endpoint IP, port) for a service proxy name."""
    parts = split_scheme_name_port(raw_name)
    if parts is None:
        raise errors.bad_request(f'invalid service request "{raw_name}"')
    scheme, name, port_text = parts
    stored = store.peek(SERVICE_KEY, namespace, name)
    if stored is None:
        raise errors.not_found("services", "", name)
    service = stored.obj
    spec = service.get("spec") or {}
    service_port: dict[str, Any] | None = None
    for candidate in spec.get("ports") or []:
        if port_text.isdigit() and int(candidate.get("port", 0)) == int(port_text):
            service_port = candidate
            break
        if not port_text.isdigit() and candidate.get("name", "") == port_text:
            service_port = candidate
            break
    if service_port is None:
        if port_text.isdigit():
            raise errors.ApiError(
                503, f"no service port {port_text} found for service {json.dumps(name)}"
            )
        raise errors.ApiError(503, f"no endpoints available for service {json.dumps(name)}")
    for pod in _endpoint_pods(store, namespace, name, spec):
        port = _container_port(pod, service_port.get("targetPort", service_port.get("port")))
        if port is None:
            continue
        ip = (pod.get("status") or {}).get("podIP", "")
        return scheme, runtime.port(pod["metadata"].get("uid", ""), port), ip, port
    raise errors.ApiError(503, f"no endpoints available for service {json.dumps(name)}")


def _endpoint_pods(
    store: Store, namespace: str, name: str, spec: dict[str, Any]
) -> list[dict[str, Any]]:
    endpoints = store.peek(ENDPOINTS_KEY, namespace, name)
    if endpoints is not None:
        pods: list[dict[str, Any]] = []
        for subset in endpoints.obj.get("subsets") or []:
            for address in subset.get("addresses") or []:
                ref = address.get("targetRef") or {}
                pod = store.peek(POD_KEY, ref.get("namespace", namespace), ref.get("name", ""))
                if pod is not None:
                    pods.append(pod.obj)
        return pods
    selector = spec.get("selector") or {}
    if not selector:
        return []
    labels = selectors.from_label_selector_object({"matchLabels": selector})
    rt = store.registry.resolve("pods")
    found = store.select(rt, namespace, labels, selectors.parse_field_selector(None))
    return [s.obj for s in found if _ready(s.obj)]
