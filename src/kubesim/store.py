"""The object store: dicts with cached JSON, one global resourceVersion, watch history."""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import datetime as dt
import itertools
import json
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, TypeVar

import msgspec

from kubesim import deep as deep_mod
from kubesim import (
    defaults,
    errors,
    list_index,
    request_limits,
    schema,
    selectors,
    ssa,
    validation,
)
from kubesim.resources import Registry, ResourceType

Key = tuple[str, str]
ObjKey = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped kinds
CRD_KEY: Key = ("apiextensions.k8s.io", "customresourcedefinitions")
NAMESPACE_KEY: Key = ("", "namespaces")
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"


# More than the JSON of everything in a recorder Event but its message (names of at most 253
# characters, reasons, times, the source): `Store.insert_event` skips the size check below it.
_EVENT_SLACK = 64 * 1024

_NOW: list[Any] = [0, ""]  # [second, its text]: formatted once per second, not per write


def now() -> str:
    """The current time in the API's RFC 3339 form (seconds precision)."""
    second = int(time.time())
    if second != _NOW[0]:
        _NOW[1] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))
        _NOW[0] = second
    return str(_NOW[1])


def timestamp_in(seconds: float) -> str:
    """An RFC 3339 time `seconds` from now."""
    moment = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str) -> dt.datetime:
    """Parse an RFC 3339 timestamp."""
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def random_suffix(length: int = 5) -> str:
    """A name suffix drawn from the alphabet the real server uses for generateName (each
    character uniformly and independently, as `random.choice` per character would)."""
    return "".join(random.choices(_NAME_CHARS, k=length))


# msgspec (lightkube's JSON codec) encodes about ten times and decodes about twice as fast as
# the json module, and every write serialises its object once; its bytes equal json.dumps's for
# ASCII text and are UTF-8 otherwise, as the real API server's are.
_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder()


# The real server's JSON decoder takes 10,000 levels (request_limits), so it stores and serves
# objects nested that deep. Both Python codecs count each level against the interpreter's
# recursion limit (1,000 by default); an object deeper than that is encoded or decoded again
# with this limit, which covers 10,000 levels plus the caller's own frames. Each level costs the
# C codecs well under a kilobyte of stack, so 8 MiB holds it.
DEEP_RECURSION_LIMIT = 25_000

_T = TypeVar("_T")


def _deep(codec: Callable[[], _T]) -> _T:
    """Run a codec call that met the recursion limit again under DEEP_RECURSION_LIMIT (only
    for that call: no await happens inside, so nothing else runs under the raised limit)."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(max(before, DEEP_RECURSION_LIMIT))
    try:
        return codec()
    finally:
        sys.setrecursionlimit(before)


# The version (4) and variant (RFC 4122) bits of a random UUID, as uuid.UUID(version=4) sets them.
_UUID_KEEP = ~((0xF000 << 64) | (0xC000 << 48)) & ((1 << 128) - 1)
_UUID_SET = (0x4000 << 64) | (0x8000 << 48)


def new_uid_bits() -> int:
    """A random (version 4) UUID as its 128-bit integer (`format_uid` spells it)."""
    return random.getrandbits(128) & _UUID_KEEP | _UUID_SET


def format_uid(bits: int) -> str:
    """A UUID's integer in its text form (8-4-4-4-12 lowercase hex digits)."""
    text = f"{bits:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def new_uid() -> str:
    """A random (version 4) UUID, as `str(uuid.uuid4())` spells it, without its system call and
    UUID object per object (a rollout of thousands of pods creates hundreds of thousands)."""
    text = f"{random.getrandbits(128) & _UUID_KEEP | _UUID_SET:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def _encode(obj: Any) -> bytes:
    try:
        # Into a buffer, then an exact-size copy: encode()'s result keeps its spare capacity,
        # about a third more memory for every stored object.
        buffer = bytearray()
        _ENCODER.encode_into(obj, buffer)
        return bytes(buffer)
    except (msgspec.EncodeError, TypeError, ValueError, OverflowError):
        # Whatever msgspec refuses still gets json's answer (or its error).
        return json.dumps(obj, separators=(",", ":")).encode()


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes (objects nested up to the real server's 10,000 levels included)."""
    try:
        return _encode(obj)
    except RecursionError:
        return _deep(lambda: _encode(obj))


def loads(raw: bytes) -> Any:
    """Parse JSON this module wrote (a deep copy of an object is `loads(dumps(obj))`)."""
    try:
        return _DECODER.decode(raw)
    except RecursionError:
        return _deep(lambda: _DECODER.decode(raw))


def _json_copy(obj: Any) -> Any:
    """A deep copy through the json module (Python ints of any size survive), deep objects too."""
    raw = dumps(obj)
    try:
        return json.loads(raw)
    except RecursionError:
        return _deep(lambda: json.loads(raw))


class Stored:
    """One object version: the dict (never mutated after commit) and its serialised bytes."""

    __slots__ = ("_depth", "obj", "proto", "raw", "row")

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.raw = dumps(obj)
        self._depth: int | None = None
        # (protobuf message name, encoded message), set by the first protobuf list that
        # includes this version, or ahead of it by kubesim.list_encoding.Prewarmer.
        self.proto: tuple[str, bytes] | None = None
        # (table form, the Table row's JSON), likewise for lists asked as=Table.
        self.row: tuple[tuple[str, ...], bytes] | None = None

    @property
    def deep(self) -> bool:
        """Whether the object nests deeper than kubesim.deep.SHALLOW (computed once)."""
        if self._depth is None:
            self._depth = request_limits.json_depth(self.raw, deep_mod.SHALLOW)
        return self._depth > deep_mod.SHALLOW

    def copy(self) -> dict[str, Any]:
        """A private, mutable copy of the object."""
        result: dict[str, Any] = loads(self.raw)
        return result

    def copy_sharing(self, field: str) -> dict[str, Any]:
        """A private copy of the object but for one top-level field, which is the stored value
        itself (the caller must not mutate it); key order is kept."""
        if field not in self.obj:
            return self.copy()
        result: dict[str, Any] = loads(
            dumps({k: None if k == field else v for k, v in self.obj.items()})
        )
        result[field] = self.obj[field]
        return result

    @property
    def rv(self) -> int:
        """The resourceVersion as an integer."""
        return int(self.obj["metadata"].get("resourceVersion") or 0)


class LazyStored(Stored):
    """A version whose bytes are encoded when something first reads them (a watch, a list, a
    copy), not at its commit: recorder Events, most writes while a fleet rolls out, which
    nothing may ever read as bytes. The object is never mutated after its commit, so the bytes
    are the ones an eager encode would have given."""

    __slots__ = ("_raw",)

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self._raw: bytes | None = None
        self._depth = None
        self.proto = None
        self.row = None

    @property
    def raw(self) -> bytes:
        """The object's JSON, encoded on first use."""
        if self._raw is None:
            self._raw = dumps(self.obj)
        return self._raw

    @raw.setter
    def raw(self, value: bytes) -> None:
        self._raw = value


class CompactEvent(LazyStored):
    """A recorder Event kept as its variable fields, its dict and bytes built when read.

    Most recorder Events are never read while a fleet rolls out (ten per pod, a million and more
    at 20,000 nodes); this form holds about a third of the dict's memory. What repeats across
    Events (namespace, involved kind and apiVersion, field path, reason, type, source and
    reporting component) is one shared `shape` tuple; the rest are slots (the source's host,
    also the reporting instance when there is a reporting component). `obj` is built on each
    read (the version is immutable, so each build is equal, key order included, to the dict
    the recorder used to store); `raw` is encoded from it once, then kept (`LazyStored`'s).
    """

    __slots__ = (
        "_count",
        "_created",
        "_first",
        "_host",
        "_last",
        "_message",
        "_name",
        "_obj_name",
        "_obj_rv",
        "_obj_uid",
        "_rv",
        "_shape",
        "_uid",
    )

    # The fields of `shape`, in order.
    SHAPE = (
        "namespace",
        "kind",
        "apiVersion",
        "objectNamespace",
        "fieldPath",
        "reason",
        "type",
        "component",
        "reportingComponent",
    )

    def __init__(
        self,
        shape: tuple[str, ...],
        host: str,
        name: str,
        obj_name: str,
        obj_uid: str,
        obj_rv: str,
        message: str,
        first: str,
        last: str,
        count: int,
    ) -> None:
        self._shape = shape
        self._host = host
        self._name = name
        self._obj_name = obj_name
        self._obj_uid = obj_uid
        self._obj_rv = obj_rv
        self._message = message
        self._first = first
        self._last = last
        self._count = count
        self._uid = 0
        self._created = ""
        self._rv = 0
        self._raw = None
        self._depth = None
        self.proto = None
        self.row = None

    @property
    def namespace(self) -> str:
        """The Event's namespace."""
        return self._shape[0]

    @property
    def name(self) -> str:
        """The Event's name."""
        return self._name

    @property
    def message(self) -> str:
        """The Event's message."""
        return self._message

    @property
    def obj(self) -> dict[str, Any]:  # type: ignore[override]
        """The Event as a dict (built on each read; callers must not mutate it)."""
        (namespace, kind, api_version, obj_namespace, field_path, reason, event_type,
         component, reporting_component) = self._shape  # fmt: skip
        host = self._host
        involved: dict[str, Any] = {
            "kind": kind,
            "name": self._obj_name,
            "uid": self._obj_uid,
            "apiVersion": api_version,
            "resourceVersion": self._obj_rv,
        }
        if obj_namespace:
            involved["namespace"] = obj_namespace
        if field_path:
            involved["fieldPath"] = field_path
        metadata: dict[str, Any] = {"name": self._name, "namespace": namespace}
        if self._uid:
            metadata["uid"] = format_uid(self._uid)
            metadata["creationTimestamp"] = self._created
        if self._rv:
            metadata["resourceVersion"] = str(self._rv)
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": metadata,
            "involvedObject": involved,
            "reason": reason,
            "message": self._message,
            "type": event_type,
            "source": {"component": component, "host": host} if host else {"component": component},
            "firstTimestamp": self._first,
            "lastTimestamp": self._last,
            "count": self._count,
            "reportingComponent": reporting_component,
            "reportingInstance": host if reporting_component else "",
        }

    @property
    def rv(self) -> int:
        """The resourceVersion as an integer."""
        return self._rv


