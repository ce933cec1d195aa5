"""Semantic checks of the fields NVIDIA added in 26.x: hostNetwork everywhere, the exporter's pod
metadata, ServiceMonitor timeouts, secret env, the NRI plugin's namespace allowlist, Kata."""

from __future__ import annotations

from typing import Any

import pytest
from test_validation import cp, errors, nvd, warnings

HOST_NETWORK_SECTIONS = (
    "driver", "toolkit", "devicePlugin", "dcgm", "dcgmExporter", "gfd", "migManager",
    "nodeStatusExporter", "validator", "vgpuManager", "vgpuDeviceManager", "vfioManager",
    "sandboxDevicePlugin", "kataSandboxDevicePlugin", "kataManager", "ccManager",
)  # fmt: skip


def with_section(name: str, fields: dict[str, Any]) -> dict[str, Any]:
    doc = cp()
    doc["spec"][name] = {**doc["spec"].get(name, {}), **fields}
    return doc


@pytest.mark.parametrize("section", HOST_NETWORK_SECTIONS)
def test_host_network_is_a_known_boolean_of_every_operand(section: str) -> None:
    doc = with_section(section, {"hostNetwork": True})
    assert errors(doc) == []
    assert not [w for w in warnings(doc) if "hostNetwork" in w]
    bad = errors(with_section(section, {"hostNetwork": "yes"}))
    assert any(e.startswith(f"spec.{section}.hostNetwork:") for e in bad), bad


@pytest.mark.parametrize(
    ("monitor", "problem"),
    [
        ({"interval": "15s", "scrapeTimeout": "10s"}, None),
        ({"interval": "1m", "scrapeTimeout": "59s500ms"}, None),
        ({"interval": "1d", "scrapeTimeout": "1h"}, None),  # Prometheus units upstream accepts
        ({"scrapeTimeout": "30s"}, None),  # against Prometheus' global interval: unknown here
        ({"interval": "", "scrapeTimeout": ""}, None),  # empty means unset upstream
        (
            {"interval": "15s", "scrapeTimeout": "20s"},
            "spec.dcgmExporter.serviceMonitor.scrapeTimeout: 20s is longer than "
            "spec.dcgmExporter.serviceMonitor.interval (15s)",
        ),
        (
            {"scrapeTimeout": "10 seconds"},
            "spec.dcgmExporter.serviceMonitor.scrapeTimeout: expected a string matching",
        ),
    ],
)
def test_scrape_timeout(monitor: dict[str, Any], problem: str | None) -> None:
    found = errors(with_section("dcgmExporter", {"serviceMonitor": monitor}))
    if problem is None:
        assert found == []
    else:
        assert any(e.startswith(problem) for e in found), found


def test_operator_metrics_scrape_timeout_is_checked_too() -> None:
    monitor = {"interval": "5s", "scrapeTimeout": "6s"}
    found = errors(with_section("operator", {"metrics": {"serviceMonitor": monitor}}))
    assert any(e.startswith("spec.operator.metrics.serviceMonitor.scrapeTimeout") for e in found)


def test_pod_label_allowlist_must_be_re2_regular_expressions() -> None:
    exporter = {"enablePodLabels": True, "podLabelAllowlistRegex": ["^app$", "(", "^(?!x)"]}
    found = errors(with_section("dcgmExporter", exporter))
    assert found[0].startswith("spec.dcgmExporter.podLabelAllowlistRegex[1]: not a regular")
    assert found[1].startswith("spec.dcgmExporter.podLabelAllowlistRegex[2]: lookarounds")
    assert len(found) == 2


@pytest.mark.parametrize(
    ("exporter", "warns"),
    [
        ({"podLabelAllowlistRegex": ["^app$"]}, True),
        ({"podLabelAllowlistRegex": ["^app$"], "enablePodLabels": True}, False),
        (
            {
                "podLabelAllowlistRegex": ["^app$"],
                "env": [{"name": "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS", "value": "TRUE"}],
            },
            False,
        ),
        ({"enablePodUID": True, "hostPID": True, "annotations": {"a": "b"}}, False),
    ],
)
def test_allowlist_without_pod_labels_has_no_effect(exporter: dict[str, Any], warns: bool) -> None:
    found = [w for w in warnings(with_section("dcgmExporter", exporter)) if "Allowlist" in w]
    assert bool(found) is warns, found


def test_secret_env_and_kernel_module_config_name_objects() -> None:
    assert errors(with_section("driver", {"secretEnv": "driver-env"})) == []
    found = errors(with_section("driver", {"secretEnv": "Driver_Env"}))
    assert found == [
        "spec.driver.secretEnv: expected the name of a Secret (lower-case letters, digits, "
        "'-' and '.'), got \"Driver_Env\""
    ]
    found = errors(with_section("vgpuManager", {"kernelModuleConfig": {"name": "KMod"}}))
    assert found[0].startswith("spec.vgpuManager.kernelModuleConfig.name: expected the name of")
    assert errors(nvd(secretEnv="bad name"))[0].startswith("spec.secretEnv: expected the name")


def nri(value: str, *, enabled: bool = True) -> dict[str, Any]:
    doc = cp(cdi={"enabled": True, "nriPluginEnabled": enabled})
    doc["spec"]["toolkit"] = {
        "env": [{"name": "NRI_MANAGEMENT_CDI_DEVICE_NAMESPACES", "value": value}]
    }
    return doc


def test_nri_management_namespaces_are_exact_namespace_names() -> None:
    assert errors(nri("monitoring, gpu-diagnostics")) == []
    assert warnings(nri("monitoring")) == []
    assert errors(nri("monitoring,gpu-*,Bad_NS")) == [
        "spec.toolkit.env[0].value: 'gpu-*': namespaces are matched exactly; wildcards do not work",
        "spec.toolkit.env[0].value: 'Bad_NS' is not a namespace name",
    ]


def test_nri_management_namespaces_without_the_nri_plugin_warn() -> None:
    assert warnings(nri("monitoring", enabled=False)) == [
        "spec.toolkit.env[0].value: has no effect: the NRI plugin is off "
        "(spec.cdi.nriPluginEnabled)"
    ]


def test_kata_manager_config_is_accepted_with_a_deprecation_warning() -> None:
    doc = with_section("kataManager", {"config": {"artifactsDir": "/opt/nvidia-gpu-operator"}})
    assert errors(doc) == []
    assert warnings(doc) == [
        "spec.kataManager.config: deprecated and ignored: the Kata manager is never deployed"
    ]
