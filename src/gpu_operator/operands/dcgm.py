"""State `state-dcgm`: the standalone DCGM host engine and its node-local Service."""

from __future__ import annotations

from typing import Any

from gpu_operator import api
from gpu_operator.api import enablement
from gpu_operator.operands import common
from gpu_operator.operands.common import Obj, container
from gpu_operator.operands.facts import ClusterFacts

NAME = "state-dcgm"
DS_NAME = "nvidia-dcgm"
SA_NAME = "nvidia-dcgm"
CTR = "nvidia-dcgm-ctr"
PORT = 5555


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    return enablement.is_enabled(policy.spec, "dcgm")


def host_engine_container() -> Obj:
    """The host engine's container: port 5555 and upstream's TCP probes (a GPUCluster's
    `nvidia-dcgm-dra` runs the same one, operands/dra_driver.py)."""
    main = container(CTR, command=["nv-hostengine"], args=["-n", "-b", "ALL"], privileged=True)
    main["ports"] = [{"name": "dcgm", "containerPort": PORT, "protocol": "TCP"}]
    # Upstream's probes: the host engine accepts connections on its port.
    probe = {"tcpSocket": {"port": PORT}, "initialDelaySeconds": 15}
    main["livenessProbe"] = dict(probe)
    main["readinessProbe"] = dict(probe)
    return main


def _base(facts: ClusterFacts) -> Obj:
    main = host_engine_container()
    return common.daemonset(
        DS_NAME,
        NAME,
        facts,
        deploy_label="dcgm",
        service_account_name=SA_NAME,
        main=[main],
        inits=[common.toolkit_ready_init()],
        volumes=[common.run_nvidia_volume()],
    )


def _transform(ds: Obj, policy: api.ClusterPolicy, facts: ClusterFacts) -> None:
    common.apply_runtime_class(ds, policy, facts)
    common.apply_operand_spec(ds, policy.spec.dcgm, "dcgm", facts)


def render(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[dict[str, Any]]:
    """The host engine DaemonSet and Service `nvidia-dcgm` (5555, node-local traffic only)."""
    # Upstream's Role grants only the OpenShift SCC.
    objects = common.rbac(SA_NAME, NAME, facts, namespace_rules=[common.SCC_USE_PRIVILEGED])
    ds = _base(facts)
    objects.append(common.finalize(ds, policy, facts, lambda d: _transform(d, policy, facts)))
    # Local traffic policy: each exporter talks to the host engine on its own node.
    objects.append(
        common.service(
            DS_NAME, NAME, facts, port=PORT, port_name="dcgm", internal_traffic_policy="Local"
        )
    )
    return objects
