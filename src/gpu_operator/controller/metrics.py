"""The operator's Prometheus metrics, with upstream's names (prefix `gpu_operator_`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

# reconciliation_status values (upstream): 1 ready, 0 not ready, -1 no ClusterPolicy, -2 error.
STATUS_READY = 1
STATUS_NOT_READY = 0
STATUS_NO_POLICY = -1
STATUS_ERROR = -2


class OperatorMetrics:
    """One registry per operator instance (tests run several in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.gpu_nodes = Gauge(
            "gpu_operator_gpu_nodes_total", "GPU nodes in the cluster.", registry=r
        )
        self.status = Gauge(
            "gpu_operator_reconciliation_status",
            "1 ready, 0 not ready, -1 no ClusterPolicy, -2 reconcile error.",
            registry=r,
        )
        self.last_success = Gauge(
            "gpu_operator_reconciliation_last_success_ts_seconds",
            "Unix time of the last reconcile that found everything ready.",
            registry=r,
        )
        self.total = Counter(
            "gpu_operator_reconciliation", "ClusterPolicy reconciles run.", registry=r
        )
        self.failed = Counter(
            "gpu_operator_reconciliation_failed",
            "ClusterPolicy reconciles that failed.",
            registry=r,
        )
        self.has_nfd = Gauge(
            "gpu_operator_reconciliation_has_nfd_labels",
            "1 when nodes carry NFD labels.",
            registry=r,
        )
        self.auto_upgrade = Gauge(
            "gpu_operator_driver_auto_upgrade_enabled",
            "1 when automatic driver upgrades are on.",
            registry=r,
        )
        self.upgrades = {
            state: Gauge(
                f"gpu_operator_nodes_upgrades_{state}",
                f"Nodes whose driver upgrade is {state.replace('_', ' ')}.",
                registry=r,
            )
            for state in ("in_progress", "done", "failed", "available", "pending")
        }
        self.status.set(STATUS_NO_POLICY)
