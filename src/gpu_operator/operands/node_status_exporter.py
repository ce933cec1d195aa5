"""State `state-node-status-exporter`: validation results per node as metrics on port 8000."""

from __future__ import annotations

from typing import Any

from gpu_operator import api
from gpu_operator.api import enablement
from gpu_operator.operands import common
from gpu_operator.operands.common import Obj, container, env, host_path, mount
from gpu_operator.operands.facts import ClusterFacts

NAME = "state-node-status-exporter"
DS_NAME = "nvidia-node-status-exporter"
SA_NAME = "nvidia-node-status-exporter"
CTR = "nvidia-node-status-exporter"
PORT = 8000
PORT_NAME = "node-status"


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    return enablement.is_enabled(policy.spec, "nodeStatusExporter")


def _base(facts: ClusterFacts) -> Obj:
    main = container(
        CTR,
        command=["nvidia-validator"],
        env_vars=[
            env("COMPONENT", "metrics"),
            env("METRICS_PORT", str(PORT)),
            common.node_name_env(),
            common.namespace_env(),
        ],
        mounts=[
            mount("run-nvidia-validations", common.VALIDATIONS_DIR, propagation="HostToContainer"),
            mount(
                "driver-install-dir",
                "/run/nvidia/driver",
                read_only=True,
                propagation="HostToContainer",
            ),
            mount("host-root", "/host", read_only=True, propagation="HostToContainer"),
        ],
        privileged=True,
    )
    main["ports"] = [{"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"}]
    return common.daemonset(
        DS_NAME,
        NAME,
        facts,
        deploy_label="node-status-exporter",
        service_account_name=SA_NAME,
        main=[main],
        volumes=[
            *common.VALIDATION_VOLUMES,
            host_path("driver-install-dir", common.DEFAULT_DRIVER_INSTALL_DIR, "DirectoryOrCreate"),
            host_path("host-root", "/"),
        ],
    )


def render(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[dict[str, Any]]:
    """RBAC, DaemonSet, Service (8000) and a ServiceMonitor when its CRD exists."""
    objects = common.rbac(
        SA_NAME,
        NAME,
        facts,
        cluster_rules=[common.rule([""], ["nodes"], common.READ)],
        # Upstream's Role: pods/nodes reads in the namespace, and SCC use (upstream: any SCC;
        # here only `privileged`, which is all the pod needs).
        namespace_rules=[
            common.SCC_USE_PRIVILEGED,
            common.rule([""], ["pods", "nodes"], ("get", "list")),
        ],
    )
    spec = policy.spec.nodeStatusExporter
    ds = _base(facts)
    objects.append(
        common.finalize(
            ds,
            policy,
            facts,
            lambda d: common.apply_operand_spec(d, spec, "nodeStatusExporter", facts),
        )
    )
    objects.append(
        common.service(
            DS_NAME,
            NAME,
            facts,
            port=PORT,
            port_name=PORT_NAME,
            annotations={"prometheus.io/scrape": "true"},
        )
    )
    if facts.has_servicemonitor_crd:
        objects.append(
            common.service_monitor(
                DS_NAME, NAME, facts, port_name=PORT_NAME, settings=None, job_label="node-status"
            )
        )
    return objects
