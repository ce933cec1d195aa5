"""Pod settings of every operand DaemonSet: `hostNetwork` per section (the pods join the host's
network namespace with the DNS policy that keeps cluster DNS working there, and only the section's
own DaemonSets do) and `daemonsets.podSecurityContext` on all of them."""

from __future__ import annotations

from types import ModuleType

import pytest
from operand_helpers import Obj, make_facts, make_policy, pod

from gpu_operator.operands import (
    cc_manager,
    container_toolkit,
    dcgm,
    dcgm_exporter,
    device_plugin,
    driver,
    gpu_feature_discovery,
    kata_device_plugin,
    kata_manager,
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

# Each ClusterPolicy section with hostNetwork, and the states whose DaemonSets it governs
# (upstream: the MPS control daemon follows devicePlugin, the sandbox validator the validator).
SECTIONS: dict[str, tuple[ModuleType, ...]] = {
    "driver": (driver,),
    "toolkit": (container_toolkit,),
    "devicePlugin": (device_plugin, mps_control_daemon),
    "dcgm": (dcgm,),
    "dcgmExporter": (dcgm_exporter,),
    "gfd": (gpu_feature_discovery,),
    "migManager": (mig_manager,),
    "nodeStatusExporter": (node_status_exporter,),
    "validator": (operator_validation, sandbox_validation),
    "vgpuManager": (vgpu_manager,),
    "vgpuDeviceManager": (vgpu_device_manager,),
    "vfioManager": (vfio_manager,),
    "sandboxDevicePlugin": (sandbox_device_plugin,),
    "kataSandboxDevicePlugin": (kata_device_plugin,),
    "ccManager": (cc_manager,),
}
EVERY_STATE = tuple({m for modules in SECTIONS.values() for m in modules})


def _daemonsets(module: ModuleType, **sections: object) -> list[Obj]:
    objects = module.render(make_policy(**sections), make_facts())
    return [o for o in objects if o["kind"] == "DaemonSet"]


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_host_network_reaches_exactly_the_sections_daemonsets(section: str) -> None:
    for module in EVERY_STATE:
        for ds in _daemonsets(module, **{section: {"hostNetwork": True}}):
            spec = pod(ds)
            name = ds["metadata"]["name"]
            if module in SECTIONS[section]:
                assert spec["hostNetwork"] is True, name
                assert spec["dnsPolicy"] == "ClusterFirstWithHostNet", name
            else:
                assert "hostNetwork" not in spec, f"{section} leaked into {name}"
                assert "dnsPolicy" not in spec, name


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_host_network_false_or_unset_leaves_the_pod_network_alone(section: str) -> None:
    for module in SECTIONS[section]:
        for ds in _daemonsets(module, **{section: {"hostNetwork": False}}):
            assert "hostNetwork" not in pod(ds)
            assert "dnsPolicy" not in pod(ds)


def test_the_kata_manager_is_never_deployed_even_with_host_network() -> None:
    policy = make_policy(
        sandboxWorkloads={"enabled": True, "mode": "kata"},
        kataManager={"enabled": True, "hostNetwork": True, "config": {"artifactsDir": "/x"}},
    )
    assert not kata_manager.enabled(policy, make_facts())
    assert kata_manager.render(policy, make_facts()) == []


def test_pod_security_context_reaches_every_operand_daemonset() -> None:
    context = {"runAsUser": 0, "fsGroup": 2000, "seccompProfile": {"type": "RuntimeDefault"}}
    rendered = 0
    for module in EVERY_STATE:
        for ds in _daemonsets(module, daemonsets={"podSecurityContext": context}):
            assert pod(ds)["securityContext"] == context, ds["metadata"]["name"]
            rendered += 1
        for ds in _daemonsets(module):
            assert "securityContext" not in pod(ds), ds["metadata"]["name"]
    assert rendered >= len(EVERY_STATE)