class Event(NamedTuple):
    """A committed change: ADDED, MODIFIED or DELETED, with the previous version for MODIFIED."""

    rv: int
    type: str
    key: Key
    new: Stored
    old: Stored | None


class Watcher:
    """A watch subscription; events that enter or leave its selection become ADDED or DELETED."""

    def __init__(
        self,
        key: Key,
        namespace: str | None,
        labels: selectors.LabelSelector,
        fields: selectors.FieldSelector,
    ) -> None:
        self.key = key
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.queue: asyncio.Queue[tuple[str, Stored] | None] = asyncio.Queue()
        self.closed = False
        # Without selectors only the namespace decides, and no update moves an object to
        # another namespace: its events pass or not as they are (none enters or leaves).
        self._unfiltered = labels.empty and fields.empty

    def selects(self, obj: dict[str, Any]) -> bool:
        """Whether an object is inside this watcher's selection."""
        meta = obj["metadata"]
        if self.namespace is not None and meta.get("namespace", "") != self.namespace:
            return False
        if not self.labels.empty and not self.labels.matches(meta.get("labels")):
            return False
        return self.fields.empty or self.fields.matches(obj)

    def translate(self, event: Event) -> tuple[str, Stored] | None:
        """The event this watcher should see, if any."""
        if self._unfiltered:
            namespace = self.namespace
            if namespace is None or event.new.obj["metadata"].get("namespace", "") == namespace:
                return (event.type, event.new)
            return None
        new_in = self.selects(event.new.obj)
        if event.type != "MODIFIED" or event.old is None:
            return (event.type, event.new) if new_in else None
        old_in = self.selects(event.old.obj)
        if new_in and old_in:
            return ("MODIFIED", event.new)
        if new_in:
            return ("ADDED", event.new)
        if old_in:
            return ("DELETED", event.new)
        return None

    def offer(self, event: Event) -> None:
        """Queue an event if it concerns this watcher."""
        if self.closed:
            return
        translated = self.translate(event)
        if translated is not None:
            self.queue.put_nowait(translated)

    def close(self) -> None:
        """End the watch stream."""
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(None)


Listener = Callable[[Event], None]
AdmissionHook = Callable[["Store", ResourceType, dict[str, Any], dict[str, Any] | None], None]


