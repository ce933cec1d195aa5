"""Taking an object over from its previous writer, state in and patches out: what only NVIDIA's
operator set and ours does not render goes, in the same patch that sets ours, and its
managedFields entries go after our apply (operands/takeover.py)."""

from __future__ import annotations

import copy
import json
from typing import Any

from gpu_operator.operands import takeover

Obj = dict[str, Any]
NS_REF = {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}


def f(*names: str) -> dict[str, Any]:
    """A FieldsV1 tree with the given leaf paths (dotted, `k:` elements as JSON)."""
    tree: dict[str, Any] = {}
    for name in names:
        node = tree
        for element in name.split("|"):
            node = node.setdefault(element, {})
    return tree


def entry(manager: str, operation: str, fields: dict[str, Any], **extra: str) -> Obj:
    return {"manager": manager, "operation": operation, "apiVersion": "apps/v1",
            "fieldsType": "FieldsV1", "fieldsV1": fields, **extra}  # fmt: skip


C = 'k:{"name":"mig-manager"}'
ENV = 'k:{"name":"DEFAULT_GPU_CLIENTS_NAMESPACE"}'


def daemonset(env: list[Obj], managed: list[Obj]) -> Obj:
    container = {"name": "mig-manager", "image": "nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0",
                 "env": env, "terminationMessagePath": "/dev/termination-log"}  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "nvidia-mig-manager", "namespace": "gpu-operator",
                     "resourceVersion": "42", "managedFields": managed,
                     "annotations": {"openshift.io/scc": "nvidia-mig-manager"}},
        "spec": {"selector": {"matchLabels": {"app": "nvidia-mig-manager"}},
                 "template": {"metadata": {"labels": {"app": "nvidia-mig-manager"}},
                              "spec": {"containers": [container]}}},
        "status": {"numberReady": 1},
    }  # fmt: skip


def nvidias(*extra_fields: str) -> Obj:
    """The MIG manager as NVIDIA's operator created it: the namespace from a fieldRef, a
    server-defaulted termination path, both owned by its Update entry."""
    env = [{"name": "DEFAULT_GPU_CLIENTS_NAMESPACE", "valueFrom": copy.deepcopy(NS_REF)}]
    container = f"f:spec|f:template|f:spec|f:containers|{C}"
    owned = f(
        "f:metadata|f:annotations|f:openshift.io/scc",
        "f:spec|f:selector",
        "f:spec|f:template|f:metadata|f:labels|f:app",
        f"{container}|f:name",
        f"{container}|f:image",
        f"{container}|f:terminationMessagePath",
        f"{container}|f:env|{ENV}|f:name",
        f"{container}|f:env|{ENV}|f:valueFrom|f:fieldRef",
        *extra_fields,
    )
    return daemonset(env, [entry("gpu-operator", "Update", owned)])


def ours(env: list[Obj]) -> Obj:
    desired = daemonset(env, [])
    del desired["metadata"]["managedFields"], desired["metadata"]["resourceVersion"]
    del desired["metadata"]["annotations"], desired["status"]
    del desired["spec"]["template"]["spec"]["containers"][0]["terminationMessagePath"]
    return desired


def env_of(obj: Obj) -> list[Obj]:
    found: list[Obj] = obj["spec"]["template"]["spec"]["containers"][0]["env"]
    return found


def test_a_field_only_the_previous_writer_set_goes_in_the_patch_that_sets_ours() -> None:
    # NVIDIA's `valueFrom` beside our `value` is what the API server rejects with 422.
    live = nvidias()
    change = takeover.plan(ours([{"name": "DEFAULT_GPU_CLIENTS_NAMESPACE", "value": "ns"}]), live)
    assert change is not None
    assert env_of(change.content) == [{"name": "DEFAULT_GPU_CLIENTS_NAMESPACE", "value": "ns"}]
    assert (
        "spec.template.spec.containers[mig-manager].env[DEFAULT_GPU_CLIENTS_NAMESPACE].valueFrom"
        in change.removed
    )
    # One JSON patch, first testing the resourceVersion it was computed from; metadata and
    # status are not in it (NVIDIA's openshift.io/scc annotation stays).
    assert change.patch is not None
    assert change.patch[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "42"}
    assert [op["path"] for op in change.patch[1:]] == ["/spec"]
    assert change.patch[1]["value"] == change.content["spec"]


