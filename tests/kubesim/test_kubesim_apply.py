"""Server-side apply as the real server does it (lists by their schema semantics, ownership,
conflicts, pruning), and the request limits and media types that keep one request from stalling
or inflating kubesim: over HTTP, with kubectl and lightkube, and as properties checked against a
literal model of structured-merge-diff (ssa_reference)."""

from __future__ import annotations

import asyncio
import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import ssa_reference as ref
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubesim_helpers import CM, Api, configmap, daemonset
from waiting import DEADLINE, eventually

import kubesim
from kubesim import errors, ssa, typed
from kubesim import managed_fields as mf

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
JSONP = "application/json-patch+json"
SMP = "application/strategic-merge-patch+json"
DS = "/apis/apps/v1/namespaces/default/daemonsets"
DEPLOY = "/apis/apps/v1/namespaces/default/deployments"
KUBECTL = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "kubectl"
needs_kubectl = pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl not installed")
DS_SHAPE = typed.root_shape("apps", "v1", "DaemonSet", None)


def applied(api: Api, path: str, body: Any, manager: str, **params: str) -> Any:
    """PATCH an apply configuration (a coroutine returning (status, body))."""
    return api.req("PATCH", path, body, ctype=APPLY, params={"fieldManager": manager, **params})


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def container(obj: dict[str, Any], index: int = 0) -> dict[str, Any]:
    found: dict[str, Any] = pod_spec(obj)["containers"][index]
    return found


def fields_of(obj: dict[str, Any], manager: str, operation: str = "Apply") -> dict[str, Any]:
    for entry in obj["metadata"].get("managedFields") or ():
        if entry["manager"] == manager and entry["operation"] == operation:
            found: dict[str, Any] = entry["fieldsV1"]
            return found
    raise AssertionError(f"no {operation} entry for {manager}: {obj['metadata']}")


def keyed_items_have_keys(obj: dict[str, Any]) -> list[str]:
    """Paths of list items in a pod template that lack their list key (nameless leftovers)."""
    spec = pod_spec(obj)
    problems = []
    for field, key in (("containers", "name"), ("initContainers", "name"), ("volumes", "name")):
        for i, item in enumerate(spec.get(field) or ()):
            if key not in item:
                problems.append(f"{field}[{i}]")
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        for field, key in (
            ("env", "name"),
            ("volumeMounts", "mountPath"),
            ("ports", "containerPort"),
        ):
            for i, item in enumerate(c.get(field) or ()):
                if key not in item:
                    problems.append(f"{c.get('name')}.{field}[{i}]")
    return problems


# ----- the merged order ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("live", "config", "merged"),
    [
        ("abc", "de", "abcde"),
        ("abc", "cdef", "abcdef"),
        ("abcgf", "cdef", "abcgdef"),
        ("cdef", "ace", "acdef"),
        ("abcxyz", "defxyz", "abcdefxyz"),
        ("cagf", "cfag", "cfag"),
        ("abcd", "defa", "bcdefa"),
        ("cdefghij", "2h3e4kl", "cdfg2hij3e4kl"),
        ("abcdefghij", "1b2h3e4kl", "a1bcdfg2hij3e4kl"),
    ],
)
def test_merged_list_order_keeps_live_places_and_follows_the_appliers_order(
    live: str, config: str, merged: str
) -> None:
    # The library's own merge examples for sets of strings.
    shape = typed.Shape(typed.LIST, list_type=typed.SET)
    assert ssa.merge(list(live), list(config), shape, ssa._Walk()) == list(merged)


def test_merged_keyed_list_moves_shared_items_to_the_appliers_positions() -> None:
    env = DS_SHAPE.field("spec").field("template").field("spec").field("containers").elem()
    shape = env.field("env")
    live = [{"name": n, "value": "1"} for n in "abc"]
    config = [{"name": "c", "value": "2"}, {"name": "a", "value": "1"}]
    merged = ssa.merge(live, config, shape, ssa._Walk())
    assert merged == [
        {"name": "b", "value": "1"},
        {"name": "c", "value": "2"},
        {"name": "a", "value": "1"},
    ]


# ----- properties against the model -----------------------------------------------------------


@st.composite
def ds_configs(draw: st.DrawFn) -> dict[str, Any]:
    """DaemonSet apply configurations over keyed, multi-key, atomic and set lists and maps."""
    containers = []
    names = draw(st.lists(st.sampled_from(["a", "b"]), unique=True, min_size=1, max_size=2))
    for name in names:
        c: dict[str, Any] = {"name": name}
        if draw(st.booleans()):
            c["image"] = draw(st.sampled_from(["x:1", "x:2"]))
        env = draw(st.lists(st.sampled_from("ABC"), unique=True, max_size=3))
        if env or draw(st.booleans()):
            c["env"] = [{"name": e, "value": draw(st.sampled_from(["1", "2"]))} for e in env]
        ports = draw(
            st.lists(
                st.sampled_from([(80, None), (53, "UDP"), (53, "TCP")]), unique=True, max_size=3
            )
        )
        if ports:
            c["ports"] = [
                {"containerPort": p, **({"protocol": proto} if proto else {})} for p, proto in ports
            ]
        if draw(st.booleans()):
            c["resources"] = {"limits": {"cpu": draw(st.sampled_from(["1", "2"]))}}
        containers.append(c)
    spec: dict[str, Any] = {"containers": containers}
    if draw(st.booleans()):
        effect = draw(st.sampled_from(["NoSchedule", "NoExecute"]))
        spec["tolerations"] = [{"operator": "Exists", "effect": effect}]
    volumes = draw(st.lists(st.sampled_from(["v1", "v2"]), unique=True, max_size=2))
    if volumes:
        spec["volumes"] = [{"name": v, "hostPath": {"path": "/" + v}} for v in volumes]
    meta: dict[str, Any] = {"name": "d", "namespace": "default"}
    labels = draw(
        st.dictionaries(st.sampled_from(["x", "y"]), st.sampled_from(["1", "2"]), max_size=2)
    )
    if labels:
        meta["labels"] = labels
    finalizers = draw(st.lists(st.sampled_from(["f1", "f2"]), unique=True, max_size=2))
    if finalizers:
        meta["finalizers"] = finalizers
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta,
        "spec": {"template": {"spec": spec}},
    }


