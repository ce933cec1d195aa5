"""`helm lint` and `helm template` for the common setups: every object valid for Kubernetes 1.35,
the ClusterPolicy valid for the operator and mapped from the values like NVIDIA's chart does."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpu_operator.api import check_document, crds
from gpu_operator.api.images import IMAGE_ENV
from gpu_operator.operands import dra_driver
from gpu_operator.operands.facts import ClusterFacts
from gpu_operator.upgrade import selectors
from gpu_operator.upgrade.snapshot import owner_from

from .conftest import CHART, NAMESPACE, Rendered, helm, needs_helm

pytestmark = needs_helm

CI = CHART / "ci"
OURS = {"ClusterPolicy", "NVIDIADriver"}
# Third-party CRD kinds kubernetes-validate has no schema for; tests below check their shape.
THIRD_PARTY = {"ServiceMonitor", "PrometheusRule", "NodeFeatureRule"}
EVERYTHING_ON = (
    "monitoring.prometheusRule.enabled=true",
    "monitoring.grafanaDashboard.enabled=true",
    "nfd.nodefeaturerules=true",
    "operator.cleanupCRD=true",
)


def subset(expected: Any, actual: Any, path: str = "spec") -> None:
    """Every key of `expected` is in `actual` with that value (lists compared whole)."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: expected a mapping, got {actual!r}"
        for key, value in expected.items():
            assert key in actual, f"{path}.{key} missing"
            subset(value, actual[key], f"{path}.{key}")
    else:
        assert actual == expected, f"{path}: expected {expected!r}, got {actual!r}"


def validate_all(rendered: Rendered) -> set[str]:
    kinds = set()
    for obj in rendered.objects:
        kind = obj["kind"]
        kinds.add(kind)
        if kind in OURS:
            checked = check_document(obj)
            assert checked.errors == [], checked.errors
            assert checked.warnings == [], checked.warnings
        elif kind in THIRD_PARTY:
            assert obj["metadata"]["name"]
        else:
            kubernetes_validate.validate(obj, "1.35.0", strict=True)
    return kinds


SETUPS: dict[str, dict[str, Any]] = {
    "default": {
        "driver": {"enabled": True, "repository": "nvcr.io/nvidia", "image": "driver",
                   "upgradePolicy": {"autoUpgrade": True, "maxUnavailable": "25%",
                                     "podDeletion": {"timeoutSeconds": 300}}},
        "mig": {"strategy": "single"},
        "cdi": {"enabled": True, "nriPluginEnabled": False},
        "daemonsets": {"priorityClassName": "system-node-critical",
                       "rollingUpdate": {"maxUnavailable": "1"}},
        "migManager": {"enabled": True, "config": {"default": "all-disabled"}},
        "dcgm": {"enabled": False},
    },
    "aks-rdma-values.yaml": {
        "driver": {"enabled": True, "rdma": {"enabled": True, "useHostMofed": False}},
        "migManager": {"enabled": False},
        "vgpuDeviceManager": {"enabled": False},
        "vfioManager": {"enabled": False},
        "sandboxDevicePlugin": {"enabled": False},
        "dcgmExporter": {"enabled": True, "serviceMonitor": {"enabled": True, "interval": "15s"}},
    },
    "time-slicing-values.yaml": {
        "devicePlugin": {"config": {"name": "time-slicing-config", "default": "any"}},
    },
    "mig-mixed-values.yaml": {
        "mig": {"strategy": "mixed"},
        "migManager": {"enabled": True, "config": {"name": "custom-mig-config",
                                                   "default": "all-disabled"},
                       "env": [{"name": "WITH_REBOOT", "value": "true"}]},
    },
    "kubevirt-passthrough-values.yaml": {
        "sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-passthrough",
                             "mode": "kubevirt"},
        "vfioManager": {"enabled": True},
        "sandboxDevicePlugin": {"enabled": True},
    },
    "nvidiadriver-crd-values.yaml": {
        "driver": {"enabled": True, "useNvidiaDriverCRD": True, "kernelModuleType": "open",
                   "upgradePolicy": {"maxParallelUpgrades": 2, "maxUnavailable": "50%",
                                     "podDeletion": {"force": True, "timeoutSeconds": 600,
                                                     "deleteEmptyDir": True}}},
    },
    # The startup taint goes to the operator's env (tests/chart/test_startup_taint_values.py).
    "startup-taint-values.yaml": {"daemonsets": {"priorityClassName": "system-node-critical"}},
    "custom-registry-values.yaml": {
        "driver": {"repository": "registry.example.com/nvidia", "imagePullSecrets": ["regcred"]},
        "toolkit": {"repository": "registry.example.com/nvidia/k8s"},
        "devicePlugin": {"imagePullSecrets": ["regcred"]},
        "validator": {"repository": "registry.example.com/nvidia/cloud-native"},
    },
}  # fmt: skip


