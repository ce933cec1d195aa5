"""The write path's fast paths give exactly what the general paths give: managedFields of updates
that only change owned values, request bodies decoded without the duplicate-key hook, name checks
that remember valid names, watchers without selectors, patches that share the stored status;
checked on generated input, over HTTP and with kubectl."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import uuid
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kubesim_helpers import KUBECTL, Api, configmap, kubectl, needs_kubectl
from waiting import DEADLINE, within

import kubesim
from kubesim import managed_fields as mf
from kubesim import schema, selectors, ssa
from kubesim.store import Store, Stored, Watcher, dumps, new_uid
from kubesim.validation import duplicates, syntax

MERGE = "application/merge-patch+json"
SMP = "application/strategic-merge-patch+json"

# ----- managedFields of updates ----------------------------------------------------------------

MANAGERS = ("kubectl", "operator", "helm")
# Leaf paths an update may set or remove (containers are a keyed list, matched by name).
PATHS: tuple[tuple[Any, ...], ...] = (
    ("metadata", "generation"),
    ("metadata", "labels", "app"),
    ("metadata", "labels", "tier"),
    ("metadata", "annotations", "note"),
    ("spec", "replicas"),
    ("spec", "paused"),
    ("spec", "template", "metadata", "labels", "app"),
    ("spec", "template", "spec", "containers", 0, "image"),
    ("spec", "template", "spec", "containers", 0, "args"),
    ("spec", "template", "spec", "containers", 1, "image"),
    ("spec", "template", "metadata", "labels", "tier"),
    ("spec", "template", "metadata", "labels"),
    ("spec", "template", "spec", "nodeSelector", "zone"),
)
VALUES = st.one_of(
    st.none(),  # remove
    st.sampled_from(["a", "b", "x:1"]),
    st.integers(0, 3),
    st.sampled_from([["1"], ["1", "2"], {"k": "v"}]),
)


def entry(manager: str, fields: dict[str, Any]) -> dict[str, Any]:
    """A managedFields entry of operation Update."""
    return {"manager": manager, "operation": "Update", "apiVersion": "apps/v1",
            "fieldsType": "FieldsV1", "fieldsV1": fields}  # fmt: skip


# Entries a client may have written itself: not in normal form, one manager twice, a stripped
# field claimed.
MEMBER_MARKED_ONLY = [entry("operator", {"f:spec": {"f:replicas": {".": {}}}})]
ODD_MARKER_VALUE = [entry("operator", {"f:spec": {".": {"x": {}}, "f:replicas": {}}})]
TWICE = [
    entry("kubectl", {"f:spec": {"f:replicas": {}}}),
    entry("kubectl", {"f:metadata": {"f:labels": {"f:app": {}}}}),
]
ROOT_MARKED = [entry("operator", {".": {}, "f:spec": {"f:replicas": {}}})]
GENERATION_CLAIMED = [
    entry("helm", {"f:metadata": {"f:generation": {}}, "f:spec": {"f:replicas": {}}})
]
ODD_ENTRIES: tuple[list[dict[str, Any]], ...] = (
    [],
    MEMBER_MARKED_ONLY,
    ODD_MARKER_VALUE,
    TWICE,
    GENERATION_CLAIMED,
    ROOT_MARKED,
    [entry("helm", {"f:spec": {"f:replicas": {}, "f:paused": {}}})],
)


def deployment() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "default", "generation": 1, "labels": {"app": "a"}},
        "spec": {
            "replicas": 1,
            "template": {
                "metadata": {"labels": {"app": "a"}},
                "spec": {
                    "containers": [
                        {"name": "main", "image": "a"},
                        {"name": "side", "image": "b"},
                    ]
                },
            },
        },
    }


def changed(obj: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    """Set (or, for None, remove) the value at `path`, creating maps on the way."""
    node: Any = obj
    for step in path[:-1]:
        if isinstance(step, int):
            if not isinstance(node, list) or step >= len(node):
                return
            node = node[step]
        else:
            if not isinstance(node.get(step), dict):
                node[step] = {}
            node = node[step]
    if value is None:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = copy.deepcopy(value)


def recorded(obj: dict[str, Any], old: dict[str, Any], manager: str, now: str) -> str:
    """The managedFields an update records, as JSON (the order of entries and keys counts)."""
    ssa.record_update(obj, old, manager, "apps/v1", None, None, now)
    return json.dumps(obj["metadata"].get("managedFields"))


LABELS = ("spec", "template", "metadata", "labels")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# A value changed under a parent the writer owns only children of (then not owned itself).
@example(
    odd=[],
    steps=[
        ("helm", [((*LABELS, "tier"), "a")], 0),
        ("operator", [((*LABELS, "tier"), "b")], 0),
        ("operator", [(LABELS, "x")], 0),
    ],
)
# The writer's first entry owns the value; a second entry of the same manager must survive.
@example(odd=TWICE, steps=[("kubectl", [(("spec", "replicas"), 2)], 0)])
# Entries of the writer not in normal form along the changed path.
@example(odd=MEMBER_MARKED_ONLY, steps=[("operator", [(("spec", "replicas"), 2)], 0)])
@example(odd=ODD_MARKER_VALUE, steps=[("operator", [(("spec", "replicas"), 2)], 0)])
@example(odd=ROOT_MARKED, steps=[("operator", [(("spec", "replicas"), 2)], 0)])
# A stripped field (generation) the writer's own entry claims.
@example(odd=GENERATION_CLAIMED, steps=[("helm", [(("metadata", "generation"), 2)], 0)])
@given(
    odd=st.sampled_from(ODD_ENTRIES),
    steps=st.lists(
        st.tuples(
            st.sampled_from(MANAGERS),
            st.lists(st.tuples(st.sampled_from(PATHS), VALUES), min_size=1, max_size=3),
            st.integers(0, 2),
        ),
        min_size=1,
        max_size=8,
    ),
)
def test_updates_of_owned_values_record_what_the_general_path_records(
    odd: list[dict[str, Any]], steps: list[tuple[str, list[tuple[Any, Any]], int]]
) -> None:
    current = deployment()
    if odd:
        current["metadata"]["managedFields"] = copy.deepcopy(odd)
    for index, (manager, edits, tick) in enumerate(steps):
        new = copy.deepcopy(current)
        for path, value in edits:
            changed(new, path, value)
        now = f"2026-01-01T00:00:{index + tick:02d}Z"
        fast = recorded(copy.deepcopy(new), current, manager, now)
        with mock.patch.object(ssa, "_owned_update", return_value=None):
            general = recorded(copy.deepcopy(new), current, manager, now)
        assert fast == general
        ssa.record_update(new, current, manager, "apps/v1", None, None, now)
        current = new


def test_an_update_of_values_the_writer_owns_takes_the_owned_path() -> None:
    # The property above compares the two paths; this shows the owned one is really taken.
    old = deployment()
    ssa.record_update(old, None, "operator", "apps/v1", None, None, "2026-01-01T00:00:00Z")
    new = copy.deepcopy(old)
    new["spec"]["replicas"] = 3
    answers: list[Any] = []
    real = ssa._owned_update

    def spy(*args: Any) -> Any:
        answers.append(real(*args))
        return answers[-1]

    with mock.patch.object(ssa, "_owned_update", spy):
        ssa.record_update(new, old, "operator", "apps/v1", None, None, "2026-01-01T00:00:09Z")
    assert answers
    assert answers[0] is not None
    [entry] = new["metadata"]["managedFields"]
    assert entry["time"] == "2026-01-01T00:00:09Z"
    assert entry["fieldsV1"] == old["metadata"]["managedFields"][0]["fieldsV1"]


def test_canonical_keeps_a_set_already_in_order_and_orders_another() -> None:
    ordered = {"f:data": {".": {}, "f:a": {}, "f:b": {}}, "f:metadata": {"f:labels": {"f:x": {}}}}
    assert mf.canonical(ordered) is ordered
    shuffled = {"f:metadata": {"f:labels": {"f:x": {}}}, "f:data": {"f:b": {}, ".": {}, "f:a": {}}}
    result = mf.canonical(shuffled)
    assert json.dumps(result) == json.dumps(ordered)
    # The part that was in order already is shared, not copied.
    assert result["f:metadata"] is shuffled["f:metadata"]


# ----- request bodies ----------------------------------------------------------------------------

KEYS = st.sampled_from(["a", "b", "t:x", 'q"', "é"])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "12:00", 'a":b', "\\", " : ", "\u00e9", "\U0001f600"]),
)
SPACES = st.sampled_from(["", "", " ", "\n", "\t"])
# A JSON document as (kind, parts), so objects may repeat keys; each member has its own
# whitespace around its colon.
DOCUMENTS = st.recursive(
    SCALARS.map(lambda v: ("scalar", v)),
    lambda inner: st.one_of(
        st.lists(st.tuples(KEYS, SPACES, inner), max_size=4).map(lambda m: ("object", m)),
        st.lists(inner, max_size=3).map(lambda items: ("array", items)),
    ),
    max_leaves=12,
)


def render(document: tuple[str, Any]) -> str:
    """JSON text for a document."""
    kind, parts = document
    if kind == "object":
        members = (f"{json.dumps(k)}{space}:{space}{render(v)}" for k, space, v in parts)
        return "{" + ",".join(members) + "}"
    if kind == "array":
        return "[" + ", ".join(render(item) for item in parts) + "]"
    return json.dumps(parts)


def loaded(body: bytes) -> tuple[str, list[str]]:
    """A body's value (as JSON, order kept) and the duplicate paths it reports."""
    sink: list[str] = []
    token = schema.DUPLICATES.set(sink)
    try:
        value = duplicates.loads_json(body)
    finally:
        schema.DUPLICATES.reset(token)
    return json.dumps(value), sink


