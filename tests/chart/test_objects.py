"""The operator Deployment, least-privilege RBAC, CRD hooks and monitoring objects."""

from __future__ import annotations

import json
import re
from typing import Any

from gpu_operator import api
from gpu_operator.api.gpucluster import GPUCluster
from gpu_operator.api.images import IMAGE_ENV
from gpu_operator.operands import dra_driver, nvidiadriver, registry
from gpu_operator.operands.facts import ClusterFacts

from .conftest import CHART, needs_helm

pytestmark = needs_helm


def rules_of(rendered: Any, kind: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = rendered.one(kind, "gpu-operator")["rules"]
    return rules


def test_operator_deployment(render: Any) -> None:
    deployment = render().one("Deployment", "gpu-operator")
    pod = deployment["spec"]["template"]
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert container["image"] == "ghcr.io/gpu-operator-py/gpu-operator:0.1.0"
    assert container["command"] == ["gpu-operator", "controller"]
    assert "--leader-elect" in container["args"]
    assert "--log-format=json" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["OPERATOR_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert (
        env["DRIVER_MANAGER_IMAGE"]["value"]
        == "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0"
    )
    assert env["VALIDATOR_IMAGE"]["value"] == "nvcr.io/nvidia/gpu-operator:v26.7.0"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert {p["containerPort"] for p in container["ports"]} == {8080, 8081}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert pod["metadata"]["labels"]["nvidia.com/gpu-driver-upgrade-drain.skip"] == "true"
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert spec["serviceAccountName"] == "gpu-operator"
    assert spec["priorityClassName"] == "system-node-critical"
    assert {t["key"] for t in spec["tolerations"]} >= {"node-role.kubernetes.io/control-plane"}
    assert "nodeAffinity" in spec["affinity"]


def test_operator_image_logging_and_pull_secrets_follow_the_values(render: Any) -> None:
    rendered = render(
        [CHART / "ci" / "custom-registry-values.yaml"],
        ["operator.logging.develMode=true", "operator.logging.level=debug",
         "operator.version=sha256:abc"],
    )  # fmt: skip
    spec = rendered.one("Deployment", "gpu-operator")["spec"]["template"]["spec"]
    assert spec["containers"][0]["image"] == "registry.example.com/gpu/gpu-operator@sha256:abc"
    assert {"--log-format=text", "--log-level=debug"} <= set(spec["containers"][0]["args"])
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]


def all_operand_rbac() -> dict[str, set[str]]:
    """Every RBAC object name the operand renderers can produce (every operand enabled)."""
    spec: dict[str, Any] = {k: {"enabled": True} for k in IMAGE_ENV if k not in (
        "validator", "initContainer", "driverManager", "gds", "gdrcopy")}  # fmt: skip
    spec.update(operator={}, daemonsets={})
    spec["dcgmExporter"] = {"enabled": True, "enablePodLabels": True}
    facts = ClusterFacts(operator_env=dict.fromkeys(IMAGE_ENV.values(), "r/i:1"), kernels=("6.8",))
    names: dict[str, set[str]] = {}
    for mode in ("kubevirt", "kata"):
        spec["sandboxWorkloads"] = {"enabled": True, "mode": mode}
        policy = api.ClusterPolicy.model_validate({"metadata": {"name": "p"}, "spec": spec})
        for state in registry.render_all(policy, facts):
            for obj in state.objects:
                names.setdefault(obj["kind"], set()).add(obj["metadata"]["name"])
    # NVIDIADriver pools share one account per driver type.
    drivers = [
        nvidiadriver.DriverInput(t, t, api.NVIDIADriverSpec.model_validate({"driverType": t}))
        for t in nvidiadriver.ACCOUNTS
    ]
    for obj in nvidiadriver.render_accounts(drivers, facts):
        names.setdefault(obj["kind"], set()).add(obj["metadata"]["name"])
    # A GPUCluster's DRA driver with compute domains and MPS (its controller, kubelet plugin and
    # IMEX daemon roles), DCGM and the exporter.
    cluster = GPUCluster.model_validate({"metadata": {"name": "c"}, "spec": {"draDriver": {
        "repository": "r", "image": "dra-driver-nvidia-gpu", "version": "v25.8.0",
        "computeDomains": {"enabled": True}, "featureGates": {"MPSSupport": True}},
        "dcgm": {"enabled": True}, "dcgmExporter": {}}})  # fmt: skip
    for obj in dra_driver.render(cluster, facts).objects():
        if obj["kind"] in ("ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"):
            names.setdefault(obj["kind"], set()).add(obj["metadata"]["name"])
    return names


def named(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> set[str] | None:
    """The resourceNames a verb is limited to (None: unlimited), or an empty set if not granted."""
    found: set[str] = set()
    for rule in rules:
        if group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]:
            if "resourceNames" not in rule:
                return None
            found |= set(rule["resourceNames"])
    return found


def test_rbac_lists_exactly_the_operand_objects_the_operator_renders(render: Any) -> None:
    rendered = render()
    cluster, namespaced = rules_of(rendered, "ClusterRole"), rules_of(rendered, "Role")
    operands = all_operand_rbac()
    rbac = "rbac.authorization.k8s.io"
    for verb in ("create", "patch", "delete", "escalate", "bind"):
        assert named(cluster, rbac, "clusterroles", verb) == operands["ClusterRole"], verb
        assert named(namespaced, rbac, "roles", verb) == operands["Role"], verb
    for verb in ("create", "patch", "delete"):
        assert named(cluster, rbac, "clusterrolebindings", verb) == operands["ClusterRoleBinding"]
        assert named(namespaced, rbac, "rolebindings", verb) == operands["RoleBinding"]
        assert named(cluster, "node.k8s.io", "runtimeclasses", verb) == operands["RuntimeClass"]


