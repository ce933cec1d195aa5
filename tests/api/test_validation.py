"""Semantic validation: every problem reported, each with its field path and what was expected."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpu_operator.api import check_document

BASE_SPEC: dict[str, Any] = {
    "operator": {},
    "daemonsets": {},
    "driver": {"repository": "nvcr.io/nvidia", "image": "driver", "version": "580.95.05"},
    "toolkit": {},
    "devicePlugin": {},
    "dcgmExporter": {},
    "dcgm": {},
    "nodeStatusExporter": {},
    "gfd": {},
}


def cp(**spec: Any) -> dict[str, Any]:
    merged = copy.deepcopy(BASE_SPEC)
    merged.update(spec)
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy"},
        "spec": merged,
    }


def nvd(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "NVIDIADriver",
        "metadata": {"name": "pool"},
        "spec": {"repository": "nvcr.io/nvidia", "image": "driver", "version": "1.2", **spec},
    }


def errors(doc: dict[str, Any]) -> list[str]:
    return [str(p) for p in check_document(doc).errors]


def warnings(doc: dict[str, Any]) -> list[str]:
    return [str(p) for p in check_document(doc).warnings]


def test_minimal_policy_is_valid() -> None:
    result = check_document(cp())
    assert result.ok, result.errors
    assert result.ref == "ClusterPolicy/cluster-policy"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"driver": {"upgradePolicy": {"maxUnavailable": "abc"}}},
            "spec.driver.upgradePolicy.maxUnavailable: expected an integer or a percentage like "
            '"25%", got "abc"',
        ),
        (
            {"daemonsets": {"rollingUpdate": {"maxUnavailable": "x"}}},
            "spec.daemonsets.rollingUpdate.maxUnavailable: expected an integer or a percentage",
        ),
        (
            {"driver": {"upgradePolicy": {"maxParallelUpgrades": -1}}},
            "spec.driver.upgradePolicy.maxParallelUpgrades: expected a number >= 0, got -1",
        ),
        (
            {"mig": {"strategy": "double"}},
            "spec.mig.strategy: expected one of 'none', 'single' or 'mixed', got \"double\"",
        ),
        (
            {"driver": {"enabled": "true"}},
            'spec.driver.enabled: expected true or false, got "true"',
        ),
        (
            {"driver": {"version": 550.1, "repository": "r", "image": "driver"}},
            "spec.driver.version: expected a string, got 550.1 (quote it in YAML)",
        ),
        (
            {"driver": {"kernelModuleType": "precompiled"}},
            "spec.driver.kernelModuleType: expected one of 'auto', 'open' or 'proprietary'",
        ),
        (
            {"cdi": {"enabled": False, "nriPluginEnabled": True}},
            "spec.cdi.nriPluginEnabled: the NRI plugin needs spec.cdi.enabled: true",
        ),
        (
            {"toolkit": {"enabled": False}, "cdi": {"nriPluginEnabled": True}},
            "spec.cdi.nriPluginEnabled: the NRI plugin needs the container toolkit",
        ),
        (
            {"devicePlugin": {"repository": "nvcr.io/nvidia", "image": "k8s-device-plugin"}},
            "spec.devicePlugin.version: required when spec.devicePlugin.repository is set",
        ),
        (
            {"gfd": {"image": "k8s-device-plugin"}},
            'spec.gfd.image: expected a full image reference like "k8s-device-plugin:<tag>"',
        ),
        (
            {"toolkit": {"installDir": "usr/local/nvidia"}},
            'spec.toolkit.installDir: expected an absolute path, got "usr/local/nvidia"',
        ),
        (
            {"daemonsets": {"tolerations": [{"operator": "Exists", "value": "x"}]}},
            'spec.daemonsets.tolerations[0].value: must be empty when operator is "Exists"',
        ),
        (
            {"daemonsets": {"labels": {"bad key!": "v"}}},
            "spec.daemonsets.labels.bad key!: invalid label key",
        ),
        (
            {"driver": {"resources": {"limits": {"memory": "lots"}}}},
            'spec.driver.resources.limits.memory: expected a quantity like 500m, 2 or "1Gi", '
            'got "lots"',
        ),
        (
            {"driver": {"usePrecompiled": True}, "gds": {"enabled": True}},
            "spec.gds.enabled: not supported together with precompiled drivers",
        ),
        (
            {"driver": {"env": [{"name": ""}]}},
            "spec.driver.env[0].name: expected a non-empty name",
        ),
        (
            {"dcgmExporter": {"serviceMonitor": {"interval": "15 seconds"}}},
            "spec.dcgmExporter.serviceMonitor.interval: expected a string matching",
        ),
        ({"gfd": None}, "spec.gfd: expected an object, got null"),
    ],
)
def test_clusterpolicy_problem_is_reported_with_its_path(
    spec: dict[str, Any], expected: str
) -> None:
    doc = cp()
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(doc["spec"].get(key), dict):
            doc["spec"][key] = {**doc["spec"][key], **value}
        else:
            doc["spec"][key] = value
    found = errors(doc)
    assert any(line.startswith(expected) for line in found), found


def test_missing_required_section() -> None:
    doc = cp()
    del doc["spec"]["gfd"]
    assert errors(doc) == ["spec.gfd: required field is missing"]


def test_all_problems_are_reported_not_just_the_first() -> None:
    doc = cp(
        driver={"enabled": "yes", "upgradePolicy": {"maxUnavailable": "abc"}},
        mig={"strategy": "double"},
        toolkit={"installDir": "relative"},
        cdi={"enabled": False, "nriPluginEnabled": True},
    )
    found = errors(doc)
    assert len(found) == 5, found
    assert {line.split(":")[0] for line in found} == {
        "spec.driver.enabled",
        "spec.driver.upgradePolicy.maxUnavailable",
        "spec.mig.strategy",
        "spec.toolkit.installDir",
        "spec.cdi.nriPluginEnabled",
    }


def test_unknown_fields_are_warnings_with_a_suggestion() -> None:
    doc = cp(daemonsets={"priorityClasName": "system-node-critical"})
    doc["spec"]["devicePlugn"] = {}
    found = warnings(doc)
    assert (
        'spec.daemonsets.priorityClasName: unknown field (did you mean "priorityClassName"?): '
        "kubectl rejects the object (strict field validation, its default); with kubectl "
        "--validate=false, or a client that does not ask for strict validation, the API server "
        "drops the field" in found
    )
    assert any(w.startswith("spec.devicePlugn:") and '"devicePlugin"' in w for w in found)
    assert check_document(doc).ok


def test_unknown_field_inside_lists_and_maps() -> None:
    doc = cp(
        driver={
            "env": [{"name": "A", "valu": "1"}],
            "repository": "r",
            "image": "d",
            "version": "1",
        }
    )
    assert any(w.startswith("spec.driver.env[0].valu:") for w in warnings(doc))


def test_deprecated_fields_warn() -> None:
    found = warnings(cp(operator={"defaultRuntime": "containerd"}, psp={"enabled": True}))
    assert any(w.startswith("spec.operator.defaultRuntime: deprecated") for w in found)
    assert any(w.startswith("spec.psp.enabled:") for w in found)


def test_unknown_pull_policy_warns_like_upstream_falls_back() -> None:
    found = warnings(cp(toolkit={"imagePullPolicy": "Sometimes"}))
    assert any("the operator will use IfNotPresent" in w for w in found)


def test_image_problem_of_a_disabled_operand_is_only_a_warning() -> None:
    doc = cp(nodeStatusExporter={"enabled": False, "repository": "r"})
    assert check_document(doc).ok
    assert any(w.startswith("spec.nodeStatusExporter.image") for w in warnings(doc))


def test_wrong_api_version_for_kind() -> None:
    doc = cp()
    doc["apiVersion"] = "nvidia.com/v1alpha1"
    assert any(e.startswith("apiVersion: expected one of 'nvidia.com/v1'") for e in errors(doc))


def test_missing_name() -> None:
    doc = cp()
    doc["metadata"] = {}
    assert "metadata.name: required field is missing" in errors(doc)


def test_namespace_on_cluster_scoped_kind_warns() -> None:
    doc = cp()
    doc["metadata"]["namespace"] = "gpu-operator"
    assert any(
        w.startswith("metadata.namespace: ClusterPolicy is cluster-scoped") for w in warnings(doc)
    )


def test_other_kinds_are_skipped() -> None:
    result = check_document({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})
    assert result.skipped
    assert result.ok


# --- NVIDIADriver ---


def test_valid_nvidiadriver() -> None:
    assert check_document(nvd(nodeSelector={"pool": "a"})).ok


def test_default_driver_must_not_have_a_node_selector() -> None:
    assert "spec.nodeSelector: a default NVIDIADriver must not have a nodeSelector" in errors(
        nvd(default=True, nodeSelector={"pool": "a"})
    )


def test_selector_on_owner_label_is_rejected() -> None:
    found = errors(nvd(nodeSelector={"nvidia.com/gpu-operator.driver.owner": "x"}))
    assert any("managed by the operator" in e for e in found)


def test_driver_needs_a_version() -> None:
    doc = nvd()
    del doc["spec"]["version"]
    assert any(e.startswith("spec.version: required") for e in errors(doc))


def test_full_image_reference_needs_no_version() -> None:
    doc = nvd()
    doc["spec"] = {"image": "registry.local/driver:580.95.05"}
    assert check_document(doc).ok


def test_precompiled_with_gdrcopy_is_rejected() -> None:
    found = errors(nvd(usePrecompiled=True, gdrcopy={"enabled": True}))
    assert any(e.startswith("spec.gdrcopy.enabled: not supported together") for e in found)


@pytest.mark.parametrize(
    ("version", "kmt", "bad"),
    [("v2.17.5", "auto", True), ("v2.20.1", "proprietary", True), ("v2.17.5", "open", False),
     ("2.16.1", "auto", False), ("sha256:ab", "auto", True)],
)  # fmt: skip
def test_new_gds_needs_open_kernel_modules(version: str, kmt: str, bad: bool) -> None:
    gds = {"enabled": True, "repository": "nvcr.io/nvidia/cloud-native", "image": "nvidia-fs",
           "version": version}  # fmt: skip
    found = errors(nvd(kernelModuleType=kmt, gds=gds))
    assert any(e.startswith("spec.gds.version: GPUDirect Storage") for e in found) is bad


def test_immutable_enum_values() -> None:
    found = errors(nvd(driverType="cpu"))
    assert found == [
        "spec.driverType: expected one of 'gpu', 'vgpu' or 'vgpu-host-manager', got \"cpu\""
    ]


def test_nvidiadriver_max_unavailable() -> None:
    found = errors(nvd(upgradePolicy={"maxUnavailable": "3"}))
    assert found == [
        'spec.upgradePolicy.maxUnavailable: expected an integer or a percentage like "25%", '
        'got "3" (write the number without quotes)'
    ]