class Store:
    """All objects, the global resourceVersion counter, watch history and in-process listeners."""

    def __init__(self, registry: Registry | None = None, history: int = 10_000) -> None:
        self.registry = registry or Registry.with_builtins()
        self._data: dict[Key, dict[ObjKey, Stored]] = {}
        self._sorted: dict[Key, list[ObjKey]] = {}
        # Keys created since their kind's order was sorted, but for those past its end: merged
        # into it at the next read. Inserting each into the list in place moves, on average,
        # half of it: about 40 µs per Event once 300,000 are stored and anything listed them.
        self._unsorted: dict[Key, dict[ObjKey, None]] = {}
        # Label and field indexes of the kinds listed with selectors (kubesim.list_index).
        self._indexes: dict[Key, list_index.KindIndex] = {}
        self._rv = 1
        self._history: deque[Event] = deque()
        self._history_limit = history
        self.compacted_rv = 0
        self._watchers: dict[Key, set[Watcher]] = {}
        # Listeners of every kind, each with the kinds it ignores, and listeners of some kinds.
        self._listeners: list[tuple[Listener, frozenset[Key]]] = []
        self._keyed_listeners: dict[Key, list[Listener]] = {}
        # Per resource key, the listeners its commits call (built on first use, dropped on any
        # subscribe or unsubscribe): a commit does one lookup, not a filter over every listener.
        self._fanout: dict[Key, tuple[Listener, ...]] = {}
        # Listeners of every kind's deletions only (but the kinds each ignores), and per key
        # the listeners its deletions call (built and dropped as `_fanout`).
        self._deletion_listeners: list[tuple[Listener, frozenset[Key]]] = []
        self._keyed_deletion_listeners: dict[Key, list[Listener]] = {}
        self._deletion_fanout: dict[Key, tuple[Listener, ...]] = {}
        self._dependents: dict[str, set[tuple[Key, str, str]]] = {}
        # Side effects of the real storage layer for some kinds (Service IP and node-port
        # allocation, Job selectors, HPA defaults, pod priority), run on create (old None) and
        # update: registered by the cluster set-up (kubesim.admission.install).
        self.admission: list[AdmissionHook] = []

    # ----- low level -------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        """The latest committed resourceVersion."""
        return self._rv

    def bucket(self, key: Key) -> dict[ObjKey, Stored]:
        """The objects stored under one resource key."""
        found = self._data.get(key)
        if found is None:
            found = self._data[key] = {}
        return found

    def peek(self, key: Key, namespace: str, name: str) -> Stored | None:
        """The stored version of an object, without copying (callers must not mutate it)."""
        data = self._data.get(key)  # `bucket` inlined: listeners peek several times a commit
        return None if data is None else data.get((namespace, name))

    def scan(self, key: Key, namespace: str | None = None) -> Iterator[Stored]:
        """Objects under a key in (namespace, name) order."""
        data = self.bucket(key)
        order = self._sorted_keys(key)
        if namespace is None:
            for obj_key in order:
                stored = data.get(obj_key)
                if stored is not None:
                    yield stored
            return
        if not order:
            return  # nothing of the kind (the disruption controller's PDBs, mostly)
        # One namespace's keys are a run of the sorted list: start at it and stop after it
        # (listeners scan a namespace per event: the disruption controller its PDBs per pod).
        # The list's own iterator (skipping to the run in C), so a removal during the scan acts
        # as it did when the scan walked the whole list.
        for obj_key in itertools.islice(order, bisect.bisect_left(order, (namespace, "")), None):
            if obj_key[0] != namespace:
                return
            stored = data.get(obj_key)
            if stored is not None:
                yield stored

    def subscribe(
        self,
        listener: Listener,
        keys: Iterable[Key] | None = None,
        *,
        ignore: Iterable[Key] = (),
        deletions_only: bool = False,
    ) -> Callable[[], None]:
        """Call `listener` synchronously for every committed event (only those of `keys` when
        given: most controllers read a few kinds, and Events alone are most writes at scale;
        with `keys` None, every kind but those in `ignore`); returns an unsubscribe.

        `deletions_only`: only DELETED events (of `keys`, or with `keys` None of every kind but
        those in `ignore`): the namespace controller's of every kind, the Deployment
        controller's of pods; the creates and updates of those kinds then call nothing of it."""
        self._fanout.clear()
        self._deletion_fanout.clear()
        if keys is None:
            entry = (listener, frozenset(ignore))
            entries = self._deletion_listeners if deletions_only else self._listeners
            entries.append(entry)

            def unsubscribe_all() -> None:
                if entry in entries:
                    entries.remove(entry)
                    self._fanout.clear()
                    self._deletion_fanout.clear()

            return unsubscribe_all
        chosen = tuple(keys)
        keyed = self._keyed_deletion_listeners if deletions_only else self._keyed_listeners
        for key in chosen:
            keyed.setdefault(key, []).append(listener)

        def unsubscribe() -> None:
            for key in chosen:
                listeners = keyed.get(key)
                if listeners is not None and listener in listeners:
                    listeners.remove(listener)
            self._fanout.clear()
            self._deletion_fanout.clear()

        return unsubscribe

    def _listeners_of(self, key: Key) -> tuple[Listener, ...]:
        """The listeners a commit under `key` calls: those of every kind first, in order."""
        found = self._fanout.get(key)
        if found is None:
            found = self._fanout[key] = (
                *(listener for listener, ignored in self._listeners if key not in ignored),
                *self._keyed_listeners.get(key, ()),
            )
        return found

    def _deletion_listeners_of(self, key: Key) -> tuple[Listener, ...]:
        """The listeners a deletion under `key` calls: those of every kind, then those of
        every kind's deletions, then those of `key`, then those of its deletions."""
        found = self._deletion_fanout.get(key)
        if found is None:
            found = self._deletion_fanout[key] = (
                *(listener for listener, ignored in self._listeners if key not in ignored),
                *(each for each, ignored in self._deletion_listeners if key not in ignored),
                *self._keyed_listeners.get(key, ()),
                *self._keyed_deletion_listeners.get(key, ()),
            )
        return found

    def dependents(self, uid: str) -> list[tuple[Key, str, str]]:
        """Objects whose ownerReferences name `uid`."""
        return sorted(self._dependents.get(uid, ()))

    def _index_owners(
        self, key: Key, obj: dict[str, Any] | None, old: dict[str, Any] | None
    ) -> None:
        if old is None and obj is not None and not obj["metadata"].get("ownerReferences"):
            return  # a new object without owners (most creates: every Event)
        if obj is not None and old is not None:
            refs = obj["metadata"].get("ownerReferences")
            before = old["metadata"].get("ownerReferences")
            if refs is before or refs == before:
                return  # most updates (status writes share the stored metadata's values)
        entry_new = set()
        entry_old = set()
        if obj is not None:
            entry_new = {r.get("uid") for r in obj["metadata"].get("ownerReferences") or ()}
        if old is not None:
            entry_old = {r.get("uid") for r in old["metadata"].get("ownerReferences") or ()}
        if entry_new == entry_old:
            return
        source = obj if obj is not None else old
        assert source is not None
        ident = (key, source["metadata"].get("namespace", ""), source["metadata"]["name"])
        for uid in entry_old - entry_new:
            holders = self._dependents.get(uid)
            if holders is not None:
                holders.discard(ident)
                if not holders:
                    del self._dependents[uid]
        for uid in entry_new - entry_old:
            self._dependents.setdefault(uid, set()).add(ident)

    def commit(
        self,
        event_type: str,
        rt: ResourceType,
        obj: dict[str, Any],
        old: Stored | None,
        *,
        lazy: bool = False,
    ) -> Stored:
        """Assign the next resourceVersion, store or remove the object, and fan the event out.

        `lazy`: the caller knows the object is far below the size limit, so its bytes are
        encoded when first read (`LazyStored`), not now."""
        obj["metadata"]["resourceVersion"] = str(self._rv + 1)
        if lazy:
            stored: Stored = LazyStored(obj)
        else:
            stored = Stored(obj)
            if event_type != "DELETED":
                request_limits.check_object_size(len(stored.raw))  # before anything changes
        self._rv += 1
        meta = obj["metadata"]
        obj_key = (meta.get("namespace", ""), meta["name"])
        data = self.bucket(rt.key)
        index = self._indexes.get(rt.key)
        if index is not None:
            previous = data.get(obj_key)
            if event_type == "DELETED":
                if previous is not None:
                    index.remove(obj_key, previous.obj)
            elif previous is None:
                index.add(obj_key, obj)
            else:
                index.update(obj_key, previous.obj, obj)
        order = self._sorted.get(rt.key)
        if event_type == "DELETED":
            if data.pop(obj_key, None) is not None and order is not None:
                pending = self._unsorted.get(rt.key)
                if pending and obj_key in pending:
                    del pending[obj_key]
                else:
                    at = bisect.bisect_left(order, obj_key)
                    if at < len(order) and order[at] == obj_key:
                        del order[at]
            self._index_owners(rt.key, None, old.obj if old else obj)
        else:
            if obj_key not in data and order is not None:
                self._add_to_order(rt.key, order, obj_key)
            data[obj_key] = stored
            self._index_owners(rt.key, obj, old.obj if old else None)
        self._publish(Event(self._rv, event_type, rt.key, stored, old))
        return stored

    def _add_to_order(self, key: Key, order: list[ObjKey], obj_key: ObjKey) -> None:
        """A new object's key in its kind's sorted keys (no full sort on the next list):
        appended when it sorts last, else merged at the next read."""
        if not order or obj_key > order[-1]:
            order.append(obj_key)
        else:
            self._unsorted.setdefault(key, {})[obj_key] = None

    def _publish(self, event: Event) -> None:
        """A committed change into the watch history, to the watchers and the listeners."""
        self._history.append(event)
        if len(self._history) > self._history_limit:
            self.compacted_rv = self._history.popleft().rv
        key = event.key
        watchers = self._watchers.get(key)
        if watchers:
            for watcher in tuple(watchers):
                watcher.offer(event)
        if key == CRD_KEY:
            self._crd_changed(event)
        if event.type == "DELETED":
            for listener in self._deletion_listeners_of(key):
                listener(event)
        else:
            for listener in self._listeners_of(key):
                listener(event)

    def _crd_changed(self, event: Event) -> None:
        name = event.new.obj["metadata"]["name"]
        if event.type == "DELETED":
            for rt in self.registry.crd_types(name)[:1]:
                for stored in list(self.scan(rt.key)):
                    gone = stored.copy()
                    self.commit("DELETED", rt, gone, stored)
            self.registry.remove_crd(name)
        else:
            self.registry.add_crd(event.new.obj)

    # ----- watches ---------------------------------------------------------------------------

    def watch(
        self,
        key: Key,
        namespace: str | None,
        labels: selectors.LabelSelector,
        fields: selectors.FieldSelector,
        since: int | None,
    ) -> Watcher:
        """Open a watch; `since=None` replays current objects as ADDED, else history after it."""
        watcher = Watcher(key, namespace, labels, fields)
        if since is None:
            for stored in self.scan(key, namespace):
                if watcher.selects(stored.obj):
                    watcher.queue.put_nowait(("ADDED", stored))
        else:
            if since < self.compacted_rv:
                raise errors.gone(f"too old resource version: {since} ({self.compacted_rv})")
            for event in self._history:
                if event.rv > since and event.key == key:
                    watcher.offer(event)
        self._watchers.setdefault(key, set()).add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        """Forget a watcher."""
        self._watchers.get(watcher.key, set()).discard(watcher)

    def close_watches(self) -> int:
        """End every open watch stream (clients reconnect); returns how many were closed."""
        count = 0
        for watchers in self._watchers.values():
            for watcher in list(watchers):
                watcher.close()
                count += 1
            watchers.clear()
        return count

    def compact(self) -> None:
        """Drop all watch history, so any watch from an older resourceVersion gets 410 Gone."""
        self._history.clear()
        self.compacted_rv = self._rv

    def snapshot(self) -> tuple[int, dict[Key, dict[ObjKey, Stored]], dict[str, set[Any]]]:
        """The stored state as of now, for `restore` (stored versions are immutable: cheap)."""
        data = {key: dict(bucket) for key, bucket in self._data.items()}
        dependents = {uid: set(holders) for uid, holders in self._dependents.items()}
        return self._rv, data, dependents

    def restore(
        self, snapshot: tuple[int, dict[Key, dict[ObjKey, Stored]], dict[str, set[Any]]]
    ) -> None:
        """Go back to a snapshot as an etcd restore does: objects and the resourceVersion move
        backwards, every watch ends and history is gone. In-process listeners are not told."""
        rv, data, dependents = snapshot
        self.close_watches()
        self._data = {key: dict(bucket) for key, bucket in data.items()}
        self._sorted.clear()
        self._unsorted.clear()
        self._indexes.clear()
        self._dependents = {uid: set(holders) for uid, holders in dependents.items()}
        self._rv = rv
        self._history.clear()
        self.compacted_rv = rv

    def watcher_count(self) -> int:
        """How many watches are open."""
        return sum(len(w) for w in self._watchers.values())

    # ----- semantics -------------------------------------------------------------------------

    def _require_namespace(self, rt: ResourceType, namespace: str) -> None:
        if not rt.namespaced:
            return
        if not namespace:
            raise errors.bad_request("the namespace of the object must be set")
        ns = self.peek(NAMESPACE_KEY, "", namespace)
        if ns is None:
            raise errors.not_found("namespaces", "", namespace)
        if ns.obj["metadata"].get("deletionTimestamp"):
            raise errors.ApiError(
                403,
                f'{rt.kind.lower()}s "{namespace}" is forbidden: unable to create new content '
                f"in namespace {namespace} because it is being terminated",
                reason="Forbidden",
                details={"name": namespace, "kind": rt.plural},
            )

    def insert(
        self,
        rt: ResourceType,
        obj: dict[str, Any],
        *,
        manager: str | None = None,
        dry_run: bool = False,
        trusted: bool = False,
        defaulted: bool = False,
    ) -> Stored:
        """Create an object (takes ownership of `obj`).

        `trusted`: an in-process copy of a body that already passed decoding and validation
        (a controller stamping out pods from a checked template), so both are skipped;
        `defaulted`: its spec is also a copy of a defaulted one, so spec defaulting is skipped.
        """
        if not isinstance(obj, dict):
            raise errors.bad_request("the body must be a JSON object")
        kind = obj.get("kind")
        if kind and kind != rt.kind:
            raise errors.bad_request(f"the kind {kind!r} does not match the resource {rt.plural!r}")
        obj["kind"] = rt.kind
        obj["apiVersion"] = obj.get("apiVersion") or rt.api_version
        meta = obj.get("metadata")
        if meta is None:
            meta = obj["metadata"] = {}
        if not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        if not trusted:
            validation.decode(rt, obj)
        meta = obj.setdefault("metadata", {})
        if meta.get("resourceVersion"):
            raise errors.invalid(
                rt.kind,
                rt.group,
                meta.get("name", ""),
                [("metadata.resourceVersion", "must be empty on create")],
            )
        namespace = meta.get("namespace", "") if rt.namespaced else ""
        if not rt.namespaced:
            meta.pop("namespace", None)
        self._require_namespace(rt, namespace)
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise errors.invalid(
                    rt.kind,
                    rt.group,
                    "",
                    [("metadata.name", "Required value: name or generateName is required")],
                )
            for _ in range(16):
                candidate = f"{prefix}{random_suffix()}"
                if self.peek(rt.key, namespace, candidate) is None:
                    break
            meta["name"] = candidate
        if not trusted:
            defaults.validate_name(rt, meta["name"])
        if self.peek(rt.key, namespace, meta["name"]) is not None:
            raise errors.already_exists(rt.plural, rt.group, meta["name"])
        for field in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(field, None)
        meta["uid"] = new_uid()
        meta["creationTimestamp"] = now()
        if rt.has_generation:
            meta["generation"] = 1
        else:
            meta.pop("generation", None)
        if rt.status_subresource and not rt.status_on_create:
            obj.pop("status", None)
        defaults.apply_create_defaults(rt, obj, spec_defaulted=trusted and defaulted)
        if rt.schema is not None:
            schema.admit(rt, obj)
        # Like the real storage, allocation and generated fields come before validation.
        for hook in self.admission:
            hook(self, rt, obj, None)
        if not trusted:
            validation.validate(rt, obj, None)
        if rt.key == CRD_KEY:
            _crd_status(obj, None)
        if manager:
            ssa.record_update(
                obj, None, manager, obj["apiVersion"], rt.schema, None, now(),
                status_reset=rt.status_subresource,
            )  # fmt: skip
        if dry_run:
            return Stored(obj)
        return self.commit("ADDED", rt, obj, None)

    def insert_event(self, rt: ResourceType, obj: dict[str, Any]) -> Stored:
        """Create a core Event an in-process recorder built, named and in decoded form, like one
        of the same shape that already passed `insert` (kubesim.controllers.events).

        What `insert` does for such an Event, and only that: the namespace must exist and not be
        terminating (the real server refuses recorder Events there too), the name must be free,
        then the uid and creation time. Nothing else applies to a core Event: it has no defaults
        and no schema, and no storage admission hook acts on it (a test checks
        every installed hook leaves one as it is); the recorders set no field manager.
        """
        meta = obj["metadata"]
        namespace = meta["namespace"]
        self._require_namespace(rt, namespace)
        if self.peek(rt.key, namespace, meta["name"]) is not None:
            raise errors.already_exists(rt.plural, rt.group, meta["name"])
        meta["uid"] = new_uid()
        meta["creationTimestamp"] = now()
        # Only the message of a recorder Event is free text: names, kinds, reasons, the field
        # path and the times are bounded far below the size limit. When even a message of all
        # six-byte escapes cannot reach the limit, the bytes wait until something reads them.
        lazy = 6 * len(obj.get("message") or "") + _EVENT_SLACK <= request_limits.MAX_OBJECT_BYTES
        return self.commit("ADDED", rt, obj, None, lazy=lazy)

    def insert_compact_event(self, rt: ResourceType, event: CompactEvent) -> Stored:
        """`insert_event` for an Event in compact form: the same checks, uid and creation time,
        then what `commit("ADDED", ...)` does for a new object without owners (the next
        resourceVersion, the kind's index and order, history, watchers, listeners: the last two
        steps are `commit`'s own), keeping the compact form, which takes its resourceVersion here.
        An Event whose message could reach the size limit takes `insert_event` as a dict (the
        size check needs its bytes)."""
        if 6 * len(event._message) + _EVENT_SLACK > request_limits.MAX_OBJECT_BYTES:
            return self.insert_event(rt, event.obj)
        obj_key = (event._shape[0], event._name)
        namespaces = self._data.get(NAMESPACE_KEY)
        ns = namespaces.get(("", obj_key[0])) if namespaces is not None else None
        if ns is None or ns.obj["metadata"].get("deletionTimestamp"):
            self._require_namespace(rt, obj_key[0])  # raises (missing or terminating)
        key = rt.key
        data = self._data.get(key)
        if data is None:
            data = self.bucket(key)
        elif obj_key in data:
            raise errors.already_exists(rt.plural, rt.group, event._name)
        event._uid = new_uid_bits()
        event._created = now()
        self._rv += 1
        rv = event._rv = self._rv
        index = self._indexes.get(key)
        if index is not None:
            index.add(obj_key, event.obj)
        order = self._sorted.get(key)
        if order is not None:
            self._add_to_order(key, order, obj_key)
        data[obj_key] = event
        self._publish(Event(rv, "ADDED", key, event, None))
        return event

    def replace(
        self,
        rt: ResourceType,
        obj: dict[str, Any],
        *,
        namespace: str,
        name: str,
        subresource: str | None = None,
        manager: str | None = None,
        dry_run: bool = False,
        keep_managed_fields: bool = False,
        trusted: bool = False,
    ) -> Stored:
        """Update an object (PUT semantics; takes ownership of `obj`).

        `trusted`: an in-process status write built in decoded form (the kubelet's: no nulls,
        no unknown fields), so decoding, which would leave it as it is, is skipped.
        """
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata", {}), dict):
            raise errors.bad_request("the body must be a JSON object with object metadata")
        old = self.peek(rt.key, namespace if rt.namespaced else "", name)
        if old is None:
            raise errors.not_found(rt.plural, rt.group, name)
        kind = obj.get("kind")
        if kind and kind != rt.kind:
            raise errors.bad_request(f"the kind {kind!r} does not match the resource {rt.plural!r}")
        if not (trusted and subresource == "status"):
            validation.decode(rt, obj, old.obj)
        meta = obj.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise errors.bad_request(
                f"the name of the object ({meta.get('name')}) does not match "
                f"the name on the URL ({name})"
            )
        old_meta = old.obj["metadata"]
        wanted_rv = meta.get("resourceVersion")
        if wanted_rv and wanted_rv != old_meta["resourceVersion"]:
            raise errors.conflict(
                rt.plural,
                rt.group,
                name,
                "the object has been modified; please apply your changes "
                "to the latest version and try again",
            )
        if subresource == "status":
            if manager is None and not keep_managed_fields:
                # An in-process status write (kubelet, controllers): share everything but
                # metadata and status with the stored version, which is never mutated.
                new = {**old.obj, "metadata": dict(old.obj["metadata"])}
            else:
                new = old.copy()
            if "status" in obj:
                new["status"] = obj["status"]
            else:
                new.pop("status", None)
            if keep_managed_fields and "managedFields" in meta:  # an apply to /status
                new["metadata"]["managedFields"] = meta["managedFields"]
                if not meta["managedFields"]:
                    new["metadata"].pop("managedFields")
            obj = new
            meta = obj["metadata"]
        else:
            obj["kind"] = rt.kind
            obj["apiVersion"] = obj.get("apiVersion") or old.obj.get("apiVersion", rt.api_version)
            if rt.status_subresource:
                if "status" in old.obj:
                    obj["status"] = old.obj["status"]
                else:
                    obj.pop("status", None)
            for field in (
                "uid",
                "creationTimestamp",
                "namespace",
                "name",
                "generation",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
            ):
                if field in old_meta:
                    meta[field] = old_meta[field]
                else:
                    meta.pop(field, None)
            # A client's update or patch may set managedFields itself (the documented way to
            # drop a manager's entries): a non-empty list replaces the stored one; an absent or
            # empty one keeps it, so clients that do not know the field never lose it.
            overwrite = (
                bool(manager)
                and isinstance(meta.get("managedFields"), list)
                and bool(meta.get("managedFields"))
            )
            if overwrite and not keep_managed_fields:
                pass
            elif not keep_managed_fields or "managedFields" not in meta:
                if "managedFields" in old_meta:
                    meta["managedFields"] = old_meta["managedFields"]
                else:
                    meta.pop("managedFields", None)
            elif not meta["managedFields"]:
                meta.pop("managedFields")  # an apply that left no manager owning anything
            if old_meta.get("deletionTimestamp"):
                added = set(meta.get("finalizers") or ()) - set(old_meta.get("finalizers") or ())
                if added:
                    raise errors.invalid(
                        rt.kind,
                        rt.group,
                        name,
                        [
                            (
                                "metadata.finalizers",
                                "Forbidden: no new finalizers can be added "
                                "if the object is being deleted",
                            )
                        ],
                    )
            defaults.apply_update_defaults(rt, obj)
            if rt.schema is not None:
                schema.admit(rt, obj)
            for hook in self.admission:
                hook(self, rt, obj, old.obj)
            validation.validate(rt, obj, old.obj)
            if rt.has_generation and _spec_changed(old.obj, obj):
                meta["generation"] = int(old_meta.get("generation", 1)) + 1
            if rt.key == CRD_KEY:
                _crd_status(obj, old.obj)
        meta["resourceVersion"] = old_meta["resourceVersion"]
        if manager:
            ssa.record_update(
                obj,
                old.obj,
                manager,
                obj.get("apiVersion", rt.api_version),
                rt.schema,
                subresource,
                now(),
            )
        if obj == old.obj:
            return old
        if dry_run:
            return Stored(obj)
        if (
            meta.get("deletionTimestamp")
            and not _has_finalizers(rt, obj)
            and not _awaits_kubelet(rt, obj)
        ):
            return self.commit("DELETED", rt, obj, old)
        return self.commit("MODIFIED", rt, obj, old)

    def remove(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        *,
        propagation: str | None = None,
        grace: int | None = None,
        preconditions: dict[str, Any] | None = None,
        dry_run: bool = False,
    ) -> tuple[Stored, bool]:
        """Delete an object; returns the last version and whether it is gone (vs. pending)."""
        namespace = namespace if rt.namespaced else ""
        old = self.peek(rt.key, namespace, name)
        if old is None:
            raise errors.not_found(rt.plural, rt.group, name)
        old_meta = old.obj["metadata"]
        for field, meta_field in (("uid", "uid"), ("resourceVersion", "resourceVersion")):
            wanted = (preconditions or {}).get(field)
            if wanted and wanted != old_meta.get(meta_field):
                raise errors.conflict(
                    rt.plural,
                    rt.group,
                    name,
                    f"Precondition failed: {field} in precondition: {wanted}, "
                    f"{field} in object meta: {old_meta.get(meta_field)}",
                )
        obj = old.copy()
        meta = obj["metadata"]
        finalizers: list[str] = list(meta.get("finalizers") or [])
        if propagation not in (None, "Orphan", "Background", "Foreground"):
            raise errors.bad_request(f"invalid propagationPolicy {propagation!r}")
        if propagation in ("Orphan", "Foreground") and self._dependents.get(old_meta["uid"]):
            marker = "orphan" if propagation == "Orphan" else "foregroundDeletion"
            if marker not in finalizers:
                finalizers.append(marker)
        if rt.key == NAMESPACE_KEY:
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = now()
                meta["deletionGracePeriodSeconds"] = 0
                obj.setdefault("status", {})["phase"] = "Terminating"
                if finalizers:
                    meta["finalizers"] = finalizers
                if dry_run:
                    return Stored(obj), False
                return self.commit("MODIFIED", rt, obj, old), False
            return old, False
        pending_grace = 0
        if _awaits_kubelet(rt, obj):
            spec_grace = int((obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
            pending_grace = spec_grace if grace is None else max(0, grace)
            current = meta.get("deletionGracePeriodSeconds")
            if current is not None and pending_grace >= int(current) and pending_grace > 0:
                return old, False
        if finalizers or pending_grace > 0:
            if finalizers:
                meta["finalizers"] = finalizers
            if not meta.get("deletionTimestamp") or pending_grace < int(
                meta.get("deletionGracePeriodSeconds") or 0
            ):
                meta["deletionTimestamp"] = timestamp_in(pending_grace)
                meta["deletionGracePeriodSeconds"] = pending_grace
            if obj == old.obj:
                return old, False
            if dry_run:
                return Stored(obj), False
            return self.commit("MODIFIED", rt, obj, old), False
        if dry_run:
            return Stored(obj), True
        return self.commit("DELETED", rt, obj, old), True

    def _sorted_keys(self, key: Key) -> list[ObjKey]:
        """The keys of a kind in (namespace, name) order (callers must not mutate it)."""
        order = self._sorted.get(key)
        if order is None:
            self._unsorted.pop(key, None)
            order = self._sorted[key] = sorted(self.bucket(key))
            return order
        pending = self._unsorted.pop(key, None)
        if pending:
            # A new list, sorted as two runs (one merge): a scan still reading the old one
            # goes on over it.
            order = self._sorted[key] = sorted([*order, *pending])
        return order

    def _order(self, key: Key, namespace: str | None) -> list[ObjKey]:
        """The keys of a kind in (namespace, name) order; only one namespace's when given."""
        order = self._sorted_keys(key)
        if namespace is None:
            return order
        low = bisect.bisect_left(order, (namespace, ""))
        high = bisect.bisect_left(order, (namespace + "\x00", ""))
        return order[low:high]

    def _index(self, key: Key) -> list_index.KindIndex:
        index = self._indexes.get(key)
        if index is None:
            index = self._indexes[key] = list_index.KindIndex(list_index.indexed_fields(key))
            for obj_key, stored in self.bucket(key).items():
                index.add(obj_key, stored.obj)
        return index

    def _candidates(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: selectors.LabelSelector,
        fields: selectors.FieldSelector,
    ) -> list[ObjKey]:
        """The keys that can match, in order: from the indexes when the selectors narrow the
        kind, else the namespace's (or the kind's) keys."""
        if labels.empty and fields.empty:
            return self._order(rt.key, namespace)
        found = self._index(rt.key).candidates(labels, fields)
        if found is None:
            return self._order(rt.key, namespace)
        if namespace is not None:
            return sorted(k for k in found if k[0] == namespace)
        return sorted(found)

    def select(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: selectors.LabelSelector,
        fields: selectors.FieldSelector,
    ) -> Iterator[Stored]:
        """Objects of a type matching the selectors, in key order."""
        if labels.nothing:
            return
        data = self.bucket(rt.key)
        for obj_key in self._candidates(rt, namespace, labels, fields):
            stored = data.get(obj_key)
            if stored is not None and _selected(stored.obj, labels, fields):
                yield stored

    def _versions_at(self, key: Key, rv: int) -> dict[ObjKey, Stored | None]:
        """The objects of a kind changed since `rv`, each with its version at `rv` (None: it
        did not exist then); from the watch history, which must reach back to `rv`."""
        versions: dict[ObjKey, Stored | None] = {}
        for event in reversed(self._history):
            if event.rv <= rv:
                break
            if event.key != key:
                continue
            meta = event.new.obj["metadata"]
            # Newest first: the last one written is the oldest change, whose prior version
            # is the one at `rv`.
            prior = None if event.type == "ADDED" else event.old
            versions[(meta.get("namespace", ""), meta["name"])] = prior
        return versions

    def list_page(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: selectors.LabelSelector,
        fields: selectors.FieldSelector,
        limit: int = 0,
        continue_token: str | None = None,
    ) -> Page:
        """A page of a list: its items, the list's resourceVersion, the continue token when
        more items match, and how many remain (only for lists without selectors, as the real
        server). A continued list is served as of the first page's resourceVersion (from the
        watch history; 410 Expired once that is compacted), like the real server's
        consistent snapshots; the items are immutable stored versions, so the caller may
        encode them later, at its own pace, without holding the store."""
        if limit < 0:
            limit = 0
        rv = self._rv
        start: ObjKey | None = None
        if continue_token:
            rv, start = decode_continue(continue_token)
            if rv < self.compacted_rv:
                raise errors.gone(
                    "The provided continue parameter is too old to display "
                    "a consistent list result. "
                    "You can start a new list without the continue parameter."
                )
        versions = self._versions_at(rt.key, rv) if rv < self._rv else {}
        data = self.bucket(rt.key)
        candidates = [] if labels.nothing else self._candidates(rt, namespace, labels, fields)
        if versions:
            # Objects changed since `rv` are judged by their version at `rv`: deleted ones, or
            # ones whose labels moved them out of the indexed candidates, may belong.
            extra = [k for k in versions if namespace is None or k[0] == namespace]
            candidates = sorted({*candidates, *extra}) if extra else candidates
        position = 0 if start is None else bisect.bisect_right(candidates, start)
        items: list[Stored] = []
        token = None
        remaining: int | None = None
        for at in range(position, len(candidates)):
            obj_key = candidates[at]
            stored = versions[obj_key] if obj_key in versions else data.get(obj_key)
            if stored is None or not _selected(stored.obj, labels, fields):
                continue
            if limit and len(items) >= limit:
                token = encode_continue(rv, items[-1])
                if labels.empty and fields.empty:
                    remaining = sum(
                        1
                        for k in candidates[at:]
                        if (versions[k] if k in versions else data.get(k)) is not None
                    )
                break
            items.append(stored)
        return Page(items, rv, token, remaining)

    # ----- convenience API for Python callers (copies in, copies out) ------------------------

    def get(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """A copy of an object, or None; `resource` is a plural, kind or `plural.group`."""
        rt = self.registry.resolve(resource)
        stored = self.peek(rt.key, namespace or "" if rt.namespaced else "", name)
        return stored.copy() if stored else None

    def list(
        self,
        resource: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """Copies of the matching objects."""
        rt = self.registry.resolve(resource)
        found = self.select(
            rt,
            namespace if rt.namespaced else None,
            selectors.parse_label_selector(label_selector),
            selectors.parse_field_selector(field_selector),
        )
        return [stored.copy() for stored in found]

    def count(self, resource: str) -> int:
        """How many objects of a type are stored."""
        return len(self.bucket(self.registry.resolve(resource).key))

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create an object from a dict with apiVersion and kind."""
        rt = self.registry.for_object(obj)
        return self.insert(rt, _json_copy(obj)).copy()

    def update(self, obj: dict[str, Any], *, status: bool = False) -> dict[str, Any]:
        """Replace an object (or only its status); a stale resourceVersion raises Conflict."""
        rt = self.registry.for_object(obj)
        meta = obj.get("metadata") or {}
        old = self.peek(
            rt.key, meta.get("namespace", "") if rt.namespaced else "", meta.get("name", "")
        )
        with deep_mod.raised(old is not None and old.deep):
            stored = self.replace(
                rt,
                _json_copy(obj),
                namespace=meta.get("namespace", ""),
                name=meta.get("name", ""),
                subresource="status" if status else None,
            )
        return stored.copy()

    def patch(
        self,
        resource: str,
        name: str,
        patch: dict[str, Any],
        namespace: str | None = None,
        *,
        status: bool = False,
    ) -> dict[str, Any]:
        """Apply a JSON merge patch to an object (or its status)."""
        from kubesim import patch as patching

        rt = self.registry.resolve(resource)
        ns = namespace or "" if rt.namespaced else ""
        stored = self.peek(rt.key, ns, name)
        if stored is None:
            raise errors.not_found(rt.plural, rt.group, name)
        with deep_mod.raised(stored.deep):
            merged = patching.merge_patch(stored.copy(), patch)
            result = self.replace(
                rt, merged, namespace=ns, name=name, subresource="status" if status else None
            )
        return result.copy()

    def delete(
        self,
        resource: str,
        name: str,
        namespace: str | None = None,
        *,
        propagation: str | None = None,
        grace: int | None = None,
    ) -> bool:
        """Delete an object; returns True when it is gone now (False when deletion is pending)."""
        rt = self.registry.resolve(resource)
        _, gone = self.remove(rt, namespace or "", name, propagation=propagation, grace=grace)
        return gone

    def iter_all(self) -> Iterable[tuple[Key, Stored]]:
        """Every stored object (for dumps and memory accounting)."""
        for key, data in self._data.items():
            for stored in data.values():
                yield key, stored


class Page(NamedTuple):
    """One page of a list (Store.list_page)."""

    items: list[Stored]
    rv: int
    token: str | None
    remaining: int | None


def _selected(
    obj: dict[str, Any], labels: selectors.LabelSelector, fields: selectors.FieldSelector
) -> bool:
    if not labels.empty and not labels.matches(obj["metadata"].get("labels")):
        return False
    return fields.empty or fields.matches(obj)


def encode_continue(rv: int, last: Stored) -> str:
    """A continue token in the real server's shape: URL-safe base64 (no padding) of
    {"v": "meta.k8s.io/v1", "rv": <the list's resourceVersion>, "start": <the key after the
    last item returned>}; kubesim's key is "<namespace>/<name>" with a NUL appended."""
    meta = last.obj["metadata"]
    key = f"{meta.get('namespace', '')}/{meta['name']}\x00"
    state = {"v": "meta.k8s.io/v1", "rv": rv, "start": key}
    return base64.urlsafe_b64encode(dumps(state)).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, ObjKey]:
    """(resourceVersion, last key returned) of a continue token; 400 when it is not one."""
    try:
        raw = base64.urlsafe_b64decode(token.encode() + b"=" * (-len(token) % 4))
        state = json.loads(raw)
        if not isinstance(state, dict) or state.get("v") != "meta.k8s.io/v1":
            raise ValueError(f"unrecognized continue version {state.get('v')!r}")
        rv = int(state["rv"])
        start = str(state["start"])
        if rv <= 0 or not start.endswith("\x00") or "/" not in start:
            raise ValueError("invalid start key or resourceVersion")
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as exc:
        raise errors.bad_request(f"continue key is not valid: {exc}") from exc
    namespace, _, name = start[:-1].partition("/")
    return rv, (namespace, name)


def _has_finalizers(rt: ResourceType, obj: dict[str, Any]) -> bool:
    """Metadata finalizers, plus spec.finalizers for namespaces."""
    if obj["metadata"].get("finalizers"):
        return True
    return rt.key == NAMESPACE_KEY and bool((obj.get("spec") or {}).get("finalizers"))


def _spec_changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether anything outside metadata and status differs (the generation rule)."""
    keys = (set(old) | set(new)) - {"metadata", "status", "apiVersion", "kind"}
    return any(old.get(k) != new.get(k) for k in keys)


def _awaits_kubelet(rt: ResourceType, obj: dict[str, Any]) -> bool:
    """Pods bound to a node and not finished terminate gracefully through the kubelet."""
    if rt.key != ("", "pods"):
        return False
    phase = (obj.get("status") or {}).get("phase")
    return bool((obj.get("spec") or {}).get("nodeName")) and phase not in ("Succeeded", "Failed")


def _crd_status(obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    """CRD status as the apiextensions controllers set it: names accepted, established."""
    spec = obj.get("spec") or {}
    old_conditions = {
        c.get("type"): c for c in ((old or {}).get("status") or {}).get("conditions") or []
    }
    stamp = now()
    conditions = []
    for ctype, reason, message in (
        ("NamesAccepted", "NoConflicts", "no conflicts found"),
        ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
    ):
        previous = old_conditions.get(ctype)
        conditions.append(
            {
                "type": ctype,
                "status": "True",
                "lastTransitionTime": previous.get("lastTransitionTime", stamp)
                if previous
                else stamp,
                "reason": reason,
                "message": message,
            }
        )
    names = dict(spec.get("names") or {})
    names.setdefault("singular", str(names.get("kind", "")).lower())
    names.setdefault("listKind", f"{names.get('kind', '')}List")
    storage = [v.get("name") for v in spec.get("versions") or [] if v.get("storage")]
    obj["status"] = {"conditions": conditions, "acceptedNames": names, "storedVersions": storage}
