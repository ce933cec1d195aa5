"""Conformance: one test per API-server semantic, over HTTP against kubesim."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubesim_helpers import CM, Api, configmap, daemonset
from waiting import DEADLINE, eventually, within

import kubesim
from kubesim.resources import BUILTINS

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
JSONP = "application/json-patch+json"
SMP = "application/strategic-merge-patch+json"
DS = "/apis/apps/v1/namespaces/default/daemonsets"
PODS = "/api/v1/namespaces/default/pods"

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {
        "group": "example.com",
        "names": {
            "plural": "widgets",
            "singular": "widget",
            "kind": "Widget",
            "shortNames": ["wd"],
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"}
                ],
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {
                                    "size": {"type": "integer"},
                                    "items": {
                                        "type": "array",
                                        "x-kubernetes-list-type": "map",
                                        "x-kubernetes-list-map-keys": ["name"],
                                        "items": {
                                            "type": "object",
                                            "properties": {
                                                "name": {"type": "string"},
                                                "value": {"type": "string"},
                                            },
                                        },
                                    },
                                },
                            },
                            "status": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                        },
                    }
                },
            }
        ],
    },
}
WIDGETS = "/apis/example.com/v1/namespaces/default/widgets"


def pod(name: str, node: str | None = None, **labels: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox:1"}]}
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }


def assert_status(body: Any, code: int, reason: str) -> None:
    assert body["kind"] == "Status"
    assert body["status"] == "Failure"
    assert body["code"] == code
    assert body["reason"] == reason


# ----- discovery -----------------------------------------------------------------------------


async def test_version_reports_the_configured_release(api: Api) -> None:
    body = await api.ok("GET", "/version")
    assert body["gitVersion"] == "v1.35.0"
    assert (body["major"], body["minor"]) == ("1", "35")


async def test_core_discovery_lists_kinds_verbs_scope_and_short_names(api: Api) -> None:
    assert (await api.ok("GET", "/api"))["versions"] == ["v1"]
    body = await api.ok("GET", "/api/v1")
    assert body["groupVersion"] == "v1"
    by_name = {r["name"]: r for r in body["resources"]}
    assert by_name["pods"]["namespaced"] is True
    assert by_name["pods"]["kind"] == "Pod"
    assert "po" in by_name["pods"]["shortNames"]
    assert "watch" in by_name["pods"]["verbs"]
    assert by_name["nodes"]["namespaced"] is False
    assert "pods/status" in by_name
    assert by_name["pods/eviction"]["group"] == "policy"


async def test_group_discovery_serves_every_builtin_group(api: Api) -> None:
    groups = {g["name"]: g for g in (await api.ok("GET", "/apis"))["groups"]}
    for group in {rt.group for rt in BUILTINS if rt.group}:
        assert group in groups
    assert groups["apps"]["preferredVersion"]["groupVersion"] == "apps/v1"
    apps = await api.ok("GET", "/apis/apps/v1")
    assert {"daemonsets", "deployments", "replicasets", "controllerrevisions"} <= {
        r["name"] for r in apps["resources"]
    }
    assert (await api.ok("GET", "/apis/apps"))["name"] == "apps"


async def test_openapi_v3_advertises_field_validation(api: Api) -> None:
    index = await api.ok("GET", "/openapi/v3")
    url = index["paths"]["apis/apps/v1"]["serverRelativeURL"]
    document = await api.ok("GET", url)
    patch = document["paths"]["/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"]["patch"]
    assert "fieldValidation" in {p["name"] for p in patch["parameters"]}
    assert patch["x-kubernetes-group-version-kind"]["kind"] == "DaemonSet"


@pytest.mark.parametrize("rt", BUILTINS, ids=lambda rt: rt.qualified)
async def test_every_builtin_resource_is_listable(
    api: Api, rt: kubesim.resources.ResourceType
) -> None:
    prefix = f"/apis/{rt.group}/{rt.version}" if rt.group else "/api/v1"
    body = await api.ok("GET", f"{prefix}/{rt.plural}")
    assert body["kind"] == rt.kind + "List"
    assert body["apiVersion"] == rt.api_version


async def test_crd_serves_its_kind_until_deleted(api: Api) -> None:
    assert (await api.req("GET", WIDGETS))[0] == 404
    crd = await api.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD)
    assert {c["type"] for c in crd["status"]["conditions"]} == {"Established", "NamesAccepted"}
    resources = (await api.ok("GET", "/apis/example.com/v1"))["resources"]
    assert {r["name"] for r in resources} == {"widgets", "widgets/status"}
    widget = {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w"},
        "spec": {"size": 2},
    }
    created = await api.ok("POST", WIDGETS, widget)
    assert created["metadata"]["generation"] == 1
    table = await api.ok(
        "GET", WIDGETS, headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
    )
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names == ["Name", "Size", "Age"]
    assert table["rows"][0]["cells"][:2] == ["w", 2]
    await api.ok(
        "DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com"
    )
    assert (await api.req("GET", WIDGETS))[0] == 404


async def test_custom_resources_are_pruned_and_validated_by_schema(api: Api) -> None:
    await api.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD)
    widget = {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w"},
        "spec": {"size": 2, "unknown": True},
    }
    status, body = await api.req("POST", WIDGETS, widget, params={"fieldValidation": "Strict"})
    assert status == 400
    assert "unknown field" in body["message"]
    created = await api.ok("POST", WIDGETS, widget)
    assert created["spec"] == {"size": 2}
    widget["metadata"]["name"] = "w2"
    widget["spec"] = {"size": "big"}
    status, body = await api.req("POST", WIDGETS, widget)
    assert_status(body, 422, "Invalid")


# ----- object semantics ----------------------------------------------------------------------


async def test_create_assigns_uid_timestamp_and_generation(api: Api) -> None:
    ds = await api.ok("POST", DS, daemonset("d"))
    assert ds["metadata"]["uid"]
    assert ds["metadata"]["creationTimestamp"].endswith("Z")
    assert ds["metadata"]["generation"] == 1


async def test_generation_bumps_on_spec_changes_only(api: Api) -> None:
    await api.ok("POST", DS, daemonset("d"))
    meta = await api.ok("PATCH", f"{DS}/d", {"metadata": {"labels": {"a": "b"}}}, ctype=MERGE)
    assert meta["metadata"]["generation"] == 1
    status = await api.ok("PATCH", f"{DS}/d/status", {"status": {"numberReady": 7}}, ctype=MERGE)
    assert status["metadata"]["generation"] == 1
    spec = await api.ok("PATCH", f"{DS}/d", {"spec": {"minReadySeconds": 3}}, ctype=MERGE)
    assert spec["metadata"]["generation"] == 2


async def test_resource_version_is_global_and_monotonic(api: Api) -> None:
    versions = []
    for index in range(3):
        cm = await api.ok("POST", CM, configmap(f"c{index}"))
        versions.append(int(cm["metadata"]["resourceVersion"]))
        ds = await api.ok("POST", DS, daemonset(f"d{index}"))
        versions.append(int(ds["metadata"]["resourceVersion"]))
    assert versions == sorted(versions)
    assert len(set(versions)) == len(versions)


async def test_stale_resource_version_update_conflicts(api: Api) -> None:
    cm = await api.ok("POST", CM, configmap("c"))
    cm["data"] = {"k": "2"}
    await api.ok("PUT", f"{CM}/c", cm)
    cm["data"] = {"k": "3"}
    status, body = await api.req("PUT", f"{CM}/c", cm)
    assert status == 409
    assert_status(body, 409, "Conflict")
    assert body["details"]["name"] == "c"
    patch = {"metadata": {"resourceVersion": cm["metadata"]["resourceVersion"]}, "data": {"k": "4"}}
    assert (await api.req("PATCH", f"{CM}/c", patch, ctype=MERGE))[0] == 409


async def test_already_exists_and_not_found_have_status_bodies(api: Api) -> None:
    await api.ok("POST", CM, configmap("c"))
    status, body = await api.req("POST", CM, configmap("c"))
    assert status == 409
    assert_status(body, 409, "AlreadyExists")
    status, body = await api.req("GET", f"{CM}/missing")
    assert_status(body, 404, "NotFound")
    assert body["details"] == {"name": "missing", "kind": "configmaps"}


async def test_invalid_name_is_unprocessable(api: Api) -> None:
    status, body = await api.req("POST", CM, configmap("Not_Valid"))
    assert status == 422
    assert_status(body, 422, "Invalid")
    assert body["details"]["causes"][0]["field"] == "metadata.name"


async def test_generate_name_creates_unique_names(api: Api) -> None:
    manifest = configmap("")
    manifest["metadata"] = {"generateName": "gen-"}
    first = await api.ok("POST", CM, manifest)
    second = await api.ok("POST", CM, manifest)
    assert first["metadata"]["name"].startswith("gen-")
    assert first["metadata"]["name"] != second["metadata"]["name"]


async def test_namespaced_objects_need_an_existing_namespace(api: Api) -> None:
    status, body = await api.req(
        "POST", "/api/v1/namespaces/nope/configmaps", configmap("c", "nope")
    )
    assert status == 404
    assert body["details"]["kind"] == "namespaces"


async def test_deleting_a_namespace_deletes_its_contents(api: Api, sim: kubesim.Cluster) -> None:
    await api.ok(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tmp"}},
    )
    await api.ok("POST", "/api/v1/namespaces/tmp/configmaps", configmap("c", "tmp"))
    deleted = await api.ok("DELETE", "/api/v1/namespaces/tmp")
    assert deleted["status"]["phase"] == "Terminating"
    status, _ = await api.req("POST", "/api/v1/namespaces/tmp/configmaps", configmap("d", "tmp"))
    assert status in (403, 404)
    await sim.wait_for(lambda: sim.store.get("namespaces", "tmp") is None, DEADLINE)
    assert sim.store.list("configmaps", namespace="tmp") == []


# ----- verbs and patch types -----------------------------------------------------------------


async def test_merge_patch_sets_and_removes_fields(api: Api) -> None:
    await api.ok("POST", CM, configmap("c"))
    body = await api.ok("PATCH", f"{CM}/c", {"data": {"k": None, "n": "1"}}, ctype=MERGE)
    assert body["data"] == {"n": "1"}


async def test_json_patch_applies_operations_and_fails_tests(api: Api) -> None:
    await api.ok("POST", CM, configmap("c"))
    ops = [{"op": "add", "path": "/data/x", "value": "1"}, {"op": "remove", "path": "/data/k"}]
    body = await api.ok("PATCH", f"{CM}/c", ops, ctype=JSONP)
    assert body["data"] == {"x": "1"}
    status, result = await api.req(
        "PATCH", f"{CM}/c", [{"op": "test", "path": "/data/x", "value": "2"}], ctype=JSONP
    )
    assert status == 422
    assert result["kind"] == "Status"


async def test_strategic_merge_patch_merges_lists_by_key(api: Api) -> None:
    manifest = daemonset("d")
    manifest["spec"]["template"]["spec"]["containers"] = [
        {
            "name": "a",
            "image": "a:1",
            "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "1"}],
        },
        {"name": "b", "image": "b:1"},
    ]
    manifest["spec"]["template"]["spec"]["tolerations"] = [{"key": "t1", "operator": "Exists"}]
    await api.ok("POST", DS, manifest)
    patch = {
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {"name": "a", "image": "a:2", "env": [{"name": "Y", "value": "2"}]},
                        {"name": "b", "$patch": "delete"},
                    ],
                    "tolerations": [{"key": "t2", "operator": "Exists"}],
                    "$setElementOrder/containers": [{"name": "a"}],
                }
            }
        }
    }
    body = await api.ok("PATCH", f"{DS}/d", patch, ctype=SMP)
    pod_spec = body["spec"]["template"]["spec"]
    assert [c["name"] for c in pod_spec["containers"]] == ["a"]
    assert pod_spec["containers"][0]["image"] == "a:2"
    assert pod_spec["containers"][0]["env"] == [
        {"name": "X", "value": "1"},
        {"name": "Y", "value": "2"},
    ]
    # Like the real API server, tolerations have no merge key: the list is replaced.
    assert pod_spec["tolerations"] == [{"key": "t2", "operator": "Exists"}]


async def test_strategic_merge_patch_merges_conditions_and_owner_references(api: Api) -> None:
    uids = [(await api.ok("POST", CM, configmap(n)))["metadata"]["uid"] for n in ("o", "p")]
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": uids[0]}
    manifest = configmap("c")
    manifest["metadata"]["ownerReferences"] = [owner]
    await api.ok("POST", CM, manifest)
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "p", "uid": uids[1]}
    body = await api.ok("PATCH", f"{CM}/c", {"metadata": {"ownerReferences": [other]}}, ctype=SMP)
    assert [r["uid"] for r in body["metadata"]["ownerReferences"]] == uids
    node = await api.ok(
        "PATCH",
        "/api/v1/nodes/node-1/status",
        {"status": {"conditions": [{"type": "Custom", "status": "True"}]}},
        ctype=SMP,
    )
    types = [c["type"] for c in node["status"]["conditions"]]
    assert "Ready" in types
    assert "Custom" in types


async def test_server_side_apply_creates_and_tracks_managers(api: Api) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c"},
        "data": {"a": "1"},
    }
    status, body = await api.req(
        "PATCH", f"{CM}/c", config, ctype=APPLY, params={"fieldManager": "one"}
    )
    assert status == 201
    entry = body["metadata"]["managedFields"][0]
    assert entry["manager"] == "one"
    assert entry["operation"] == "Apply"
    assert entry["fieldsV1"] == {"f:data": {"f:a": {}}}


async def test_server_side_apply_conflicts_unless_forced(api: Api) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c"},
        "data": {"a": "1"},
    }
    await api.ok("PATCH", f"{CM}/c", config, ctype=APPLY, params={"fieldManager": "one"})
    config["data"] = {"a": "2"}
    status, body = await api.req(
        "PATCH", f"{CM}/c", config, ctype=APPLY, params={"fieldManager": "two"}
    )
    assert status == 409
    assert_status(body, 409, "Conflict")
    assert body["details"]["causes"][0]["field"] == ".data.a"
    assert 'conflict with "one"' in body["message"]
    forced = await api.ok(
        "PATCH", f"{CM}/c", config, ctype=APPLY, params={"fieldManager": "two", "force": "true"}
    )
    assert forced["data"] == {"a": "2"}
    managers = {e["manager"]: e for e in forced["metadata"]["managedFields"]}
    assert "one" not in managers
    assert managers["two"]["fieldsV1"] == {"f:data": {"f:a": {}}}


async def test_server_side_apply_conflicts_with_update_managers(api: Api) -> None:
    await api.ok("POST", CM, configmap("c"), params={"fieldManager": "editor"})
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c"},
        "data": {"k": "other"},
    }
    status, body = await api.req(
        "PATCH", f"{CM}/c", config, ctype=APPLY, params={"fieldManager": "op"}
    )
    assert status == 409
    assert 'conflict with "editor"' in body["message"]
    same = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}}
    await api.ok("PATCH", f"{CM}/c", same, ctype=APPLY, params={"fieldManager": "op"})


async def test_server_side_apply_removes_fields_no_longer_applied(api: Api) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c", "labels": {"x": "1"}},
        "data": {"a": "1", "b": "2"},
    }
    await api.ok("PATCH", f"{CM}/c", config, ctype=APPLY, params={"fieldManager": "one"})
    await api.ok(
        "PATCH", f"{CM}/c", {"data": {"mine": "z"}}, ctype=MERGE, params={"fieldManager": "other"}
    )
    config["data"] = {"a": "1"}
    del config["metadata"]["labels"]
    body = await api.ok("PATCH", f"{CM}/c", config, ctype=APPLY, params={"fieldManager": "one"})
    assert body["data"] == {"a": "1", "mine": "z"}
    assert "x" not in (body["metadata"].get("labels") or {})


async def test_server_side_apply_merges_keyed_lists_by_schema(api: Api) -> None:
    await api.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD)

    def widget(items: list[dict[str, str]]) -> dict[str, Any]:
        return {
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "metadata": {"name": "w"},
            "spec": {"items": items},
        }

    await api.ok(
        "PATCH",
        f"{WIDGETS}/w",
        widget([{"name": "a", "value": "1"}]),
        ctype=APPLY,
        params={"fieldManager": "one"},
    )
    body = await api.ok(
        "PATCH",
        f"{WIDGETS}/w",
        widget([{"name": "b", "value": "2"}]),
        ctype=APPLY,
        params={"fieldManager": "two"},
    )
    assert [i["name"] for i in body["spec"]["items"]] == ["a", "b"]


async def test_delete_background_removes_dependents(api: Api, sim: kubesim.Cluster) -> None:
    owner = await api.ok("POST", CM, configmap("owner"))
    dependent = configmap("dep")
    dependent["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    ]
    await api.ok("POST", CM, dependent)
    await api.ok("DELETE", f"{CM}/owner", params={"propagationPolicy": "Background"})
    await sim.wait_for(lambda: sim.store.get("configmaps", "dep", "default") is None, DEADLINE)


async def test_delete_orphan_keeps_dependents_without_owner(api: Api, sim: kubesim.Cluster) -> None:
    owner = await api.ok("POST", CM, configmap("owner"))
    dependent = configmap("dep")
    dependent["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    ]
    await api.ok("POST", CM, dependent)
    await api.ok("DELETE", f"{CM}/owner", {"propagationPolicy": "Orphan"})
    await sim.wait_for(lambda: sim.store.get("configmaps", "owner", "default") is None, DEADLINE)
    remaining = sim.store.get("configmaps", "dep", "default")
    assert remaining is not None
    assert "ownerReferences" not in remaining["metadata"]


async def test_delete_foreground_waits_for_blocking_dependents(
    api: Api, sim: kubesim.Cluster
) -> None:
    owner = await api.ok("POST", CM, configmap("owner"))
    dependent = configmap("dep")
    dependent["metadata"]["finalizers"] = ["example.com/hold"]
    dependent["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "owner",
            "uid": owner["metadata"]["uid"],
            "blockOwnerDeletion": True,
        }
    ]
    await api.ok("POST", CM, dependent)
    body = await api.ok("DELETE", f"{CM}/owner", {"propagationPolicy": "Foreground"})
    assert "foregroundDeletion" in body["metadata"]["finalizers"]
    await sim.wait_for(
        lambda: bool(
            (sim.store.get("configmaps", "dep", "default") or {})["metadata"].get(
                "deletionTimestamp"
            )
        ),
        DEADLINE,
    )
    await sim.settle(timeout=DEADLINE)
    assert sim.store.get("configmaps", "owner", "default") is not None
    await api.ok("PATCH", f"{CM}/dep", {"metadata": {"finalizers": None}}, ctype=MERGE)
    await sim.wait_for(lambda: sim.store.get("configmaps", "owner", "default") is None, DEADLINE)


async def test_pod_deletion_honours_grace_period(api: Api, sim: kubesim.Cluster) -> None:
    sim.kubelet.config.termination_delay = 30
    await api.ok("POST", PODS, pod("p", "node-1"))
    await sim.wait_for(
        lambda: (
            (sim.store.get("pods", "p", "default") or {}).get("status", {}).get("phase")
            == "Running"
        ),
        DEADLINE,
    )
    body = await api.ok("DELETE", f"{PODS}/p", params={"gracePeriodSeconds": "1"})
    assert body["metadata"]["deletionGracePeriodSeconds"] == 1
    assert sim.store.get("pods", "p", "default") is not None
    await sim.wait_for(lambda: sim.store.get("pods", "p", "default") is None, DEADLINE)
    await api.ok("POST", PODS, pod("q", "node-1"))
    await api.ok("DELETE", f"{PODS}/q", params={"gracePeriodSeconds": "0"})
    assert sim.store.get("pods", "q", "default") is None


async def test_delete_preconditions_are_checked(api: Api) -> None:
    await api.ok("POST", CM, configmap("c"))
    status, body = await api.req("DELETE", f"{CM}/c", {"preconditions": {"uid": "wrong"}})
    assert status == 409
    assert "Precondition failed" in body["message"]


async def test_deletecollection_honours_selectors(api: Api, sim: kubesim.Cluster) -> None:
    await api.ok("POST", CM, configmap("a", app="x"))
    await api.ok("POST", CM, configmap("b", app="y"))
    await api.ok("DELETE", CM, params={"labelSelector": "app=x"})
    assert [c["metadata"]["name"] for c in sim.store.list("configmaps", "default")] == ["b"]


async def test_status_subresource_separates_status_from_spec(api: Api) -> None:
    ds = await api.ok("POST", DS, daemonset("d"))
    ds["status"] = {
        "numberReady": 99,
        "currentNumberScheduled": 0,
        "desiredNumberScheduled": 0,
        "numberMisscheduled": 0,
    }
    ds["spec"]["minReadySeconds"] = 5
    del ds["metadata"]["resourceVersion"]  # the DaemonSet controller writes status meanwhile
    updated = await api.ok("PUT", f"{DS}/d", ds)
    assert updated["status"].get("numberReady") != 99
    assert updated["spec"]["minReadySeconds"] == 5
    updated["status"]["numberReady"] = 42
    updated["spec"]["minReadySeconds"] = 9
    del updated["metadata"]["resourceVersion"]
    via_status = await api.ok("PUT", f"{DS}/d/status", updated)
    assert via_status["status"]["numberReady"] == 42
    assert via_status["spec"]["minReadySeconds"] == 5


# ----- list ----------------------------------------------------------------------------------


async def test_label_selectors_equality_and_set_based(api: Api) -> None:
    for name, tier in (("a", "web"), ("b", "db"), ("c", "cache")):
        await api.ok("POST", CM, configmap(name, tier=tier))

    async def names(selector: str) -> list[str]:
        body = await api.ok("GET", CM, params={"labelSelector": selector})
        return [i["metadata"]["name"] for i in body["items"]]

    assert await names("tier=web") == ["a"]
    assert await names("tier!=web") == ["b", "c"]
    assert await names("tier in (web,db)") == ["a", "b"]
    assert await names("tier notin (web,db)") == ["c"]
    assert await names("tier") == ["a", "b", "c"]
    assert await names("!tier") == []
    _status, body = await api.req("GET", CM, params={"labelSelector": "tier in (web"})
    assert_status(body, 400, "BadRequest")


async def test_field_selectors(api: Api, sim: kubesim.Cluster) -> None:
    await api.ok("POST", PODS, pod("on1", "node-1"))
    await api.ok("POST", PODS, pod("on2", "node-2"))
    await sim.wait_for(
        lambda: all(p.get("status", {}).get("phase") == "Running" for p in sim.store.list("pods")),
        DEADLINE,
    )

    async def names(path: str, selector: str) -> list[str]:
        body = await api.ok("GET", path, params={"fieldSelector": selector})
        return [i["metadata"]["name"] for i in body["items"]]

    assert await names("/api/v1/pods", "spec.nodeName=node-1") == ["on1"]
    assert await names("/api/v1/pods", "status.phase=Running,metadata.name!=on1") == ["on2"]
    assert await names("/api/v1/pods", "metadata.namespace=kube-system") == []
    await api.ok("PATCH", "/api/v1/nodes/node-2", {"spec": {"unschedulable": True}}, ctype=MERGE)
    assert await names("/api/v1/nodes", "spec.unschedulable=false") == ["node-1"]


async def test_list_pagination_with_limit_and_continue(api: Api) -> None:
    for index in range(5):
        await api.ok("POST", CM, configmap(f"c{index}"))
    seen: list[str] = []
    params = {"limit": "2"}
    while True:
        body = await api.ok("GET", CM, params=params)
        seen += [i["metadata"]["name"] for i in body["items"]]
        token = body["metadata"].get("continue")
        if not token:
            break
        params = {"limit": "2", "continue": token}
    assert seen == [f"c{i}" for i in range(5)]


async def test_expired_continue_token_is_gone(api: Api, sim: kubesim.Cluster) -> None:
    for index in range(3):
        await api.ok("POST", CM, configmap(f"c{index}"))
    body = await api.ok("GET", CM, params={"limit": "1"})
    await api.ok("POST", CM, configmap("later"))
    sim.faults.restart()
    status, result = await api.req(
        "GET", CM, params={"limit": "1", "continue": body["metadata"]["continue"]}
    )
    assert status == 410
    assert_status(result, 410, "Expired")


# ----- watch ---------------------------------------------------------------------------------


async def read_events(
    api: Api, path: str, params: dict[str, str], count: int
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []

    async def read() -> None:
        async with api.session.get(path, params={"watch": "true", **params}) as resp:
            assert resp.status == 200
            async for line in resp.content:
                events.append(json.loads(line))
                if len(events) >= count:
                    break

    try:
        await within(read(), f"{count} watch event(s) on {path}")
    except AssertionError as err:
        raise AssertionError(f"{err}; events so far: {events}") from None
    return events


async def test_watch_from_resource_version_replays_later_events(api: Api) -> None:
    first = await api.ok("POST", CM, configmap("a"))
    await api.ok("POST", CM, configmap("b"))
    await api.ok("DELETE", f"{CM}/a")
    events = await read_events(
        api, CM, {"resourceVersion": first["metadata"]["resourceVersion"]}, 2
    )
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "b"),
        ("DELETED", "a"),
    ]


async def test_watch_without_resource_version_starts_with_current_state(
    api: Api, sim: kubesim.Cluster
) -> None:
    await api.ok("POST", CM, configmap("a"))
    watches = sim.store.watcher_count()
    task = asyncio.ensure_future(read_events(api, CM, {}, 2))
    # The change must come after the watch opened (else the watch starts with it as ADDED).
    await eventually(
        lambda: sim.store.watcher_count() > watches or task.done(), "the watch to open"
    )
    await api.ok("PATCH", f"{CM}/a", {"data": {"z": "1"}}, ctype=MERGE)
    events = await within(task, "the ADDED and MODIFIED events")
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED"]


async def test_watch_too_old_resource_version_is_gone(api: Api, sim: kubesim.Cluster) -> None:
    cm = await api.ok("POST", CM, configmap("a"))
    await api.ok("POST", CM, configmap("b"))
    sim.store.compact()
    events = await read_events(api, CM, {"resourceVersion": cm["metadata"]["resourceVersion"]}, 1)
    assert events[0]["type"] == "ERROR"
    assert events[0]["object"]["code"] == 410


async def test_watch_sends_bookmarks_when_allowed(api: Api) -> None:
    events = await read_events(api, CM, {"allowWatchBookmarks": "true", "resourceVersion": "1"}, 2)
    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert bookmarks
    assert int(bookmarks[0]["object"]["metadata"]["resourceVersion"]) > 1


async def test_watch_ends_after_timeout_seconds(api: Api) -> None:
    async with api.session.get(
        CM, params={"watch": "1", "timeoutSeconds": "0.2", "resourceVersion": "1"}
    ) as resp:
        body = await within(resp.read(), "the watch to end after timeoutSeconds")
    assert body == b""


async def test_watch_selector_transitions_become_added_and_deleted(api: Api) -> None:
    cm = await api.ok("POST", CM, configmap("a", app="x"))
    rv = cm["metadata"]["resourceVersion"]
    await api.ok("PATCH", f"{CM}/a", {"metadata": {"labels": {"app": "y"}}}, ctype=MERGE)
    await api.ok("PATCH", f"{CM}/a", {"metadata": {"labels": {"app": "x"}}}, ctype=MERGE)
    await api.ok("PATCH", f"{CM}/a", {"data": {"k": "2"}}, ctype=MERGE)
    events = await read_events(api, CM, {"resourceVersion": rv, "labelSelector": "app=x"}, 3)
    assert [e["type"] for e in events] == ["DELETED", "ADDED", "MODIFIED"]


# ----- finalizers, GC, eviction --------------------------------------------------------------


async def test_finalizers_hold_deletion_until_removed(api: Api, sim: kubesim.Cluster) -> None:
    manifest = configmap("c")
    manifest["metadata"]["finalizers"] = ["example.com/x"]
    await api.ok("POST", CM, manifest)
    body = await api.ok("DELETE", f"{CM}/c")
    assert body["metadata"]["deletionTimestamp"]
    status, _result = await api.req(
        "PATCH", f"{CM}/c", {"metadata": {"finalizers": ["example.com/x", "new"]}}, ctype=MERGE
    )
    assert status == 422
    await api.ok("PATCH", f"{CM}/c", {"metadata": {"finalizers": []}}, ctype=MERGE)
    assert sim.store.get("configmaps", "c", "default") is None


async def test_eviction_honours_pod_disruption_budgets(api: Api, sim: kubesim.Cluster) -> None:
    await api.ok("POST", PODS, pod("a", "node-1", app="web"))
    await api.ok("POST", PODS, pod("b", "node-2", app="web"))
    await sim.wait_for(
        lambda: all(p.get("status", {}).get("phase") == "Running" for p in sim.store.list("pods")),
        DEADLINE,
    )
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "web"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}},
    }
    await api.ok("POST", "/apis/policy/v1/namespaces/default/poddisruptionbudgets", pdb)
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "a", "namespace": "default"},
    }
    status, body = await api.req("POST", f"{PODS}/a/eviction", eviction)
    assert status == 429
    assert_status(body, 429, "TooManyRequests")
    await sim.wait_for(
        lambda: (
            (sim.store.get("poddisruptionbudgets", "web", "default") or {})
            .get("status", {})
            .get("currentHealthy")
            == 2
        ),
        DEADLINE,
    )
    await api.ok(
        "PATCH",
        "/apis/policy/v1/namespaces/default/poddisruptionbudgets/web",
        {"spec": {"minAvailable": 1}},
        ctype=MERGE,
    )
    status, body = await api.req("POST", f"{PODS}/a/eviction", eviction)
    assert status == 201
    await sim.wait_for(lambda: sim.store.get("pods", "a", "default") is None, DEADLINE)


# ----- errors --------------------------------------------------------------------------------


async def test_malformed_bodies_get_bad_request_status(api: Api) -> None:
    status, body = await api.req("POST", CM, raw=b"{not json")
    assert_status(body, 400, "BadRequest")
    status, body = await api.req(
        "PATCH", f"{CM}/x", raw=b"a: [", ctype=APPLY, params={"fieldManager": "m"}
    )
    assert_status(body, 400, "BadRequest")
    await api.ok("POST", CM, configmap("c"))
    status, body = await api.req("PATCH", f"{CM}/c", {"op": "add"}, ctype=JSONP)
    assert_status(body, 400, "BadRequest")
    status, body = await api.req("PATCH", f"{CM}/c", {}, ctype="text/plain")
    assert_status(body, 415, "UnsupportedMediaType")
    status, body = await api.req(
        "POST", CM, raw=b"k8s\x00...", ctype="application/vnd.kubernetes.protobuf"
    )
    assert status == 400  # protobuf is decoded now; these bytes are not a valid envelope
    assert_status(body, 400, "BadRequest")


async def test_unknown_resources_are_not_found(api: Api) -> None:
    for path in (
        "/api/v1/nothings",
        "/apis/nothing.io/v1/things",
        "/apis/apps/v9/daemonsets",
        "/other",
    ):
        status, body = await api.req("GET", path)
        assert status == 404, path
        assert body["kind"] == "Status"


async def test_strategic_merge_patch_on_custom_resources_is_unsupported(api: Api) -> None:
    await api.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD)
    widget = {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w"},
        "spec": {"size": 1},
    }
    await api.ok("POST", WIDGETS, widget)
    _status, body = await api.req("PATCH", f"{WIDGETS}/w", {"spec": {"size": 2}}, ctype=SMP)
    assert_status(body, 415, "UnsupportedMediaType")


async def test_injected_throttling_returns_too_many_requests(
    api: Api, sim: kubesim.Cluster
) -> None:
    sim.faults.add(verb="list", resource="configmaps", code=429, count=1)
    async with api.session.get(CM) as resp:
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "1"
        assert_status(await resp.json(), 429, "TooManyRequests")
    await api.ok("GET", CM)


async def test_table_output_for_pods(api: Api, sim: kubesim.Cluster) -> None:
    await api.ok("POST", PODS, pod("p", "node-1"))
    await sim.wait_for(
        lambda: (
            (sim.store.get("pods", "p", "default") or {}).get("status", {}).get("phase")
            == "Running"
        ),
        DEADLINE,
    )
    table = await api.ok(
        "GET",
        PODS,
        headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"},
    )
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]][:4] == [
        "Name",
        "Ready",
        "Status",
        "Restarts",
    ]
    assert table["rows"][0]["cells"][:3] == ["p", "1/1", "Running"]
    assert table["rows"][0]["object"]["metadata"]["name"] == "p"
