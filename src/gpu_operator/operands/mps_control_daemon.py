"""State `state-mps-control-daemon`: MPS control daemons where GPUs are shared by MPS."""

from __future__ import annotations

from typing import Any

from gpu_operator import api
from gpu_operator.api import enablement, keys
from gpu_operator.operands import common, config_manager, device_plugin
from gpu_operator.operands.common import Obj, container, mount
from gpu_operator.operands.facts import ClusterFacts

NAME = "state-mps-control-daemon"
DS_NAME = "nvidia-device-plugin-mps-control-daemon"
# Upstream names the account, its roles and bindings after the DaemonSet.
SA_NAME = "nvidia-device-plugin-mps-control-daemon"
CTR = "mps-control-daemon-ctr"
MOUNTS_INIT = "mps-control-daemon-mounts"


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    return enablement.is_enabled(policy.spec, "devicePlugin")


def _base(facts: ClusterFacts) -> Obj:
    main = container(
        CTR,
        command=["mps-control-daemon"],
        env_vars=[common.node_name_env()],
        mounts=[
            mount("mps-root", "/mps", propagation="Bidirectional"),
            mount("mps-shm", "/dev/shm"),
            mount("run-nvidia-validations", common.VALIDATIONS_DIR),
        ],
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
        service_account_name=SA_NAME,
        main=[main, sidecar_cm],
        inits=[common.toolkit_ready_init(), shm_init, init_cm],
        volumes=list(common.VALIDATION_VOLUMES),
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
        namespace_rules=[common.SCC_USE_PRIVILEGED, config_manager.EVENTS_RULE],
    )
    ds = _base(facts)
    objects.append(common.finalize(ds, policy, facts, lambda d: _transform(d, policy, facts)))
    return objects
