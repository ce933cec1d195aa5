"""Sandbox states: validator steps, device plugins per mode, vGPU and VFIO managers, CC manager."""

from __future__ import annotations

from typing import Any

import pytest
from operand_helpers import ctr, env_of, find, make_facts, make_policy, names, pod, volumes_of

from gpu_operator.operands import (
    cc_manager,
    kata_device_plugin,
    kata_manager,
    sandbox_device_plugin,
    sandbox_validation,
    vfio_manager,
    vgpu_device_manager,
    vgpu_manager,
)
from gpu_operator.operands.common import RenderError

SANDBOX = {"enabled": True, "defaultWorkload": "vm-passthrough"}


def policy(**sections: Any) -> Any:
    return make_policy(sandboxWorkloads=SANDBOX, **sections)


def test_sandbox_validator_steps() -> None:
    ds = find(
        sandbox_validation.render(policy(ccManager={"enabled": True}), make_facts()), "DaemonSet"
    )
    assert names(ds, "initContainers") == [
        "cc-manager-validation",
        "vfio-pci-validation",
        "vgpu-manager-validation",
        "vgpu-devices-validation",
    ]
    for init in pod(ds)["initContainers"]:
        assert env_of(init)["DEFAULT_GPU_WORKLOAD_CONFIG"] == "vm-passthrough"
    ds = find(sandbox_validation.render(policy(), make_facts()), "DaemonSet")
    assert "cc-manager-validation" not in names(ds, "initContainers")


def test_validator_component_env_for_sandbox_steps() -> None:
    validator = {"vfioPCI": {"env": [{"name": "X", "value": "1"}]}}
    ds = find(sandbox_validation.render(policy(validator=validator), make_facts()), "DaemonSet")
    assert env_of(ctr(ds, "vfio-pci-validation"))["X"] == "1"


@pytest.mark.parametrize(
    ("module", "vgpu"), [(sandbox_device_plugin, True), (kata_device_plugin, False)]
)
def test_sandbox_plugins_wait_for_their_workload(module: Any, vgpu: bool) -> None:
    ds = find(module.render(policy(), make_facts()), "DaemonSet")
    script = ctr(ds, "vfio-pci-validation")["args"][0]
    assert "workload-type" in script
    assert "vfio-pci-ready" in script
    assert ("vgpu-devices-ready" in script) is vgpu
    assert volumes_of(ds)["device-plugin"]["hostPath"]["path"] == "/var/lib/kubelet/device-plugins"
    assert ctr(ds, "vfio-pci-validation")["securityContext"]["runAsUser"] == 0


def test_vfio_manager_unloads_the_driver_without_eviction() -> None:
    manager = {
        "repository": "nvcr.io/nvidia/cloud-native",
        "image": "k8s-driver-manager",
        "version": "v0.9.0",
    }
    ds = find(
        vfio_manager.render(policy(vfioManager={"driverManager": manager}), make_facts()),
        "DaemonSet",
    )
    init = ctr(ds, "k8s-driver-manager")
    assert init["image"] == "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.9.0"
    assert env_of(init)["ENABLE_GPU_POD_EVICTION"] == "false"
    assert "vfio-manage bind --all" in ctr(ds, "nvidia-vfio-manager")["args"][0]


def test_vgpu_manager_image_gets_the_os_tag() -> None:
    spec = {"enabled": True, "repository": "r", "image": "vgpu-manager", "version": "550.54.16"}
    ds = find(vgpu_manager.render(policy(vgpuManager=spec), make_facts()), "DaemonSet")
    assert ctr(ds, "nvidia-vgpu-manager-ctr")["image"] == "r/vgpu-manager:550.54.16-ubuntu22.04"
    assert names(ds, "initContainers") == ["k8s-driver-manager"]


def test_vgpu_device_manager_default_and_custom_config() -> None:
    objects = vgpu_device_manager.render(policy(), make_facts())
    config = find(objects, "ConfigMap", "default-vgpu-devices-config")
    assert "vgpu-configs" in config["data"]["config.yaml"]
    ds = find(objects, "DaemonSet")
    assert env_of(ctr(ds, "nvidia-vgpu-device-manager"))["DEFAULT_VGPU_CONFIG"] == "default"
    assert "vgpu-manager-ready" in ctr(ds, "vgpu-manager-validation")["args"][0]
    custom = vgpu_device_manager.render(
        policy(vgpuDeviceManager={"config": {"name": "mine", "default": "A100-4C"}}), make_facts()
    )
    assert [o for o in custom if o["kind"] == "ConfigMap"] == []
    ds = find(custom, "DaemonSet")
    assert env_of(ctr(ds, "nvidia-vgpu-device-manager"))["DEFAULT_VGPU_CONFIG"] == "A100-4C"
    assert volumes_of(ds)["vgpu-config"]["configMap"] == {"name": "mine"}


def test_cc_manager_default_mode() -> None:
    ds = find(
        cc_manager.render(policy(ccManager={"defaultMode": "devtools"}), make_facts()), "DaemonSet"
    )
    assert env_of(ctr(ds, "nvidia-cc-manager"))["DEFAULT_CC_MODE"] == "devtools"
    ds = find(cc_manager.render(policy(), make_facts()), "DaemonSet")
    assert env_of(ctr(ds, "nvidia-cc-manager"))["DEFAULT_CC_MODE"] == "on"


def test_kata_manager_renders_nothing() -> None:
    assert kata_manager.render(policy(kataManager={"enabled": True}), make_facts()) == []


def test_vgpu_manager_kernel_module_config_is_mounted_key_by_key() -> None:
    facts = make_facts(config_map_keys={"kmod": ("nvidia.conf",)})
    section = {"kernelModuleConfig": {"name": "kmod"}}
    ds = find(vgpu_manager.render(policy(vgpuManager=section), facts), "DaemonSet")
    main = pod(ds)["containers"][0]
    [item] = [m for m in main["volumeMounts"] if m["mountPath"] == "/drivers/nvidia.conf"]
    assert item["subPath"] == "nvidia.conf"
    assert volumes_of(ds)[item["name"]]["configMap"]["name"] == "kmod"
    with pytest.raises(RenderError, match=r"vgpuManager.kernelModuleConfig.name: ConfigMap 'kmod'"):
        vgpu_manager.render(policy(vgpuManager=section), make_facts())