def _update_op(obj: dict[str, Any], choice: int) -> dict[str, Any]:
    """A non-apply write: change an image, add an env var, or label the object."""
    new = copy.deepcopy(obj)
    containers = pod_spec(new).get("containers") if "spec" in new else None
    if choice == 0 and containers:
        containers[0]["image"] = "edited:1"
    elif choice == 1 and containers:
        env = containers[0].setdefault("env", [])
        env[:] = [e for e in env if e["name"] != "U"] + [{"name": "U", "value": f"u{len(env)}"}]
    elif choice == 2 and containers and containers[0].get("env"):
        del containers[0]["env"][0]
    elif choice == 3 and new["metadata"].get("labels"):
        new["metadata"]["labels"].pop(sorted(new["metadata"]["labels"])[0])
    else:
        new["metadata"].setdefault("labels", {})["z"] = "edited"
    return new


steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("apply"), st.sampled_from(["a1", "a2", "a3"]), ds_configs(), st.booleans()
        ),
        st.tuples(
            st.just("update"), st.sampled_from(["u1", "u2"]), st.integers(0, 4), st.just(False)
        ),
    ),
    min_size=1,
    max_size=8,
)


def _mine_sets(obj: dict[str, Any]) -> dict[str, set[tuple[str, ...]]]:
    return {
        e["manager"]: ref.paths_of(e["fieldsV1"])
        for e in obj["metadata"].get("managedFields") or ()
    }


def _body(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
    return ref.normalized({**obj, "metadata": meta})  # type: ignore[no-any-return]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_apply_and_update_match_the_structured_merge_diff_model(plan: list[Any]) -> None:
    mine: dict[str, Any] | None = None
    model: dict[str, Any] = {}
    owners: dict[str, set[tuple[str, ...]]] = {}
    for index, (op, manager, arg, force) in enumerate(plan):
        stamp = f"2025-01-01T00:00:{index:02d}Z"
        if op == "apply":
            conflict = None
            try:
                result = ssa.apply(
                    mine, arg, crd_schema=None, manager=manager, force=force,
                    subresource=None, status_split=True, stamp=stamp,
                )  # fmt: skip
            except errors.ApiError as exc:
                causes = (exc.details or {}).get("causes") or []
                conflict = {(c["message"], c["field"]) for c in causes} if exc.code == 409 else {}
            try:
                model_obj, owners = ref.apply(model, arg, DS_SHAPE, owners, manager, force)
            except ref.Conflict as exc:
                expected = {
                    (f'conflict with "{m}"' + (" using apps/v1" if m.startswith("u") else ""),
                     mf.path_string(p))
                    for m, ps in exc.paths.items() for p in ps
                }  # fmt: skip
                assert conflict == expected
                continue
            assert conflict is None
            mine = result
            model = ref.normalized(model_obj)
        else:
            if mine is None:
                continue
            before = copy.deepcopy(mine)
            after = _update_op(mine, arg)
            ssa.record_update(after, before, manager, "apps/v1", None, None, stamp)
            owners = ref.update(model, _update_op(model, arg), DS_SHAPE, owners, manager)
            mine = after
            model = ref.normalized(_update_op(model, arg))
        assert _body(mine) == model
        assert _mine_sets(mine) == {m: s for m, s in owners.items() if s}


# ----- lists by their semantics, over HTTP --------------------------------------------------------


def operand(env: list[str], volumes: list[str], ports: list[dict[str, Any]]) -> dict[str, Any]:
    """A DaemonSet apply configuration with env vars, hostPath volumes (mounted) and ports."""
    ds = daemonset("op")
    main = container(ds)
    main["env"] = [{"name": e, "value": e.lower()} for e in env]
    main["volumeMounts"] = [{"name": v, "mountPath": f"/{v}"} for v in volumes]
    main["ports"] = ports
    pod_spec(ds)["volumes"] = [{"name": v, "hostPath": {"path": f"/{v}"}} for v in volumes]
    return ds


async def test_dropping_an_env_var_volume_and_port_removes_the_whole_entries(api: Api) -> None:
    ports = [{"containerPort": 80}, {"containerPort": 53, "protocol": "UDP"}]
    status, _ = await applied(api, f"{DS}/op", operand(["A", "B"], ["v1", "v2"], ports), "op")
    assert status == 201
    status, body = await applied(api, f"{DS}/op", operand(["A"], ["v1"], ports[:1]), "op")
    assert status == 200, body
    main = container(body)
    assert main["env"] == [{"name": "A", "value": "a"}]
    assert main["volumeMounts"] == [{"name": "v1", "mountPath": "/v1"}]
    assert main["ports"] == [{"containerPort": 80, "protocol": "TCP"}]
    assert [v["name"] for v in pod_spec(body)["volumes"]] == ["v1"]
    assert keyed_items_have_keys(body) == []
    assert fields_of(body, "op")["f:spec"]["f:selector"] == {}  # an atomic struct: one leaf


def test_custom_resource_list_keys_take_their_schema_defaults() -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "listeners": {
                        "type": "array",
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["port", "name"],
                        "items": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string"},
                                "port": {"type": "integer", "default": 80},
                                "tls": {"type": "object", "x-kubernetes-map-type": "atomic"},
                            },
                        },
                    }
                },
            }
        },
    }
    config = {
        "apiVersion": "example.com/v1",
        "kind": "Gateway",
        "metadata": {"name": "g"},
        "spec": {"listeners": [{"name": "web", "tls": {"mode": "x"}}]},
    }
    shape = typed.root_shape("example.com", "v1", "Gateway", schema)
    fields = ssa.field_set(config, shape)
    assert fields["f:spec"]["f:listeners"] == {
        'k:{"name":"web","port":80}': {".": {}, "f:name": {}, "f:tls": {}}
    }