def test_server_defaulted_fields_only_the_previous_writer_owns_are_left_to_the_server() -> None:
    live = nvidias()
    change = takeover.plan(ours(env_of(live)), live)
    assert change is not None
    container = change.content["spec"]["template"]["spec"]["containers"][0]
    assert "terminationMessagePath" not in container  # the API server defaults it again
    assert env_of(change.content) == env_of(live)


def test_fields_another_manager_owns_stay() -> None:
    # `kubectl rollout restart` writes an annotation into the template as its own manager.
    live = nvidias()
    live["spec"]["template"]["metadata"]["annotations"] = {"kubectl.kubernetes.io/restartedAt": "t"}
    restart = f("f:spec|f:template|f:metadata|f:annotations|f:kubectl.kubernetes.io/restartedAt")
    live["metadata"]["managedFields"].append(entry("kubectl-rollout", "Update", restart))
    change = takeover.plan(ours(env_of(live)), live)
    assert change is not None
    template = change.content["spec"]["template"]["metadata"]
    assert template["annotations"] == {"kubectl.kubernetes.io/restartedAt": "t"}


def test_a_container_only_the_previous_writer_rendered_goes_whole() -> None:
    live = nvidias('f:spec|f:template|f:spec|f:containers|k:{"name":"sidecar"}|f:name')
    live["spec"]["template"]["spec"]["containers"].append({"name": "sidecar", "image": "x"})
    change = takeover.plan(ours(env_of(live)), live)
    assert change is not None
    names = [c["name"] for c in change.content["spec"]["template"]["spec"]["containers"]]
    assert names == ["mig-manager"]
    assert "spec.template.spec.containers[sidecar]" in change.removed


def test_no_previous_writer_no_takeover() -> None:
    live = nvidias()
    live["metadata"]["managedFields"] = [
        entry("gpu-operator", "Apply", f("f:spec|f:selector")),
        entry("kube-controller-manager", "Update", f("f:status|f:numberReady"),
              subresource="status"),
    ]  # fmt: skip
    assert takeover.plan(ours(env_of(live)), live) is None
    assert takeover.managed_fields_patch(live) is None


def test_after_the_apply_the_previous_writers_entries_are_dropped_and_the_rest_kept() -> None:
    applied = nvidias()
    status = entry("kube-controller-manager", "Update", f("f:status|f:numberReady"),
                   subresource="status")  # fmt: skip
    mine = entry("gpu-operator", "Apply", f("f:spec|f:selector"))
    applied["metadata"]["managedFields"] += [status, mine]
    patch = takeover.managed_fields_patch(applied)
    assert patch == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
        {"op": "replace", "path": "/metadata/managedFields", "value": [status, mine]},
    ]


def test_merge_follows_the_appliers_order_and_keeps_live_only_items_in_place() -> None:
    live = {"env": [{"name": "A", "value": "1"}, {"name": "X", "value": "x"},
                    {"name": "B", "value": "2"}]}  # fmt: skip
    desired = {"env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"},
                       {"name": "A", "value": "1"}]}  # fmt: skip
    merged = takeover.merge(live, desired)
    assert [e["name"] for e in merged["env"]] == ["X", "B", "C", "A"]
    assert merged["env"][1] == {"name": "B", "value": "3"}
    # Atomic lists are replaced whole.
    assert takeover.merge({"args": ["a", "b"]}, {"args": ["c"]}) == {"args": ["c"]}


def test_ports_match_by_number_and_the_defaulted_protocol() -> None:
    live = {"ports": [{"containerPort": 8080, "protocol": "TCP", "name": "old"}]}
    merged = takeover.merge(live, {"ports": [{"containerPort": 8080, "name": "metrics"}]})
    assert merged == {"ports": [{"containerPort": 8080, "protocol": "TCP", "name": "metrics"}]}


def test_the_patch_is_plain_json() -> None:
    live = nvidias()
    change = takeover.plan(ours([{"name": "DEFAULT_GPU_CLIENTS_NAMESPACE", "value": "n"}]), live)
    assert change is not None
    assert json.loads(json.dumps(change.patch)) == change.patch