@settings(max_examples=400, deadline=None)
# A repeated key whose colon follows a space, and no other `":` to count.
@example(document=("object", [("a", " ", ("scalar", 1)), ("a", "", ("scalar", 2))]))
@given(document=DOCUMENTS)
def test_bodies_decode_and_report_repeated_keys_as_the_json_module_path_does(
    document: tuple[str, Any],
) -> None:
    body = render(document).encode()
    fast = loaded(body)
    with mock.patch.object(duplicates, "_without_repeats", return_value=duplicates._SLOW):
        slow = loaded(body)
    assert fast == slow


@pytest.mark.parametrize(
    "body",
    [b"NaN", b'{"a": Infinity}', b"\xef\xbb\xbf{}", b'"\\ud800"', b"1e400", b'{"a":1}x'],
)
def test_bodies_msgspec_refuses_get_the_json_modules_value_or_error(body: bytes) -> None:
    try:
        expected: Any = json.dumps(json.loads(body))
    except ValueError as exc:
        expected = type(exc)
    try:
        got: Any = loaded(body)[0]
    except ValueError as exc:
        got = type(exc)
    assert got == expected


def test_a_body_with_a_repeated_key_still_reports_its_path() -> None:
    assert loaded(b'{"spec":{"replicas":1,"replicas":2}}') == (
        '{"spec": {"replicas": 2}}',
        ["spec.replicas"],
    )


