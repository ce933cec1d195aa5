"""State `state-kata-device-plugin`: the Kata GPU device plugin (passthrough only)."""

from __future__ import annotations

from typing import Any

from gpu_operator import api
from gpu_operator.operands import sandbox, sandbox_device_plugin
from gpu_operator.operands.facts import ClusterFacts

NAME = "state-kata-device-plugin"
DS_NAME = "nvidia-kata-sandbox-device-plugin-daemonset"
SA_NAME = "nvidia-kata-sandbox-device-plugin"
CTR = "nvidia-kata-sandbox-device-plugin-ctr"


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    return sandbox.sandbox_on(policy, "kataSandboxDevicePlugin") and sandbox.mode(policy) == "kata"


def render(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[dict[str, Any]]:
    return sandbox_device_plugin.build(
        policy,
        facts,
        name=DS_NAME,
        state=NAME,
        sa=SA_NAME,
        ctr_name=CTR,
        command="nvidia-kata-gpu-device-plugin",
        deploy_label="kata-sandbox-device-plugin",
        section="kataSandboxDevicePlugin",
        vgpu=False,
    )
