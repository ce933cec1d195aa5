"""Content negotiation for protobuf clients: request bodies in, responses and watch streams out.

The server keeps building JSON; when a request's Accept prefers
`application/vnd.kubernetes.protobuf` (client-go's typed clients send
`application/vnd.kubernetes.protobuf,application/json`), the finished JSON response is re-encoded
here, so JSON clients pay nothing but one header lookup. Kinds without a schema (custom resources,
Tables) stay JSON when the client also accepts JSON and get 406 otherwise, as the real server's
custom-resource handler does.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web

from kubesim import errors
from kubesim.protobuf import codec

log = logging.getLogger("kubesim.protobuf")
JSON_TYPE = "application/json"
# What the real server lists in 406/415 errors for kinds served as JSON only.
_JSON_MEDIA_TYPES = "application/json, application/yaml"
_JSON_RANGES = frozenset({"application/json", "application/yaml", "application/*", "*/*"})


def wants_protobuf(request: web.Request) -> bool:
    """Cheap pre-check: the Accept header mentions protobuf at all."""
    return "protobuf" in request.headers.get("Accept", "")


def preferences(accept: str) -> tuple[bool, bool]:
    """(protobuf preferred over JSON, JSON acceptable) for an Accept header."""
    ranges: list[tuple[float, int, str, dict[str, str]]] = []
    for position, part in enumerate(accept.split(",")):
        media, *raw_params = (p.strip() for p in part.split(";"))
        params = dict(p.partition("=")[::2] for p in raw_params if p)
        try:
            quality = float(params.pop("q", "1") or 1)
        except ValueError:
            quality = 1.0
        if quality > 0:
            ranges.append((-quality, position, media.lower(), params))
    ranges.sort()
    json_ok = any(media in _JSON_RANGES and "as" not in params for _q, _p, media, params in ranges)
    for _q, _p, media, params in ranges:
        # `as=` asks for a conversion (Table, PartialObjectMetadata) that is served as JSON only.
        if "as" in params:
            continue
        if media == codec.MEDIA_TYPE:
            return True, json_ok
        if media in _JSON_RANGES:
            return False, True
    return False, json_ok


def is_resource_path(path: str) -> bool:
    """`/api/v1/<resource>...` or `/apis/<group>/<version>/<resource>...` (not discovery)."""
    parts = [p for p in path.split("/") if p]
    return (len(parts) >= 3 and parts[0] == "api") or (len(parts) >= 4 and parts[0] == "apis")


def negotiate(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """The response re-encoded as protobuf when the client prefers it and the kind allows."""
    if not isinstance(response, web.Response) or response.content_type != JSON_TYPE:
        return response
    if response.status == 406:
        return response  # a failed negotiation is reported in JSON, as the real server does
    if not is_resource_path(request.path):
        return response
    prefer_protobuf, json_ok = preferences(request.headers.get("Accept", ""))
    if not prefer_protobuf:
        return response
    body = response.body
    if not isinstance(body, bytes | bytearray):
        return response
    try:
        obj = json.loads(body)
    except ValueError:
        return response
    proto = codec.default()
    if not (
        isinstance(obj, dict)
        and isinstance(obj.get("apiVersion"), str)
        and isinstance(obj.get("kind"), str)
        and proto.has_kind(obj["apiVersion"], obj["kind"])
    ):
        if json_ok:
            return response
        return _json_error(not_acceptable())
    try:
        encoded = proto.encode_object(obj)
    except codec.ProtobufError as exc:
        log.error("cannot encode %s as protobuf: %s", obj.get("kind"), exc)
        return _json_error(
            errors.ApiError(500, f"unable to encode the response as protobuf: {exc}")
        )
    headers = {
        k: v
        for k, v in response.headers.items()
        if k.lower() not in ("content-type", "content-length")
    }
    return web.Response(
        body=encoded, status=response.status, content_type=codec.MEDIA_TYPE, headers=headers
    )


def not_acceptable() -> errors.ApiError:
    """The real server's 406 for a JSON-only kind asked for in protobuf only."""
    return errors.ApiError(406, f"only the following media types are accepted: {_JSON_MEDIA_TYPES}")


def unsupported_kind(exc: codec.UnknownKind) -> errors.ApiError:
    """The 415 for a protobuf body of a kind kubesim has no schema for (custom resources...)."""
    return errors.ApiError(
        415,
        f"the body of the request was in an unknown format - accepted media types include: "
        f"{_JSON_MEDIA_TYPES} (kind {exc.kind!r} of {exc.api_version!r} is served as JSON only "
        f"in kubesim: it has no protobuf schema)",
    )


def decode_body(body: bytes) -> dict[str, Any]:
    """A protobuf request body as the JSON dict the server works on; errors are Status errors."""
    try:
        return codec.default().decode_object(body)
    except codec.UnknownKind as exc:
        raise unsupported_kind(exc) from exc
    except codec.ProtobufError as exc:
        raise errors.bad_request(f"error decoding the protobuf body: {exc}") from exc


def watch_response(request: web.Request, api_version: str, kind: str) -> web.StreamResponse:
    """The stream response for a watch: protobuf frames when preferred and possible, else JSON."""
    if wants_protobuf(request) and not _wants_table(request):
        prefer_protobuf, json_ok = preferences(request.headers.get("Accept", ""))
        if prefer_protobuf and codec.default().has_kind(api_version, kind):
            return ProtobufWatchResponse()
        if prefer_protobuf and not json_ok:
            raise not_acceptable()
    return web.StreamResponse(headers={"Content-Type": JSON_TYPE})


def _wants_table(request: web.Request) -> bool:
    return "as=Table" in request.headers.get("Accept", "")


class ProtobufWatchResponse(web.StreamResponse):
    """A watch stream that turns the server's JSON event lines into length-prefixed frames."""

    def __init__(self) -> None:
        super().__init__(headers={"Content-Type": codec.WATCH_MEDIA_TYPE})
        self._pending = b""

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Translate every complete JSON line; keep a partial one for the next write."""
        buffer = self._pending + bytes(data)
        *lines, self._pending = buffer.split(b"\n")
        frames = [self._frame(line) for line in lines if line.strip()]
        if frames:
            await super().write(b"".join(frames))

    def _frame(self, line: bytes) -> bytes:
        proto = codec.default()
        event = json.loads(line)
        try:
            return proto.watch_frame(event["type"], event["object"])
        except codec.ProtobufError as exc:
            log.error("cannot encode a watch event as protobuf: %s", exc)
            status = errors.ApiError(500, f"unable to encode the event as protobuf: {exc}")
            return proto.watch_frame("ERROR", status.status())


def _json_error(exc: errors.ApiError) -> web.Response:
    return web.Response(
        body=json.dumps(exc.status(), separators=(",", ":")).encode(),
        status=exc.code,
        content_type=JSON_TYPE,
    )