# ----- validation memo ---------------------------------------------------------------------------


def test_a_value_found_invalid_is_reported_every_time() -> None:
    first = syntax.label_value("not a label value!")
    second = syntax.label_value("not a label value!")
    assert first == second
    assert first  # invalid values are never remembered as valid


def test_checks_answer_alike_once_their_memory_starts_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(syntax, "_MEMO_LIMIT", 3)
    names = [f"name-{i}" for i in range(10)] + ["Bad_Name", "name-1"]
    answers = [syntax.dns1123_subdomain(n) for n in names]
    assert answers[:10] == [[]] * 10
    assert answers[10]  # invalid
    assert answers[11] == []


# ----- watch fan-out -----------------------------------------------------------------------------


def drained(watcher: Watcher) -> list[tuple[str, str, str]]:
    """(type, namespace, name) of the events queued for a watcher."""
    seen = []
    while not watcher.queue.empty():
        item = watcher.queue.get_nowait()
        assert item is not None
        meta = item[1].obj["metadata"]
        seen.append((item[0], meta.get("namespace", ""), meta["name"]))
    return seen


@pytest.mark.parametrize(
    ("namespace", "label_selector"),
    [(None, None), ("a", None), ("a", "x=1"), (None, "x=1")],
)
def test_watchers_without_selectors_get_what_selecting_each_event_gives(
    namespace: str | None, label_selector: str | None
) -> None:
    store = Store()
    for name in ("a", "b"):
        store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    key = store.registry.resolve("configmaps").key
    fields = selectors.parse_field_selector(None)
    labels = selectors.parse_label_selector(label_selector)
    watcher = store.watch(key, namespace, labels, fields, store.resource_version)
    twin = store.watch(key, namespace, labels, fields, store.resource_version)
    twin._unfiltered = False  # always asks `selects`, old version and new
    for ns in ("a", "b"):
        store.create(configmap("c", ns))
        store.patch("configmaps", "c", {"metadata": {"labels": {"x": "1"}}}, ns)
        store.patch("configmaps", "c", {"data": {"k": "v"}}, ns)
        store.patch("configmaps", "c", {"metadata": {"labels": {"x": "2"}}}, ns)
        store.delete("configmaps", "c", ns)
    events = drained(watcher)
    assert events == drained(twin)
    assert events  # every case sees something
    assert watcher._unfiltered == (label_selector is None)