async def test_dropping_a_container_removes_it_and_keeps_the_others(api: Api) -> None:
    ds = daemonset("two")
    pod_spec(ds)["containers"].append({"name": "side", "image": "side:1", "env": [{"name": "S"}]})
    await api.ok("PATCH", f"{DS}/two", ds, ctype=APPLY, params={"fieldManager": "op"})
    del pod_spec(ds)["containers"][1]
    body = await api.ok("PATCH", f"{DS}/two", ds, ctype=APPLY, params={"fieldManager": "op"})
    assert [c["name"] for c in pod_spec(body)["containers"]] == ["main"]
    assert keyed_items_have_keys(body) == []


async def test_ports_are_keyed_by_number_and_defaulted_protocol(api: Api) -> None:
    ports = [{"containerPort": 53}, {"containerPort": 53, "protocol": "UDP"}]
    body = await api.ok(
        "PATCH", f"{DS}/op", operand([], [], ports), ctype=APPLY, params={"fieldManager": "op"}
    )
    assert container(body)["ports"] == [
        {"containerPort": 53, "protocol": "TCP"},
        {"containerPort": 53, "protocol": "UDP"},
    ]
    owned = fields_of(body, "op")["f:spec"]["f:template"]["f:spec"]["f:containers"]
    port_fields = owned['k:{"name":"main"}']["f:ports"]
    # Keys sorted by name, the omitted protocol filled from its default, as the server writes.
    assert list(port_fields) == [
        'k:{"containerPort":53,"protocol":"TCP"}',
        'k:{"containerPort":53,"protocol":"UDP"}',
    ]
    assert port_fields['k:{"containerPort":53,"protocol":"TCP"}'] == {
        ".": {},
        "f:containerPort": {},
    }
    body = await api.ok(
        "PATCH", f"{DS}/op", operand([], [], ports[1:]), ctype=APPLY, params={"fieldManager": "op"}
    )
    assert container(body)["ports"] == [{"containerPort": 53, "protocol": "UDP"}]


async def test_tolerations_are_atomic_replaced_whole_and_owned_whole(api: Api) -> None:
    ds = daemonset("t", tolerations=[{"key": "a", "operator": "Exists"}, {"operator": "Exists"}])
    await api.ok("PATCH", f"{DS}/t", ds, ctype=APPLY, params={"fieldManager": "op"})
    pod_spec(ds)["tolerations"] = [{"key": "a", "operator": "Exists"}]
    body = await api.ok("PATCH", f"{DS}/t", ds, ctype=APPLY, params={"fieldManager": "op"})
    assert pod_spec(body)["tolerations"] == [{"key": "a", "operator": "Exists"}]
    assert "f:tolerations" in fields_of(body, "op")["f:spec"]["f:template"]["f:spec"]
    other = daemonset("t", tolerations=[{"key": "b", "operator": "Exists"}])
    status, conflict = await applied(api, f"{DS}/t", other, "other")
    assert status == 409
    assert conflict["details"]["causes"][-1]["field"] == ".spec.template.spec.tolerations"


async def test_finalizers_are_a_set_each_manager_keeps_its_own(api: Api) -> None:
    def with_finalizers(*names: str) -> dict[str, Any]:
        cm = configmap("f")
        cm["metadata"]["finalizers"] = list(names)
        del cm["metadata"]["labels"]
        return cm

    await api.ok("PATCH", f"{CM}/f", with_finalizers("a.io/x"), ctype=APPLY,
                 params={"fieldManager": "one"})  # fmt: skip
    body = await api.ok("PATCH", f"{CM}/f", with_finalizers("b.io/y"), ctype=APPLY,
                        params={"fieldManager": "two"})  # fmt: skip
    assert body["metadata"]["finalizers"] == ["a.io/x", "b.io/y"]
    assert fields_of(body, "one")["f:metadata"]["f:finalizers"] == {'v:"a.io/x"': {}}
    body = await api.ok("PATCH", f"{CM}/f", with_finalizers(), ctype=APPLY,
                        params={"fieldManager": "one"})  # fmt: skip
    assert body["metadata"]["finalizers"] == ["b.io/y"]


async def test_managers_sharing_a_list_keep_the_items_and_fields_they_own(api: Api) -> None:
    def env_of(*items: dict[str, str]) -> dict[str, Any]:
        ds = daemonset("s")
        container(ds)["env"] = list(items)
        return ds

    both = env_of({"name": "X", "value": "1"}, {"name": "Y", "value": "1"})
    await api.ok("PATCH", f"{DS}/s", both, ctype=APPLY, params={"fieldManager": "one"})
    # Same values: no conflict, shared ownership; Z is added after one's items.
    body = await api.ok("PATCH", f"{DS}/s", env_of({"name": "Y"}, {"name": "Z", "value": "2"}),
                        ctype=APPLY, params={"fieldManager": "two"})  # fmt: skip
    assert [e["name"] for e in container(body)["env"]] == ["X", "Y", "Z"]
    # one stops applying X and Y: X goes, Y stays (two owns the item) but loses one's value.
    body = await api.ok("PATCH", f"{DS}/s", env_of(), ctype=APPLY, params={"fieldManager": "one"})
    assert container(body)["env"] == [{"name": "Y"}, {"name": "Z", "value": "2"}]
    assert keyed_items_have_keys(body) == []


