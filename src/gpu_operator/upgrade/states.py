"""Upgrade states and the node keys the upgrade writes: upstream's spellings, plus a few of ours.

The state values and upstream's keys are a contract (dashboards, runbooks and
k8s-driver-manager read them). Keys under `nvidia.com/gpu-operator.upgrade-` are this operator's
own additions; upstream ignores them.
"""

from __future__ import annotations

from typing import Final

from gpu_operator.api import keys

STATE_LABEL: Final = keys.UPGRADE_STATE

UNKNOWN: Final = ""
UPGRADE_REQUIRED: Final = "upgrade-required"
CORDON_REQUIRED: Final = "cordon-required"
WAIT_FOR_JOBS_REQUIRED: Final = "wait-for-jobs-required"
POD_DELETION_REQUIRED: Final = "pod-deletion-required"
DRAIN_REQUIRED: Final = "drain-required"
POD_RESTART_REQUIRED: Final = "pod-restart-required"
VALIDATION_REQUIRED: Final = "validation-required"
UNCORDON_REQUIRED: Final = "uncordon-required"
UPGRADE_DONE: Final = "upgrade-done"
UPGRADE_FAILED: Final = "upgrade-failed"

# In the order a node passes through them.
ORDER: Final = (
    UPGRADE_REQUIRED,
    CORDON_REQUIRED,
    WAIT_FOR_JOBS_REQUIRED,
    POD_DELETION_REQUIRED,
    DRAIN_REQUIRED,
    POD_RESTART_REQUIRED,
    VALIDATION_REQUIRED,
    UNCORDON_REQUIRED,
    UPGRADE_DONE,
    UPGRADE_FAILED,
)
KNOWN: Final = frozenset(ORDER)
# States in which the node must already be cordoned: finding one uncordoned means the label is
# stale (left by an earlier run, or copied), and following it would skip the cordon and eviction.
CORDONED_STATES: Final = frozenset(
    {
        WAIT_FOR_JOBS_REQUIRED,
        POD_DELETION_REQUIRED,
        DRAIN_REQUIRED,
        POD_RESTART_REQUIRED,
        VALIDATION_REQUIRED,
    }
)
# States after which the driver pod may already have been replaced (no way back but forward).
DRIVER_TOUCHED: Final = frozenset({POD_RESTART_REQUIRED, VALIDATION_REQUIRED, UNCORDON_REQUIRED})
# Counted as "not in progress" by upstream's slot arithmetic.
IDLE: Final = frozenset({UNKNOWN, UPGRADE_DONE, UPGRADE_REQUIRED})

# Upstream's node annotations (k8s-operator-libs, driver name "gpu").
INITIAL_UNSCHEDULABLE: Final = keys.UPGRADE_INITIAL_UNSCHEDULABLE
WAIT_FOR_COMPLETION_START: Final = keys.UPGRADE_WAIT_FOR_POD_COMPLETION_START
VALIDATION_START: Final = keys.UPGRADE_VALIDATION_START
REQUESTED: Final = keys.UPGRADE_REQUESTED
SAFE_LOAD: Final = keys.UPGRADE_SAFE_LOAD
SKIP_LABEL: Final = keys.UPGRADE_SKIP
DRAIN_SKIP_LABEL: Final = keys.UPGRADE_DRAIN_SKIP
EVENT_REASON: Final = "GPUDriverUpgrade"

# Ours: when the node entered its current state (Unix seconds), for timeouts that survive a
# restart of the operator (upstream keeps the drain and pod-deletion clocks in memory).
STATE_SINCE: Final = "nvidia.com/gpu-operator.upgrade-state-since"
# Ours: why the node failed and how to retry, in words.
FAILURE: Final = "nvidia.com/gpu-operator.upgrade-failure"
# Ours: the driver revision the node ran before its upgrade started (rollback goes back to it).
FROM_REVISION: Final = "nvidia.com/gpu-operator.upgrade-from-revision"
# Ours: the revision a canary node tested; a pool's canary passed when its canaries are done.
CANARY: Final = "nvidia.com/gpu-operator.upgrade-canary"
# Ours (label): a node returned to its previous driver; the value is that revision's hash and
# the rollback DaemonSet selects on it.
ROLLBACK_LABEL: Final = "nvidia.com/gpu-operator.upgrade-rollback"
# The driver deploy label while a rollback DaemonSet serves the node instead of the main one.
DRIVER_DEPLOY_LABEL: Final = keys.DEPLOY_PREFIX + "driver"
ROLLBACK_PAUSE: Final = "paused-for-driver-rollback"

# Ours, on a ClusterPolicy or NVIDIADriver: the canary and rollback extension (docs/upgrades.md).
CANARY_NODES: Final = "nvidia.com/gpu-operator.upgrade-canary-nodes"
MAX_FAILED_NODES: Final = "nvidia.com/gpu-operator.upgrade-max-failed-nodes"
ROLLBACK: Final = "nvidia.com/gpu-operator.upgrade-rollback"
VALIDATION_TIMEOUT: Final = "nvidia.com/gpu-operator.upgrade-validation-timeout-seconds"
POLICY_ANNOTATIONS: Final = (CANARY_NODES, MAX_FAILED_NODES, ROLLBACK, VALIDATION_TIMEOUT)

# Node annotations the upgrade clears when a node finishes (done, or retried from the start).
PROGRESS_ANNOTATIONS: Final = (
    INITIAL_UNSCHEDULABLE,
    WAIT_FOR_COMPLETION_START,
    VALIDATION_START,
    STATE_SINCE,
    FAILURE,
    FROM_REVISION,
)

# Pod labels.
VALIDATOR_APP: Final = "nvidia-operator-validator"
DRIVER_APP: Final = "nvidia-driver-daemonset"
DRIVER_COMPONENT: Final = "nvidia-driver"
REVISION_HASH_LABEL: Final = "controller-revision-hash"
# A driver pod restarting more often than this while its node waits has failed (upstream: 10).
MAX_DRIVER_RESTARTS: Final = 10
DEFAULT_VALIDATION_TIMEOUT: Final = 600
# How often blocked evictions are retried (upstream's drain helper waits 5 s between tries).
EVICTION_RETRY_SECONDS: Final = 5.0
