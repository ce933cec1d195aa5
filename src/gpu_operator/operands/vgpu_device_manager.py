"""State `state-vgpu-device-manager`: creates the vGPU devices named by `nvidia.com/vgpu.config`."""

from __future__ import annotations

from typing import Any

from gpu_operator import api
from gpu_operator.operands import common, sandbox
from gpu_operator.operands.common import Obj, container, env, host_path, mount, set_env
from gpu_operator.operands.facts import ClusterFacts

NAME = "state-vgpu-device-manager"
DS_NAME = "nvidia-vgpu-device-manager"
SA_NAME = "nvidia-vgpu-device-manager"
CTR = "nvidia-vgpu-device-manager"
DEVICES_CM = "default-vgpu-devices-config"
CONFIG_DIR = "/vgpu-config"

# A config with no devices: the real vGPU type tables depend on the licensed host driver, so
# the default only lets nodes reach a known state; users name their own ConfigMap.
DEFAULT_CONFIG = """version: v1
vgpu-configs:
  default:
    - devices: all
      vgpu-devices: {}
"""


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    return sandbox.sandbox_on(policy, "vgpuDeviceManager")


def _config(policy: api.ClusterPolicy) -> tuple[str, str]:
    manager = policy.spec.vgpuDeviceManager
    config = manager.config if manager else None
    name = config.name if config and config.name else DEVICES_CM
    return name, config.default if config else "default"


def _base(policy: api.ClusterPolicy, facts: ClusterFacts) -> Obj:
    main = container(
        CTR,
        command=["nvidia-k8s-vgpu-dm"],
        env_vars=[
            common.node_name_env(),
            env("CONFIG_FILE", f"{CONFIG_DIR}/config.yaml"),
            env("DEFAULT_VGPU_CONFIG", "default"),
        ],
        mounts=[mount("vgpu-config", CONFIG_DIR), mount("host-sys", "/sys")],
        privileged=True,
    )
    ready = [
        f"{common.VALIDATIONS_DIR}/vgpu-manager-ready",
        f"{common.VALIDATIONS_DIR}/host-vgpu-manager-ready",
    ]
    return common.daemonset(
        DS_NAME,
        NAME,
        facts,
        deploy_label="vgpu-device-manager",
        service_account_name=SA_NAME,
        main=[main],
        inits=[common.wait_for_file_init("vgpu-manager-validation", ready, "vGPU manager")],
        volumes=[
            *common.VALIDATION_VOLUMES,
            {"name": "vgpu-config", "configMap": {"name": _config(policy)[0]}},
            host_path("host-sys", "/sys", "Directory"),
        ],
    )


def _transform(ds: Obj, policy: api.ClusterPolicy, facts: ClusterFacts) -> None:
    set_env(common.main_container(ds), "DEFAULT_VGPU_CONFIG", _config(policy)[1])
    common.apply_operand_spec(ds, policy.spec.vgpuDeviceManager, "vgpuDeviceManager", facts)


def render(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[dict[str, Any]]:
    objects = common.rbac(
        SA_NAME,
        NAME,
        facts,
        cluster_rules=[
            common.rule([""], ["nodes"], ("get", "list", "watch", "update", "patch")),
            common.rule([""], ["pods"], ("get", "list", "watch", "delete")),
        ],
    )
    if _config(policy)[0] == DEVICES_CM:
        objects.append(common.config_map(DEVICES_CM, NAME, facts, {"config.yaml": DEFAULT_CONFIG}))
    ds = _base(policy, facts)
    objects.append(common.finalize(ds, policy, facts, lambda d: _transform(d, policy, facts)))
    return objects