async def test_conflicts_name_every_field_and_manager_and_force_takes_them(api: Api) -> None:
    first = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
             "data": {"a": "1", "b": "1"}}  # fmt: skip
    await api.ok("PATCH", f"{CM}/c", first, ctype=APPLY, params={"fieldManager": "one"})
    await api.ok("PATCH", f"{CM}/c", {"data": {"e": "1"}}, ctype=MERGE,
                 params={"fieldManager": "editor"})  # fmt: skip
    second = {**first, "data": {"a": "2", "b": "2", "e": "2"}}
    status, body = await applied(api, f"{CM}/c", second, "two")
    assert status == 409
    assert body["reason"] == "Conflict"
    assert body["message"] == (
        'Apply failed with 3 conflicts: conflicts with "editor" using v1:\n- .data.e\n'
        'conflicts with "one":\n- .data.a\n- .data.b'
    )
    assert body["details"] == {
        "causes": [
            {"reason": "FieldManagerConflict", "message": 'conflict with "editor" using v1',
             "field": ".data.e"},
            {"reason": "FieldManagerConflict", "message": 'conflict with "one"',
             "field": ".data.a"},
            {"reason": "FieldManagerConflict", "message": 'conflict with "one"',
             "field": ".data.b"},
        ]
    }  # fmt: skip
    assert (await api.ok("GET", f"{CM}/c"))["data"] == {"a": "1", "b": "1", "e": "1"}
    status, body = await applied(api, f"{CM}/c", second, "two", force="true")
    assert status == 200
    assert body["data"] == {"a": "2", "b": "2", "e": "2"}
    assert {e["manager"] for e in body["metadata"]["managedFields"]} == {"two"}
    assert fields_of(body, "two") == {"f:data": {"f:a": {}, "f:b": {}, "f:e": {}}}


STATUS_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "gadgets.example.com"},
    "spec": {
        "group": "example.com",
        "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                            "status": {
                                "type": "object",
                                "properties": {
                                    "conditions": {
                                        "type": "array",
                                        "x-kubernetes-list-type": "map",
                                        "x-kubernetes-list-map-keys": ["type"],
                                        "items": {
                                            "type": "object",
                                            "properties": {
                                                "type": {"type": "string"},
                                                "status": {"type": "string"},
                                            },
                                        },
                                    }
                                },
                            },
                        },
                    }
                },
            }
        ],
    },
}
GADGETS = "/apis/example.com/v1/namespaces/default/gadgets"


async def test_status_apply_owns_status_through_the_subresource_only(
    api: Api, sim: kubesim.Cluster
) -> None:
    await api.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", STATUS_CRD)
    await sim.wait_for(
        lambda: sim.store.registry.get("example.com", "v1", "gadgets") is not None, DEADLINE
    )
    gadget = {"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"},
              "spec": {"size": 1}}  # fmt: skip
    await api.ok("PATCH", f"{GADGETS}/g", gadget, ctype=APPLY, params={"fieldManager": "user"})

    def report(*types: str) -> dict[str, Any]:
        conditions = [{"type": t, "status": "True"} for t in types]
        return {**gadget, "spec": {"size": 99}, "status": {"conditions": conditions}}

    body = await api.ok("PATCH", f"{GADGETS}/g/status", report("Ready", "Synced"), ctype=APPLY,
                        params={"fieldManager": "ctrl"})  # fmt: skip
    assert body["spec"] == {"size": 1}
    assert [c["type"] for c in body["status"]["conditions"]] == ["Ready", "Synced"]
    entry = next(e for e in body["metadata"]["managedFields"] if e["manager"] == "ctrl")
    assert entry["subresource"] == "status"
    assert list(entry["fieldsV1"]) == ["f:status"]
    body = await api.ok("PATCH", f"{GADGETS}/g/status", report("Ready"), ctype=APPLY,
                        params={"fieldManager": "ctrl"})  # fmt: skip
    assert body["status"]["conditions"] == [{"type": "Ready", "status": "True"}]
    assert fields_of(body, "user") == {"f:spec": {"f:size": {}}}


async def test_creates_record_update_managers_without_the_servers_status(api: Api) -> None:
    created = await api.ok("POST", DS, daemonset("made"), params={"fieldManager": "maker"})
    assert "status" in created
    owned = fields_of(created, "maker", "Update")
    assert "f:status" not in owned
    assert "f:spec" in owned
    assert 'k:{"name":"main"}' in owned["f:spec"]["f:template"]["f:spec"]["f:containers"]
    config = await api.ok("POST", CM, configmap("cm"), params={"fieldManager": "maker"})
    # A map the write creates is owned as a whole too, as the server records it.
    assert fields_of(config, "maker", "Update")["f:data"] == {".": {}, "f:k": {}}


async def test_applying_the_same_configuration_twice_writes_nothing(
    api: Api, sim: kubesim.Cluster
) -> None:
    ds = operand(["A"], ["v1"], [{"containerPort": 80}])
    await api.ok("PATCH", f"{DS}/op", ds, ctype=APPLY, params={"fieldManager": "op"})

    def rolled_out() -> bool:
        stored = sim.store.get("daemonsets.apps", "op", namespace="default") or {}
        status = stored.get("status") or {}
        # Every figure final: both nodes counted, their pods updated, ready and available, the
        # generation observed (ready == desired alone also holds for an earlier status).
        generation = (stored.get("metadata") or {}).get("generation")
        return bool(generation) and status.get("observedGeneration") == generation and all(
            status.get(field) == 2
            for field in (
                "desiredNumberScheduled", "currentNumberScheduled", "updatedNumberScheduled",
                "numberReady", "numberAvailable",
            )
        )  # fmt: skip

    # The DaemonSet controller has written its last status (its pods run and are ready): the
    # controllers' queues alone may drain while a kubelet still starts a pod.
    await eventually(rolled_out, "the DaemonSet's pods ready")
    await sim.settle(timeout=DEADLINE)
    first = await api.ok("GET", f"{DS}/op")
    version = sim.store.resource_version
    again = await api.ok("PATCH", f"{DS}/op", ds, ctype=APPLY, params={"fieldManager": "op"})
    assert again == first
    assert sim.store.resource_version == version  # nothing was committed


async def test_configurations_the_schema_rejects_are_refused_like_the_server(api: Api) -> None:
    ds = daemonset("dup")
    container(ds)["env"] = [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]
    container(ds)["ports"] = [{"name": "p"}]
    status, body = await applied(api, f"{DS}/dup", ds, "op")
    assert status == 500
    assert "reason" not in body
    assert body["message"] == (
        "failed to create typed patch object (default/dup; apps/v1, Kind=DaemonSet): errors:\n"
        '  .spec.template.spec.containers[name="main"].env: duplicate entries for key '
        '[name="A"]\n'
        '  .spec.template.spec.containers[name="main"].ports: element 0: associative list with '
        'keys has an element that omits key field "containerPort" (and doesn\'t have default '
        "value)"
    )
    config = configmap("m")
    config["metadata"]["managedFields"] = []
    status, body = await applied(api, f"{CM}/m", config, "op")
    assert (status, body["message"]) == (400, "metadata.managedFields must be nil")
    assert (await api.req("GET", f"{DS}/dup"))[0] == 404


