"""The state list, the enablement matrix (reference §3.3) and per-state render errors."""

from __future__ import annotations

from typing import Any

import pytest
from operand_helpers import make_facts, make_policy

from gpu_operator.operands import registry
from gpu_operator.operands.facts import ClusterFacts

UPSTREAM_ORDER = [
    "pre-requisites",
    "state-operator-metrics",
    "state-driver",
    "state-container-toolkit",
    "state-operator-validation",
    "state-device-plugin",
    "state-mps-control-daemon",
    "state-dcgm",
    "state-dcgm-exporter",
    "gpu-feature-discovery",
    "state-mig-manager",
    "state-node-status-exporter",
    "state-vgpu-manager",
    "state-vgpu-device-manager",
    "state-sandbox-validation",
    "state-vfio-manager",
    "state-sandbox-device-plugin",
    "state-kata-device-plugin",
    "state-kata-manager",
    "state-cc-manager",
]

DEFAULT_ON = {
    "pre-requisites", "state-operator-metrics", "state-driver", "state-container-toolkit",
    "state-operator-validation", "state-device-plugin", "state-mps-control-daemon", "state-dcgm",
    "state-dcgm-exporter", "gpu-feature-discovery", "state-mig-manager",
}  # fmt: skip
SANDBOX_ALL = {
    "vgpuManager": {"enabled": True}, "vgpuDeviceManager": {"enabled": True},
    "vfioManager": {"enabled": True}, "sandboxDevicePlugin": {"enabled": True},
    "kataSandboxDevicePlugin": {"enabled": True}, "ccManager": {"enabled": True},
    "kataManager": {"enabled": True},
}  # fmt: skip


def enabled_states(**sections: Any) -> set[str]:
    policy = make_policy(**sections)
    return {s.name for s in registry.STATES if s.enabled(policy, make_facts())}


def test_states_are_in_upstream_order() -> None:
    assert [s.name for s in registry.STATES] == UPSTREAM_ORDER


@pytest.mark.parametrize(
    ("sections", "added", "removed"),
    [
        ({}, set(), set()),
        ({"nodeStatusExporter": {"enabled": True}}, {"state-node-status-exporter"}, set()),
        ({"driver": {"enabled": False}}, set(), {"state-driver"}),
        ({"driver": {"useNvidiaDriverCRD": True}}, set(), {"state-driver"}),
        ({"toolkit": {"enabled": False}}, set(), {"state-container-toolkit"}),
        ({"devicePlugin": {"enabled": False}}, set(),
         {"state-device-plugin", "state-mps-control-daemon"}),
        ({"dcgm": {"enabled": False}}, set(), {"state-dcgm"}),
        ({"dcgmExporter": {"enabled": False}}, set(), {"state-dcgm-exporter"}),
        ({"gfd": {"enabled": False}}, set(), {"gpu-feature-discovery"}),
        ({"migManager": {"enabled": False}}, set(), {"state-mig-manager"}),
        ({"cdi": {"nriPluginEnabled": True}}, set(), {"pre-requisites"}),
        # NRI needs CDI: without it the NRI flag has no effect.
        ({"cdi": {"enabled": False, "nriPluginEnabled": True}}, set(), set()),
        # Sandbox sections do nothing without sandboxWorkloads.enabled.
        (SANDBOX_ALL, set(), set()),
        ({"sandboxWorkloads": {"enabled": True}}, {"state-sandbox-validation"}, set()),
        ({"sandboxWorkloads": {"enabled": True}, **SANDBOX_ALL},
         {"state-sandbox-validation", "state-vgpu-manager", "state-vgpu-device-manager",
          "state-vfio-manager", "state-sandbox-device-plugin"}, set()),
        ({"sandboxWorkloads": {"enabled": True, "mode": "kata"}, **SANDBOX_ALL},
         {"state-sandbox-validation", "state-vgpu-manager", "state-vgpu-device-manager",
          "state-vfio-manager", "state-kata-device-plugin", "state-cc-manager"}, set()),
        # CRD mode hands the vGPU manager over too.
        ({"sandboxWorkloads": {"enabled": True}, "driver": {"useNvidiaDriverCRD": True},
          "vgpuManager": {"enabled": True}},
         {"state-sandbox-validation"}, {"state-driver"}),
    ],
)  # fmt: skip
def test_enablement_matrix(sections: dict[str, Any], added: set[str], removed: set[str]) -> None:
    assert enabled_states(**sections) == (DEFAULT_ON | added) - removed


def test_kata_manager_is_never_enabled() -> None:
    policy = make_policy(sandboxWorkloads={"enabled": True, "mode": "kata"}, **SANDBOX_ALL)
    (rendered,) = [
        r for r in registry.render_all(policy, make_facts()) if r.name == "state-kata-manager"
    ]
    assert (rendered.enabled, rendered.objects, rendered.error) == (False, [], None)


def test_disabled_states_render_no_objects() -> None:
    rendered = registry.render_all(make_policy(gfd={"enabled": False}), make_facts())
    gfd = next(r for r in rendered if r.name == "gpu-feature-discovery")
    assert (gfd.enabled, gfd.objects) == (False, [])


def test_an_unresolvable_image_fails_only_its_own_states() -> None:
    env = {k: v for k, v in make_facts().operator_env.items() if k != "CONTAINER_TOOLKIT_IMAGE"}
    rendered = {r.name: r for r in registry.render_all(make_policy(), make_facts(operator_env=env))}
    toolkit = rendered["state-container-toolkit"]
    assert toolkit.objects == []
    assert toolkit.error is not None
    assert "CONTAINER_TOOLKIT_IMAGE" in toolkit.error
    assert "spec.toolkit" in toolkit.error
    assert [n for n, r in rendered.items() if r.error] == ["state-container-toolkit"]
    assert rendered["state-device-plugin"].objects


def test_a_missing_os_fails_the_driver_with_the_nfd_labels_named() -> None:
    rendered = {r.name: r for r in registry.render_all(make_policy(), make_facts(os_id=None))}
    error = rendered["state-driver"].error or ""
    assert "system-os_release.ID" in error
    assert rendered["state-container-toolkit"].error is None


def test_render_keeps_daemonsets_without_gpu_nodes() -> None:
    rendered = registry.render_all(make_policy(), make_facts(gpu_node_count=0))
    kinds = [o["kind"] for r in rendered for o in r.objects]
    assert kinds.count("DaemonSet") == 9  # driver .. mig-manager, dcgm on by default


def test_facts_os_tag() -> None:
    assert ClusterFacts().os_tag == "ubuntu22.04"
    assert ClusterFacts(os_id="rhel", os_version_id="9.4").os_tag == "rhel9"
    assert ClusterFacts(os_version_id=None).os_tag is None