# ----- copies that share the stored status --------------------------------------------------------


async def test_a_merge_patch_of_a_node_shares_its_stored_status_and_leaves_the_old_version(
    sim: kubesim.Cluster, api: Api
) -> None:
    key = sim.store.registry.resolve("nodes").key
    before = sim.store.peek(key, "", "node-1")
    assert before is not None
    raw = before.raw
    await api.ok("PATCH", "/api/v1/nodes/node-1", {"metadata": {"labels": {"team": "a"}}},
                 ctype=MERGE)  # fmt: skip
    # A status in the body of a main-resource patch is dropped, as the real server drops it.
    await api.ok("PATCH", "/api/v1/nodes/node-1", {"status": {"phase": "x"}, "metadata": {
        "labels": {"team": "b"}}}, ctype=MERGE)  # fmt: skip
    await api.ok("PATCH", "/api/v1/nodes/node-1", {"metadata": {"labels": {"team": "c"}}},
                 ctype=SMP)  # fmt: skip
    after = sim.store.peek(key, "", "node-1")
    assert after is not None
    assert after.obj["metadata"]["labels"]["team"] == "c"
    assert after.obj["status"] == before.obj["status"]
    assert after.obj["status"] is before.obj["status"]
    assert before.raw == raw == dumps(before.obj)  # the previous version is untouched


async def test_a_status_of_the_wrong_type_in_a_main_resource_patch_is_still_refused(
    api: Api,
) -> None:
    status, body = await api.req(
        "PATCH", "/api/v1/nodes/node-1", {"status": {"capacity": "lots"}}, ctype=MERGE
    )
    assert status == 400
    assert (
        "cannot unmarshal string into Go struct field NodeStatus.status.capacity"
        in (body["message"])
    )


