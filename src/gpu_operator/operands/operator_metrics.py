"""State `state-operator-metrics`: the Service (and ServiceMonitor) for the operator's metrics."""

from __future__ import annotations

from typing import Any

from gpu_operator import api
from gpu_operator.operands import common
from gpu_operator.operands.facts import ClusterFacts

NAME = "state-operator-metrics"
SERVICE_NAME = "gpu-operator"
PORT = 8080
PORT_NAME = "gpu-operator-metrics"


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    return True


def render(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[dict[str, Any]]:
    """Service `gpu-operator` on 8080; a ServiceMonitor whenever its CRD exists."""
    objects = [
        common.service(
            SERVICE_NAME,
            NAME,
            facts,
            port=PORT,
            port_name=PORT_NAME,
            annotations={"prometheus.io/scrape": "true"},
        )
    ]
    if facts.has_servicemonitor_crd:
        metrics = policy.spec.operator.metrics
        objects.append(
            common.service_monitor(
                SERVICE_NAME,
                NAME,
                facts,
                port_name=PORT_NAME,
                settings=metrics.serviceMonitor if metrics else None,
                job_label="operator",
            )
        )
    return objects