# ----- request limits -----------------------------------------------------------------------------

LAUGHS = (
    b'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    b"b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    b"c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    b"d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    b"e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    b"f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    b"g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
    b"h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n"
    b"i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n"
)
TOO_LARGE = "Request entity too large: limit is 3145728"


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth - 1):
        value = {"n": value}
    return {"n": value} if depth else value


async def test_bodies_over_3_mib_are_413_whatever_their_type(
    api: Api, sim: kubesim.Cluster
) -> None:
    big = configmap("big")
    big["data"] = {"k": "x" * (3 * 1024 * 1024)}
    status, body = await api.req("POST", CM, big)
    assert (status, body["reason"], body["message"]) == (413, "RequestEntityTooLarge", TOO_LARGE)
    status, body = await applied(api, f"{CM}/big", big, "op")
    assert (status, body["message"]) == (413, TOO_LARGE)

    async def chunks() -> Any:  # no Content-Length: refused while it is read
        for _ in range(4):
            yield b" " * (1024 * 1024)

    async with api.session.post(
        CM, data=chunks(), headers={"Content-Type": "application/json"}
    ) as r:
        assert (r.status, (await r.json())["message"]) == (413, TOO_LARGE)
    assert sim.store.get("configmaps", "big", "default") is None


async def test_yaml_alias_bombs_are_refused_before_anything_expands(
    api: Api, sim: kubesim.Cluster
) -> None:
    status, body = await api.req("PATCH", f"{CM}/lol", raw=LAUGHS, ctype=APPLY,
                                 params={"fieldManager": "op"})  # fmt: skip
    assert (status, body["reason"]) == (400, "BadRequest")
    assert body["message"] == (
        "error decoding YAML: error converting YAML to JSON: yaml: document contains excessive "
        "aliasing"
    )
    status, body = await api.req("POST", CM, raw=LAUGHS, ctype="application/yaml")
    assert status == 400
    assert body["message"].startswith(
        "the object provided is unrecognized (must be of type ConfigMap): "
        "yaml: document contains excessive aliasing (613a2026"
    )
    assert sim.store.count("configmaps") == len(sim.store.list("configmaps"))
    assert sim.store.get("configmaps", "lol", "default") is None
    # A few aliases, as manifests use them, are fine and decode to independent values.
    small = (
        b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ok\n  labels: &l {a: b}\n"
        b"  annotations: *l\n"
    )
    created = await api.ok("POST", CM, raw=small, ctype="application/yaml")
    assert created["metadata"]["labels"] == created["metadata"]["annotations"] == {"a": "b"}


def nested_json(depth: int) -> str:
    """`nested(depth)` as JSON text, built without recursion (json.dumps stops near 1,000)."""
    return '{"n": ' * depth + '"leaf"' + "}" * depth


def with_field(obj: dict[str, Any], name: str, raw: str) -> bytes:
    """`obj` as JSON with one more field whose value is the JSON text `raw`."""
    return (json.dumps(obj)[:-1] + f', "{name}": {raw}}}').encode()


async def test_documents_nested_deeper_than_the_limit_are_refused(api: Api) -> None:
    limit = kubesim.request_limits.MAX_DEPTH
    assert limit == 10_000  # the real server's JSON and YAML decoders' depth
    too_deep = nested_json(limit + 1)
    status, body = await api.req("POST", CM, raw=with_field(configmap("deep"), "x", too_deep))
    assert status == 400
    assert body["message"].startswith(
        "the object provided is unrecognized (must be of type ConfigMap): couldn't get "
        'version/kind; json parse error: exceeded max depth ({"apiVersion": "v1", "kind": '
    )
    await api.ok("POST", CM, configmap("c"))
    status, body = await api.req("PATCH", f"{CM}/c", raw=with_field({}, "x", too_deep), ctype=MERGE)
    assert (status, body["message"]) == (400, "error decoding patch: exceeded max depth")
    status, body = await api.req("PATCH", f"{CM}/c", raw=with_field(configmap("c"), "x", too_deep),
                                 ctype=APPLY, params={"fieldManager": "m"})  # fmt: skip
    assert (status, body["message"]) == (
        400,
        f"error decoding YAML: error converting YAML to JSON: yaml: exceeded max depth of {limit}",
    )
    deep_yaml = b"a: " + b"[" * 100_000
    status, body = await api.req("PATCH", f"{CM}/c", raw=deep_yaml, ctype=APPLY,
                                 params={"fieldManager": "m"})  # fmt: skip
    assert status == 400
    assert "exceeded max depth" in body["message"]