def test_rbac_has_no_wildcards_no_secret_reads_and_no_crd_writes(render: Any) -> None:
    rendered = render([], ["operator.cleanupCRD=true"])
    for kind in ("ClusterRole", "Role"):
        for rule in rules_of(rendered, kind):
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(key, []), (kind, rule)
            assert "secrets" not in rule["resources"], (kind, rule)
    cluster = rules_of(rendered, "ClusterRole")
    for verb in ("create", "update", "patch", "delete"):
        assert named(cluster, "apiextensions.k8s.io", "customresourcedefinitions", verb) == set()
    assert named(cluster, "", "namespaces", "patch") == {"gpu-operator"}
    # The CRD hooks may touch only our CRDs.
    for job in ("gpu-operator-upgrade-crd", "gpu-operator-cleanup-crd"):
        (hook_rule,) = rendered.one("ClusterRole", job)["rules"]
        assert set(hook_rule["resourceNames"]) == {
            "clusterpolicies.nvidia.com",
            "gpuclusters.nvidia.com",
            "nvidiadrivers.nvidia.com",
            "computedomains.resource.nvidia.com",
            "computedomaincliques.resource.nvidia.com",
        }


def test_every_rbac_rule_says_why() -> None:
    lines = (CHART / "templates" / "rbac.yaml").read_text().splitlines()
    rules = [n for n, line in enumerate(lines) if line.strip().startswith("- apiGroups:")]
    assert len(rules) > 20
    for number in rules:
        assert lines[number - 1].strip().startswith("#"), (
            f"rbac.yaml:{number + 1}: rule without a comment saying why"
        )


def test_crd_hooks(render: Any) -> None:
    rendered = render()
    job = rendered.one("Job", "gpu-operator-upgrade-crd")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-upgrade"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["gpu-operator", "crds", "--apply"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    crd_jobs = [j for j in rendered.of_kind("Job") if j["metadata"]["name"].endswith("-crd")]
    assert crd_jobs == [job]  # no CRD cleanup hook unless asked for
    cleanup = render([], ["operator.cleanupCRD=true", "operator.upgradeCRD=false"]).one(
        "Job", "gpu-operator-cleanup-crd"
    )
    assert cleanup["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    assert cleanup["spec"]["template"]["spec"]["containers"][0]["command"][-1] == "--delete"


def test_node_cleanup_hook_runs_after_uninstall_with_only_node_patch_rights(render: Any) -> None:
    rendered = render()
    job = rendered.one("Job", "gpu-operator-cleanup-nodes")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-delete"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["gpu-operator", "cleanup-nodes"]
    assert container["env"][0]["name"] == "OPERATOR_NAMESPACE"
    (nodes,) = rendered.one("ClusterRole", "gpu-operator-cleanup-nodes")["rules"]
    assert (nodes["resources"], nodes["verbs"]) == (["nodes"], ["list", "patch"])
    (pods,) = rendered.one("Role", "gpu-operator-cleanup-nodes")["rules"]
    assert (pods["resources"], pods["verbs"]) == (["pods"], ["list"])
    off = render([], ["operator.cleanupNodeLabels=false"])
    assert not [j for j in off.of_kind("Job") if j["metadata"]["name"].endswith("-nodes")]


def test_prometheus_rule_alerts(render: Any) -> None:
    rule = render([], ["monitoring.prometheusRule.enabled=true"]).one("PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert alerts["GPUTemperatureHigh"]["expr"] == "DCGM_FI_DEV_GPU_TEMP > 85"
    assert alerts["GPUTemperatureCritical"]["expr"] == "DCGM_FI_DEV_GPU_TEMP > 90"
    assert alerts["GPUTemperatureCritical"]["labels"]["severity"] == "critical"
    assert "DCGM_FI_DEV_FB_FREE" in alerts["GPUFramebufferNearlyFull"]["expr"]
    assert alerts["GPUFramebufferNearlyFull"]["expr"].endswith("> 95")
    assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" in alerts["GPUDoubleBitECCErrors"]["expr"]
    assert "DCGM_FI_DEV_XID_ERRORS" in alerts["GPUXIDError"]["expr"]
    assert alerts["GPUUtilizationSustainedHigh"]["for"] == "30m"
    assert "DCGM_FI_DEV_GPU_UTIL[30m]) > 95" in alerts["GPUUtilizationSustainedHigh"]["expr"]
    assert "gpu_operator_reconciliation_status" in alerts["GPUOperatorReconcileFailing"]["expr"]
    assert "gpu_operator_nodes_upgrades_failed" in alerts["GPUOperatorDriverUpgradeFailed"]["expr"]
    described = alerts["GPUTemperatureHigh"]["annotations"]["description"]
    assert "{{ $labels.Hostname }}" in described
    assert render().of_kind("PrometheusRule") == []


def test_grafana_dashboard_uses_dcgm_exporter_metrics(render: Any) -> None:
    config = render([], ["monitoring.grafanaDashboard.enabled=true"]).one(
        "ConfigMap", "gpu-operator-dcgm-dashboard"
    )
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config["data"]["nvidia-dcgm-exporter.json"])
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    metrics = set(re.findall(r"DCGM_FI_[A-Z_]+", exprs))
    assert {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED",
            "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS"} <= metrics  # fmt: skip
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_node_feature_rule_labels_kernel_module_capabilities(render: Any) -> None:
    rule = render([], ["nfd.nodefeaturerules=true"]).one("NodeFeatureRule")
    labels = {k for r in rule["spec"]["rules"] for k in r["labels"]}
    assert labels == {f"nvidia.com/{x}.capable" for x in ("gds", "gdrcopy", "peermem")}
