"""A lean HTTP/1.1 path for the operator's hot writes (node label patches, status patches, events).

Each request through lightkube costs about half a millisecond of CPU in the client stack: httpx
merges and parses the URL, httpcore's pool walks and probes every pooled connection before each
request and after each response, and anyio/httpcore send the headers and the body as two TLS
records. At 5,000 nodes the operator sends some 10,000 such writes on a two-core machine.

`LeanHttp` sends a request with the settings lightkube resolved from the same kubeconfig: the
server URL (with any path prefix), TLS verified against the cluster CA (or not, with
`insecure-skip-tls-verify`), the client certificate, the bearer token (a token file is re-read
and the request sent once more on a 401, as lightkube does), basic auth, the field manager
(lightkube prepares each request's path and query) and the client's timeouts; no retries, as
lightkube. A refusal raises lightkube's `ApiError` with the server's Status. Requests are
framed and parsed by h11 (the HTTP/1.1 state machine httpcore itself uses), headers and body
written at once, over keep-alive connections kept in a plain list: a
connection the server closed is seen by the event loop (`at_eof`), with no socket probe.

`LeanHttp.for_client` answers None for a client it cannot speak for (exec or other auth plugins,
a proxy or a custom transport): the writer then goes through lightkube as before.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import weakref
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import quote, urlencode

import h11
import httpx2
import msgspec
from lightkube import ApiError, AsyncClient
from lightkube.config import client_adapter
from lightkube.core.generic_client import GenericAsyncClient
from lightkube.models.meta_v1 import Status

# How long an idle connection is kept (httpx's default keep-alive expiry).
KEEPALIVE_EXPIRY = 5.0
# Idle connections kept at most (the operator writes with at most 8 workers + 16 apply slots).
MAX_IDLE = 24
READ_CHUNK = 65536

_encode = msgspec.json.encode


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    h11: h11.Connection
    idle_since: float = 0.0

    def usable(self, now: float) -> bool:
        return (
            not self.reader.at_eof()
            and not self.writer.is_closing()
            and now - self.idle_since < KEEPALIVE_EXPIRY
        )

    def close(self) -> None:
        self.writer.close()


class _TokenFile:
    """A service-account token file, re-read when the server answers 401 (it is rotated)."""

    def __init__(self, auth: client_adapter.BearerTokenFileAuth):
        self.auth = auth

    def header(self, *, fresh: bool = False) -> str:
        if fresh or self.auth._last_bearer is None:
            self.auth._last_bearer = self.auth._read_token()
        return self.auth._last_bearer


class LeanHttp:
    """Keep-alive HTTP/1.1 requests to the API server a lightkube client is configured for."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        prefix: str,
        ssl_context: ssl.SSLContext | None,
        authorization: str | _TokenFile | None,
        timeout: httpx2.Timeout,
        user_agent: str,
    ):
        self.host, self.port, self.prefix = host, port, prefix.rstrip("/")
        self.ssl_context = ssl_context
        self.authorization = authorization
        self.connect_timeout = timeout.connect
        self.read_timeout = timeout.read
        default_port = 443 if ssl_context is not None else 80
        self.host_header = host if port == default_port else f"{host}:{port}"
        if ":" in host and not host.startswith("["):  # an IPv6 address
            self.host_header = f"[{host}]" if port == default_port else f"[{host}]:{port}"
        self.user_agent = user_agent
        self._idle: list[_Conn] = []
        self._sweeper: asyncio.TimerHandle | None = None

    @classmethod
    def for_client(cls, client: AsyncClient) -> LeanHttp | None:
        """The lean path for `client`'s cluster, or None where it cannot stand in for it."""
        generic = getattr(client, "_client", None)
        httpx_client = getattr(generic, "_client", None)
        if not isinstance(generic, GenericAsyncClient) or not isinstance(
            httpx_client, httpx2.AsyncClient
        ):
            return None
        config = generic.config
        if config is None or config.user is None:
            return None
        if httpx_client._mounts or not isinstance(
            httpx_client._transport, httpx2.AsyncHTTPTransport
        ):
            return None  # a proxy or a transport of its own
        auth = httpx_client.auth
        authorization: str | _TokenFile | None
        if auth is None:
            authorization = None
        elif type(auth) is client_adapter.BearerAuth:
            authorization = auth._bearer
        elif type(auth) is client_adapter.BearerTokenFileAuth:
            authorization = _TokenFile(auth)
        elif type(auth) is httpx2.BasicAuth:
            authorization = auth._auth_header
        else:
            return None  # exec plugins and others: lightkube's flow
        url = httpx_client.base_url
        scheme = url.scheme
        if scheme not in ("http", "https") or not url.host:
            return None
        context = None
        if scheme == "https":
            context = client_adapter.verify_cluster(
                config.cluster, config.user, config.abs_file, trust_env=False
            )
        return cls(
            host=url.host,
            port=url.port or (443 if scheme == "https" else 80),
            prefix=url.path,
            ssl_context=context,
            authorization=authorization,
            timeout=httpx_client.timeout,
            user_agent=str(httpx_client.headers.get("user-agent", "gpu-operator")),
        )

    def target(self, url: str, params: dict[str, str]) -> str:
        """The request target for the relative API path and query lightkube prepared (its
        `BasicRequest`: the field manager and dryRun already in the query)."""
        path = f"{self.prefix}/{quote(url)}"
        return f"{path}?{urlencode(params)}" if params else path

    async def send(self, method: str, target: str, body: Any, content_type: str) -> bytes:
        """Send a write and return the response body; a refusal raises `ApiError`."""
        data = body if isinstance(body, bytes) else _encode(body)
        auth = self.authorization
        header = auth.header() if isinstance(auth, _TokenFile) else auth
        status, payload = await self._exchange(method, target, data, content_type, header)
        if status == 401 and isinstance(auth, _TokenFile):
            # The token was rotated: read it again and send once more (as lightkube does).
            header = auth.header(fresh=True)
            status, payload = await self._exchange(method, target, data, content_type, header)
        if status >= 400:
            raise api_error(status, payload)
        return payload

    async def _exchange(
        self, method: str, target: str, data: bytes, content_type: str, authorization: str | None
    ) -> tuple[int, bytes]:
        headers = [
            ("Host", self.host_header),
            ("Accept", "application/json"),
            ("User-Agent", self.user_agent),
            ("Content-Type", content_type),
            ("Content-Length", str(len(data))),
        ]
        if authorization is not None:
            headers.append(("Authorization", authorization))
        conn = await self._acquire()
        try:
            h = conn.h11
            out = h.send(h11.Request(method=method, target=target, headers=headers))
            body = h.send(h11.Data(data=data))
            end = h.send(h11.EndOfMessage())
            conn.writer.write(b"".join((out or b"", body or b"", end or b"")))
            async with asyncio.timeout(self.read_timeout):
                await conn.writer.drain()
                status, payload = await self._response(conn)
        except TimeoutError:
            conn.close()
            raise httpx2.ReadTimeout(
                f"{method} {target}: no answer in {self.read_timeout}s"
            ) from None
        except (OSError, h11.ProtocolError, EOFError) as err:
            conn.close()
            raise httpx2.RemoteProtocolError(f"{method} {target}: {err}") from err
        except BaseException:
            conn.close()
            raise
        self._release(conn)
        return status, payload

    async def _response(self, conn: _Conn) -> tuple[int, bytes]:
        h = conn.h11
        status = 0
        chunks: list[bytes] = []
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                h.receive_data(await conn.reader.read(READ_CHUNK))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return status, b"".join(chunks)
            elif isinstance(event, h11.ConnectionClosed):
                raise EOFError("the server closed the connection")
            # InformationalResponse (1xx): keep reading

    async def _acquire(self) -> _Conn:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()  # the most recently used: least likely to have expired
            if conn.usable(now):
                return conn
            conn.close()
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(
                    self.host,
                    self.port,
                    ssl=self.ssl_context,
                    server_hostname=self.host if self.ssl_context is not None else None,
                    limit=READ_CHUNK,
                )
        except TimeoutError:
            raise httpx2.ConnectTimeout(
                f"no connection to {self.host_header} in {self.connect_timeout}s"
            ) from None
        except (OSError, ssl.SSLError) as err:
            raise httpx2.ConnectError(f"cannot connect to {self.host_header}: {err}") from err
        return _Conn(reader, writer, h11.Connection(h11.CLIENT))

    def _release(self, conn: _Conn) -> None:
        h = conn.h11
        if h.our_state is h11.DONE and h.their_state is h11.DONE and len(self._idle) < MAX_IDLE:
            h.start_next_cycle()
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
            if self._sweeper is None:
                self._sweeper = asyncio.get_running_loop().call_later(KEEPALIVE_EXPIRY, self._sweep)
        else:
            conn.close()

    def _sweep(self) -> None:
        """Close the connections idle past the keep-alive expiry; look again while any is left."""
        self._sweeper = None
        now = time.monotonic()
        kept = [c for c in self._idle if c.usable(now)]
        for conn in self._idle:
            if conn not in kept:
                conn.close()
        self._idle = kept
        if kept:
            oldest = min(c.idle_since for c in kept)
            self._sweeper = asyncio.get_running_loop().call_later(
                max(0.05, oldest + KEEPALIVE_EXPIRY - now), self._sweep
            )

    def close(self) -> None:
        """Close every idle connection (the client is closing)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


# One lean path per lightkube client, shared by its writers (their connections are reused).
_SHARED: weakref.WeakKeyDictionary[AsyncClient, LeanHttp | None] = weakref.WeakKeyDictionary()


def shared(client: AsyncClient) -> LeanHttp | None:
    """The lean path of `client` (made on first use), or None where lightkube must send."""
    try:
        return _SHARED[client]
    except KeyError:
        lean = _SHARED[client] = LeanHttp.for_client(client)
        return lean
    except TypeError:  # not weakly referenceable: a stand-in client in a test
        return None


def close(client: AsyncClient) -> None:
    """Close the idle connections of `client`'s lean path, if it has one."""
    lean = _SHARED.pop(client, None)
    if lean is not None:
        lean.close()


def api_error(code: int, payload: bytes) -> ApiError:
    """lightkube's ApiError for a refused request: the server's Status, or one made of the code
    and the body's text when the answer is no Status (a proxy's error page)."""
    try:
        decoded = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        decoded = None
    if isinstance(decoded, dict) and decoded.get("kind") == "Status":
        status = cast(Status, Status.from_dict(decoded))
        if status.code is None:
            status.code = code
    else:
        text = payload.decode("utf-8", "replace").strip()[:512]
        status = Status(code=code, message=text or f"HTTP {code}", status="Failure")
    return ApiError(status=status)