def values_for(setup: str) -> list[Path]:
    return [] if setup == "default" else [CI / setup]


def test_every_ci_values_file_has_a_setup() -> None:
    assert {p.name for p in CI.glob("*.yaml")} == set(SETUPS) - {"default"}


def test_helm_lint_passes_for_the_source_chart_and_every_setup() -> None:
    lint = helm("lint", str(CHART))
    assert lint.returncode == 0, lint.stdout + lint.stderr
    # The NFD sub-chart ships in charts/, so nothing is missing from a source checkout.
    warnings = [line for line in lint.stdout.splitlines() if "[WARNING]" in line]
    assert warnings == []


def test_helm_lint_strict_passes_for_the_packaged_chart(packaged_chart: Path) -> None:
    for values in [[], *([["-f", str(p)]] for p in sorted(CI.glob("*.yaml")))]:
        lint = helm("lint", "--strict", str(packaged_chart), *[a for v in values for a in v])
        assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_setup_renders_valid_objects_and_the_expected_policy(render: Any, setup: str) -> None:
    rendered = render(values_for(setup))
    kinds = validate_all(rendered)
    assert {"ClusterPolicy", "Deployment", "ServiceAccount", "ClusterRole", "Role"} <= kinds
    policy = rendered.one("ClusterPolicy", "cluster-policy")
    subset(SETUPS[setup], policy["spec"])
    # Chart-only knobs never reach the API object.
    spec = policy["spec"]
    assert "nvidiaDriverCRD" not in spec["driver"]
    assert "gpuPodDeletion" not in spec["driver"].get("upgradePolicy", {})
    for section in ("devicePlugin", "migManager", "dcgmExporter"):
        assert not {"create", "data"} & set(spec[section].get("config", {}))
    assert spec["daemonsets"]["labels"]["app.kubernetes.io/managed-by"] == "gpu-operator"
    assert spec["daemonsets"]["labels"]["helm.sh/chart"].startswith("gpu-operator-")


def test_everything_enabled_renders_valid_objects(render: Any) -> None:
    rendered = render([CI / "custom-registry-values.yaml"], EVERYTHING_ON)
    kinds = validate_all(rendered)
    assert {"PrometheusRule", "NodeFeatureRule", "ConfigMap", "Job", "Secret"} <= kinds


def test_aks_setup_renders_no_nfd_at_all(render: Any) -> None:
    rendered = render([CI / "aks-rdma-values.yaml"], (), "--include-crds")
    names = {o["metadata"]["name"] for o in rendered.objects}
    assert not any("node-feature-discovery" in n or "nfd.k8s-sigs.io" in n for n in names)