async def test_a_custom_resource_nested_to_the_limit_is_stored_and_served(
    api: Api, sim: kubesim.Cluster
) -> None:
    crd = copy.deepcopy(STATUS_CRD)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"]["spec"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    await api.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    await sim.wait_for(
        lambda: sim.store.registry.get("example.com", "v1", "gadgets") is not None, DEADLINE
    )
    limit = kubesim.request_limits.MAX_DEPTH
    gadget = {"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "deep"}}
    # The body's own object is one level and spec another: the whole body nests `limit` deep.
    # (The answer is not decoded here: it is deeper than the test's own json module goes.)
    async with api.session.patch(
        f"{GADGETS}/deep",
        data=with_field(gadget, "spec", nested_json(limit - 2)),
        params={"fieldManager": "m"},
        headers={"Content-Type": APPLY},
    ) as resp:
        assert resp.status == 201, (await resp.read())[:300]
    stored = sim.store.get("gadgets.example.com", "deep", "default")
    assert stored is not None
    spec, levels = stored["spec"], 0
    while isinstance(spec, dict):
        spec, levels = spec["n"], levels + 1
    assert (levels, spec) == (limit - 2, "leaf")
    async with api.session.patch(
        f"{GADGETS}/deep",
        data=b'{"metadata": {"labels": {"a": "b"}}}',
        headers={"Content-Type": MERGE},
    ) as resp:
        assert resp.status == 200, (await resp.read())[:300]
    labelled = sim.store.get("gadgets.example.com", "deep", "default")
    assert labelled is not None
    assert labelled["metadata"]["labels"] == {"a": "b"}


async def test_json_patches_are_bounded_in_operations_and_copies(api: Api) -> None:
    await api.ok("POST", CM, configmap("c"))
    many = [{"op": "test", "path": "/data/k", "value": "v"}] * 10_001
    status, body = await api.req("PATCH", f"{CM}/c", many, ctype=JSONP)
    assert (status, body["message"]) == (
        413,
        "Request entity too large: The allowed maximum operations in a JSON patch is 10000, "
        "got 10001",
    )
    seed = [{"op": "add", "path": "/data/k", "value": "x" * 1024 * 1024}]
    doubling = [{"op": "copy", "from": "/data/k", "path": f"/data/k{i}"} for i in range(4)]
    status, body = await api.req("PATCH", f"{CM}/c", seed + doubling, ctype=JSONP)
    assert status == 422
    assert "Unable to complete the copy" in body["message"]
    assert (await api.ok("GET", f"{CM}/c"))["data"] == {"k": "v"}


async def test_objects_larger_than_etcd_takes_are_413_and_not_stored(
    api: Api, sim: kubesim.Cluster
) -> None:
    crd = copy.deepcopy(STATUS_CRD)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"]["spec"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    await api.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    await sim.wait_for(
        lambda: sim.store.registry.get("example.com", "v1", "gadgets") is not None, DEADLINE
    )
    version = sim.store.resource_version
    gadget = {"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "huge"},
              "spec": {"blob": "x" * (1600 * 1024)}}  # fmt: skip
    status, body = await api.req("POST", GADGETS, gadget)
    assert (status, body["message"]) == (
        413,
        "Request entity too large: etcdserver: request is too large",
    )
    assert sim.store.resource_version == version
    assert (await api.req("GET", f"{GADGETS}/huge"))[0] == 404


# ----- media types --------------------------------------------------------------------------------

BODY_TYPES = "application/json, application/yaml, application/vnd.kubernetes.protobuf"
PATCH_TYPES = (
    "application/json-patch+json, application/merge-patch+json, "
    "application/strategic-merge-patch+json, application/apply-patch+yaml"
)


@pytest.mark.parametrize(
    "ctype",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None],
)
async def test_writes_from_browser_simple_requests_are_415(
    api: Api, sim: kubesim.Cluster, ctype: str | None
) -> None:
    await api.ok("POST", CM, configmap("c"))
    headers = {"Content-Type": ctype} if ctype else {}
    body = json.dumps(configmap("evil")).encode()
    for method, path in (("POST", CM), ("PUT", f"{CM}/c"), ("PATCH", f"{CM}/c")):
        async with api.session.request(method, path, data=body, headers=headers) as resp:
            status = await resp.json()
            assert resp.status == 415, (method, status)
            assert status["reason"] == "UnsupportedMediaType"
            accepted = PATCH_TYPES if method == "PATCH" else BODY_TYPES
            assert status["message"] == (
                "the body of the request was in an unknown format - accepted media types "
                f"include: {accepted}"
            )
            assert "Access-Control-Allow-Origin" not in resp.headers
    async with api.session.delete(f"{CM}/c", data=b"{}", headers=headers) as resp:
        assert resp.status == 415
    assert sim.store.get("configmaps", "evil", "default") is None
    assert sim.store.get("configmaps", "c", "default") is not None


async def test_each_verb_takes_the_media_types_the_server_does(
    api: Api, sim: kubesim.Cluster
) -> None:
    yaml_body = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: y\ndata:\n  k: v\n"
    created = await api.ok("POST", CM, raw=yaml_body, ctype="application/yaml; charset=utf-8")
    assert created["data"] == {"k": "v"}
    status, body = await api.req("PATCH", f"{CM}/y", {}, ctype="application/apply-patch+cbor",
                                 params={"fieldManager": "m"})  # fmt: skip
    assert (status, body["message"].rsplit(": ", 1)[1]) == (415, PATCH_TYPES)
    await api.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", STATUS_CRD)
    await sim.wait_for(
        lambda: sim.store.registry.get("example.com", "v1", "gadgets") is not None, DEADLINE
    )
    await api.ok("POST", GADGETS, {"apiVersion": "example.com/v1", "kind": "Gadget",
                                   "metadata": {"name": "g"}})  # fmt: skip
    status, body = await api.req("PATCH", f"{GADGETS}/g", {"spec": {"size": 2}}, ctype=SMP)
    assert status == 415
    assert body["message"].endswith(
        "include: application/json-patch+json, application/merge-patch+json, "
        "application/apply-patch+yaml"
    )


async def test_cross_origin_requests_get_no_cors_headers(api: Api) -> None:
    origin = {"Origin": "https://evil.example"}
    async with api.session.get(CM, headers=origin) as resp:
        assert resp.status == 200
        assert not [h for h in resp.headers if h.lower().startswith("access-control-")]
    preflight = {**origin, "Access-Control-Request-Method": "POST"}
    async with api.session.options(CM, headers=preflight) as resp:
        assert resp.status == 405
        assert not [h for h in resp.headers if h.lower().startswith("access-control-")]


# ----- real clients -------------------------------------------------------------------------------


async def kubectl(sim: kubesim.Cluster, *args: str, stdin: str | None = None) -> tuple[int, str]:
    env = {**os.environ, "KUBECONFIG": str(sim.kubeconfig_path)}
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL), *args, env=env,
        stdin=asyncio.subprocess.PIPE if stdin else None,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), 60)
    return proc.returncode or 0, out.decode()


