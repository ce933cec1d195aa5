"""State `state-device-plugin`: the kubelet device plugin advertising `nvidia.com/gpu` resources."""

from __future__ import annotations

from typing import Any

from gpu_operator import api
from gpu_operator.api import enablement
from gpu_operator.operands import common, config_manager
from gpu_operator.operands.common import Obj, container, env, host_path, mount, set_env
from gpu_operator.operands.facts import ClusterFacts

NAME = "state-device-plugin"
DS_NAME = "nvidia-device-plugin-daemonset"
SA_NAME = "nvidia-device-plugin"
CTR = "nvidia-device-plugin"
ENTRYPOINT_CM = "nvidia-device-plugin-entrypoint"

ENTRYPOINT = """#!/bin/sh
# Take the driver root the validator found, then run the device plugin.
if [ -f /run/nvidia/validations/driver-ready ]; then
  set -o allexport
  . /run/nvidia/validations/driver-ready
  set +o allexport
fi
exec nvidia-device-plugin
"""


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    return enablement.is_enabled(policy.spec, "devicePlugin")


DEFAULT_MPS_ROOT = "/run/nvidia/mps"


def mps_root(policy: api.ClusterPolicy) -> str:
    mps = policy.spec.devicePlugin.mps
    return mps.root if mps and mps.root else DEFAULT_MPS_ROOT


def add_mps_volumes(ds: Obj, policy: api.ClusterPolicy) -> None:
    root = mps_root(policy).rstrip("/")
    common.add_volume(ds, host_path("mps-root", root, "DirectoryOrCreate"))
    common.add_volume(ds, host_path("mps-shm", f"{root}/shm"))


def _base(policy: api.ClusterPolicy, facts: ClusterFacts) -> Obj:
    kubelet = enablement.host_paths(policy.spec).kubeletRootDir.rstrip("/")
    main = container(
        CTR,
        command=["/bin/sh", "-c"],
        args=["/bin/entrypoint.sh"],
        env_vars=[
            env("PASS_DEVICE_SPECS", "true"),
            env("FAIL_ON_INIT_ERROR", "true"),
            env("DEVICE_LIST_STRATEGY", "envvar"),
            env("DEVICE_ID_STRATEGY", "uuid"),
            env("NVIDIA_VISIBLE_DEVICES", "all"),
            env("NVIDIA_DRIVER_CAPABILITIES", "all"),
            env("MPS_ROOT", DEFAULT_MPS_ROOT),
        ],
        mounts=[
            mount("nvidia-device-plugin-entrypoint", "/bin/entrypoint.sh", read_only=True),
            mount("device-plugin", "/var/lib/kubelet/device-plugins"),
            mount("run-nvidia-validations", common.VALIDATIONS_DIR),
            mount("driver-install-dir", "/driver-root", propagation="HostToContainer"),
            mount("host-root", "/host", read_only=True, propagation="HostToContainer"),
            mount("cdi-root", "/var/run/cdi"),
            mount("mps-shm", "/dev/shm"),
            mount("mps-root", "/mps"),
        ],
        privileged=True,
    )
    main["volumeMounts"][0]["subPath"] = "entrypoint.sh"
    init_cm, sidecar_cm = config_manager.containers(CTR)
    volumes = [
        {
            "name": "nvidia-device-plugin-entrypoint",
            "configMap": {"name": ENTRYPOINT_CM, "defaultMode": 448},
        },
        host_path("device-plugin", f"{kubelet}/device-plugins"),
        *common.VALIDATION_VOLUMES,
        host_path("driver-install-dir", common.DEFAULT_DRIVER_INSTALL_DIR, "DirectoryOrCreate"),
        host_path("host-root", "/"),
        host_path("cdi-root", "/var/run/cdi", "DirectoryOrCreate"),
    ]
    return common.daemonset(
        DS_NAME,
        NAME,
        facts,
        deploy_label="device-plugin",
        service_account_name=SA_NAME,
        main=[main, sidecar_cm],
        inits=[common.toolkit_ready_init(volume="run-nvidia-validations"), init_cm],
        volumes=volumes,
    )


def _transform(ds: Obj, policy: api.ClusterPolicy, facts: ClusterFacts) -> None:
    spec = policy.spec
    ctr = common.main_container(ds)
    if enablement.is_enabled(spec, "gds"):
        set_env(ctr, "GDS_ENABLED", "true")
        set_env(ctr, "MOFED_ENABLED", "true")
    if enablement.is_enabled(spec, "gdrcopy"):
        set_env(ctr, "GDRCOPY_ENABLED", "true")
    # Upstream's order: MIG env, then CDI env (a different order is a different pod template).
    common.apply_mig_env(ctr, policy)
    if enablement.is_enabled(spec, "cdi"):
        set_env(ctr, "CDI_ENABLED", "true")
        set_env(ctr, "DEVICE_LIST_STRATEGY", "cdi-annotations,cdi-cri")
        set_env(ctr, "CDI_ANNOTATION_PREFIX", "cdi.k8s.io/")
        set_env(ctr, "NVIDIA_CDI_HOOK_PATH", common.cdi_hook_path(policy))
    set_env(ctr, "MPS_ROOT", mps_root(policy))
    add_mps_volumes(ds, policy)
    common.apply_runtime_class(ds, policy, facts)
    common.apply_operand_spec(ds, spec.devicePlugin, "devicePlugin", facts)
    config_manager.wire(ds, policy, ctr)


def render(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[dict[str, Any]]:
    objects = common.rbac(
        SA_NAME,
        NAME,
        facts,
        cluster_rules=[common.rule([""], ["nodes"], common.READ)],
        # Upstream's Role (the SCC), plus ours: Events on the node (device health changes, the
        # config manager's rejections), also for the MPS daemon, which runs as this account.
        namespace_rules=[common.SCC_USE_PRIVILEGED, config_manager.EVENTS_RULE],
    )
    objects.append(
        common.config_map(
            ENTRYPOINT_CM, NAME, facts, {"entrypoint.sh": ENTRYPOINT}, labels={"app": DS_NAME}
        )
    )
    ds = _base(policy, facts)
    objects.append(common.finalize(ds, policy, facts, lambda d: _transform(d, policy, facts)))
    return objects
