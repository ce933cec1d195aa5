"""Operand RBAC at parity with upstream 26.7 (assets/state-*/0200_role.yaml, 0210_clusterrole.yaml;
the objects its operator writes are compared whole in test_parity_26_7.py).

Upstream facts pinned here:
- MPS control daemon: ServiceAccount, Role, ClusterRole and both bindings are all named
  `nvidia-device-plugin-mps-control-daemon`; ClusterRole: nodes get/list/watch; Role: use of
  OpenShift's `privileged` SCC. Its pods run as the device plugin's account.
- MIG manager: ClusterRole nodes get/list/watch/update/patch and pods `list` only; Role: pods
  get/list/watch/delete and configmaps create/get/list/update/patch.
- Validator: the ClusterPolicy and NVIDIADriver finalizers (ClusterRole), and the `privileged` SCC.
- Namespaced Roles upstream creates where we had none: `nvidia-dcgm-exporter` (configmaps
  get/list; pods only through its read-pods ClusterRole), `nvidia-dcgm` (SCC only),
  `nvidia-node-status-exporter` (pods and nodes get/list).
- Driver: OpenShift clusterversions get/list, nodes get/list/watch/update/patch, pods
  get/list/watch, pods/eviction create, resourceclaims get/list, daemonsets get (cluster-wide),
  and the `privileged` SCC in its Role.
Deliberate differences (docs/operands.md): SCC `use` is limited to `privileged` everywhere;
finalizers get `update` only (upstream: every verb; the API server checks only update).
"""

from __future__ import annotations

from typing import Any

import pytest
from operand_helpers import find, make_facts, make_policy

from gpu_operator.operands import (
    dcgm,
    dcgm_exporter,
    driver,
    mig_manager,
    mps_control_daemon,
    node_status_exporter,
    operator_validation,
)

SCC_PRIVILEGED = {
    "apiGroups": ["security.openshift.io"],
    "resources": ["securitycontextconstraints"],
    "verbs": ["use"],
    "resourceNames": ["privileged"],
}


def rule(groups: list[str], resources: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


def render(module: Any, **sections: Any) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = module.render(make_policy(**sections), make_facts())
    return objects


def test_mps_control_daemon_objects_use_upstreams_name() -> None:
    name = "nvidia-device-plugin-mps-control-daemon"
    objects = render(mps_control_daemon)
    for kind in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"):
        assert find(objects, kind)["metadata"]["name"] == name
    assert find(objects, "ClusterRole")["rules"] == [
        rule([""], ["nodes"], ["get", "list", "watch"])
    ]
    binding = find(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == name
    assert binding["subjects"][0]["name"] == name
    assert find(objects, "Role")["rules"] == [SCC_PRIVILEGED]
    ds = find(objects, "DaemonSet")
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == "nvidia-device-plugin"


def test_mig_manager_lists_pods_cluster_wide_and_nothing_more() -> None:
    objects = render(mig_manager, migManager={"enabled": True})
    assert find(objects, "ClusterRole")["rules"] == [
        rule([""], ["nodes"], ["get", "list", "watch", "update", "patch"]),
        rule([""], ["pods"], ["list"]),
    ]
    # In its namespace: its own pod, deleting the validator pods after a MIG change, publishing
    # `<node>-mig-config` (ours also watches and deletes it, and records Events).
    role = find(objects, "Role")["rules"]
    assert role[:2] == [SCC_PRIVILEGED, rule([""], ["pods"], ["get", "list", "watch", "delete"])]


def test_validator_holds_the_cluster_policy_finalizers() -> None:
    objects = render(operator_validation)
    finalizers = rule(
        ["nvidia.com"], ["clusterpolicies/finalizers", "nvidiadrivers/finalizers"], ["update"]
    )
    assert finalizers in find(objects, "ClusterRole")["rules"]
    assert finalizers not in find(objects, "Role")["rules"]
    assert SCC_PRIVILEGED in find(objects, "Role")["rules"]


@pytest.mark.parametrize(
    ("module", "name", "rules"),
    [
        (
            dcgm_exporter,
            "nvidia-dcgm-exporter",
            [SCC_PRIVILEGED, rule([""], ["configmaps"], ["get", "list"])],
        ),
        (dcgm, "nvidia-dcgm", [SCC_PRIVILEGED]),
        (
            node_status_exporter,
            "nvidia-node-status-exporter",
            [SCC_PRIVILEGED, rule([""], ["pods", "nodes"], ["get", "list"])],
        ),
    ],
    ids=["dcgm-exporter", "dcgm", "node-status-exporter"],
)
def test_namespaced_roles_upstream_creates(module: Any, name: str, rules: list[Any]) -> None:
    objects = render(module, dcgm={"enabled": True}, nodeStatusExporter={"enabled": True})
    role = find(objects, "Role")
    assert role["metadata"]["name"] == name
    assert role["rules"] == rules
    binding = find(objects, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": name,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": name, "namespace": "gpu-operator"}
    ]


def test_driver_rules() -> None:
    objects = render(driver)
    assert find(objects, "ClusterRole")["rules"] == [
        rule(["config.openshift.io"], ["clusterversions"], ["get", "list"]),
        rule([""], ["nodes"], ["get", "list", "patch", "update", "watch"]),
        rule([""], ["pods"], ["get", "list", "watch"]),
        rule([""], ["pods/eviction"], ["create"]),
        rule(["resource.k8s.io"], ["resourceclaims"], ["get", "list"]),
        rule(["apps"], ["daemonsets"], ["get"]),
    ]
    role_rules = find(objects, "Role")["rules"]
    assert role_rules[0] == SCC_PRIVILEGED
    # Our addition: the driver manager's Node Events.
    assert rule([""], ["events"], ["create"]) in role_rules
