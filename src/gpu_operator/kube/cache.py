"""Watch-fed caches: list once, then watch from the list's resourceVersion; relist on 410, on a
watch that ends in an error, and when resourceVersions go backwards (the server lost state).

Watches ask for bookmarks (`allowWatchBookmarks`): the API server sends one about once a minute
with its current resourceVersion, so a watch resumed from a version the server no longer has
(after an etcd restore, every watch ends and resumes from a version in the server's future)
learns within a bookmark period that the server went back in time. A relist after a failed watch
compares the list's resourceVersion with the newest one the cache had seen, for the same reason.
Either way the cache reports it (`on_state_lost`) so that every cache relists, not only this one.

Objects are stored after a transform that keeps only what the planners read, which is what keeps
the operator's memory flat at thousands of nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import msgspec
from lightkube import ApiError, AsyncClient
from lightkube.core import decoders
from lightkube.core.selector import build_selector

log = logging.getLogger(__name__)

# A transform may return any value (a smaller dict, a summary tuple): keys come from the raw object.
Transform = Callable[[dict[str, Any]], Any]
Handler = Callable[[str, Any, Any], None]
# Told which cache saw the API server go back in time, and how.
StateLostHandler = Callable[["Informer", str], None]


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


# Objects per list request (client-go's reflector pages its lists by 500 too).
LIST_PAGE_SIZE = 500

# The API server decodes JSON nested up to 10,000 levels; Python's recursive decoders stop near
# 1,000. A cache that met one such object retries with this limit (the C stack holds it), so the
# object decodes and its transform can bound it (strip.bounded) instead of the watch failing
# forever on it.
DEEP_RECURSION_LIMIT = 12_000


@contextlib.contextmanager
def deep_recursion(enabled: bool) -> Iterator[None]:
    """Raise the interpreter's recursion limit while decoding, when `enabled`."""
    before = sys.getrecursionlimit()
    if enabled and before < DEEP_RECURSION_LIMIT:
        sys.setrecursionlimit(DEEP_RECURSION_LIMIT)
    try:
        yield
    finally:
        if sys.getrecursionlimit() != before:
            sys.setrecursionlimit(before)


class StateLost(Exception):
    """The API server's state went back in time (an etcd restore, a restart that lost data)."""


def _older(version: str, than: str | None) -> bool:
    """Whether resourceVersion `version` is before `than` (both etcd revisions in practice;
    they are opaque by contract, so anything not a number is never called older)."""
    if than is None or not version.isdigit() or not than.isdigit():
        return False
    return int(version) < int(than)


def _plain(obj: Any) -> dict[str, Any]:
    data: dict[str, Any] = obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
    return data


class WatchEvent(msgspec.Struct):
    """One line of a watch stream, decoded in one pass straight into the dict the cache keeps
    (lightkube decodes the line, then the object again, then wraps it in a resource class)."""

    type: str
    object: dict[str, Any]


_decode_event = msgspec.json.Decoder(WatchEvent).decode


def watch_event(line: bytes) -> tuple[str, dict[str, Any]]:
    """A watch line's event type and object; an ERROR event (the server ended the watch with a
    Status: 410 Gone, a failure) raises the ApiError lightkube raises for it."""
    event = _decode_event(line)
    if event.type == "ERROR":
        raise ApiError(status=decoders.decode_status(msgspec.json.encode(event.object)))
    return event.type, event.object