@needs_kubectl
async def test_kubectl_server_side_apply_drops_removed_items_and_reports_conflicts(
    sim: kubesim.Cluster,
) -> None:
    ports = [{"containerPort": 9400, "name": "metrics"}]
    full = json.dumps(operand(["A", "B"], ["v1", "v2"], ports))
    assert (await kubectl(sim, "apply", "--server-side", "-f", "-", stdin=full))[0] == 0
    smaller = json.dumps(operand(["A"], ["v1"], ports))
    code, out = await kubectl(sim, "apply", "--server-side", "-f", "-", stdin=smaller)
    assert code == 0, out
    assert "serverside-applied" in out
    code, out = await kubectl(sim, "get", "daemonset", "op", "-o", "json")
    stored = json.loads(out)
    assert container(stored)["env"] == [{"name": "A", "value": "a"}]
    assert [v["name"] for v in pod_spec(stored)["volumes"]] == ["v1"]
    assert container(stored)["volumeMounts"] == [{"name": "v1", "mountPath": "/v1"}]
    assert keyed_items_have_keys(stored) == []
    other = operand(["A"], ["v1"], ports)
    container(other)["image"] = "example/op:2"
    code, out = await kubectl(
        sim, "apply", "--server-side", "--field-manager=other", "-f", "-", stdin=json.dumps(other)
    )
    assert code != 0
    assert 'Apply failed with 1 conflict: conflict with "kubectl": ' in out
    assert '.spec.template.spec.containers[name="main"].image' in out
    code, out = await kubectl(
        sim, "apply", "--server-side", "--field-manager=other", "--force-conflicts", "-f", "-",
        stdin=json.dumps(other),
    )  # fmt: skip
    assert code == 0, out
    stored = sim.store.get("daemonsets.apps", "op", "default")
    assert stored is not None
    assert container(stored)["image"] == "example/op:2"


GPU_NODE = "nvidia.com/gpu.deploy.device-plugin"


def operator_daemonset(*, env: list[str], volumes: list[str]) -> dict[str, Any]:
    """A DaemonSet shaped like the operator's operands: init containers, env from the downward
    API, privileged host mounts, tolerations, node selector and a metrics port."""
    mounts = [{"name": v, "mountPath": f"/host/{v}", "readOnly": True} for v in volumes]
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": "nvidia-device-plugin-daemonset",
            "namespace": "default",
            "labels": {"app": "nvidia-device-plugin-daemonset"},
            "annotations": {"nvidia.com/last-applied-hash": "abc"},
        },
        "spec": {
            "selector": {"matchLabels": {"app": "nvidia-device-plugin-daemonset"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": {"app": "nvidia-device-plugin-daemonset"}},
                "spec": {
                    "serviceAccountName": "nvidia-device-plugin",
                    "nodeSelector": {GPU_NODE: "true"},
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                    ],
                    "initContainers": [
                        {
                            "name": "toolkit-validation",
                            "image": "nvcr.io/nvidia/cloud-native/gpu-operator-validator:v1",
                            "command": ["sh", "-c"],
                            "args": ["until [ -f /run/nvidia/ready ]; do sleep 5; done"],
                            "securityContext": {"privileged": True},
                            "volumeMounts": [{"name": "run-nvidia", "mountPath": "/run/nvidia"}],
                        }
                    ],
                    "containers": [
                        {
                            "name": "nvidia-device-plugin",
                            "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0",
                            "env": [
                                {"name": "NODE_NAME",
                                 "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                                *({"name": e, "value": "true"} for e in env),
                            ],
                            "securityContext": {"privileged": True},
                            "ports": [{"name": "metrics", "containerPort": 2112}],
                            "volumeMounts": [
                                {"name": "run-nvidia", "mountPath": "/run/nvidia"},
                                *mounts,
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": "run-nvidia", "hostPath": {"path": "/run/nvidia",
                                                            "type": "Directory"}},
                        *({"name": v, "hostPath": {"path": f"/{v}"}} for v in volumes),
                    ],
                },
            },
        },
    }  # fmt: skip


async def test_operator_daemonset_reapplied_without_an_env_var_and_a_volume_stays_valid(
    sim: kubesim.Cluster,
) -> None:
    from lightkube import AsyncClient, KubeConfig
    from lightkube.resources.apps_v1 import DaemonSet

    sim.store.patch("nodes", "node-1", {"metadata": {"labels": {GPU_NODE: "true"}}})
    client = AsyncClient(KubeConfig.from_file(sim.kubeconfig_path), field_manager="gpu-operator")
    first = operator_daemonset(env=["PASS_DEVICE_SPECS", "MIG_STRATEGY"], volumes=["dev", "lib"])
    second = operator_daemonset(env=["PASS_DEVICE_SPECS"], volumes=["dev"])
    try:
        await client.apply(DaemonSet.from_dict(first), force=True)
        ds = await client.apply(DaemonSet.from_dict(second), force=True)
    finally:
        await client.close()
    stored = sim.store.get("daemonsets.apps", "nvidia-device-plugin-daemonset", "default")
    assert stored is not None
    plugin = container(stored)
    assert [e["name"] for e in plugin["env"]] == ["NODE_NAME", "PASS_DEVICE_SPECS"]
    assert [m["name"] for m in plugin["volumeMounts"]] == ["run-nvidia", "dev"]
    assert [v["name"] for v in pod_spec(stored)["volumes"]] == ["run-nvidia", "dev"]
    assert keyed_items_have_keys(stored) == []
    assert ds.metadata.generation == 2

    def rolled() -> bool:
        pods = sim.store.list(
            "pods", "default", label_selector="app=nvidia-device-plugin-daemonset"
        )
        envs = [[e["name"] for e in p["spec"]["containers"][0].get("env", [])] for p in pods]
        return envs == [["NODE_NAME", "PASS_DEVICE_SPECS"]]

    await sim.wait_for(rolled, DEADLINE)


# ----- properties through the store -------------------------------------------------------------


