"""Upstream's meaning of an unset `enabled`, and the CRD defaults, per the reference tables."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.api import ClusterPolicy, enablement

REQUIRED = ("operator", "daemonsets", "driver", "toolkit", "devicePlugin", "dcgmExporter", "dcgm",
            "nodeStatusExporter", "gfd")  # fmt: skip


def policy(**sections: Any) -> ClusterPolicy:
    spec: dict[str, Any] = {name: {} for name in REQUIRED}
    spec.update(sections)
    return ClusterPolicy.model_validate({"metadata": {"name": "p"}, "spec": spec})


# Reference §1.2 and §11 "Enabled defaults": nil => true for these, false for the rest.
@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ("driver", True),
        ("toolkit", True),
        ("devicePlugin", True),
        ("dcgm", True),
        ("dcgmExporter", True),
        ("gfd", True),
        ("migManager", True),
        ("cdi", True),
        ("nodeStatusExporter", False),
        ("psa", False),
        ("psp", False),
        ("gds", False),
        ("gdrcopy", False),
        ("sandboxWorkloads", False),
        ("vfioManager", False),
        ("vgpuManager", False),
        ("vgpuDeviceManager", False),
        ("sandboxDevicePlugin", False),
        ("kataSandboxDevicePlugin", False),
        ("kataManager", False),
        ("ccManager", False),
    ],
)
def test_unset_enabled_means_upstream_default(section: str, expected: bool) -> None:
    assert enablement.is_enabled(policy().spec, section) is expected
    assert enablement.is_enabled(policy(**{section: {}}).spec, section) is expected


@pytest.mark.parametrize("section", sorted(enablement.ENABLED_WHEN_UNSET))
@pytest.mark.parametrize("value", [True, False])
def test_explicit_enabled_wins(section: str, value: bool) -> None:
    assert enablement.is_enabled(policy(**{section: {"enabled": value}}).spec, section) is value


def test_unknown_section_is_a_programming_error() -> None:
    with pytest.raises(KeyError, match="mig"):
        enablement.is_enabled(policy().spec, "mig")


# Reference §11 "CRD defaults" and §1.2 special fields.
@pytest.mark.parametrize(
    ("sections", "path", "expected"),
    [
        ({}, "operator.runtimeClass", "nvidia"),
        ({}, "daemonsets.updateStrategy", "RollingUpdate"),
        ({}, "toolkit.installDir", "/usr/local/nvidia"),
        ({}, "driver.kernelModuleType", "auto"),
        ({"devicePlugin": {"mps": {}}}, "devicePlugin.mps.root", "/run/nvidia/mps"),
        ({"migManager": {"config": {}}}, "migManager.config.default", "all-disabled"),
        ({"vgpuDeviceManager": {"config": {}}}, "vgpuDeviceManager.config.default", "default"),
        ({"sandboxWorkloads": {}}, "sandboxWorkloads.defaultWorkload", "container"),
        ({"sandboxWorkloads": {}}, "sandboxWorkloads.mode", "kubevirt"),
        ({"cdi": {}}, "cdi.enabled", True),
        ({"cdi": {}}, "cdi.nriPluginEnabled", False),
        ({"hostPaths": {}}, "hostPaths.rootFS", "/"),
        ({"hostPaths": {}}, "hostPaths.driverInstallDir", "/run/nvidia/driver"),
        ({"hostPaths": {}}, "hostPaths.kubeletRootDir", "/var/lib/kubelet"),
        (
            {"dcgmExporter": {"hpcJobMapping": {}}},
            "dcgmExporter.hpcJobMapping.directory",
            "/var/lib/dcgm-exporter/job-mapping",
        ),
        ({"driver": {"upgradePolicy": {}}}, "driver.upgradePolicy.autoUpgrade", False),
        ({"driver": {"upgradePolicy": {}}}, "driver.upgradePolicy.maxParallelUpgrades", 1),
        ({"driver": {"upgradePolicy": {}}}, "driver.upgradePolicy.maxUnavailable", "25%"),
        (
            {"driver": {"upgradePolicy": {"podDeletion": {}}}},
            "driver.upgradePolicy.podDeletion.timeoutSeconds",
            300,
        ),
        (
            {"driver": {"upgradePolicy": {"drain": {}}}},
            "driver.upgradePolicy.drain.timeoutSeconds",
            300,
        ),
        (
            {"driver": {"upgradePolicy": {"waitForCompletion": {}}}},
            "driver.upgradePolicy.waitForCompletion.timeoutSeconds",
            0,
        ),
    ],
)
def test_crd_defaults(sections: dict[str, Any], path: str, expected: object) -> None:
    value: Any = policy(**sections).spec
    for part in path.split("."):
        value = getattr(value, part)
    assert value == expected


def test_effective_values_fill_missing_sections() -> None:
    spec = policy().spec
    assert enablement.host_paths(spec).rootFS == "/"
    assert enablement.cdi(spec).enabled is True
    assert enablement.mig_strategy(spec) is None
    assert enablement.rdma_enabled(spec) is False


def test_nri_only_counts_with_cdi() -> None:
    assert enablement.nri_plugin_enabled(policy(cdi={"nriPluginEnabled": True}).spec)
    assert not enablement.nri_plugin_enabled(
        policy(cdi={"enabled": False, "nriPluginEnabled": True}).spec
    )
