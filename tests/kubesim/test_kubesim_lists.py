"""Selected and chunked lists: indexes, continue tokens, consistent pages, non-blocking encoding."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import random
import time
from typing import Any

import pytest
from kubesim_helpers import CM, Api, configmap, kubectl, needs_kubectl
from waiting import within

import kubesim
from kubesim import list_encoding, list_index, selectors, tables
from kubesim.protobuf import codec
from kubesim.store import Store, dumps

PROTOBUF = "application/vnd.kubernetes.protobuf,application/json"


def labelled(name: str, labels: dict[str, str], **data: str) -> dict[str, Any]:
    body = configmap(name)
    body["metadata"]["labels"] = labels
    body["data"] = dict(data)
    return body


async def names(api: Api, path: str, params: dict[str, str]) -> tuple[list[str], dict[str, Any]]:
    body = await api.ok("GET", path, params=params)
    return [i["metadata"]["name"] for i in body["items"]], body["metadata"]


# ----- continue tokens -----------------------------------------------------------------------


async def test_continued_pages_are_served_as_of_the_first_page(api: Api) -> None:
    """Pages after the first show the objects as they were at the first page's resourceVersion,
    whatever was created, changed or deleted since (the real server's consistent snapshot)."""
    for index in range(6):
        await api.ok("POST", CM, labelled(f"c{index}", {"app": "snap"}, v="old"))
    params = {"limit": "2", "labelSelector": "app=snap"}
    first, meta = await names(api, CM, params)
    assert first == ["c0", "c1"]
    rv = meta["resourceVersion"]
    await api.ok("DELETE", f"{CM}/c2")
    await api.ok("PUT", f"{CM}/c3", labelled("c3", {"app": "snap"}, v="new"))
    await api.ok("POST", CM, labelled("c1a", {"app": "snap"}))  # sorts right after c1
    await api.ok("PUT", f"{CM}/c4", labelled("c4", {"app": "other"}, v="moved"))
    seen: list[dict[str, Any]] = []
    token = meta["continue"]
    while token:
        body = await api.ok("GET", CM, params={**params, "continue": token})
        assert body["metadata"]["resourceVersion"] == rv
        seen += body["items"]
        token = body["metadata"].get("continue")
    assert [i["metadata"]["name"] for i in seen] == ["c2", "c3", "c4", "c5"]
    assert [i["data"]["v"] for i in seen] == ["old"] * 4
    # A new list sees the changes.
    fresh, _ = await names(api, CM, {"labelSelector": "app=snap"})
    assert fresh == ["c0", "c1", "c1a", "c3", "c5"]


async def test_remaining_item_count_only_without_selectors(api: Api) -> None:
    for index in range(5):
        await api.ok("POST", CM, labelled(f"r{index}", {"app": "count"}))
    everything, _ = await names(api, CM, {})
    _, meta = await names(api, CM, {"limit": "2"})
    assert meta["remainingItemCount"] == len(everything) - 2
    _, selected = await names(api, CM, {"limit": "2", "labelSelector": "app=count"})
    assert "continue" in selected
    assert "remainingItemCount" not in selected
    # The last page has neither a token nor a count.
    _, last = await names(api, CM, {"limit": "100"})
    assert "continue" not in last
    assert "remainingItemCount" not in last


async def test_continue_token_shape_and_bad_tokens(api: Api) -> None:
    for index in range(3):
        await api.ok("POST", CM, configmap(f"t{index}"))
    _, meta = await names(api, CM, {"limit": "1"})
    token = meta["continue"]
    state = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    assert state["v"] == "meta.k8s.io/v1"
    assert str(state["rv"]) == meta["resourceVersion"]
    assert state["start"].endswith("\x00")
    for bad in ("not-a-token!", base64.urlsafe_b64encode(b'{"v":"x","rv":1}').decode()):
        status, body = await api.req("GET", CM, params={"limit": "1", "continue": bad})
        assert status == 400, body
        assert "continue key is not valid" in body["message"]


# ----- indexes -------------------------------------------------------------------------------


def _brute(
    store: Store,
    resource: str,
    namespace: str | None,
    labels: selectors.LabelSelector,
    fields: selectors.FieldSelector,
) -> list[str]:
    rt = store.registry.resolve(resource)
    return [
        f"{s.obj['metadata']['namespace']}/{s.obj['metadata']['name']}"
        for s in store.scan(rt.key, namespace)
        if labels.matches(s.obj["metadata"].get("labels")) and fields.matches(s.obj)
    ]


def test_indexes_follow_creates_updates_label_changes_and_deletes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Indexed lists equal a full scan after every kind of write, selector by selector,
    whole and chunked."""
    monkeypatch.setitem(list_index._FIELDS, ("", "configmaps"), ("data.owner",))
    store = Store()
    for namespace in ("default", "other"):
        store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    rt = store.registry.resolve("configmaps")
    rng = random.Random(7)
    label_selectors = [
        "a=x", "a in (x,y)", "a=x,b=1", "a!=x", "b", "!b", "a notin (z)", "a=x,b!=2", "a=",
    ]  # fmt: skip
    field_selectors = ["", "data.owner=o1", "data.owner!=o1", "data.owner=o2,metadata.name!=c3"]

    def random_object(name: str, namespace: str) -> dict[str, Any]:
        labels = {
            k: rng.choice(values) for k, values in (("a", "xyz"), ("b", "12")) if rng.random() < 0.8
        }
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
        }
        if rng.random() < 0.7:
            body["data"] = {"owner": rng.choice(["o1", "o2", "o3"])}
        return body

    def check() -> None:
        for text in label_selectors:
            for field_text in field_selectors:
                labels = selectors.parse_label_selector(text)
                fields = selectors.parse_field_selector(field_text)
                for namespace in (None, "default", "other"):
                    want = _brute(store, "configmaps", namespace, labels, fields)
                    page = store.list_page(rt, namespace, labels, fields)
                    got = [
                        f"{s.obj['metadata']['namespace']}/{s.obj['metadata']['name']}"
                        for s in page.items
                    ]
                    assert got == want, (text, field_text, namespace)
                    chunked: list[str] = []
                    token = None
                    while True:
                        page = store.list_page(rt, namespace, labels, fields, 3, token)
                        chunked += [s.obj["metadata"]["name"] for s in page.items]
                        token = page.token
                        if not token:
                            break
                    assert chunked == [w.split("/")[1] for w in want]

    check()  # builds the indexes on an empty kind
    alive: set[tuple[str, str]] = set()
    for step in range(300):
        action = rng.random()
        if action < 0.45 or not alive:
            key = (rng.choice(["default", "other"]), f"c{rng.randrange(40)}")
            if key in alive:
                continue
            store.create(random_object(key[1], key[0]))
            alive.add(key)
        elif action < 0.8:
            namespace, name = rng.choice(sorted(alive))
            current = store.get("configmaps", name, namespace)
            assert current is not None
            replacement = random_object(name, namespace)
            replacement["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            store.update(replacement)
        else:
            namespace, name = rng.choice(sorted(alive))
            store.delete("configmaps", name, namespace)
            alive.discard((namespace, name))
        if step % 10 == 0:
            check()
    check()


def test_pods_are_indexed_by_node_name_and_restores_rebuild_indexes() -> None:
    store = Store()
    store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})
    rt = store.registry.resolve("pods")
    assert "spec.nodeName" in list_index.indexed_fields(rt.key)
    for index in range(20):
        store.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"p{index:02d}", "namespace": "default"},
                "spec": {
                    "nodeName": f"n{index % 3}",
                    "containers": [{"name": "c", "image": "example/c"}],
                },
            }
        )
    by_node = selectors.parse_field_selector("spec.nodeName=n1")
    everything = selectors.parse_label_selector(None)
    snapshot = store.snapshot()
    before = [
        s.obj["metadata"]["name"] for s in store.list_page(rt, None, everything, by_node).items
    ]
    assert before == [f"p{i:02d}" for i in range(20) if i % 3 == 1]
    index = store._index(rt.key)
    assert len(index.fields["spec.nodeName"]["n1"]) == len(before)
    store.delete("pods", "p01", "default", grace=0)
    store.restore(snapshot)
    after = [
        s.obj["metadata"]["name"] for s in store.list_page(rt, None, everything, by_node).items
    ]
    assert after == before


# ----- encoding without holding the server ---------------------------------------------------


async def test_a_big_list_does_not_hold_up_a_small_request(sim: kubesim.Cluster, api: Api) -> None:
    """While a big protobuf list is encoded, a small request is answered long before it ends
    (before, the list's encode ran in one piece and every other request waited for it)."""
    big = {f"key-{k:02d}": "value " * 8 for k in range(30)}
    for index in range(3000):
        sim.store.create(labelled(f"big-{index:04d}", {"app": "big"}, **big))
    await api.ok("POST", CM, configmap("small"))
    lists_before = sim.stats.count("list", "configmaps")

    async def timed(path: str, headers: dict[str, str], params: dict[str, str]) -> float:
        async with api.session.get(path, headers=headers, params=params) as response:
            assert response.status == 200, await response.text()
            body = await response.read()
        if "protobuf" in headers.get("Accept", ""):
            assert body.startswith(codec.MAGIC)
            assert body.count(b"big-") == 3000
        return time.monotonic()

    gaps: list[float] = []

    async def ticker() -> None:
        """How long the event loop was held between two turns of this loop."""
        while True:
            before = time.monotonic()
            await asyncio.sleep(0)
            gaps.append(time.monotonic() - before)

    ticking = asyncio.ensure_future(ticker())
    sent = time.monotonic()
    big_list = asyncio.ensure_future(timed(CM, {"Accept": PROTOBUF}, {"labelSelector": "app=big"}))

    async def list_started() -> None:
        while sim.stats.count("list", "configmaps") == lists_before:
            await asyncio.sleep(0)

    await within(list_started(), "the big list to start")
    small_done = await within(timed(f"{CM}/small", {"Accept": "application/json"}, {}), "small GET")
    big_done = await within(big_list, "the big list")
    ticking.cancel()
    # An ordering and a ratio, not times: the small GET ends first, and the loop was never held
    # for most of the big list's time (a list encoded in one piece holds it for nearly all).
    assert small_done < big_done
    assert max(gaps) < (big_done - sent) / 2, (max(gaps), big_done - sent)


async def test_a_big_list_body_goes_out_in_chunks(
    sim: kubesim.Cluster, api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list body of megabytes is handed to the connection in chunks, each written once the
    previous one drained (before: in one write, one long loop step copying the whole body), and
    arrives whole, with its Content-Length, as JSON and as protobuf."""
    from aiohttp import http_writer

    big = {f"key-{k:02d}": "value " * 8 for k in range(30)}
    for index in range(400):
        sim.store.create(labelled(f"chunk-{index:04d}", {"app": "chunk"}, **big))
    writes: list[int] = []
    write, write_eof = http_writer.StreamWriter.write, http_writer.StreamWriter.write_eof

    async def spy_write(self: http_writer.StreamWriter, chunk: Any, **kw: Any) -> None:
        writes.append(len(memoryview(chunk).cast("B")))
        await write(self, chunk, **kw)

    async def spy_write_eof(self: http_writer.StreamWriter, chunk: Any = b"") -> None:
        writes.append(len(chunk))
        await write_eof(self, chunk)

    monkeypatch.setattr(http_writer.StreamWriter, "write", spy_write)
    monkeypatch.setattr(http_writer.StreamWriter, "write_eof", spy_write_eof)
    for accept in ("application/json", PROTOBUF):
        writes.clear()
        async with api.session.get(
            CM, headers={"Accept": accept}, params={"labelSelector": "app=chunk"}
        ) as response:
            assert response.status == 200, await response.text()
            body = await response.read()
            assert int(response.headers["Content-Length"]) == len(body)
        assert len(body) > 2 * list_encoding.ListBody.CHUNK, (accept, len(body))
        assert max(writes) <= list_encoding.ListBody.CHUNK, (accept, max(writes))
        assert sum(writes) >= len(body)
        if accept == PROTOBUF:
            assert len(codec.default().decode_object(body)["items"]) == 400
        else:
            assert len(json.loads(body)["items"]) == 400


async def test_protobuf_list_equals_the_whole_list_encoded_at_once(
    sim: kubesim.Cluster, api: Api
) -> None:
    """Item by item (and cached per stored version) encodes the same bytes as the whole list."""
    for index in range(5):
        await api.ok("POST", CM, labelled(f"p{index}", {"app": "proto"}, k=str(index)))
    params = {"labelSelector": "app=proto", "limit": "3"}
    for _ in range(2):  # the second time from the cache
        async with api.session.get(CM, headers={"Accept": PROTOBUF}, params=params) as response:
            got = await response.read()
        async with api.session.get(CM, params=params) as response:
            as_json = json.loads(await response.read())
        assert codec.default().decode_object(got) == codec.default().decode_object(
            codec.default().encode_object(as_json)
        )
        assert codec.default().encode_object(as_json) == got


TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


async def _read(api: Api, accept: str, params: dict[str, str]) -> bytes:
    async with api.session.get(CM, headers={"Accept": accept}, params=params) as response:
        assert response.status == 200, await response.text()
        return await response.read()


async def test_changed_items_are_encoded_before_the_next_protobuf_and_table_list(
    sim: kubesim.Cluster, api: Api
) -> None:
    """After a kind was listed as protobuf and as Table, its changed objects are encoded in the
    loop's idle time: the next lists encode nothing themselves, and their bytes equal what
    encoding everything afresh gives. Objects outside the listed selector are left alone, and
    an object changed twice before the prewarmer reached it is encoded once, as its newest
    version."""
    prewarmer = sim.server.prewarmer
    for index in range(40):
        sim.store.create(labelled(f"w{index:02d}", {"app": "warm"}, v="0"))
    sim.store.create(labelled("cold", {"app": "cold"}, v="0"))
    params = {"labelSelector": "app=warm"}
    await _read(api, PROTOBUF, params)
    await _read(api, TABLE, params)
    before = dict(list_encoding.STATS)
    rt = sim.store.registry.get("", "v1", "configmaps")
    assert rt is not None
    for index in range(40):
        for version in ("1", "2"):  # the second replaces the first in the queue
            obj = labelled(f"w{index:02d}", {"app": "warm"}, v=version)
            sim.store.update(obj)
    sim.store.update(labelled("cold", {"app": "cold"}, v="1"))

    async def drained() -> None:
        while prewarmer.queued:
            await asyncio.sleep(0.01)

    await within(drained(), "the prewarmer to drain its queue")
    assert list_encoding.STATS["proto_prewarmed"] - before["proto_prewarmed"] == 40
    assert list_encoding.STATS["row_prewarmed"] - before["row_prewarmed"] == 40
    cold = sim.store.peek(rt.key, "default", "cold")
    assert cold is not None
    assert (cold.proto, cold.row) == (None, None)
    got_proto = await _read(api, PROTOBUF, params)
    got_table = await _read(api, TABLE, params)
    assert list_encoding.STATS["proto_on_demand"] == before["proto_on_demand"]
    assert list_encoding.STATS["row_on_demand"] == before["row_on_demand"]
    # The same bytes as encoding every item afresh.
    page = sim.store.list_page(
        rt, None, selectors.parse_label_selector("app=warm"), selectors.parse_field_selector(None)
    )
    assert [s.obj["data"]["v"] for s in page.items] == ["2"] * 40
    as_json = json.loads(await _read(api, "application/json", params))
    assert got_proto == codec.default().encode_object(as_json)
    assert got_table == dumps(tables.table(rt, page.items, page.rv, {}))


async def test_a_whole_list_kept_bytes_never_serve_a_changed_object_stale(
    sim: kubesim.Cluster, api: Api
) -> None:
    """A whole list listed again with the same stored versions is served from its kept bytes,
    in each form; once an object changes, leaves the selection or is deleted, the next list
    shows it as it is now, byte for byte what encoding the list afresh gives."""
    for index in range(20):
        sim.store.create(labelled(f"k{index:02d}", {"app": "kept"}, v="0"))
    params = {"labelSelector": "app=kept"}
    forms = {"json": "application/json", "protobuf": PROTOBUF, "table": TABLE}
    rt = sim.store.registry.get("", "v1", "configmaps")
    assert rt is not None

    async def read_all() -> dict[str, bytes]:
        return {name: await _read(api, accept, params) for name, accept in forms.items()}

    def afresh(got: dict[str, bytes]) -> None:
        page = sim.store.list_page(
            rt,
            None,
            selectors.parse_label_selector("app=kept"),
            selectors.parse_field_selector(None),
        )
        as_json = json.loads(got["json"])
        assert as_json["metadata"]["resourceVersion"] == str(page.rv)
        assert [json.loads(s.raw) for s in page.items] == as_json["items"]
        assert got["protobuf"] == codec.default().encode_object(as_json)
        assert got["table"] == dumps(tables.table(rt, page.items, page.rv, {}))

    await read_all()
    hits = list_encoding.STATS["selection_hits"]
    afresh(await read_all())
    assert list_encoding.STATS["selection_hits"] - hits == 3  # each form from its kept bytes
    sim.store.update(labelled("k03", {"app": "kept"}, v="changed"))
    got = await read_all()
    assert json.loads(got["json"])["items"][3]["data"] == {"v": "changed"}
    assert b"changed" in got["protobuf"]
    afresh(got)
    sim.store.update(labelled("k04", {"app": "gone"}, v="0"))
    sim.store.delete("configmaps", "k05", "default")
    got = await read_all()
    names = [i["metadata"]["name"] for i in json.loads(got["json"])["items"]]
    assert "k04" not in names
    assert "k05" not in names
    assert len(names) == 18
    afresh(got)


async def test_a_list_in_flight_holds_the_collector_until_it_is_sent() -> None:
    """The cyclic collector's automatic passes wait while a list is in flight; after the last
    one it is given back at once, or, when a pass is due, a moment later with that pass run
    then; lists back to back for longer than the hold do not keep it away."""
    in_flight = list_encoding.IN_FLIGHT
    gc.collect()
    assert gc.isenabled()
    assert not in_flight.count
    in_flight.begin()
    in_flight.begin()
    assert not gc.isenabled()
    in_flight.end()
    assert not gc.isenabled()  # another list is still in flight
    in_flight.end()
    assert gc.isenabled()  # no pass due: given back at once

    in_flight.begin()
    garbage = [[] for _ in range(2 * gc.get_threshold()[0] + 10)]
    assert gc.get_count()[0] > gc.get_threshold()[0]
    in_flight.end()
    assert not gc.isenabled()  # a pass is due: not inside this response's writing

    async def released() -> None:
        while not gc.isenabled():
            await asyncio.sleep(0.005)

    await within(released(), "the collector to be given back")
    assert gc.get_count()[0] < gc.get_threshold()[0]  # the due pass ran then
    del garbage

    in_flight.begin()
    assert not gc.isenabled()
    in_flight._held_since = time.monotonic() - 2 * in_flight.HOLD_SECONDS
    in_flight.begin()  # lists back to back for longer than the hold
    assert gc.isenabled()
    in_flight.end()
    in_flight.end()
    assert gc.isenabled()
    assert not in_flight.holding


async def test_table_rows_kept_per_version_equal_rows_built_afresh(
    sim: kubesim.Cluster, api: Api
) -> None:
    """A Table list served from rows kept with the stored versions (also with includeObject and
    a continue token) has the same bytes as the Table built from scratch."""
    for index in range(5):
        sim.store.create(labelled(f"t{index}", {"app": "tab"}, k=str(index)))
    rt = sim.store.registry.get("", "v1", "configmaps")
    assert rt is not None
    for extra in ({}, {"includeObject": "Object"}, {"includeObject": "None"}):
        params = {"labelSelector": "app=tab", "limit": "3", **extra}
        for _ in range(2):  # the second time from the kept rows
            got = await _read(api, TABLE, params)
            page = sim.store.list_page(
                rt,
                None,
                selectors.parse_label_selector("app=tab"),
                selectors.parse_field_selector(None),
                3,
            )
            expected = tables.table(rt, page.items, page.rv, extra, page.token)
            assert got == dumps(expected)


# ----- real kubectl --------------------------------------------------------------------------


@needs_kubectl
async def test_kubectl_chunked_get_returns_every_object_once(sim: kubesim.Cluster) -> None:
    for index in range(230):
        namespace = "default" if index % 2 else "kube-system"
        body = labelled(f"chunk-{index:03d}", {"app": "chunk"})
        body["metadata"]["namespace"] = namespace
        sim.store.create(body)
    sim.store.create(labelled("unrelated", {"app": "other"}))
    want = sorted(f"configmap/chunk-{i:03d}" for i in range(230))
    out = await kubectl(
        sim, "get", "configmaps", "-A", "-l", "app=chunk", "--chunk-size=50", "-o", "name"
    )
    assert sorted(out.split()) == want
    table = await kubectl(
        sim, "get", "configmaps", "-A", "-l", "app=chunk", "--chunk-size=50", "--no-headers",
        "-o", "wide",
    )  # fmt: skip
    rows = [line.split()[1] for line in table.splitlines() if line.strip()]
    assert sorted(rows) == sorted(w.split("/")[1] for w in want)
    assert len(rows) == len(set(rows)) == 230
