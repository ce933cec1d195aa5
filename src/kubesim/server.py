"""The HTTP front door: discovery, openapi, CRUD, patch, watch and subresources over aiohttp."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from kubesim import (
    deep,
    errors,
    list_encoding,
    list_options,
    openapi,
    openapi_v2,
    patch,
    request_limits,
    scale,
    schema,
    selectors,
    tables,
    turns,
)
from kubesim.auth import REVIEW_GROUPS, Auth, loopback
from kubesim.controllers import disruption
from kubesim.faults import Faults
from kubesim.protobuf import codec, negotiation
from kubesim.resources import (
    Registry,
    ResourceType,
    discovery_group,
    discovery_group_list,
    discovery_resource_list,
)
from kubesim.stats import Stats
from kubesim.store import Page, Store, Stored, dumps, now
from kubesim.streaming import api as streaming_api
from kubesim.validation import field_warnings

log = logging.getLogger("kubesim.server")
JSON_TYPE = "application/json"
# Set on a request while it counts in `turns.TURNS.pending`.
_COUNTED = web.RequestKey("kubesim.turns.counted", bool)


def _uncount(request: web.Request) -> None:
    """The request stops counting as in flight (idempotent)."""
    if request.get(_COUNTED):
        request[_COUNTED] = False
        turns.TURNS.end()


@dataclass
class Target:
    """A parsed resource URL."""

    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None

    @property
    def stats_name(self) -> str:
        base = self.rt.qualified
        return f"{base}/{self.subresource}" if self.subresource else base


class ApiServer:
    """Serves one store over HTTP; routing is done by hand for speed."""

    def __init__(
        self,
        store: Store,
        *,
        stats: Stats | None = None,
        faults: Faults | None = None,
        version: str = "1.35.0",
        bookmark_interval: float = 5.0,
        auth: Auth | None = None,
    ) -> None:
        self.store = store
        self.auth = auth or Auth(store)
        self.stats = stats or Stats()
        self.faults = faults or Faults(store)
        self.version = version
        self.bookmark_interval = bookmark_interval
        # aiohttp refuses longer bodies itself; request_limits turns that into the 413 Status.
        self.app = web.Application(client_max_size=request_limits.MAX_BODY_BYTES)
        self.app.router.add_route("*", "/{tail:.*}", self.handle)
        self._streams: set[web.StreamResponse] = set()
        # Encodes changed objects of kinds recently listed as protobuf or Table ahead of the
        # next such list.
        self.prewarmer = list_encoding.Prewarmer(store)
        # The cluster points this at the kubelet's container runtime.
        self.streaming = streaming_api.StreamingApi(store)

    @property
    def registry(self) -> Registry:
        return self.store.registry

    # ----- entry point -------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Route one request; every failure becomes a Kubernetes Status body."""
        # Background work waits while requests are in flight (watches and streams leave the
        # count once they start streaming): kubesim.turns.
        turns.TURNS.begin()
        request[_COUNTED] = True
        try:
            return await self._handle(request)
        finally:
            _uncount(request)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            self.auth.admit(request)  # 401/403 before routing, as the real filter chain does
            response = await self._route(request)
        except loopback.RefusedHost as exc:  # no authentication and not a loopback Host
            return web.Response(status=403, text=f"{exc}\n", content_type="text/plain")
        except errors.ApiError as exc:
            response = self._status_response(exc)
        except web.HTTPRequestEntityTooLarge:
            limit = f"limit is {request_limits.MAX_BODY_BYTES}"
            response = self._status_response(request_limits.too_large(limit))
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:  # a bug must still answer with a Status, never a traceback
            log.exception("internal error serving %s %s", request.method, request.path)
            response = self._status_response(errors.ApiError(500, f"internal error: {exc}"))
        if "protobuf" in request.headers.get("Accept", ""):
            return negotiation.negotiate(request, response)  # JSON built, re-encoded once
        return response

    def _status_response(self, exc: errors.ApiError) -> web.Response:
        headers = {}
        # Like the real server, only throttling carries Retry-After (a PDB refusal does not).
        if exc.details and "retryAfterSeconds" in exc.details:
            headers["Retry-After"] = str(exc.details["retryAfterSeconds"])
        return web.Response(
            body=dumps(exc.status()), status=exc.code, content_type=JSON_TYPE, headers=headers
        )

    async def _route(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        parts = [p for p in path.split("/") if p]
        if not parts:
            return self._json(
                {"paths": ["/api", "/api/v1", "/apis", "/openapi/v2", "/openapi/v3", "/version"]}
            )
        head = parts[0]
        if head == "version":
            return self._json(self._version_info())
        if head in ("healthz", "readyz", "livez"):
            return web.Response(text="ok")
        if head == "openapi":
            return self._openapi(parts, request)
        if head == "api":
            if len(parts) == 1:
                return self._json(
                    {
                        "kind": "APIVersions",
                        "versions": ["v1"],
                        "serverAddressByClientCIDRs": [
                            {"clientCIDR": "0.0.0.0/0", "serverAddress": request.host}
                        ],
                    }
                )
            if parts[1] != "v1":
                raise errors.ApiError(404, "the server could not find the requested resource")
            if len(parts) == 2:
                return self._json(discovery_resource_list(self.registry, "", "v1"))
            target = self._target("", "v1", parts[2:])
        elif head == "apis":
            if len(parts) == 1:
                return self._json(discovery_group_list(self.registry))
            groups = self.registry.groups()
            if parts[1] not in groups:
                raise errors.ApiError(404, "the server could not find the requested resource")
            if len(parts) == 2:
                return self._json(discovery_group(parts[1], groups[parts[1]]))
            if parts[2] not in groups[parts[1]]:
                raise errors.ApiError(404, "the server could not find the requested resource")
            if len(parts) == 3:
                return self._json(discovery_resource_list(self.registry, parts[1], parts[2]))
            target = self._target(parts[1], parts[2], parts[3:])
        else:
            raise errors.ApiError(404, "the server could not find the requested resource")
        return await self._resource(request, target)

    def _version_info(self) -> dict[str, Any]:
        major, minor, *_ = ([*self.version.split("."), "0", "0"])[:3]
        return {
            "major": major,
            "minor": minor,
            "gitVersion": f"v{self.version}",
            "gitCommit": "kubesim",
            "gitTreeState": "clean",
            "buildDate": "2025-01-01T00:00:00Z",
            "goVersion": "go1.24.0",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    def _openapi(self, parts: list[str], request: web.Request) -> web.Response:
        if len(parts) >= 2 and parts[1] == "v3":
            if len(parts) == 2:
                return self._json(openapi.index(self.registry))
            document = openapi.group_version_bytes(self.registry, "/".join(parts[2:]))
            if document is not None:
                return web.Response(body=document, content_type=JSON_TYPE)
        if len(parts) == 2 and parts[1] == "v2":
            # kubectl asks for gnostic protobuf; browsers and curl get JSON.
            accept = request.headers.get("Accept", "")
            protobuf = openapi_v2.MEDIA_TYPE in accept or openapi_v2.RESPONSE_TYPE in accept
            body = openapi.v2_bytes(self.registry, protobuf=protobuf)
            media = openapi_v2.RESPONSE_TYPE if protobuf else JSON_TYPE
            return web.Response(body=body, headers={"Content-Type": media})
        raise errors.ApiError(404, "the server could not find the requested resource")

    def _target(self, group: str, version: str, rest: list[str]) -> Target:
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
            namespace = rest[1]
            rest = rest[2:]
        # Only proxy subresources take a path after them (pods/x/proxy/metrics).
        if len(rest) > 3 and rest[2] != "proxy":
            raise errors.ApiError(404, "the server could not find the requested resource")
        rt = self.registry.get(group, version, rest[0])
        if rt is None:
            raise errors.ApiError(404, "the server could not find the requested resource")
        if namespace is not None and not rt.namespaced:
            raise errors.ApiError(404, "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub is not None:
            allowed = {s.name for s in rt.extra_subresources}
            if rt.status_subresource:
                allowed.add("status")
            if rt.key == ("", "namespaces"):
                allowed.add("finalize")
            if sub not in allowed:
                raise errors.ApiError(404, "the server could not find the requested resource")
        return Target(rt, namespace, name, sub)

    def _json(self, body: Any, status: int = 200) -> web.Response:
        return web.Response(body=dumps(body), status=status, content_type=JSON_TYPE)

    def _object(self, rt: ResourceType, stored: Stored, status: int = 200) -> web.Response:
        raw = stored.raw
        if stored.obj.get("apiVersion") != rt.api_version:
            raw = list_encoding.reversioned(rt, stored)
        return web.Response(body=raw, status=status, content_type=JSON_TYPE)

    # ----- resources ---------------------------------------------------------------------------

    async def _resource(self, request: web.Request, target: Target) -> web.StreamResponse:
        if streaming_api.handles(target.rt, target.name, target.subresource):
            return await self._streaming(request, target)
        method = request.method
        query = request.query
        watch = query.get("watch") in ("true", "1")
        if method == "GET":
            verb = "get" if target.name else ("watch" if watch else "list")
        elif method == "POST":
            verb = "create"
        elif method == "PUT":
            verb = "update"
        elif method == "PATCH":
            verb = "patch"
        elif method == "DELETE":
            verb = "delete" if target.name else "deletecollection"
        else:
            raise errors.ApiError(405, f"method {method} is not supported")
        self.stats.record(verb, target.stats_name)
        await self.faults.before(verb, target.stats_name)
        rt = target.rt
        if (
            target.namespace is None
            and rt.namespaced
            and verb not in ("list", "watch", "deletecollection")
        ):
            raise errors.ApiError(404, "the server could not find the requested resource")
        body_depth = await request_limits.admit_body(request, verb, rt.kind, custom=rt.from_crd)
        namespace = target.namespace or ""
        # A write on a deep body or object runs under kubesim.deep's recursion limit. Past this
        # point a write only awaits the body admit_body has already read, which returns at once.
        deep_write = verb in ("create", "update", "patch", "delete") and (
            body_depth > deep.SHALLOW or self._deep_target(target, namespace)
        )
        field_warnings.check_directive(request.method, query.get("fieldValidation"))
        validation = query.get("fieldValidation") or "Warn"
        token = schema.FIELD_VALIDATION.set(validation)
        pruned: list[str] = []
        pruned_token = schema.PRUNED.set(pruned)
        duplicated: list[str] = []
        duplicates_token = schema.DUPLICATES.set(duplicated)
        try:
            with deep.raised(deep_write):
                response = await self._dispatch(request, target, verb, namespace)
        finally:
            schema.FIELD_VALIDATION.reset(token)
            schema.PRUNED.reset(pruned_token)
            schema.DUPLICATES.reset(duplicates_token)
        warnings = [field_warnings.header(validation, pruned, duplicated)]
        if rt.deprecation:
            warnings.insert(0, f'299 - "{rt.deprecation}"')
        warning = ", ".join(w for w in warnings if w)
        if warning and isinstance(response, web.Response):
            response.headers["Warning"] = warning
        return response

    def _deep_target(self, target: Target, namespace: str) -> bool:
        if target.name is None:
            return False
        ns = namespace if target.rt.namespaced else ""
        stored = self.store.peek(target.rt.key, ns, target.name)
        return stored is not None and stored.deep

    async def _streaming(self, request: web.Request, target: Target) -> web.StreamResponse:
        """Logs, exec, attach, port-forward, proxy and ephemeral containers (kubesim.streaming)."""
        _uncount(request)
        assert target.name is not None
        assert target.subresource is not None
        verb = streaming_api.verb_for(request.method)
        self.stats.record(verb, target.stats_name)
        await self.faults.before(verb, target.stats_name)
        if target.namespace is None and target.rt.namespaced:
            raise errors.ApiError(404, "the server could not find the requested resource")
        manager = request.query.get("fieldManager") or _default_manager(request)
        return await self.streaming.handle(
            request, target.rt, target.namespace or "", target.name, target.subresource, manager
        )

    async def _dispatch(
        self, request: web.Request, target: Target, verb: str, namespace: str
    ) -> web.StreamResponse:
        rt = target.rt
        query = request.query
        dry_run = query.get("dryRun") == "All"
        manager = query.get("fieldManager") or _default_manager(request)
        if target.subresource == "scale" and target.name is not None:
            return self._json(await self._scale(request, target, verb, namespace, manager))
        if verb == "get":
            assert target.name is not None
            stored = self.store.peek(rt.key, namespace, target.name)
            if stored is None:
                raise errors.not_found(rt.plural, rt.group, target.name)
            if _wants_table(request):
                return self._json(tables.table(rt, [stored], self.store.resource_version, query))
            return self._object(rt, stored)
        if verb == "list":
            return await self._list(request, target)
        if verb == "watch":
            return await self._watch(request, target)
        if verb == "create":
            body = patch.decode_body(await request.read(), request.content_type)
            if rt.group in REVIEW_GROUPS and rt.verbs == ("create",):
                return self._json(self.auth.review(rt, body, namespace), status=201)
            if target.subresource == "token":
                return self._json(self.auth.token_request(namespace, target.name or "", body), 201)
            if target.subresource == "eviction":
                return self._evict(target, namespace, body)
            if target.subresource == "binding":
                return self._bind(target, namespace, body)
            if target.name is not None:
                raise errors.ApiError(405, "POST is only allowed on collections")
            if isinstance(body, dict) and rt.namespaced:
                meta = body.setdefault("metadata", {})
                if isinstance(meta, dict):
                    body_ns = meta.get("namespace")
                    if body_ns and body_ns != namespace:
                        raise errors.bad_request(
                            "the namespace of the provided object does not match "
                            "the namespace sent on the request"
                        )
                    meta["namespace"] = namespace
            _check_api_version(rt, body)
            stored = self.store.insert(rt, body, manager=manager, dry_run=dry_run)
            return self._object(rt, stored, 201)
        assert target.name is not None or verb == "deletecollection"
        if verb == "update":
            assert target.name is not None
            body = patch.decode_body(await request.read(), request.content_type)
            if target.subresource == "finalize":
                return self._finalize_namespace(target, body)
            if isinstance(body, dict) and rt.namespaced and isinstance(body.get("metadata"), dict):
                body_ns = body["metadata"].get("namespace")
                if body_ns and body_ns != namespace:
                    raise errors.bad_request("the namespace of the object does not match the URL")
            _check_api_version(rt, body)
            stored = self.store.replace(
                rt,
                body,
                namespace=namespace,
                name=target.name,
                subresource=target.subresource,
                manager=manager,
                dry_run=dry_run,
            )
            return self._object(rt, stored)
        if verb == "patch":
            return await self._patch(request, target, namespace, manager, dry_run)
        if verb == "delete":
            assert target.name is not None
            options = await self._delete_options(request)
            stored, _gone = self.store.remove(
                rt,
                namespace,
                target.name,
                propagation=options.get("propagationPolicy"),
                grace=options.get("gracePeriodSeconds"),
                preconditions=options.get("preconditions"),
                dry_run=dry_run,
            )
            return self._object(rt, stored)
        # deletecollection
        options = await self._delete_options(request)
        labels = selectors.parse_label_selector(request.query.get("labelSelector"))
        fields = selectors.parse_field_selector(request.query.get("fieldSelector"))
        ns_filter = target.namespace if rt.namespaced else None
        for stored in list(self.store.select(rt, ns_filter, labels, fields)):
            meta = stored.obj["metadata"]
            self.store.remove(
                rt,
                meta.get("namespace", ""),
                meta["name"],
                propagation=options.get("propagationPolicy"),
                grace=options.get("gracePeriodSeconds"),
                dry_run=dry_run,
            )
        return self._json(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
        )

    async def _delete_options(self, request: web.Request) -> dict[str, Any]:
        options: dict[str, Any] = {}
        raw = await request.read()
        if raw:
            ctype = patch.PROTOBUF if request.content_type == patch.PROTOBUF else JSON_TYPE
            body = patch.decode_body(raw, ctype)
            if not isinstance(body, dict):
                raise errors.bad_request("DeleteOptions must be an object")
            options.update(body)
        query = request.query
        if "propagationPolicy" in query:
            options["propagationPolicy"] = query["propagationPolicy"]
        if "gracePeriodSeconds" in query:
            try:
                options["gracePeriodSeconds"] = int(query["gracePeriodSeconds"])
            except ValueError as exc:
                raise errors.bad_request("gracePeriodSeconds must be an integer") from exc
        orphan = options.get("orphanDependents", query.get("orphanDependents"))
        if orphan in (True, "true") and "propagationPolicy" not in options:
            options["propagationPolicy"] = "Orphan"
        grace = options.get("gracePeriodSeconds")
        if grace is not None and not isinstance(grace, int):
            raise errors.bad_request("gracePeriodSeconds must be an integer")
        return options

    async def _patch(
        self, request: web.Request, target: Target, namespace: str, manager: str, dry_run: bool
    ) -> web.Response:
        rt = target.rt
        assert target.name is not None
        content_type = request.content_type
        if content_type not in (patch.MERGE, patch.JSON, patch.STRATEGIC, patch.APPLY_YAML):
            raise errors.ApiError(
                415,
                f"the body of the request was in an unknown format - accepted media types include: "
                f"{patch.JSON}, {patch.MERGE}, {patch.APPLY_YAML}, {patch.STRATEGIC}",
            )
        body = patch.decode_body(await request.read(), content_type)
        stored = self.store.peek(rt.key, namespace, target.name)
        if content_type == patch.APPLY_YAML:
            if not request.query.get("fieldManager"):
                raise errors.ApiError(
                    422,
                    'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                    "is required for apply patch",
                    reason="Invalid",
                )
            if isinstance(body, dict):
                meta = body.get("metadata") or {}
                if meta.get("name", target.name) != target.name:
                    raise errors.bad_request(
                        "the name of the applied object does not match the URL"
                    )
                if stored is None:
                    body.setdefault("metadata", {})["name"] = target.name
                    if rt.namespaced:
                        body["metadata"]["namespace"] = namespace
            force = request.query.get("force") in ("true", "1")
            merged = patch.server_side_apply(
                rt,
                stored.copy() if stored else None,
                body,
                manager=manager,
                force=force,
                subresource=target.subresource,
                stamp=now(),
            )
            if stored is None:
                if target.subresource:
                    raise errors.not_found(rt.plural, rt.group, target.name)
                result = self.store.insert(rt, merged, dry_run=dry_run)
                return self._object(rt, result, 201)
            result = self.store.replace(
                rt,
                merged,
                namespace=namespace,
                name=target.name,
                subresource=target.subresource,
                dry_run=dry_run,
                keep_managed_fields=True,
            )
            return self._object(rt, result)
        if stored is None:
            raise errors.not_found(rt.plural, rt.group, target.name)
        if (
            rt.status_subresource
            and target.subresource is None
            and content_type in (patch.MERGE, patch.STRATEGIC)
            and isinstance(body, dict)
            and "status" not in body
        ):
            # An update through the main resource keeps the stored status (Store.replace puts
            # it back), so its copy would only be decoded, compared equal and dropped. Neither
            # patch type descends into a field the patch does not name, and decoding leaves
            # parts equal to the stored version alone, so the shared status is never mutated.
            current = stored.copy_sharing("status")
        else:
            current = stored.copy()
        if content_type == patch.MERGE:
            if not isinstance(body, dict):
                raise errors.bad_request("a merge patch must be a JSON object")
            merged = patch.merge_patch(current, body)
        elif content_type == patch.JSON:
            merged = patch.json_patch(current, body)
        else:
            if rt.from_crd:
                raise errors.ApiError(
                    415,
                    "strategic merge patch is not supported for custom resources; "
                    "use a merge patch, a JSON patch or server-side apply",
                )
            if not isinstance(body, dict):
                raise errors.bad_request("a strategic merge patch must be a JSON object")
            merged = patch.strategic_merge_patch(current, body)
        if not isinstance(merged, dict):
            raise errors.ApiError(422, "the patched document is not an object", reason="Invalid")
        result = self.store.replace(
            rt,
            merged,
            namespace=namespace,
            name=target.name,
            subresource=target.subresource,
            manager=manager,
            dry_run=dry_run,
        )
        return self._object(rt, result)

    async def _list(self, request: web.Request, target: Target) -> web.Response:
        rt = target.rt
        query = request.query
        list_options.parse(query, watch=False)
        labels = selectors.parse_label_selector(query.get("labelSelector"))
        fields = selectors.parse_field_selector(query.get("fieldSelector"))
        try:
            limit = int(query.get("limit") or 0)
        except ValueError as exc:
            raise errors.bad_request("limit must be an integer") from exc
        # The page is chosen now, at one resourceVersion, from the indexes; its items are
        # immutable stored versions, encoded below in slices that let other requests run.
        page = self.store.list_page(
            rt, target.namespace, labels, fields, limit, query.get("continue")
        )
        # While it is in flight, background encoding waits and no collector pass runs.
        list_encoding.IN_FLIGHT.begin()
        try:
            return await self._list_body(request, rt, page, labels, target.namespace)
        finally:
            list_encoding.IN_FLIGHT.end()

    async def _list_body(
        self,
        request: web.Request,
        rt: ResourceType,
        page: Page,
        labels: selectors.LabelSelector,
        namespace: str | None,
    ) -> web.Response:
        query = request.query
        selection = list_encoding.selection_key(rt, namespace, query)
        if _wants_table(request):
            body = await list_encoding.table_body(rt, page, query, selection=selection)
            self.prewarmer.listed(rt, labels, form=list_encoding.table_form(rt, query))
            return list_encoding.response(body, JSON_TYPE)
        accept = request.headers.get("Accept", "")
        if (
            "protobuf" in accept
            and negotiation.preferences(accept)[0]
            and list_encoding.protobuf_possible(rt)
        ):
            self.prewarmer.listed(rt, labels, proto=list_encoding.list_item_message(rt))
            try:
                body = await list_encoding.protobuf_body(rt, page, selection=selection)
            except codec.ProtobufError as exc:
                log.error("cannot encode %s as protobuf: %s", rt.list_kind, exc)
                raise errors.ApiError(
                    500, f"unable to encode the response as protobuf: {exc}"
                ) from exc
            return list_encoding.response(body, codec.MEDIA_TYPE)
        body = await list_encoding.json_body(rt, page, selection=selection)
        if "protobuf" in accept:  # negotiation decides on JSON or a 406 from the bytes
            return web.Response(body=body, content_type=JSON_TYPE)
        return list_encoding.response(body, JSON_TYPE)

    async def _watch(self, request: web.Request, target: Target) -> web.StreamResponse:
        _uncount(request)  # a watch streams for minutes: background work must not wait on it
        rt = target.rt
        query = request.query
        labels = selectors.parse_label_selector(query.get("labelSelector"))
        fields = selectors.parse_field_selector(query.get("fieldSelector"))
        options = list_options.parse(query, watch=True)
        rv_param = options.resource_version
        try:
            requested = int(rv_param) if rv_param not in ("", "0") else None
        except ValueError as exc:
            raise errors.bad_request(f"invalid resourceVersion {rv_param!r}") from exc
        if options.send_initial_events:
            since = None  # the current state as ADDED events, whatever resourceVersion was given
        elif options.send_initial_events is False and requested is None:
            since = self.store.resource_version  # "from any version": only changes from now on
        else:
            since = requested
        try:
            timeout = float(query.get("timeoutSeconds") or 0)
        except ValueError as exc:
            raise errors.bad_request("timeoutSeconds must be a number") from exc
        bookmarks = options.allow_bookmarks
        as_table = _wants_table(request)
        response = negotiation.watch_response(request, rt.api_version, rt.kind)
        response.enable_chunked_encoding()
        try:
            expired = self.faults.take_watch_expiry()
            if expired:
                raise errors.gone(f"too old resource version: {rv_param}")
            if options.send_initial_events and requested is not None:
                await list_options.wait_for_resource_version(self.store, requested)
            watcher = self.store.watch(rt.key, target.namespace, labels, fields, since)
        except errors.ApiError as exc:
            # Like the real server: the stream opens, then carries a single ERROR event.
            await response.prepare(request)
            await response.write(b'{"type":"ERROR","object":' + dumps(exc.status()) + b"}\n")
            await response.write_eof()
            return response
        # Counted before any await, so no live event is mistaken for part of the initial state.
        initial_count = watcher.queue.qsize() if options.watch_list else -1
        initial_rv = self.store.resource_version
        await response.prepare(request)
        self._streams.add(response)
        if initial_count >= 0:
            initial = [watcher.queue.get_nowait() for _ in range(initial_count)]
            lines = [self._event_line(rt, item, as_table, query) for item in initial if item]
            end = {list_options.INITIAL_EVENTS_END: "true"}
            lines.append(self._bookmark(rt, resource_version=initial_rv, annotations=end))
            with contextlib.suppress(ConnectionResetError):
                await response.write(b"".join(lines))
        deadline = time.monotonic() + timeout if timeout > 0 else None
        next_bookmark = time.monotonic() + self.bookmark_interval
        try:
            while True:
                current = time.monotonic()
                waits = []
                if deadline is not None:
                    waits.append(deadline - current)
                if bookmarks:
                    waits.append(next_bookmark - current)
                wait = max(0.0, min(waits)) if waits else None
                try:
                    if wait is None:  # the usual watch: no timeout, no bookmarks to interleave
                        item = await watcher.queue.get()
                    else:
                        item = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    current = time.monotonic()
                    if deadline is not None and current >= deadline:
                        break
                    if bookmarks and current >= next_bookmark:
                        next_bookmark = current + self.bookmark_interval
                        # In order, as the real cacher sends them: events queued meanwhile
                        # are older than the bookmark's resourceVersion, so they go first.
                        lines = []
                        while not watcher.queue.empty():
                            more = watcher.queue.get_nowait()
                            if more is None:
                                watcher.closed = True
                                break
                            lines.append(self._event_line(rt, more, as_table, query))
                        if not watcher.closed:
                            lines.append(self._bookmark(rt))
                        await response.write(b"".join(lines))
                        if watcher.closed:
                            break
                    continue
                if item is None:
                    break
                chunks = [self._event_line(rt, item, as_table, query)]
                while not watcher.queue.empty():
                    more = watcher.queue.get_nowait()
                    if more is None:
                        watcher.closed = True
                        break
                    chunks.append(self._event_line(rt, more, as_table, query))
                await response.write(b"".join(chunks))
                if watcher.closed and watcher.queue.empty():
                    break
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.store.unwatch(watcher)
            self._streams.discard(response)
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await response.write_eof()
        return response

    def _bookmark(
        self,
        rt: ResourceType,
        *,
        resource_version: int | None = None,
        annotations: dict[str, str] | None = None,
    ) -> bytes:
        rv = self.store.resource_version if resource_version is None else resource_version
        metadata: dict[str, Any] = {"resourceVersion": str(rv)}
        if annotations:
            metadata["annotations"] = annotations
        obj = {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": metadata}
        return b'{"type":"BOOKMARK","object":' + dumps(obj) + b"}\n"

    def _event_line(
        self, rt: ResourceType, item: tuple[str, Stored], as_table: bool, query: Any
    ) -> bytes:
        event_type, stored = item
        if as_table:
            body = dumps(tables.table(rt, [stored], stored.rv, query, None, watch=True))
        elif stored.obj.get("apiVersion") != rt.api_version:
            body = list_encoding.reversioned(rt, stored)
        else:
            body = stored.raw
        return b'{"type":"' + event_type.encode() + b'","object":' + body + b"}\n"

    # ----- subresources ------------------------------------------------------------------------

    async def _scale(
        self, request: web.Request, target: Target, verb: str, namespace: str, manager: str
    ) -> dict[str, Any]:
        assert target.name is not None
        dry_run = request.query.get("dryRun") == "All"
        if verb == "get":
            return scale.get(self.store, target.rt, namespace, target.name)
        body = patch.decode_body(await request.read(), request.content_type)
        if verb == "update":
            return scale.update(
                self.store,
                target.rt,
                namespace,
                target.name,
                body,
                manager=manager,
                dry_run=dry_run,
            )
        if verb == "patch":
            return scale.patch_scale(
                self.store,
                target.rt,
                namespace,
                target.name,
                body,
                request.content_type,
                manager=manager,
                dry_run=dry_run,
            )
        raise errors.ApiError(405, f"the scale subresource does not support {verb}")

    def _evict(self, target: Target, namespace: str, body: Any) -> web.Response:
        assert target.name is not None
        if not isinstance(body, dict):
            raise errors.bad_request("an Eviction must be an object")
        stored = self.store.peek(("", "pods"), namespace, target.name)
        if stored is None:
            raise errors.not_found("pods", "", target.name)
        options = body.get("deleteOptions") or {}
        if not stored.obj["metadata"].get("deletionTimestamp"):
            disruption.check_eviction(self.store, stored.obj)
        self.store.remove(
            target.rt,
            namespace,
            target.name,
            grace=options.get("gracePeriodSeconds"),
            preconditions=options.get("preconditions"),
        )
        return self._json(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "code": 201,
            },
            status=201,
        )

    def _bind(self, target: Target, namespace: str, body: Any) -> web.Response:
        assert target.name is not None
        node = ((body or {}).get("target") or {}).get("name") if isinstance(body, dict) else None
        if not node:
            raise errors.bad_request("a Binding needs target.name")
        stored = self.store.peek(("", "pods"), namespace, target.name)
        if stored is None:
            raise errors.not_found("pods", "", target.name)
        if (stored.obj.get("spec") or {}).get("nodeName"):
            raise errors.conflict("pods", "", target.name, "pod is already assigned to a node")
        obj = stored.copy()
        obj["spec"]["nodeName"] = node
        self.store.replace(target.rt, obj, namespace=namespace, name=target.name)
        return self._json(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "code": 201,
            },
            status=201,
        )

    def _finalize_namespace(self, target: Target, body: Any) -> web.Response:
        assert target.name is not None
        stored = self.store.peek(("", "namespaces"), "", target.name)
        if stored is None:
            raise errors.not_found("namespaces", "", target.name)
        obj = stored.copy()
        obj.setdefault("spec", {})["finalizers"] = ((body or {}).get("spec") or {}).get(
            "finalizers"
        ) or []
        if not obj["spec"]["finalizers"]:
            obj["spec"].pop("finalizers")
        result = self.store.replace(target.rt, obj, namespace="", name=target.name)
        return self._object(target.rt, result)

    async def close_streams(self) -> None:
        """End open watch responses and the prewarming (used on shutdown)."""
        self.store.close_watches()
        self.prewarmer.close()


def _wants_table(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    return "as=Table" in accept


def _default_manager(request: web.Request) -> str:
    agent = request.headers.get("User-Agent", "unknown")
    return agent.split("/", 1)[0].split(" ", 1)[0] or "unknown"


def _check_api_version(rt: ResourceType, body: Any) -> None:
    if not isinstance(body, dict):
        raise errors.bad_request("the body must be a JSON object")
    api_version = body.get("apiVersion")
    if api_version and api_version not in [
        f"{rt.group}/{v}" if rt.group else v for v in rt.served_versions
    ]:
        raise errors.bad_request(
            f"the API version in the data ({api_version}) does not match "
            f"the expected API version ({rt.api_version})"
        )
