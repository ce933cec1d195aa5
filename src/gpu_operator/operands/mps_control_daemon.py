"""State `state-mps-control-daemon`: MPS control daemons where GPUs are shared by MPS."""

from __future__ import annotations

from typing import Any

from gpu_operator import api
from gpu_operator.api import enablement, keys
from gpu_operator.operands import common, config_manager, device_plugin
from gpu_operator.operands.common import Obj, container, env, mount
from gpu_operator.operands.facts import ClusterFacts

NAME = "state-mps-control-daemon"
DS_NAME = "nvidia-device-plugin-mps-control-daemon"
# Upstream names the account, its roles and bindings after the DaemonSet, yet its pods run as the
# device plugin's account (the daemon ships in the plugin's image and is enabled with it).
SA_NAME = "nvidia-device-plugin-mps-control-daemon"
CTR = "mps-control-daemon-ctr"
MOUNTS_INIT = "mps-control-daemon-mounts"


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    return enablement.is_enabled(policy.spec, "devicePlugin")


def _base(facts: ClusterFacts) -> Obj:
    main = container(
        CTR,
        command=["mps-control-daemon"],
        env_vars=[
            common.node_name_env(),
            env("NVIDIA_VISIBLE_DEVICES", "all"),
            env("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
        ],
        mounts=[mount("mps-shm", "/dev/shm"), mount("mps-root", "/mps")],
        privileged=True,
    )
    shm_init = container(
        MOUNTS_INIT,
        command=["mps-control-daemon", "mount-shm"],
        mounts=[mount("mps-root", "/mps", propagation="Bidirectional")],
        privileged=True,
    )
    init_cm, sidecar_cm = config_manager.containers("/usr/bin/mps-control-daemon")
    return common.daemonset(
        DS_NAME,
        NAME,
        facts,
        deploy_label="device-plugin",
        service_account_name=device_plugin.SA_NAME,
        main=[main, sidecar_cm],
        inits=[common.toolkit_ready_init(), shm_init, init_cm],
        volumes=[common.run_nvidia_volume()],
        extra_node_selector={keys.MPS_CAPABLE: "true"},
        host_pid=True,
    )


def _transform(ds: Obj, policy: api.ClusterPolicy, facts: ClusterFacts) -> None:
    ctr = common.main_container(ds)
    device_plugin.add_mps_volumes(ds, policy)
    common.apply_mig_env(ctr, policy)
    common.apply_runtime_class(ds, policy, facts)
    # The daemon ships in the device plugin image and follows the plugin's settings.
    common.apply_operand_spec(ds, policy.spec.devicePlugin, "devicePlugin", facts)
    shm_init = common.find_container(ds, MOUNTS_INIT)
    assert shm_init is not None
    shm_init["image"] = ctr["image"]
    shm_init["imagePullPolicy"] = ctr["imagePullPolicy"]
    config_manager.wire(ds, policy, ctr)


def render(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[dict[str, Any]]:
    objects = common.rbac(
        SA_NAME,
        NAME,
        facts,
        cluster_rules=[common.rule([""], ["nodes"], common.READ)],
        # Upstream's Role: the SCC only (the pods run as the device plugin's account).
        namespace_rules=[common.SCC_USE_PRIVILEGED],
    )
    ds = _base(facts)
    objects.append(common.finalize(ds, policy, facts, lambda d: _transform(d, policy, facts)))
    return objects
