"""Encoding a list response without holding the event loop: JSON, protobuf and Table.

The store hands a list its page as immutable stored versions (`Store.list_page`), chosen at one
resourceVersion; encoding them happens here, in slices of at most `SLICE_SECONDS` of CPU, with
the event loop free to serve other requests between slices. So a big list costs its client the
time to encode it, and every other client at most one slice of waiting.

JSON items are the stored bytes, joined; protobuf items and Table rows are encoded once per
stored version and kept with it (an object listed again, unchanged, costs nothing). A `Prewarmer`
encodes the changed objects of kinds recently listed as protobuf or Table in the event loop's
idle time, so such a list finds them encoded even right after a fleet-wide change.

A whole list (no limit, no continue) keeps its items' joined bytes per form: listed again with
exactly the same stored versions, it is served from them (only the list's metadata is new).
While a list is in flight (`IN_FLIGHT`), the Prewarmer waits and the cyclic collector's
automatic passes are held, so neither lands inside a list.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import itertools
import json
import operator
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from aiohttp import payload, web

from kubesim import selectors, tables
from kubesim.columns import Column
from kubesim.protobuf import codec, wire
from kubesim.protobuf.registry import Field, Message
from kubesim.resources import ResourceType
from kubesim.store import Event, Page, Store, Stored, dumps

# The longest stretch one list encodes before letting other requests run.
SLICE_SECONDS = 0.005
# Encoded fields by (message, field number, digest of the value's JSON), oldest dropped first.
PARTS_KEPT = 10_000
_PARTS: dict[tuple[str, int, bytes], bytes] = {}
# Items a list had to encode itself (not found encoded with their stored version), and items
# the Prewarmer encoded ahead of a list.
STATS = {
    "proto_on_demand": 0,
    "row_on_demand": 0,
    "proto_prewarmed": 0,
    "row_prewarmed": 0,
    "selection_hits": 0,
}
# Whole lists' joined item bytes, by (form, kind, version, namespace, selectors): the stored
# versions they were built from and the bytes. Used only when the same versions come again.
SELECTIONS_KEPT = 16
_SELECTIONS: OrderedDict[tuple[str, ...], tuple[list[Stored], bytes]] = OrderedDict()


class InFlight:
    """The lists being served in this process, from the handler's start until the response
    is handed to the transport.

    While any is in flight the Prewarmer waits (`wait_idle`) and the cyclic collector's
    automatic passes are held (`gc.disable`), at most `HOLD_SECONDS` at a time. After the last
    list the collector is given back at once, unless a pass is due (its young generation past
    the threshold): then it is given back `RELEASE_DELAY` later, once the response is on its
    way (by a timer thread), with that pass run in the gap between lists instead of inside the
    next one; a young generation more than `DUE_FRACTION` full is collected then too. The
    process's collector is shared, so this is one object for all the API servers of a process."""

    HOLD_SECONDS = 1.0
    RELEASE_DELAY = 0.02
    DUE_FRACTION = 0.25

    def __init__(self) -> None:
        self.count = 0
        self._held_since: float | None = None

    @property
    def holding(self) -> bool:
        """Whether the collector's automatic passes are held now."""
        return self._held_since is not None

    def begin(self) -> None:
        """A list starts."""
        self.count += 1
        now = time.monotonic()
        if self._held_since is not None and now - self._held_since > self.HOLD_SECONDS:
            self.release()  # lists back to back (or a lost release) for too long
        elif self._held_since is None and self.count == 1 and gc.isenabled():
            gc.disable()
            self._held_since = now

    def end(self) -> None:
        """A list's response is built: give the collector back after the last one."""
        self.count -= 1
        if self.count or self._held_since is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.release()
            return
        threshold, young = gc.get_threshold()[0], gc.get_count()[0]
        if threshold and young > threshold:
            # A pass would start on the next allocation, inside this response's writing. A
            # timer thread, not the loop, gives it back: a loop may end before its timers run.
            timer = threading.Timer(self.RELEASE_DELAY, self._release_if_idle)
            timer.daemon = True
            timer.start()
            return
        self.release()
        if threshold and young >= threshold * self.DUE_FRACTION:
            loop.call_later(self.RELEASE_DELAY, self._collect_if_idle)

    def _release_if_idle(self) -> None:
        if not self.count:
            self.release()
            self._collect_if_idle()

    def _collect_if_idle(self) -> None:
        threshold, count = gc.get_threshold(), gc.get_count()
        if not self.count and gc.isenabled() and count[0] >= threshold[0] * self.DUE_FRACTION:
            gc.collect(1 if count[1] >= threshold[1] else 0)

    def release(self) -> None:
        """Give the collector back (idempotent)."""
        if self._held_since is None:
            return
        self._held_since = None
        gc.enable()

    async def wait_idle(self, cap: float = 0.25) -> None:
        """Wait (at most `cap` seconds) until no list is in flight; background work calls it
        between its slices so that lists come first."""
        deadline = time.monotonic() + cap
        while self.count and time.monotonic() < deadline:
            await asyncio.sleep(0.002)


