"""Mirrors of the Kubernetes core types the GPU CRDs embed (env, resources, tolerations, ...)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpu_operator.api.base import FreeForm, K8sModel, NonNegativeInt, Quantity


class EnvVar(K8sModel):
    """An environment variable set on an operand container (name and literal value)."""

    name: str = Field(description="Name of the environment variable.")
    value: str | None = Field(default=None, description="Value of the environment variable.")


class ResourceRequirements(K8sModel):
    """Compute resources applied to every container of an operand."""

    limits: dict[str, Quantity] | None = Field(
        default=None, description="Maximum amount of compute resources allowed."
    )
    requests: dict[str, Quantity] | None = Field(
        default=None, description="Minimum amount of compute resources required."
    )


class Toleration(K8sModel):
    """A core/v1 Toleration."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: int | None = None


class SELinuxOptions(K8sModel):
    """A core/v1 SELinuxOptions."""

    user: str | None = None
    role: str | None = None
    type: str | None = None
    level: str | None = None


class SeccompProfile(K8sModel):
    """A core/v1 SeccompProfile."""

    type: Literal["Unconfined", "RuntimeDefault", "Localhost"]
    localhostProfile: str | None = None


class AppArmorProfile(K8sModel):
    """A core/v1 AppArmorProfile."""

    type: Literal["Unconfined", "RuntimeDefault", "Localhost"]
    localhostProfile: str | None = None


class Sysctl(K8sModel):
    """A namespaced kernel parameter set for the pod."""

    name: str
    value: str


class WindowsSecurityContextOptions(K8sModel):
    """A core/v1 WindowsSecurityContextOptions."""

    gmsaCredentialSpecName: str | None = None
    gmsaCredentialSpec: str | None = None
    runAsUserName: str | None = None
    hostProcess: bool | None = None


class PodSecurityContext(K8sModel):
    """A core/v1 PodSecurityContext applied to operand pods."""

    seLinuxOptions: SELinuxOptions | None = None
    windowsOptions: WindowsSecurityContextOptions | None = None
    runAsUser: int | None = None
    runAsGroup: int | None = None
    runAsNonRoot: bool | None = None
    supplementalGroups: list[int] | None = None
    supplementalGroupsPolicy: Literal["Merge", "Strict"] | None = None
    fsGroup: int | None = None
    sysctls: list[Sysctl] | None = None
    fsGroupChangePolicy: Literal["OnRootMismatch", "Always"] | None = None
    seccompProfile: SeccompProfile | None = None
    appArmorProfile: AppArmorProfile | None = None
    seLinuxChangePolicy: str | None = None


class NodeSelectorRequirement(K8sModel):
    """A core/v1 NodeSelectorRequirement."""

    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] | None = None


class NodeSelectorTerm(K8sModel):
    """A core/v1 NodeSelectorTerm."""

    matchExpressions: list[NodeSelectorRequirement] | None = None
    matchFields: list[NodeSelectorRequirement] | None = None


class NodeSelector(K8sModel):
    """A core/v1 NodeSelector."""

    nodeSelectorTerms: list[NodeSelectorTerm]


class PreferredSchedulingTerm(K8sModel):
    """A core/v1 PreferredSchedulingTerm."""

    weight: int = Field(ge=1, le=100)
    preference: NodeSelectorTerm


class NodeAffinity(K8sModel):
    """A core/v1 NodeAffinity."""

    requiredDuringSchedulingIgnoredDuringExecution: NodeSelector | None = None
    preferredDuringSchedulingIgnoredDuringExecution: list[PreferredSchedulingTerm] | None = None


class ContainerProbeSpec(K8sModel):
    """Probe timings; non-zero values override the operand's built-in probe."""

    initialDelaySeconds: NonNegativeInt | None = None
    timeoutSeconds: int | None = Field(default=None, ge=1)
    periodSeconds: int | None = Field(default=None, ge=1)
    successThreshold: int | None = Field(default=None, ge=1)
    failureThreshold: int | None = Field(default=None, ge=1)


class Condition(K8sModel):
    """A metav1.Condition as written into status.conditions."""

    type: str
    status: Literal["True", "False", "Unknown"]
    observedGeneration: int | None = Field(default=None, ge=0)
    lastTransitionTime: str = Field(json_schema_extra={"format": "date-time"})
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str


IMAGE_PATTERN = r"[a-zA-Z0-9\-]+"


class ImageSpec(K8sModel):
    """Where an operand's container image comes from."""

    repository: str | None = Field(default=None, description="Image registry and path.")
    image: str | None = Field(
        default=None,
        pattern=IMAGE_PATTERN,
        description="Image name, or a full reference when repository and version are empty.",
    )
    version: str | None = Field(default=None, description="Image tag, or a sha256 digest.")
    imagePullPolicy: str | None = Field(
        default=None, description="Always, Never or IfNotPresent (anything else: IfNotPresent)."
    )
    imagePullSecrets: list[str] | None = Field(
        default=None, description="Names of image pull secrets in the operator namespace."
    )


class DriverManagerSpec(ImageSpec):
    """The k8s-driver-manager init container (drains GPU pods before a driver (re)install)."""

    env: list[EnvVar] | None = None


# Free-form configuration blobs upstream keeps schemaless.
KataConfig = FreeForm