def test_nfd_enabled_renders_nfd_with_the_subchart_values(render: Any) -> None:
    rendered = render(
        [], ["node-feature-discovery.worker.config.sources.pci.deviceLabelFields={vendor,device}"]
    )
    worker_conf = rendered.one("ConfigMap", "gpu-operator-node-feature-discovery-worker-conf")
    worker = yaml.safe_load(worker_conf["data"]["nfd-worker.conf"])
    assert worker["sources"]["pci"]["deviceLabelFields"] == ["vendor", "device"]
    assert worker["sources"]["pci"]["deviceClassWhitelist"] == [
        "02",
        "0200",
        "0207",
        "0300",
        "0302",
    ]
    master_conf = rendered.one("ConfigMap", "gpu-operator-node-feature-discovery-master-conf")
    assert yaml.safe_load(master_conf["data"]["nfd-master.conf"]) == {
        "extraLabelNs": ["nvidia.com"]
    }
    daemonset = rendered.one("DaemonSet", "gpu-operator-node-feature-discovery-worker")
    pod = daemonset["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["containers"][0]["image"] == "registry.k8s.io/nfd/node-feature-discovery:v0.19.0"
    assert pod["serviceAccountName"] == "node-feature-discovery"  # NVIDIA's shared account
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert all(m.get("readOnly") for m in mounts.values())
    assert {"/host-sys", "/host-etc/os-release", "/host-boot"} <= set(mounts)
    master = rendered.one("Deployment", "gpu-operator-node-feature-discovery-master")
    container = master["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["nfd-master"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}


def test_nfd_prune_hook_runs_after_uninstall_with_its_own_rbac(render: Any) -> None:
    hooks = [
        o
        for o in render().objects
        if (o["metadata"].get("annotations") or {}).get("helm.sh/hook") == "post-delete"
    ]
    prune = next(o for o in hooks if o["kind"] == "Job" and o["metadata"]["name"].endswith("prune"))
    assert prune["spec"]["template"]["spec"]["containers"][0]["args"] == ["-prune"]
    role = next(o for o in hooks if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith(
        "prune"))  # fmt: skip
    assert role["rules"][0]["resources"] == ["nodes", "nodes/status"]


def test_unsupported_nfd_parts_fail_naming_the_key(render: Any) -> None:
    rendered = render([], ["node-feature-discovery.topologyUpdater.enable=true"])
    assert rendered.returncode != 0
    assert "node-feature-discovery.topologyUpdater.enable: not supported" in rendered.stderr


def test_chart_declares_the_bundled_nfd_dependency_behind_its_condition() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (dep,) = chart["dependencies"]
    assert dep["name"] == "node-feature-discovery"
    assert dep["condition"] == "nfd.enabled"
    # No repository: helm takes the sub-chart from charts/, offline.
    assert "repository" not in dep
    bundled = yaml.safe_load(
        (CHART / "charts" / "node-feature-discovery" / "Chart.yaml").read_text()
    )
    assert bundled["version"] == dep["version"]


@pytest.mark.parametrize("nfd", ["true", "false"])
def test_source_checkout_renders_offline_with_nfd_on_or_off(nfd: str, tmp_path: Path) -> None:
    # No repositories configured, no cache: any download would fail.
    env = {
        "HELM_REPOSITORY_CONFIG": str(tmp_path / "repositories.yaml"),
        "HELM_REPOSITORY_CACHE": str(tmp_path / "cache"),
        "HELM_REGISTRY_CONFIG": str(tmp_path / "registry.json"),
    }
    chart = tmp_path / "gpu-operator"
    shutil.copytree(CHART, chart)  # `dependency build` writes Chart.lock: not into the checkout
    build = helm("dependency", "build", str(chart), env=env)
    assert build.returncode == 0, build.stderr
    assert (chart / "charts" / "node-feature-discovery" / "Chart.yaml").is_file()
    proc = helm("template", "x", str(chart), "--set", f"nfd.enabled={nfd}", env=env)
    assert proc.returncode == 0, proc.stderr
    assert ("node-feature-discovery-worker" in proc.stdout) == (nfd == "true")


def test_packaged_chart_renders_what_the_checkout_renders(packaged_chart: Path) -> None:
    for values in ([], ["-f", str(CI / "aks-rdma-values.yaml")]):
        from_dir = helm("template", "x", str(CHART), "--include-crds", *values, check=True)
        from_archive = helm(
            "template", "x", str(packaged_chart), "--include-crds", *values, check=True
        )
        assert from_dir.stdout == from_archive.stdout


def test_nvidiadriver_mode_renders_the_default_driver_without_images_in_the_policy(
    render: Any,
) -> None:
    rendered = render([CI / "nvidiadriver-crd-values.yaml"])
    driver = rendered.one("ClusterPolicy")["spec"]["driver"]
    assert not {"repository", "image", "version"} & set(driver)
    nvd = rendered.one("NVIDIADriver", "default")["spec"]
    subset(
        {"default": True, "driverType": "gpu", "repository": "nvcr.io/nvidia", "image": "driver",
         "version": "570.195.03", "kernelModuleType": "open",
         "upgradePolicy": {"podDeletion": {"force": True, "timeoutSeconds": 600}},
         "priorityClassName": "system-node-critical"},
        nvd,
    )  # fmt: skip
    assert "nodeSelector" not in nvd


def test_the_default_nvidiadriver_carries_the_charts_upgrade_policy_as_upstreams_does(
    render: Any,
) -> None:
    """Upstream's template (26.x) writes driver.upgradePolicy into the default NVIDIADriver, with
    `gpuPodDeletion` as `podDeletion`; that policy, not the ClusterPolicy's, then governs."""
    rendered = render([], ["driver.nvidiaDriverCRD.enabled=true"])
    nvd = rendered.one("NVIDIADriver", "default")
    assert nvd["spec"]["upgradePolicy"] == {
        "autoUpgrade": True,
        "maxParallelUpgrades": 1,
        "maxUnavailable": "25%",
        "waitForCompletion": {"timeoutSeconds": 0},
        "podDeletion": {"force": False, "timeoutSeconds": 300, "deleteEmptyDir": False},
        "drain": {"enable": False, "force": False, "timeoutSeconds": 300,
                  "deleteEmptyDir": False},
    }  # fmt: skip
    off = render([], ["driver.nvidiaDriverCRD.enabled=true",
                      "driver.upgradePolicy.autoUpgrade=false",
                      "driver.upgradePolicy.drain.podSelector=app=batch"])  # fmt: skip
    policy = owner_from(off.one("NVIDIADriver", "default")).policy
    assert policy.auto_upgrade is False
    assert policy.drain_selector == selectors.parse("app=batch")


def test_nvidiadriver_with_a_node_selector_is_not_the_default(render: Any) -> None:
    rendered = render(
        [CI / "nvidiadriver-crd-values.yaml"], ["driver.nvidiaDriverCRD.nodeSelector.pool=a100"]
    )
    nvd = rendered.one("NVIDIADriver", "default")
    assert nvd["spec"]["default"] is False
    assert nvd["spec"]["nodeSelector"] == {"pool": "a100"}
    assert check_document(nvd).errors == []


def test_no_nvidiadriver_unless_the_crd_mode_and_default_cr_are_on(render: Any) -> None:
    assert render().of_kind("NVIDIADriver") == []
    off = render(
        [CI / "nvidiadriver-crd-values.yaml"], ["driver.nvidiaDriverCRD.deployDefaultCR=false"]
    )
    assert off.of_kind("NVIDIADriver") == []


def test_nri_is_written_only_with_cdi(render: Any) -> None:
    on = render([], ["cdi.nriPluginEnabled=true"]).one("ClusterPolicy")["spec"]["cdi"]
    assert on == {"enabled": True, "nriPluginEnabled": True}


def test_config_maps_are_created_from_data(render: Any, tmp_path: Path) -> None:
    rendered = render([CI / "time-slicing-values.yaml"])
    config = rendered.one("ConfigMap", "time-slicing-config")
    assert set(config["data"]) == {"any", "a100"}
    assert (
        yaml.safe_load(config["data"]["a100"])["sharing"]["timeSlicing"]["resources"][0]["replicas"]
        == 8
    )
    mig = render([CI / "mig-mixed-values.yaml"]).one("ConfigMap", "custom-mig-config")
    assert "half-and-half" in yaml.safe_load(mig["data"]["config.yaml"])["mig-configs"]
    values = tmp_path / "exporter.yaml"
    csv = "DCGM_FI_DEV_GPU_TEMP, gauge, temperature\n"
    config = {"create": True, "name": "metrics", "data": csv}
    values.write_text(yaml.safe_dump({"dcgmExporter": {"config": config}}))
    exporter = render([values])
    assert exporter.one("ConfigMap", "metrics")["data"]["dcgm-metrics.csv"].startswith(
        "DCGM_FI_DEV_GPU_TEMP"
    )
    assert exporter.one("ClusterPolicy")["spec"]["dcgmExporter"]["config"] == {"name": "metrics"}


def test_extra_objects_are_rendered_with_templates(render: Any) -> None:
    secret = render([CI / "custom-registry-values.yaml"]).one("Secret", "regcred")
    assert secret["metadata"]["namespace"] == NAMESPACE


def test_no_cluster_policy_when_deploy_cr_is_off(render: Any) -> None:
    assert render([], ["clusterPolicy.deployCR=false"]).of_kind("ClusterPolicy") == []


FAILURES = [
    (["gpuCluster.deployCR=true"], "clusterPolicy.deployCR and gpuCluster.deployCR are both true"),
    (["gpuCluster.deployCR=true", "clusterPolicy.deployCR=false"],
     "gpuCluster.deployCR needs driver.nvidiaDriverCRD.enabled=true"),
    (["gpuCluster.deployCR=true", "clusterPolicy.deployCR=false", "driver.enabled=false"],
     "gpuCluster.deployCR=true needs a cluster that serves Dynamic Resource Allocation"),
    (["cdi.enabled=false", "cdi.nriPluginEnabled=true"],
     "cdi.nriPluginEnabled=true needs cdi.enabled=true"),
    (["toolkit.enabled=false", "cdi.nriPluginEnabled=true"],
     "cdi.nriPluginEnabled=true needs toolkit.enabled=true"),
    (["devicePlugin.config.create=true", "devicePlugin.config.data.a=x"],
     "devicePlugin.config.create=true needs devicePlugin.config.name"),
    (["devicePlugin.config.create=true", "devicePlugin.config.name=c"],
     "devicePlugin.config.create=true needs devicePlugin.config.data"),
    (["devicePlugin.config.create=true", "devicePlugin.config.name=c",
      "devicePlugin.config.data.a=x", "devicePlugin.config.default=b"],
     'devicePlugin.config.default="b" is not a key of devicePlugin.config.data (keys: a)'),
    (["migManager.config.create=true"],
     "migManager.config.create=true needs migManager.config.data"),
    (["dcgmExporter.config.create=true", "dcgmExporter.config.data=x"],
     "dcgmExporter.config.create=true needs dcgmExporter.config.name"),
    (["operator.logging.level=verbose"], 'operator.logging.level="verbose": expected debug'),
]  # fmt: skip


@pytest.mark.parametrize(("sets", "message"), FAILURES, ids=[f[1][:40] for f in FAILURES])
def test_bad_values_fail_with_a_clear_message(render: Any, sets: list[str], message: str) -> None:
    rendered = render([], sets)
    assert rendered.returncode != 0
    assert message in rendered.stderr, rendered.stderr


def test_chart_crds_are_the_generated_ones() -> None:
    for filename, crd in crds.all_crds().items():
        committed = yaml.safe_load((CHART / "crds" / filename).read_text())
        assert committed == crd, (
            f"charts/gpu-operator/crds/{filename} is stale: run `gpu-operator crds --out "
            "deploy/crds && cp deploy/crds/*.yaml charts/gpu-operator/crds/`"
        )
    assert {p.name for p in (CHART / "crds").iterdir()} == set(crds.all_crds())


GPU_CLUSTER_SETS = ["gpuCluster.deployCR=true", "clusterPolicy.deployCR=false"]


@pytest.mark.parametrize("driver", ["driver.enabled=false", "driver.nvidiaDriverCRD.enabled=true"])
def test_gpucluster_deploy_cr_renders_a_valid_gpucluster_from_the_values(
    render: Any, driver: str
) -> None:
    """gpuCluster.deployCR alone (no ClusterPolicy) renders the GPUCluster `gpu-cluster` from
    draDriver.*, dcgm.*, dcgmExporter.*, hostPaths.* and daemonsets.*, and it passes the
    operator's own checks."""
    sets = [
        *GPU_CLUSTER_SETS, driver, "draDriver.featureGates.MPSSupport=true",
        "draDriver.computeDomains.enabled=false", "dcgm.enabled=true",
        "dcgmExporter.enablePodLabels=true", "hostPaths.kubeletRootDir=/var/lib/k0s/kubelet",
    ]  # fmt: skip
    rendered = render([], sets, "--api-versions", "resource.k8s.io/v1/DeviceClass")
    assert rendered.returncode == 0, rendered.stderr
    assert rendered.of_kind("ClusterPolicy") == []
    doc = rendered.one("GPUCluster", "gpu-cluster")
    checked = check_document(doc)
    assert checked.ok, checked.errors
    spec = doc["spec"]
    assert spec["draDriver"]["image"] == "dra-driver-nvidia-gpu"
    assert spec["draDriver"]["featureGates"] == {"MPSSupport": True}
    assert spec["draDriver"]["computeDomains"] == {"enabled": False}
    assert spec["dcgm"]["enabled"] is True
    assert spec["dcgmExporter"]["enabled"] is True
    assert spec["dcgmExporter"]["enablePodLabels"] is True
    assert spec["hostPaths"]["kubeletRootDir"] == "/var/lib/k0s/kubelet"
    assert spec["daemonsets"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    # The operator renders it: DCGM and the exporter on admin-access claims.
    cluster = checked.obj
    facts = ClusterFacts(operator_env=dict.fromkeys(IMAGE_ENV.values(), "r/i:1"))
    names = {o["metadata"]["name"] for o in dra_driver.render(cluster, facts).objects()}
    assert {dra_driver.DCGM_DRA, dra_driver.DCGM_EXPORTER_DRA} <= names