IN_FLIGHT = InFlight()


class Slicer:
    """Yields to the event loop once a slice's CPU budget is spent; a `background` slicer
    (the Prewarmer's) then also waits until no list is in flight."""

    __slots__ = ("_background", "_budget", "_deadline", "yields")

    def __init__(self, budget: float = SLICE_SECONDS, *, background: bool = False) -> None:
        self._budget = budget
        self._background = background
        self._deadline = time.perf_counter() + budget
        self.yields = 0

    async def tick(self) -> None:
        """Call between items: yields when the slice is used up."""
        if time.perf_counter() >= self._deadline:
            await asyncio.sleep(0)
            if self._background:
                await IN_FLIGHT.wait_idle()
            self.yields += 1
            self._deadline = time.perf_counter() + self._budget


async def _joined(
    key: tuple[str, ...] | None,
    items: list[Stored],
    part: Callable[[Stored], tuple[bytes, bool]],
    separator: bytes,
    slicer: Slicer,
) -> bytes:
    """The items' bytes joined: `part` gives an item's bytes and whether it had to encode them
    (then the slicer ticks). With a `key`, the result is kept and served again while the list
    holds exactly the same stored versions (a changed object is a new version: never stale)."""
    if key is not None:
        kept = _SELECTIONS.get(key)
        if (
            kept is not None
            and len(kept[0]) == len(items)
            and all(map(operator.is_, kept[0], items))
        ):
            _SELECTIONS.move_to_end(key)
            STATS["selection_hits"] += 1
            return kept[1]
    parts: list[bytes] = []
    for stored in items:
        encoded, fresh = part(stored)
        parts.append(encoded)
        if fresh:
            await slicer.tick()
    joined = separator.join(parts)
    if key is not None:
        _SELECTIONS[key] = (items, joined)
        _SELECTIONS.move_to_end(key)
        while len(_SELECTIONS) > SELECTIONS_KEPT:
            _SELECTIONS.popitem(last=False)
    return joined


def selection_key(
    rt: ResourceType, namespace: str | None, query: Mapping[str, str]
) -> tuple[str, ...] | None:
    """What identifies a whole list's selection (None for a page of a chunked list)."""
    if query.get("limit", "0") not in ("", "0") or query.get("continue"):
        return None
    return (
        rt.api_version,
        rt.plural,
        namespace or "",
        query.get("labelSelector") or "",
        query.get("fieldSelector") or "",
    )


def list_meta(page: Page) -> dict[str, Any]:
    """The list's metadata: resourceVersion, continue and remainingItemCount when set."""
    meta: dict[str, Any] = {"resourceVersion": str(page.rv)}
    if page.token:
        meta["continue"] = page.token
        if page.remaining is not None:
            meta["remainingItemCount"] = page.remaining
    return meta


def reversioned(rt: ResourceType, stored: Stored) -> bytes:
    """An object as seen through another served version of its CRD (no conversion: same shape)."""
    obj = json.loads(stored.raw)
    obj["apiVersion"] = rt.api_version
    return dumps(obj)


class ListBody(payload.BytesPayload):
    """A list's bytes, written to the connection `CHUNK` bytes at a time, each after the
    previous one drained.

    Handed to the transport in one write, a body of megabytes cost the loop one long step
    (10-20 ms for 8 MB on Python 3.11, whose socket transport keeps unsent bytes in one buffer
    and moves them down after every send) and the whole body's copy in memory; in chunks, the
    loop serves other requests while the client reads."""

    CHUNK = 256 * 1024

    async def write(self, writer: Any) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        view = memoryview(self._value)
        if content_length is not None:
            view = view[:content_length]
        for start in range(0, len(view), self.CHUNK):
            # The writer drains (waits for the client) once its buffer holds 64 KiB.
            await writer.write(view[start : start + self.CHUNK])


def response(body: bytes, content_type: str) -> web.Response:
    """A list's response: a body over one `ListBody.CHUNK` goes out in chunks."""
    if len(body) <= ListBody.CHUNK:
        return web.Response(body=body, content_type=content_type)
    return web.Response(body=ListBody(body, content_type=content_type))


