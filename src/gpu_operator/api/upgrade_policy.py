"""The driver upgrade policy shared by ClusterPolicy and NVIDIADriver, and its defaults."""

from __future__ import annotations

from pydantic import Field

from gpu_operator.api.base import IntOrString, K8sModel, NonNegativeInt


class PodDeletionSpec(K8sModel):
    """How GPU pods are deleted from a node before its driver is upgraded."""

    force: bool = Field(default=False, description="Delete pods not managed by a controller.")
    timeoutSeconds: NonNegativeInt = Field(
        default=300, description="Seconds to wait for the deletion; 0 waits forever."
    )
    deleteEmptyDir: bool = Field(
        default=False, description="Delete pods that use emptyDir volumes (their data is lost)."
    )


class WaitForCompletionSpec(K8sModel):
    """Which jobs must finish before a node's upgrade continues."""

    podSelector: str | None = Field(
        default=None, description="Label selector of the pods to wait for."
    )
    timeoutSeconds: NonNegativeInt = Field(
        default=0, description="Seconds to wait for completion; 0 waits forever."
    )


class DrainSpec(K8sModel):
    """Node drain settings used when GPU pod deletion is not enough."""

    enable: bool = Field(default=False, description="Drain the node before the upgrade.")
    force: bool = Field(default=False, description="Drain pods not managed by a controller.")
    podSelector: str | None = Field(
        default=None, description="Label selector limiting which pods are drained."
    )
    timeoutSeconds: NonNegativeInt = Field(
        default=300, description="Seconds to wait for the drain; 0 waits forever."
    )
    deleteEmptyDir: bool = Field(
        default=False, description="Drain pods that use emptyDir volumes (their data is lost)."
    )


class DriverUpgradePolicySpec(K8sModel):
    """Rolling driver upgrade policy (ClusterPolicy: autoUpgrade defaults to false)."""

    autoUpgrade: bool = Field(
        default=False, description="Let the operator upgrade drivers node by node."
    )
    maxParallelUpgrades: NonNegativeInt = Field(
        default=1, description="Nodes upgraded at the same time; 0 means no limit."
    )
    maxUnavailable: IntOrString = Field(
        default="25%",
        description="Nodes (count or percentage, rounded up) that may be unavailable at once.",
    )
    podDeletion: PodDeletionSpec | None = None
    waitForCompletion: WaitForCompletionSpec | None = None
    drain: DrainSpec | None = None


class NVIDIADriverUpgradePolicySpec(DriverUpgradePolicySpec):
    """Rolling driver upgrade policy of an NVIDIADriver (autoUpgrade defaults to true)."""

    autoUpgrade: bool = Field(
        default=True, description="Let the operator upgrade drivers node by node."
    )


def with_defaults(policy: DriverUpgradePolicySpec | None) -> DriverUpgradePolicySpec:
    """Fill every unset part of a policy like upstream's GetUpgradePolicyWithDefaults.

    A missing policy means auto-upgrade on, one node at a time, 25% unavailable.
    """
    if policy is None:
        return NVIDIADriverUpgradePolicySpec(
            podDeletion=PodDeletionSpec(),
            waitForCompletion=WaitForCompletionSpec(),
            drain=DrainSpec(),
        )
    return policy.model_copy(
        update={
            "podDeletion": policy.podDeletion or PodDeletionSpec(),
            "waitForCompletion": policy.waitForCompletion or WaitForCompletionSpec(),
            "drain": policy.drain or DrainSpec(),
        }
    )
