"""State `gpu-feature-discovery`: labels nodes with GPU properties (product, memory, MIG, ...)."""

from __future__ import annotations

from typing import Any

from gpu_operator import api
from gpu_operator.api import enablement
from gpu_operator.operands import common, config_manager
from gpu_operator.operands.common import Obj, container, env, host_path, mount
from gpu_operator.operands.facts import ClusterFacts

NAME = "gpu-feature-discovery"
DS_NAME = "gpu-feature-discovery"
SA_NAME = "nvidia-gpu-feature-discovery"
CTR = "gpu-feature-discovery"
FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    return enablement.is_enabled(policy.spec, "gfd")


def _base(facts: ClusterFacts) -> Obj:
    main = container(
        CTR,
        command=["gpu-feature-discovery"],
        env_vars=[
            env("GFD_SLEEP_INTERVAL", "60s"),
            env("GFD_FAIL_ON_INIT_ERROR", "true"),
            common.node_name_env(),
            common.namespace_env("NAMESPACE"),
            common.field_env("POD_NAME", "metadata.name"),
        ],
        mounts=[
            mount("output-dir", FEATURES_DIR),
            # GFD only reads the host's /sys (as upstream mounts it): never writable.
            mount("host-sys", "/sys", read_only=True),
            mount("driver-install-dir", "/driver-root", propagation="HostToContainer"),
            mount("run-nvidia-validations", common.VALIDATIONS_DIR),
        ],
        privileged=True,
    )
    init_cm, sidecar_cm = config_manager.containers(CTR)
    return common.daemonset(
        DS_NAME,
        NAME,
        facts,
        deploy_label="gpu-feature-discovery",
        service_account_name=SA_NAME,
        # Upstream selects GFD pods on app and part-of `nvidia-gpu`.
        part_of=common.PART_OF_VALUE,
        main=[main, sidecar_cm],
        inits=[common.toolkit_ready_init(), init_cm],
        volumes=[
            host_path("output-dir", FEATURES_DIR, "DirectoryOrCreate"),
            host_path("host-sys", "/sys"),
            host_path("driver-install-dir", common.DEFAULT_DRIVER_INSTALL_DIR, "DirectoryOrCreate"),
            *common.VALIDATION_VOLUMES,
        ],
    )


def _transform(ds: Obj, policy: api.ClusterPolicy, facts: ClusterFacts) -> None:
    ctr = common.main_container(ds)
    common.apply_mig_env(ctr, policy)
    common.apply_runtime_class(ds, policy, facts)
    common.apply_operand_spec(ds, policy.spec.gfd, "gfd", facts)
    config_manager.wire(ds, policy, ctr)


def render(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[dict[str, Any]]:
    objects = common.rbac(
        SA_NAME,
        NAME,
        facts,
        cluster_rules=[common.rule([""], ["nodes"], common.READ)],
        # GFD publishes its labels as an NFD NodeFeature object per node.
        namespace_rules=[
            common.rule(["nfd.k8s-sigs.io"], ["nodefeatures"], common.WRITE),
            config_manager.EVENTS_RULE,
        ],
    )
    ds = _base(facts)
    objects.append(common.finalize(ds, policy, facts, lambda d: _transform(d, policy, facts)))
    return objects