async def json_body(
    rt: ResourceType,
    page: Page,
    slicer: Slicer | None = None,
    selection: tuple[str, ...] | None = None,
) -> bytes:
    """The list as JSON: the stored bytes of each item, joined (kept by `selection`)."""
    slicer = slicer or Slicer()
    head = (
        b'{"kind":"'
        + rt.list_kind.encode()
        + b'","apiVersion":"'
        + rt.api_version.encode()
        + b'","metadata":'
        + dumps(list_meta(page))
        + b',"items":['
    )

    def part(stored: Stored) -> tuple[bytes, bool]:
        if stored.obj.get("apiVersion") == rt.api_version:
            return stored.raw, False
        return reversioned(rt, stored), True

    key = None if selection is None else ("json", *selection)
    return b"".join((head, await _joined(key, page.items, part, b",", slicer), b"]}"))


def protobuf_possible(rt: ResourceType) -> bool:
    """Whether kubesim has a protobuf schema for the kind's list."""
    return codec.default().has_kind(rt.api_version, rt.list_kind)


async def protobuf_body(
    rt: ResourceType,
    page: Page,
    slicer: Slicer | None = None,
    selection: tuple[str, ...] | None = None,
) -> bytes:
    """The list as enveloped protobuf; each item's message is encoded once per stored version
    (the framed items kept by `selection`). Raises codec.ProtobufError when an item cannot be
    encoded."""
    slicer = slicer or Slicer()
    proto = codec.default()
    message = proto.schemas.kind(rt.api_version, rt.list_kind)
    if message is None:
        raise codec.UnknownKind(rt.api_version, rt.list_kind)
    items_field = next((f for f in message.wire_order if f.json == "items"), None)
    if items_field is None or message.wire_order[-1] is not items_field:
        # Not the usual list shape (items last): encode it whole.
        whole = {
            "apiVersion": rt.api_version,
            "kind": rt.list_kind,
            "metadata": list_meta(page),
            "items": [stored.obj for stored in page.items],
        }
        return proto.encode_object(whole)
    element = items_field.type.slice
    if element is None or not element.message:
        raise codec.ProtobufError(f"{rt.list_kind}.items is not a list of objects")
    item_message = proto.schemas.message(element.message)
    field_key = wire.key(items_field.number, wire.LENGTH_DELIMITED)

    def part(stored: Stored) -> tuple[bytes, bool]:
        cached = stored.proto
        if cached is not None and cached[0] == item_message.name:
            return field_key + wire.encode_varint(len(cached[1])) + cached[1], False
        encoded = item_proto(proto, item_message, stored, rt.kind)
        STATS["proto_on_demand"] += 1
        return field_key + wire.encode_varint(len(encoded)) + encoded, True

    key = None if selection is None else ("protobuf", item_message.name, *selection)
    head = proto.encode_message(message, {"metadata": list_meta(page)}, rt.list_kind)
    items = await _joined(key, page.items, part, b"", slicer)
    return codec.wrap_parts(rt.api_version, rt.list_kind, [head, items])


def list_item_message(rt: ResourceType) -> Message | None:
    """The protobuf message of the kind's list items, when its list has the usual shape."""
    proto = codec.default()
    message = proto.schemas.kind(rt.api_version, rt.list_kind)
    if message is None:
        return None
    items_field = next((f for f in message.wire_order if f.json == "items"), None)
    if items_field is None or message.wire_order[-1] is not items_field:
        return None
    element = items_field.type.slice
    if element is None or not element.message:
        return None
    return proto.schemas.message(element.message)


def item_proto(proto: codec.Codec, message: Message, stored: Stored, kind: str) -> bytes:
    """A stored version's message, encoded and kept with it."""
    encoded = encode_item(proto, message, stored.obj, kind)
    stored.proto = (message.name, encoded)
    return encoded


def encode_item(proto: codec.Codec, message: Message, obj: dict[str, Any], path: str) -> bytes:
    """An object's message, as `proto.encode_message` writes it, but with parts encoded before
    taken from `_PARTS`: the `spec` field when an earlier version had the same spec (most
    changes during a rollout, status writes and metadata, leave the spec, the biggest part of a
    pod, as it was), else the spec's lists of objects (containers, volumes, tolerations...) when
    any object had the same (the pods of one DaemonSet differ in little but the node)."""
    spec = obj.get("spec")
    if (
        not isinstance(spec, dict)
        or message.list_wrapper
        or message.name in codec.SPECIAL_TYPES
        or not any(f.json == "spec" and f.type.message for f in message.wire_order)
    ):
        return proto.encode_message(message, obj, path)
    out = bytearray()
    for f in message.wire_order:
        if f.json == "spec" and f.type.message:
            out += _part(message.name, f, spec, partial(_spec_field, proto, message, path=path))
        else:
            out += proto.encode_field(message, f, obj, f"{path}.{f.json}")
    return bytes(out)


