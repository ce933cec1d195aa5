"""State `state-sandbox-device-plugin`: the KubeVirt GPU device plugin (passthrough and vGPU)."""

from __future__ import annotations

from typing import Any

from gpu_operator import api
from gpu_operator.api import enablement
from gpu_operator.operands import common, sandbox
from gpu_operator.operands.common import Obj, container, host_path, mount
from gpu_operator.operands.facts import ClusterFacts

NAME = "state-sandbox-device-plugin"
DS_NAME = "nvidia-sandbox-device-plugin-daemonset"
SA_NAME = "nvidia-sandbox-device-plugin"
CTR = "nvidia-sandbox-device-plugin-ctr"


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    return sandbox.sandbox_on(policy, "sandboxDevicePlugin") and sandbox.mode(policy) == "kubevirt"


def build(
    policy: api.ClusterPolicy,
    facts: ClusterFacts,
    *,
    name: str,
    state: str,
    sa: str,
    ctr_name: str,
    command: str,
    deploy_label: str,
    section: str,
    vgpu: bool,
) -> list[dict[str, Any]]:
    """RBAC and DaemonSet of a sandbox device plugin (KubeVirt or Kata flavour)."""
    kubelet = enablement.host_paths(policy.spec).kubeletRootDir.rstrip("/")
    main = container(
        ctr_name,
        command=[command],
        mounts=[
            mount("device-plugin", "/var/lib/kubelet/device-plugins"),
            mount("vfio", "/dev/vfio"),
            mount("run-nvidia-validations", common.VALIDATIONS_DIR),
        ],
        privileged=True,
    )
    ds: Obj = common.daemonset(
        name,
        state,
        facts,
        deploy_label=deploy_label,
        service_account_name=sa,
        main=[main],
        inits=[sandbox.plugin_ready_init(vgpu=vgpu)],
        volumes=[
            host_path("device-plugin", f"{kubelet}/device-plugins"),
            host_path("vfio", "/dev/vfio"),
            *common.VALIDATION_VOLUMES,
        ],
    )
    objects = common.rbac(
        sa, state, facts, cluster_rules=[common.rule([""], ["nodes"], common.READ)]
    )
    spec = getattr(policy.spec, section)
    objects.append(
        common.finalize(
            ds, policy, facts, lambda d: common.apply_operand_spec(d, spec, section, facts)
        )
    )
    return objects


def render(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[dict[str, Any]]:
    return build(
        policy,
        facts,
        name=DS_NAME,
        state=NAME,
        sa=SA_NAME,
        ctr_name=CTR,
        command="nvidia-kubevirt-gpu-device-plugin",
        deploy_label="sandbox-device-plugin",
        section="sandboxDevicePlugin",
        vgpu=True,
    )