def test_a_copy_sharing_one_field_equals_a_copy_and_owns_the_rest() -> None:
    stored = Stored({"kind": "Node", "status": {"phase": "x"}, "metadata": {"name": "n"}})
    shared = stored.copy_sharing("status")
    assert json.dumps(shared) == json.dumps(stored.copy())  # same values, same key order
    assert shared["status"] is stored.obj["status"]
    shared["metadata"]["name"] = "changed"
    assert stored.obj["metadata"]["name"] == "n"
    assert stored.copy_sharing("spec") == stored.copy()  # a field it lacks: a plain copy


# ----- kubectl -----------------------------------------------------------------------------------


@needs_kubectl
async def test_kubectl_label_twice_records_one_owner_and_keeps_the_node_status(
    sim: kubesim.Cluster,
) -> None:
    before = json.loads(await kubectl(sim, "get", "node", "node-1", "-o", "json"))
    await kubectl(sim, "label", "node", "node-1", "team=a")
    await kubectl(sim, "label", "--overwrite", "node", "node-1", "team=b")
    node = json.loads(
        await kubectl(sim, "get", "node", "node-1", "-o", "json", "--show-managed-fields")
    )
    assert node["metadata"]["labels"]["team"] == "b"
    assert node["status"] == before["status"]
    owners = [
        (entry["manager"], entry["operation"], entry["fieldsV1"])
        for entry in node["metadata"]["managedFields"]
        if "f:team" in json.dumps(entry["fieldsV1"])
    ]
    assert owners == [("kubectl-label", "Update", {"f:metadata": {"f:labels": {"f:team": {}}}})]


@needs_kubectl
async def test_kubectl_watches_see_the_changes_of_their_namespace_only(
    sim: kubesim.Cluster,
) -> None:
    await kubectl(sim, "create", "namespace", "other")
    for namespace in ("default", "other"):
        await kubectl(sim, "create", "configmap", "c", "-n", namespace)
    env = {**os.environ, "KUBECONFIG": str(sim.kubeconfig_path)}
    watches = [
        await asyncio.create_subprocess_exec(
            str(KUBECTL), "get", "configmaps", "-w", "--no-headers",
            "-o", "custom-columns=NS:.metadata.namespace,X:.metadata.labels.x",
            *scope, f"--request-timeout={3 * DEADLINE:g}s",  # open for the whole test
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
        )
        for scope in (["-n", "default"], ["-A"])
    ]  # fmt: skip
    try:
        await sim.wait_for(lambda: sim.store.watcher_count() == 2, DEADLINE)
        await kubectl(sim, "label", "configmap", "c", "-n", "other", "x=1")
        await kubectl(sim, "label", "configmap", "c", "-n", "default", "x=1")
        lines: list[list[str]] = []
        for watch, count, scope in zip(watches, (2, 4), ("-n default", "-A"), strict=True):
            assert watch.stdout is not None
            read = [
                await within(watch.stdout.readline(), f"{count} lines of kubectl get -w {scope}")
                for _ in range(count)
            ]
            lines.append([line.decode().strip() for line in read])
        # Split on whitespace: (namespace, label x) per line, the list first, then changes.
        namespaced, everywhere = ([tuple(line.split()) for line in got] for got in lines)
        # The label in "other" came first: a namespaced watch that saw it would show it here.
        assert namespaced == [("default", "<none>"), ("default", "1")]
        assert sorted(everywhere[:2]) == [("default", "<none>"), ("other", "<none>")]
        assert everywhere[2:] == [("other", "1"), ("default", "1")]
    finally:
        for watch in watches:
            watch.kill()
            await watch.wait()


# ----- uids ------------------------------------------------------------------------------------


def test_new_uids_are_random_version_4_uuids_spelled_as_uuid_spells_them() -> None:
    made = [new_uid() for _ in range(5000)]
    assert len(set(made)) == len(made)
    for text in made:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant) == (4, uuid.RFC_4122)
        assert str(parsed) == text
    stored = Store().create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}})
    assert uuid.UUID(stored["metadata"]["uid"]).version == 4