async def stream_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The non-empty lines of a byte stream read in whatever chunks the connection gives (one
    watch event per line); a last line without its newline is still a line."""
    parts: list[bytes] = []
    async for chunk in chunks:
        if b"\n" not in chunk:
            parts.append(chunk)
            continue
        if parts:
            parts.append(chunk)
            chunk = b"".join(parts)
            parts = []
        lines = chunk.split(b"\n")
        rest = lines.pop()
        if rest:
            parts.append(rest)
        for line in lines:
            if line and not line.isspace():
                yield line
    tail = b"".join(parts)
    if tail and not tail.isspace():
        yield tail


class Informer:
    """A cache of one resource (optionally filtered), kept current by a watch.

    `on_change(key, old, new)` is called for every change; `old` is None for additions and `new`
    is None for deletions.
    """

    def __init__(
        self,
        client: AsyncClient,
        resource: Any,
        *,
        namespace: str | None = None,
        labels: dict[str, Any] | None = None,
        transform: Transform | None = None,
        on_change: Handler | None = None,
        watch_timeout: int = 300,
        on_state_lost: StateLostHandler | None = None,
    ) -> None:
        self.client = client
        self.resource = resource
        self.namespace = namespace
        self.labels = labels
        self.transform = transform or (lambda obj: obj)
        self.on_change = on_change
        self.watch_timeout = watch_timeout
        self.objects: dict[str, Any] = {}
        self.synced = asyncio.Event()
        self.relists = 0
        self._stopping = False
        self._deep = False  # an object too deep for the default decoder was seen
        # The last resourceVersion seen (None: list next); `watching` while a watch is open.
        self.version: str | None = None
        # The newest resourceVersion this cache has seen from the server (list, event or
        # bookmark); one older than it later means the server lost state. None: no baseline.
        self.newest: str | None = None
        self.on_state_lost = on_state_lost
        self.bookmarks = 0
        # Since when list/watch has not worked (None: it works); readiness reads it. Set until
        # the first list, and at the first of a run of failures; cleared by a list, an event
        # or a watch the server ended normally.
        self.down_since: float | None = time.monotonic()
        self._current: asyncio.Task[Any] | None = None
        self._relist_requested = False

    @property
    def kind(self) -> str:
        return str(self.resource._api_info.resource.kind)

    def get(self, name: str, namespace: str | None = None) -> Any:
        return self.objects.get(f"{namespace}/{name}" if namespace else name)

    def _emit(self, key: str, old: Any, new: Any) -> None:
        if self.on_change is not None:
            try:
                self.on_change(key, old, new)
            except Exception:
                log.exception("event handler failed for %s %s", self.kind, key)

    def _set(self, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        stripped = self.transform(obj)
        old = self.objects.get(key)
        self.objects[key] = stripped
        self._emit(key, old, stripped)

    def _delete(self, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        old = self.objects.pop(key, None)
        if old is not None:
            self._emit(key, old, None)

    async def _list(self) -> str:
        # In pages (limit/continue), as client-go's reflector lists: one page's objects are
        # decoded and transformed before the next is asked for, so the operator never holds a
        # whole fleet's raw objects at once (its peak memory at 20,000 nodes).
        kwargs: dict[str, Any] = {"labels": self.labels, "chunk_size": LIST_PAGE_SIZE}
        if self.namespace is not None:
            kwargs["namespace"] = self.namespace
        listing = self.client.list(self.resource, **kwargs)
        seen: set[str] = set()
        async for item in listing:
            obj = _plain(item)
            seen.add(object_key(obj))
            self._set(obj)
        for key in [k for k in self.objects if k not in seen]:
            self._emit(key, self.objects.pop(key), None)
        self.synced.set()
        version = str(listing.resourceVersion)
        if _older(version, self.newest):
            self._lost(f"a relist returned resourceVersion {version}, older than {self.newest}")
        self.newest = version
        return version

    def _lost(self, how: str) -> None:
        """This cache saw the server go back in time: tell the owner (every cache relists)."""
        log.warning("%s: the API server's state went back in time (%s)", self.kind, how)
        if self.on_state_lost is not None:
            try:
                self.on_state_lost(self, how)
            except Exception:
                log.exception("state-loss handler failed for %s", self.kind)

    async def run(self) -> None:
        """List and watch until cancelled; transient errors back off and resume the watch."""
        delay = 0.2
        while not self._stopping:
            try:
                with deep_recursion(self._deep):
                    self._current = asyncio.current_task()
                    await self._list_and_watch()
                delay = 0.2
            except asyncio.CancelledError:
                if not self._relist_requested:
                    raise
                # Our own cancellation from `relist`: take it back and list again.
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                self._relist_requested = False
                self.version = None
            except RecursionError:
                self._failing()
                if self._deep:
                    log.error("%s: an object is nested too deeply to decode; relisting in "
                              "%.1fs", self.kind, delay)  # fmt: skip
                    self.version = None
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
                else:
                    log.warning("%s: an object is nested too deeply for the default decoder; "
                                "decoding with a deeper limit", self.kind)  # fmt: skip
                    self._deep = True
            except StateLost as err:
                self._lost(str(err))
                self.version = None
                self.newest = None  # known: the relist starts a new baseline
            except ApiError as err:
                if err.status.code == 410:
                    log.info("%s watch expired (410 Gone); relisting", self.kind)
                    self.version = None
                    continue
                # A watch ending in an error may mean the server lost state (a restart): list
                # again rather than resume from a version it may not have.
                self._failing()
                self.version = None
                log.warning("%s watch failed: %s; relisting in %.1fs", self.kind, err, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            except Exception as err:
                self._failing()
                self.version = None
                log.warning("%s watch interrupted: %s; relisting in %.1fs", self.kind, err, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _list_and_watch(self) -> None:
        """List when there is no version yet, then watch until the stream ends."""
        if self.version is None:
            self.version = await self._list()
            self.relists += 1
            self.down_since = None
        async with contextlib.aclosing(self._watch()) as stream:
            async for event, obj in stream:
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version is not None:
                    if _older(str(version), self.version):
                        what = "a bookmark" if event == "BOOKMARK" else "an event"
                        raise StateLost(
                            f"{what} carried resourceVersion {version}, older than {self.version}"
                        )
                    self.version = self.newest = str(version)
                self.down_since = None
                if event == "BOOKMARK":
                    self.bookmarks += 1
                elif event == "DELETED":
                    self._delete(obj)
                elif event in ("ADDED", "MODIFIED"):
                    self._set(obj)
        self.down_since = None  # the server ended the watch normally (its timeout)

    async def _watch(self) -> AsyncGenerator[tuple[str, dict[str, Any]]]:
        """One watch request from `self.version`, with bookmarks (lightkube's `watch` cannot ask
        for them); `run` opens the next one from the last version seen when the server ends it.

        The stream is read in the chunks the connection delivers and split into lines here, and
        each line is decoded once into a plain dict (lightkube's watch costs a text decode, two
        JSON decodes and a resource object per event: seconds at 150,000 events)."""
        params: dict[str, Any] = {
            "timeoutSeconds": self.watch_timeout,
            "resourceVersion": self.version,
            "labelSelector": build_selector(self.labels) if self.labels else None,
            "allowWatchBookmarks": "true",
        }
        inner = self.client._client
        prepared = inner.prepare_request(
            "list", res=self.resource, namespace=self.namespace, watch=True, params=params
        )
        request = inner._client.build_request(
            prepared.method, prepared.url, params=prepared.params, timeout=inner._watch_timeout
        )
        response = await inner._client.send(request, stream=True)
        try:
            response.raise_for_status()
            async for line in stream_lines(response.aiter_bytes()):
                yield watch_event(line)
        finally:
            await response.aclose()

    def _failing(self) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()

    def relist(self, reason: str) -> None:
        """Drop the watch and list again (the API server lost or rewound its state)."""
        log.warning("%s: %s; relisting", self.kind, reason)
        task = self._current
        self.newest = None  # the relist starts a new baseline
        if task is not None and not task.done():
            self._relist_requested = True
            task.cancel()
        else:
            self.version = None

    def stop(self) -> None:
        self._stopping = True


# What a view keeps of one source object: a value, or None to leave the object out.
Select = Callable[[Any], Any]


class View:
    """A cache derived from another cache's events, without a list or watch of its own: the
    source's objects that `select` keeps, as `select` returns them (the operator namespace's
    pod summaries out of the one all-namespace pod cache). Reads like an `Informer` (`objects`,
    `get`, `synced`) and its own events (`on_change(key, old, new)`) follow the source's, in
    their order, so its objects keep the order a cache of its own would have.
    """

    def __init__(self, source: Informer, select: Select, on_change: Handler | None = None) -> None:
        self.source = source
        self.select = select
        self.on_change = on_change
        self.objects: dict[str, Any] = {}
        self.synced = source.synced
        for key, obj in source.objects.items():
            kept = select(obj)
            if kept is not None:
                self.objects[key] = kept

    @property
    def kind(self) -> str:
        return self.source.kind

    def get(self, name: str, namespace: str | None = None) -> Any:
        return self.objects.get(f"{namespace}/{name}" if namespace else name)

    def feed(self, key: str, new: Any) -> None:
        """The source's event for `key` (`new` None: deleted there)."""
        kept = self.select(new) if new is not None else None
        objects = self.objects
        if kept is None:
            old = objects.pop(key, None)
            if old is None:
                return
        else:
            old = objects.get(key)
            objects[key] = kept
        if self.on_change is not None:
            try:
                self.on_change(key, old, kept)
            except Exception:
                log.exception("event handler failed for the view of %s %s", self.kind, key)


async def current_version(client: AsyncClient, resource: Any) -> str | None:
    """The API server's current resourceVersion, from a one-item list of `resource` (cheap: a
    list without a resourceVersion is answered at the store's latest revision)."""
    listing = client.list(resource, chunk_size=1)
    async for _ in listing:
        break
    try:
        return str(listing.resourceVersion)
    except Exception:  # an empty list may carry none
        return None


def rewound(
    seen: list[tuple[Informer, str | None]], version: str | None
) -> list[tuple[Informer, str | None]]:
    """The (cache, version it had seen before the server was asked) pairs whose version is newer
    than the server's current one."""
    if version is None:
        return []
    return [(i, v) for i, v in seen if v is not None and _older(version, v)]