def _store_apply(store: kubesim.store.Store, config: dict[str, Any], manager: str) -> Any:
    """What the server does for an apply request (create or update)."""
    from kubesim import patch
    from kubesim.store import now

    rt = store.registry.resolve("daemonsets.apps")
    current = store.peek(rt.key, "default", "d")
    merged = patch.server_side_apply(
        rt, current.copy() if current else None, copy.deepcopy(config),
        manager=manager, force=True, subresource=None, stamp=now(),
    )  # fmt: skip
    if current is None:
        return store.insert(rt, merged)
    return store.replace(rt, merged, namespace="default", name="d", keep_managed_fields=True)


def _valid(config: dict[str, Any]) -> dict[str, Any]:
    """A generated configuration made valid for storing: selector, labels and images."""
    valid = copy.deepcopy(config)
    valid["spec"]["selector"] = {"matchLabels": {"app": "d"}}
    valid["spec"]["template"]["metadata"] = {"labels": {"app": "d"}}
    for c in pod_spec(valid)["containers"]:
        c.setdefault("image", "x:1")
        if c.get("env") == []:
            # An empty keyed list applies nothing, yet reads as a change every time (as on a
            # real server, which then drops it when decoding): not a "same config" case.
            del c["env"]
    for c in pod_spec(valid)["containers"]:
        for port in c.get("ports", []):
            port.setdefault(
                "name", f"p{port['containerPort']}{port.get('protocol', 'TCP').lower()}"
            )
    return valid


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    """Scalar leaves with paths that address keyed list items by their name or port (an empty
    keyed list specifies nothing: it merges, so it has no leaves)."""
    if value == []:
        return []
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, (*path, k))]
    if isinstance(value, list) and value and all(isinstance(i, dict) for i in value):
        out = []
        for item in value:
            key = item.get("name", item.get("containerPort"))
            out.extend(_leaves(item, (*path, ("item", key))))
        return out
    return [(path, value)]


def _at(obj: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        if isinstance(step, tuple):
            obj = next(i for i in obj if i.get("name", i.get("containerPort")) == step[1])
        else:
            obj = obj[step]
    return obj


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["a1", "a2"]), ds_configs()), min_size=1, max_size=4))
def test_apply_then_read_shows_the_configuration_and_reapplying_it_is_a_no_op(
    plan: list[tuple[str, dict[str, Any]]],
) -> None:
    store = kubesim.store.Store()
    store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})
    refused: list[int] = []
    for manager, generated in plan:
        config = _valid(generated)
        try:
            stored = _store_apply(store, config, manager)
        except errors.ApiError as exc:
            # Fields another manager took and then dropped leave the object invalid, as on a
            # real server (a container without its image); such plans say nothing here.
            refused.append(exc.code)
            break
        for path, value in _leaves(config):
            if path == ("metadata", "finalizers"):  # a set: the applied members are in it
                assert set(value) <= set(_at(stored.obj, path))
            elif path[:1] != ("metadata",) or path[1:2] == ("labels",):
                assert _at(stored.obj, path) == value, path
        owned = ref.paths_of(fields_of(stored.obj, manager))
        assert owned == ref.to_set(config, DS_SHAPE) - ref.STRIP
        version = store.resource_version
        again = _store_apply(store, config, manager)
        assert store.resource_version == version
        assert again.obj == stored.obj
    assert refused in ([], [422])


# ----- taking fields over from another manager (docs/swap-in.md) --------------------------------


async def test_an_env_var_with_value_and_value_from_is_422_like_kube_apiserver(api: Api) -> None:
    # The previous writer (an Update manager) set `valueFrom`; an apply that sets `value` keeps
    # it (server-side apply never removes another manager's field): the merged object is invalid.
    ds = daemonset("swap")
    container(ds)["env"] = [
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
    ]
    await api.ok("POST", DS, ds, params={"fieldManager": "gpu-operator"})
    config = daemonset("swap")
    container(config)["env"] = [{"name": "NS", "value": "gpu-operator"}]
    status, body = await applied(api, f"{DS}/swap", config, "gpu-operator", force="true")
    assert status == 422, body
    assert body["reason"] == "Invalid"
    assert body["message"] == (
        'DaemonSet.apps "swap" is invalid: spec.template.spec.containers[0].env[0].valueFrom: '
        'Invalid value: "": may not be specified when `value` is not empty'
    )
    assert container(await api.ok("GET", f"{DS}/swap"))["env"][0].get("value") is None


async def test_an_update_or_patch_may_rewrite_managed_fields_as_on_the_real_server(
    api: Api,
) -> None:
    await api.ok("POST", CM, configmap("mf"), params={"fieldManager": "before"})
    config = {**configmap("mf"), "data": {"k": "v", "mine": "1"}}
    body = await api.ok("PATCH", f"{CM}/mf", config, ctype=APPLY,
                        params={"fieldManager": "after", "force": "true"})  # fmt: skip
    assert {e["manager"] for e in body["metadata"]["managedFields"]} == {"before", "after"}
    kept = [e for e in body["metadata"]["managedFields"] if e["manager"] == "after"]
    # A JSON patch of managedFields alone replaces the entries and changes nothing else.
    version = body["metadata"]["resourceVersion"]
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": version},
           {"op": "replace", "path": "/metadata/managedFields", "value": kept}]  # fmt: skip
    patched = await api.ok("PATCH", f"{CM}/mf", ops, ctype=JSONP, params={"fieldManager": "x"})
    assert [e["manager"] for e in patched["metadata"]["managedFields"]] == ["after"]
    assert patched["data"] == body["data"]
    # An empty list is what clients that do not know the field send: the entries stay.
    again = {**patched, "metadata": {**patched["metadata"], "managedFields": []}}
    kept_body = await api.ok("PUT", f"{CM}/mf", again, params={"fieldManager": "x"})
    assert [e["manager"] for e in kept_body["metadata"]["managedFields"]] == ["after"]
    # One empty entry clears them all.
    cleared = {**kept_body, "metadata": {**kept_body["metadata"], "managedFields": [{}]}}
    stripped = await api.ok("PUT", f"{CM}/mf", cleared, params={"fieldManager": "x"})
    assert "managedFields" not in stripped["metadata"]
