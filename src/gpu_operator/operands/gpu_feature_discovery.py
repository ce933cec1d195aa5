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
            common.namespace_env("NAMESPACE"),
            common.node_name_env(),
            common.field_env("POD_NAME", "metadata.name"),
        ],
        mounts=[
            mount("output-dir", FEATURES_DIR),
            # GFD only reads the host's /sys (as upstream mounts it): never writable.
            mount("host-sys", "/sys", read_only=True),
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
            host_path("output-dir", FEATURES_DIR),
            host_path("host-sys", "/sys"),
            common.run_nvidia_volume(),
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
        # Upstream's Role: GFD publishes its labels as an NFD NodeFeature object per node, owned
        # by its own pod (read by POD_NAME); ours also lets it patch and delete that object and
        # record the config manager's Events.
        namespace_rules=[
            common.SCC_USE_PRIVILEGED,
            common.rule(["nfd.k8s-sigs.io"], ["nodefeatures"], common.WRITE),
            common.rule([""], ["pods"], ("get",)),
            config_manager.EVENTS_RULE,
        ],
    )
    ds = _base(facts)
    objects.append(common.finalize(ds, policy, facts, lambda d: _transform(d, policy, facts)))
    return objects
