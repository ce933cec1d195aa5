"""The common DaemonSet transforms (reference §3.5), checked on real operand DaemonSets."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from operand_helpers import (
    ctr,
    env_of,
    find,
    make_facts,
    make_policy,
    mounts_of,
    names,
    pod,
    render_ds,
    volumes_of,
)

from gpu_operator.operands import (
    cc_manager,
    container_toolkit,
    dcgm,
    dcgm_exporter,
    device_plugin,
    driver,
    gpu_feature_discovery,
    kata_device_plugin,
    mig_manager,
    mps_control_daemon,
    node_status_exporter,
    operator_validation,
    sandbox_device_plugin,
    sandbox_validation,
    vfio_manager,
    vgpu_device_manager,
    vgpu_manager,
)

SANDBOX = {"sandboxWorkloads": {"enabled": True}}

# (module, DaemonSet name, deploy label) — reference §3.3 names and §4.3 deploy labels.
DAEMONSETS: list[tuple[ModuleType, str, str]] = [
    (driver, "nvidia-driver-daemonset", "driver"),
    (container_toolkit, "nvidia-container-toolkit-daemonset", "container-toolkit"),
    (operator_validation, "nvidia-operator-validator", "operator-validator"),
    (device_plugin, "nvidia-device-plugin-daemonset", "device-plugin"),
    (mps_control_daemon, "nvidia-device-plugin-mps-control-daemon", "device-plugin"),
    (dcgm, "nvidia-dcgm", "dcgm"),
    (dcgm_exporter, "nvidia-dcgm-exporter", "dcgm-exporter"),
    (gpu_feature_discovery, "gpu-feature-discovery", "gpu-feature-discovery"),
    (mig_manager, "nvidia-mig-manager", "mig-manager"),
    (node_status_exporter, "nvidia-node-status-exporter", "node-status-exporter"),
    (vgpu_manager, "nvidia-vgpu-manager-daemonset", "vgpu-manager"),
    (vgpu_device_manager, "nvidia-vgpu-device-manager", "vgpu-device-manager"),
    (sandbox_validation, "nvidia-sandbox-validator", "sandbox-validator"),
    (vfio_manager, "nvidia-vfio-manager", "vfio-manager"),
    (sandbox_device_plugin, "nvidia-sandbox-device-plugin-daemonset", "sandbox-device-plugin"),
    (
        kata_device_plugin,
        "nvidia-kata-sandbox-device-plugin-daemonset",
        "kata-sandbox-device-plugin",
    ),
    (cc_manager, "nvidia-cc-manager", "cc-manager"),
]
IDS = [d[1] for d in DAEMONSETS]
RUNTIME_CLASS_USERS = {
    "gpu-feature-discovery",
    "nvidia-device-plugin-daemonset",
    "nvidia-device-plugin-mps-control-daemon",
    "nvidia-dcgm",
    "nvidia-dcgm-exporter",
    "nvidia-mig-manager",
    "nvidia-operator-validator",
}


def render(module: ModuleType, **sections: Any) -> dict[str, Any]:
    return render_ds(module, make_policy(**sections))


@pytest.mark.parametrize(("module", "name", "deploy"), DAEMONSETS, ids=IDS)
def test_names_selectors_and_node_selectors(module: ModuleType, name: str, deploy: str) -> None:
    ds = render(module)
    assert ds["metadata"]["name"] == name
    # The whole selector and pod labels are pinned against upstream in test_parity_labels.py.
    assert ds["spec"]["selector"]["matchLabels"]["app"] == name
    assert ds["spec"]["template"]["metadata"]["labels"]["app"] == name
    # The state label marks the DaemonSet for pruning; it is never on its pods.
    assert ds["metadata"]["labels"]["nvidia.com/gpu-operator.state"] == module.NAME
    selector = pod(ds)["nodeSelector"]
    assert selector[f"nvidia.com/gpu.deploy.{deploy}"] == "true"
    expected_extra = {"nvidia.com/mps.capable": "true"} if module is mps_control_daemon else {}
    assert {k: v for k, v in selector.items() if "gpu.deploy" not in k} == expected_extra
    assert pod(ds)["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]


@pytest.mark.parametrize(("module", "name", "deploy"), DAEMONSETS, ids=IDS)
def test_runtime_class_only_on_the_upstream_list(
    module: ModuleType, name: str, deploy: str
) -> None:
    ds = render(module)
    assert pod(ds).get("runtimeClassName") == ("nvidia" if name in RUNTIME_CLASS_USERS else None)


@pytest.mark.parametrize(
    ("sections", "runtime", "expected"),
    [
        ({"operator": {"runtimeClass": "nv"}}, "containerd", "nv"),
        ({"cdi": {"enabled": False}}, "containerd", "nvidia"),
        ({"cdi": {"enabled": False}}, "crio", None),
        ({}, "crio", "nvidia"),
        ({"cdi": {"nriPluginEnabled": True}}, "containerd", None),
    ],
)
def test_runtime_class_rules(sections: dict[str, Any], runtime: str, expected: str | None) -> None:
    ds = render_ds(device_plugin, make_policy(**sections), make_facts(runtime=runtime))
    assert pod(ds).get("runtimeClassName") == expected


def test_nri_annotates_each_container_instead() -> None:
    ds = render(
        device_plugin, cdi={"nriPluginEnabled": True}, devicePlugin={"config": {"name": "c"}}
    )
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        "nvidia.cdi.k8s.io/container.nvidia-device-plugin": "management.nvidia.com/gpu=all",
        "nvidia.cdi.k8s.io/container.config-manager": "management.nvidia.com/gpu=all",
    }


@pytest.mark.parametrize(
    ("daemonsets", "expected"),
    [
        ({}, {"type": "RollingUpdate"}),
        (
            {"rollingUpdate": {"maxUnavailable": "1"}},
            {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
        ),
        (
            {"rollingUpdate": {"maxUnavailable": "25%"}},
            {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%"}},
        ),
        (
            {"updateStrategy": "OnDelete", "rollingUpdate": {"maxUnavailable": "3"}},
            {"type": "OnDelete"},
        ),
    ],
)
def test_update_strategy(daemonsets: dict[str, Any], expected: dict[str, Any]) -> None:
    assert (
        render(gpu_feature_discovery, daemonsets=daemonsets)["spec"]["updateStrategy"] == expected
    )


def test_driver_keeps_on_delete_whatever_the_policy() -> None:
    ds = render(
        driver,
        daemonsets={"updateStrategy": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "5"}},
    )
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}


def test_priority_tolerations_and_security_context() -> None:
    ds = render(
        dcgm_exporter,
        daemonsets={
            "priorityClassName": "system-node-critical",
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute"}
            ],
            "podSecurityContext": {"runAsUser": 0, "fsGroup": 2000},
        },
    )
    spec = pod(ds)
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute"}
    ]
    assert spec["securityContext"] == {"runAsUser": 0, "fsGroup": 2000}


def test_labels_and_annotations_go_to_template_and_metadata_but_not_selector_keys() -> None:
    labels = {"team": "ml", "app": "evil", "app.kubernetes.io/part-of": "evil"}
    ds = render(device_plugin, daemonsets={"labels": labels, "annotations": {"a": "b"}})
    for meta in (ds["metadata"], ds["spec"]["template"]["metadata"]):
        assert meta["labels"]["team"] == "ml"
        assert meta["labels"]["app"] == "nvidia-device-plugin-daemonset"
        assert meta["annotations"] == {"a": "b"}
    template = ds["spec"]["template"]["metadata"]["labels"]
    assert "app.kubernetes.io/part-of" not in template  # upstream's plugin pods have none
    assert ds["spec"]["selector"] == {"matchLabels": {"app": "nvidia-device-plugin-daemonset"}}


def test_host_root_rewrites_volumes_and_sets_env_everywhere() -> None:
    ds = render(container_toolkit, hostPaths={"rootFS": "/mnt/root"})
    volumes = volumes_of(ds)
    assert volumes["host-root"]["hostPath"]["path"] == "/mnt/root"
    assert volumes["host-dev-char"]["hostPath"]["path"] == "/mnt/root/dev/char"
    for container in [*pod(ds)["initContainers"], *pod(ds)["containers"]]:
        assert env_of(container)["HOST_ROOT"] == "/mnt/root"


def test_default_host_root_adds_nothing() -> None:
    ds = render(container_toolkit)
    assert "HOST_ROOT" not in env_of(ctr(ds, "driver-validation"))
    assert volumes_of(ds)["host-root"]["hostPath"]["path"] == "/"


def test_driver_install_dir_moves_the_driver_validation() -> None:
    ds = render(operator_validation, hostPaths={"driverInstallDir": "/opt/nvidia"})
    assert volumes_of(ds)["driver-install-dir"]["hostPath"]["path"] == "/opt/nvidia"
    validation = ctr(ds, "driver-validation")
    assert env_of(validation)["DRIVER_INSTALL_DIR"] == "/opt/nvidia"
    assert env_of(validation)["DRIVER_INSTALL_DIR_CTR_PATH"] == "/opt/nvidia"
    assert mounts_of(validation)["/opt/nvidia"] == "driver-install-dir"
    assert "DRIVER_INSTALL_DIR" not in env_of(ctr(ds, "toolkit-validation"))


@pytest.mark.parametrize(
    ("mig", "expected"),
    [
        (None, {"NVIDIA_MIG_MONITOR_DEVICES": "all"}),
        ({"strategy": "none"}, {"MIG_STRATEGY": "none"}),
        ({"strategy": "single"}, {"MIG_STRATEGY": "single", "NVIDIA_MIG_MONITOR_DEVICES": "all"}),
        ({"strategy": "mixed"}, {"MIG_STRATEGY": "mixed", "NVIDIA_MIG_MONITOR_DEVICES": "all"}),
    ],
)
@pytest.mark.parametrize(
    ("module", "container"),
    [
        (device_plugin, "nvidia-device-plugin"),
        (gpu_feature_discovery, "gpu-feature-discovery"),
        (mps_control_daemon, "mps-control-daemon-ctr"),
    ],
)
def test_mig_env(
    module: ModuleType, container: str, mig: dict[str, str] | None, expected: dict[str, str]
) -> None:
    ds = render(module, **({"mig": mig} if mig else {}))
    found = env_of(ctr(ds, container))
    assert {
        k: found[k] for k in ("MIG_STRATEGY", "NVIDIA_MIG_MONITOR_DEVICES") if k in found
    } == expected


def test_validation_inits_get_the_validator_image_and_settings() -> None:
    validator = {
        "repository": "nvcr.io/nvidia",
        "image": "gpu-operator",
        "version": "v26.7.0",
        "imagePullPolicy": "Always",
        "imagePullSecrets": ["regcred", "regcred"],
        "resources": {"limits": {"cpu": "100m"}},
        "toolkit": {"env": [{"name": "EXTRA", "value": "1"}]},
    }
    ds = render(
        device_plugin, validator=validator, devicePlugin={"imagePullSecrets": ["regcred", "other"]}
    )
    init = ctr(ds, "toolkit-validation")
    assert init["image"] == "nvcr.io/nvidia/gpu-operator:v26.7.0"
    assert init["imagePullPolicy"] == "Always"
    assert init["securityContext"]["runAsUser"] == 0
    assert init["resources"] == {"limits": {"cpu": "100m"}}
    assert env_of(init)["EXTRA"] == "1"
    assert pod(ds)["imagePullSecrets"] == [{"name": "regcred"}, {"name": "other"}]


def test_operand_fields_image_policy_resources_args_env_host_network() -> None:
    plugin = {
        "repository": "r.example/nvidia",
        "image": "k8s-device-plugin",
        "version": "sha256:abc",
        "imagePullPolicy": "Sometimes",
        "resources": {"requests": {"memory": "64Mi"}},
        "args": ["--fail-on-init-error=false"],
        "env": [{"name": "DEVICE_ID_STRATEGY", "value": "index"}, {"name": "NEW", "value": "x"}],
        "config": {"name": "plugin-configs"},
    }
    ds = render(device_plugin, devicePlugin=plugin)
    main = ctr(ds, "nvidia-device-plugin")
    assert main["image"] == "r.example/nvidia/k8s-device-plugin@sha256:abc"
    assert main["imagePullPolicy"] == "IfNotPresent"
    assert main["args"] == ["--fail-on-init-error=false"]
    env = env_of(main)
    assert (env["DEVICE_ID_STRATEGY"], env["NEW"]) == ("index", "x")
    assert [e["name"] for e in main["env"]].count("DEVICE_ID_STRATEGY") == 1
    for container in pod(ds)["containers"]:
        assert container["resources"] == {"requests": {"memory": "64Mi"}}
    assert "resources" not in ctr(ds, "toolkit-validation")


def test_user_env_overrides_operator_env() -> None:
    ds = render(
        dcgm_exporter,
        dcgm={"enabled": True},
        dcgmExporter={"env": [{"name": "DCGM_REMOTE_HOSTENGINE_INFO", "value": "localhost:5555"}]},
    )
    assert (
        env_of(ctr(ds, "nvidia-dcgm-exporter"))["DCGM_REMOTE_HOSTENGINE_INFO"] == "localhost:5555"
    )
    assert pod(ds)["hostNetwork"] is True
    assert pod(ds)["dnsPolicy"] == "ClusterFirstWithHostNet"


def test_host_network_sets_dns_policy() -> None:
    ds = render(dcgm_exporter, dcgmExporter={"hostNetwork": True})
    assert (pod(ds)["hostNetwork"], pod(ds)["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert "hostNetwork" not in pod(render(dcgm_exporter))


def test_operands_wait_for_the_toolkit() -> None:
    for module in (
        device_plugin,
        gpu_feature_discovery,
        dcgm,
        dcgm_exporter,
        mig_manager,
        mps_control_daemon,
    ):
        ds = render(module)
        init = ctr(ds, "toolkit-validation")
        assert "/run/nvidia/validations/toolkit-ready" in init["args"][0]
        assert names(ds, "initContainers")[0] == "toolkit-validation"


def test_rbac_binds_the_operand_service_account() -> None:
    objects = device_plugin.render(make_policy(), make_facts(namespace="gpu"))
    binding = find(objects, "ClusterRoleBinding", "nvidia-device-plugin")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "nvidia-device-plugin", "namespace": "gpu"}
    ]
    assert pod(find(objects, "DaemonSet"))["serviceAccountName"] == "nvidia-device-plugin"
    kinds = [o["kind"] for o in objects]
    assert kinds.index("ServiceAccount") < kinds.index("ConfigMap") < kinds.index("DaemonSet")
