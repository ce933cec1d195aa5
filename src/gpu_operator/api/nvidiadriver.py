"""NVIDIADriver (nvidia.com/v1alpha1, cluster-scoped): a driver for one pool of GPU nodes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from gpu_operator.api.base import K8sModel
from gpu_operator.api.clusterpolicy import GPUDirectRDMASpec, SidecarSpec
from gpu_operator.api.core_types import (
    IMAGE_PATTERN,
    Condition,
    ContainerProbeSpec,
    DriverManagerSpec,
    EnvVar,
    NodeAffinity,
    PodSecurityContext,
    ResourceRequirements,
    Toleration,
)
from gpu_operator.api.upgrade_policy import NVIDIADriverUpgradePolicySpec

GROUP = "nvidia.com"
VERSION = "v1alpha1"
KIND = "NVIDIADriver"
PLURAL = "nvidiadrivers"
DEFAULT_IMAGE = "nvcr.io/nvidia/driver"


class ConfigMapRef(K8sModel):
    """A ConfigMap (or Secret) by name."""

    name: str | None = None


class LicensingConfigSpec(K8sModel):
    """vGPU guest driver licensing."""

    secretName: str | None = None
    name: str | None = Field(default=None, description="Deprecated: use secretName.")
    nlsEnabled: bool | None = Field(default=None, description="Unset means enabled.")


class NVIDIADriverSpec(K8sModel):
    """Desired driver for the nodes this object selects."""

    # Upstream marks these required; their CRD defaults make that invisible to most users.
    model_config = ConfigDict(
        json_schema_extra={"crd_required": ["default", "driverType", "image"]}
    )

    default: bool = Field(
        default=False, description="Use for GPU nodes no other NVIDIADriver selects."
    )
    driverType: Literal["gpu", "vgpu", "vgpu-host-manager"] = Field(
        default="gpu",
        description="Kind of driver; immutable.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "driverType is an immutable field"}
            ]
        },
    )
    usePrecompiled: bool | None = Field(
        default=None,
        description="Use precompiled driver images, one per kernel; immutable.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "usePrecompiled is an immutable field"}
            ]
        },
    )
    kernelModuleType: Literal["auto", "open", "proprietary"] = "auto"
    useOpenKernelModules: bool | None = Field(
        default=None, description="Deprecated: use kernelModuleType."
    )
    startupProbe: ContainerProbeSpec | None = None
    livenessProbe: ContainerProbeSpec | None = None
    readinessProbe: ContainerProbeSpec | None = None
    rdma: GPUDirectRDMASpec | None = None
    gds: SidecarSpec | None = None
    gdrcopy: SidecarSpec | None = None
    repository: str | None = None
    image: str = Field(default=DEFAULT_IMAGE, pattern=IMAGE_PATTERN)
    version: str | None = None
    imagePullPolicy: str | None = None
    imagePullSecrets: list[str] | None = None
    manager: DriverManagerSpec | None = None
    resources: ResourceRequirements | None = None
    args: list[str] | None = None
    env: list[EnvVar] | None = None
    repoConfig: ConfigMapRef | None = None
    certConfig: ConfigMapRef | None = None
    licensingConfig: LicensingConfigSpec | None = None
    virtualTopologyConfig: ConfigMapRef | None = None
    kernelModuleConfig: ConfigMapRef | None = None
    secretEnv: str | None = None
    upgradePolicy: NVIDIADriverUpgradePolicySpec | None = None
    nodeSelector: dict[str, str] | None = None
    nodeAffinity: NodeAffinity | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    tolerations: list[Toleration] | None = None
    priorityClassName: str | None = None
    podSecurityContext: PodSecurityContext | None = None
    hostNetwork: bool | None = None


DriverState = Literal["ignored", "ready", "notReady", "disabled"]


class NVIDIADriverStatus(K8sModel):
    """Observed state of the driver pool."""

    state: DriverState
    namespace: str | None = None
    conditions: list[Condition] | None = None


class NVIDIADriver(K8sModel):
    """A driver configuration for a pool of GPU nodes."""

    apiVersion: Literal["nvidia.com/v1alpha1"] = "nvidia.com/v1alpha1"
    kind: Literal["NVIDIADriver"] = "NVIDIADriver"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: NVIDIADriverSpec
    status: NVIDIADriverStatus | None = None

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))


DEFAULT_DRIVER_SELECTOR_RULE = {
    "rule": "!(has(self.default) && self.default) || !has(self.nodeSelector) || "
    "size(self.nodeSelector) == 0",
    "message": "a default NVIDIADriver must not have a nodeSelector",
}
