"""The 26.x values keys reach the ClusterPolicy (and NVIDIADriver) as NVIDIA's chart writes them:
switches that are off and empty extras are left out, everything set is passed through."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.api import check_document

from .conftest import needs_helm

pytestmark = needs_helm

HOST_NETWORK_SECTIONS = (
    "driver", "toolkit", "devicePlugin", "dcgm", "dcgmExporter", "gfd", "migManager",
    "nodeStatusExporter", "validator", "vgpuManager", "vgpuDeviceManager", "vfioManager",
    "sandboxDevicePlugin", "kataSandboxDevicePlugin", "ccManager",
)  # fmt: skip


def policy_spec(render: Any, sets: list[str]) -> dict[str, Any]:
    spec: dict[str, Any] = render([], sets).one("ClusterPolicy")["spec"]
    return spec


def test_defaults_leave_the_26x_switches_out(render: Any) -> None:
    spec = policy_spec(render, [])
    for section in HOST_NETWORK_SECTIONS:
        assert "hostNetwork" not in spec[section], section
    exporter = spec["dcgmExporter"]
    assert not {"hostPID", "enablePodLabels", "enablePodUID", "annotations",
                "podLabelAllowlistRegex"} & set(exporter)  # fmt: skip
    assert exporter["serviceMonitor"]["scrapeTimeout"] == "10s"
    assert "secretEnv" not in spec["driver"]
    assert "kernelModuleConfig" not in spec["vgpuManager"]
    assert "kataManager" not in spec
    assert "kubeletRootDir" not in spec["hostPaths"]


@pytest.mark.parametrize("section", HOST_NETWORK_SECTIONS)
def test_host_network_reaches_its_section(render: Any, section: str) -> None:
    assert policy_spec(render, [f"{section}.hostNetwork=true"])[section]["hostNetwork"] is True


def test_exporter_pod_metadata_and_scrape_timeout(render: Any) -> None:
    sets = [
        "dcgmExporter.annotations.example\\.com/team=ml",
        "dcgmExporter.hostPID=true",
        "dcgmExporter.enablePodLabels=true",
        "dcgmExporter.enablePodUID=true",
        "dcgmExporter.podLabelAllowlistRegex={^app$,^team}",
        "dcgmExporter.serviceMonitor.scrapeTimeout=5s",
    ]
    exporter = policy_spec(render, sets)["dcgmExporter"]
    assert exporter["annotations"] == {"example.com/team": "ml"}
    assert exporter["hostPID"] is True
    assert exporter["enablePodLabels"] is True
    assert exporter["enablePodUID"] is True
    assert exporter["podLabelAllowlistRegex"] == ["^app$", "^team"]
    assert exporter["serviceMonitor"]["scrapeTimeout"] == "5s"


def test_secret_env_kernel_module_config_and_kubelet_root(render: Any) -> None:
    sets = [
        "driver.secretEnv=driver-env",
        "vgpuManager.kernelModuleConfig.name=vgpu-kmod",
        "hostPaths.kubeletRootDir=/var/lib/k0s/kubelet",
    ]
    spec = policy_spec(render, sets)
    assert spec["driver"]["secretEnv"] == "driver-env"
    assert spec["vgpuManager"]["kernelModuleConfig"] == {"name": "vgpu-kmod"}
    assert spec["hostPaths"]["kubeletRootDir"] == "/var/lib/k0s/kubelet"


def test_kata_manager_config_is_passed_and_only_warned_about(render: Any) -> None:
    policy = render([], ["kataManager.enabled=true", "kataManager.config.artifactsDir=/opt/k"]).one(
        "ClusterPolicy"
    )
    assert policy["spec"]["kataManager"]["config"] == {"artifactsDir": "/opt/k"}
    checked = check_document(policy)
    assert checked.errors == []
    assert sorted(str(w).split(":")[0] for w in checked.warnings) == [
        "spec.kataManager.config",
        "spec.kataManager.enabled",
    ]


def test_nvidiadriver_gets_host_network_and_the_pod_security_context(render: Any) -> None:
    sets = [
        "driver.nvidiaDriverCRD.enabled=true",
        "driver.hostNetwork=true",
        "driver.secretEnv=driver-env",
        "daemonsets.podSecurityContext.runAsUser=0",
    ]
    driver = render([], sets).one("NVIDIADriver")
    assert driver["spec"]["hostNetwork"] is True
    assert driver["spec"]["secretEnv"] == "driver-env"
    assert driver["spec"]["podSecurityContext"] == {"runAsUser": 0}
    assert check_document(driver).errors == []
    plain = render([], ["driver.nvidiaDriverCRD.enabled=true"]).one("NVIDIADriver")
    assert not {"hostNetwork", "podSecurityContext", "secretEnv"} & set(plain["spec"])