def _spec_field(
    proto: codec.Codec, parent: Message, f: Field, spec: dict[str, Any], path: str
) -> bytes:
    """The `spec` field, its lists of objects from `_PARTS` where they were encoded before."""
    message = proto.schemas.message(f.type.message)
    if message.list_wrapper or message.name in codec.SPECIAL_TYPES:
        return proto.encode_field(parent, f, {"spec": spec}, f"{path}.spec")

    def encode(g: Field, value: Any) -> bytes:
        return proto.encode_field(message, g, {g.json: value}, f"{path}.spec.{g.json}")

    body = bytearray()
    for g in message.wire_order:
        value = spec if g.inline else spec.get(g.json)
        if g.type.slice is not None and g.type.slice.message and isinstance(value, list) and value:
            body += _part(message.name, g, value, encode)
        else:
            body += proto.encode_field(message, g, spec, f"{path}.spec.{g.json}")
    return wire.bytes_field(f.number, bytes(body))


def _part(message: str, f: Field, value: Any, encode: Callable[[Field, Any], bytes]) -> bytes:
    """Field `f` of `message` holding `value`, from `_PARTS` or encoded and kept there. The same
    JSON is the same value, so the same bytes (field order comes from the schema, not the JSON)."""
    key = (message, f.number, hashlib.blake2b(dumps(value), digest_size=16).digest())
    part = _PARTS.get(key)
    if part is None:
        part = encode(f, value)
        if len(_PARTS) >= PARTS_KEPT:
            for old in list(itertools.islice(_PARTS, PARTS_KEPT // 2)):
                del _PARTS[old]
        _PARTS[key] = part
    return part


def table_form(rt: ResourceType, query: Mapping[str, str]) -> tuple[str, ...] | None:
    """What a Table row of the kind depends on besides the object, when rows may be kept with
    the stored version: built-in kinds only (a CRD's printer columns can change under an
    unchanged object)."""
    if rt.from_crd:
        return None
    return (rt.api_version, rt.plural, query.get("includeObject", "PartialObjectMetadata"))


def item_row(columns: list[Column], form: tuple[str, ...], stored: Stored) -> bytes:
    """A stored version's Table row as JSON, built and kept with it."""
    encoded = dumps(tables.row(columns, stored, form[2]))
    stored.row = (form, encoded)
    return encoded


async def table_body(
    rt: ResourceType,
    page: Page,
    query: Mapping[str, str],
    slicer: Slicer | None = None,
    selection: tuple[str, ...] | None = None,
) -> bytes:
    """The list as a meta.k8s.io/v1 Table (what `kubectl get` asks for), rows built in slices
    or found kept with their stored versions (the joined rows kept by `selection`)."""
    slicer = slicer or Slicer()
    result = tables.table(rt, [], page.rv, query, page.token)
    if page.token and page.remaining is not None:
        result["metadata"]["remainingItemCount"] = page.remaining
    form = table_form(rt, query)
    head = dumps(result)
    if form is None or not head.endswith(b'"rows":[]}'):
        rows: list[Any] = result["rows"]
        step = 50
        for at in range(0, len(page.items), step):
            rows.extend(tables.table(rt, page.items[at : at + step], page.rv, query)["rows"])
            await slicer.tick()
        return dumps(result)
    columns = tables.columns_for(rt)

    def part(stored: Stored) -> tuple[bytes, bool]:
        cached = stored.row
        if cached is not None and cached[0] == form:
            return cached[1], False
        STATS["row_on_demand"] += 1
        return item_row(columns, form, stored), True

    key = None if selection is None else ("table", *form, *selection)
    joined = await _joined(key, page.items, part, b",", slicer)
    return b"".join((head[:-2], joined, b"]}"))  # one copy of a big body


class Prewarmer:
    """Encodes, in the event loop's idle time, the changed objects of kinds recently listed as
    protobuf or Table, so that such a list finds its items encoded.

    A list calls `listed`; for `HOT_SECONDS` after it, every committed version of that kind
    that the list's selector (of the last `SELECTORS_KEPT` distinct ones) matches is queued,
    a newer version of an object replacing the older one in the queue, and encoded in slices of
    `SLICE_SECONDS` with the loop free between them. The queue holds at most `QUEUE_LIMIT`
    entries (the oldest dropped: a list encodes those itself); a kind not listed again for
    `HOT_SECONDS` is forgotten. Memory: the encodings live with the stored versions (about the
    size of the JSON each, per form), only for the selected objects of those kinds."""

    HOT_SECONDS = 120.0
    SELECTORS_KEPT = 8
    QUEUE_LIMIT = 50_000

    def __init__(self, store: Store) -> None:
        self._store = store
        # Per kind: its type, the forms listed (protobuf message names, Table forms), the
        # selectors, when it was last listed, and its unsubscribe.
        self._kinds: dict[tuple[str, str], _Hot] = {}
        self._queue: OrderedDict[tuple[tuple[str, str], str, str], Stored] = OrderedDict()
        self._task: asyncio.Task[None] | None = None

    def listed(
        self,
        rt: ResourceType,
        labels: selectors.LabelSelector,
        *,
        proto: Message | None = None,
        form: tuple[str, ...] | None = None,
    ) -> None:
        """A list of `rt` was served as protobuf (`proto`: its items' message) or as Table
        (`form`); start or keep prewarming the kind's changed objects in that form."""
        if proto is None and form is None:
            return
        hot = self._kinds.get(rt.key)
        if hot is None:
            hot = self._kinds[rt.key] = _Hot(rt)
            hot.unsubscribe = self._store.subscribe(self._changed, [rt.key])
        hot.last = time.monotonic()
        if proto is not None:
            hot.protos[proto.name] = proto
        if form is not None:
            hot.forms.add(form)
        if labels not in hot.selectors:
            hot.selectors.append(labels)
            del hot.selectors[: -self.SELECTORS_KEPT]

    @property
    def queued(self) -> int:
        """Versions waiting to be encoded."""
        return len(self._queue)

    def close(self) -> None:
        """Stop prewarming (the cluster is closing)."""
        for hot in self._kinds.values():
            hot.unsubscribe()
        self._kinds.clear()
        self._queue.clear()
        if self._task is not None:
            self._task.cancel()
        if not IN_FLIGHT.count:
            IN_FLIGHT.release()  # its loop may end before the delayed release runs

    def _changed(self, event: Event) -> None:
        hot = self._kinds.get(event.key)
        if hot is None:
            return
        if time.monotonic() - hot.last > self.HOT_SECONDS:
            hot.unsubscribe()
            del self._kinds[event.key]
            return
        meta = event.new.obj["metadata"]
        entry = (event.key, meta.get("namespace", ""), meta["name"])
        if event.type == "DELETED":
            self._queue.pop(entry, None)
            return
        labels = meta.get("labels") or {}
        if not any(selector.matches(labels) for selector in hot.selectors):
            return
        self._queue.pop(entry, None)
        self._queue[entry] = event.new
        if len(self._queue) > self.QUEUE_LIMIT:
            self._queue.popitem(last=False)
        if self._task is None or self._task.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # a synchronous caller outside the loop: lists encode on demand
            self._task = loop.create_task(self._drain())

    async def _drain(self) -> None:
        proto = codec.default()
        slicer = Slicer(background=True)
        while self._queue:
            entry, stored = self._queue.popitem(last=False)
            hot = self._kinds.get(entry[0])
            if hot is None:
                continue
            for message in hot.protos.values():
                cached = stored.proto
                if cached is None or cached[0] != message.name:
                    try:
                        item_proto(proto, message, stored, hot.rt.kind)
                    except codec.ProtobufError:
                        continue  # the list reports it
                    STATS["proto_prewarmed"] += 1
            for form in hot.forms:
                cached_row = stored.row
                if cached_row is None or cached_row[0] != form:
                    item_row(hot.columns, form, stored)
                    STATS["row_prewarmed"] += 1
            await slicer.tick()


class _Hot:
    """A kind being prewarmed (see Prewarmer)."""

    __slots__ = ("columns", "forms", "last", "protos", "rt", "selectors", "unsubscribe")

    def __init__(self, rt: ResourceType) -> None:
        self.rt = rt
        self.columns = tables.columns_for(rt)
        self.protos: dict[str, Message] = {}
        self.forms: set[tuple[str, ...]] = set()
        self.selectors: list[selectors.LabelSelector] = []
        self.last = time.monotonic()
        self.unsubscribe: Callable[[], None] = lambda: None
