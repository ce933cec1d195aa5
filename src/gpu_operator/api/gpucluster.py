"""GPUCluster (nvidia.com/v1alpha1, cluster-scoped): NVIDIA's 26.x DRA-based software stack.

One per cluster, named `gpu-cluster` (a rule of the CRD). The operator reconciles it
(controller/gpucluster.py) into the DRA driver's states (operands/dra_driver.py); a cluster runs
a GPUCluster or a ClusterPolicy, never both (status/gpucluster.py). The DCGM, exporter and
daemonsets sections are ClusterPolicy's own types; the DRA stack does not deploy DCGM or the
exporter yet (docs/dra.md).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from gpu_operator.api.base import K8sModel
from gpu_operator.api.clusterpolicy import DaemonsetsSpec, DCGMExporterSpec, DCGMSpec
from gpu_operator.api.core_types import IMAGE_PATTERN, Condition, EnvVar, ResourceRequirements

GROUP = "nvidia.com"
VERSION = "v1alpha1"
KIND = "GPUCluster"
PLURAL = "gpuclusters"
# There is one per cluster, by this name (a validation rule of the CRD, as upstream's).
NAME = "gpu-cluster"
SINGLETON_RULE = {
    "rule": f"self.metadata.name == '{NAME}'",
    "message": f"GPUCluster is a singleton, metadata.name must be '{NAME}'",
}


# Defaults of the kubelet-plugin containers' gRPC health services (NVIDIA's), and their HTTP
# (metrics) endpoints: the two containers share the pod's network namespace.
GPUS_HEALTHCHECK_PORT = 51516
COMPUTE_DOMAINS_HEALTHCHECK_PORT = 51515
GPUS_HTTP_PORT = 8080
COMPUTE_DOMAINS_HTTP_PORT = 8081
# Feature gates of NVIDIA's DRA driver (its pkg/featuregates) and the logging gates of
# Kubernetes' component-base it also accepts; it refuses to start on any other name.
KNOWN_FEATURE_GATES = frozenset({
    "TimeSlicingSettings", "MPSSupport", "IMEXDaemonsWithDNSNames", "PassthroughSupport",
    "NVMLDeviceHealthCheck", "DynamicMIG", "ComputeDomainCliques", "CrashOnNVLinkFabricErrors",
    "DeviceMetadata", "ContextualLogging", "LoggingAlphaOptions", "LoggingBetaOptions",
    "LoggingStableOptions",
})  # fmt: skip


class DRADriverHealthcheckSpec(K8sModel):
    """The gRPC health service of a kubelet-plugin container, checked by its probes."""

    enabled: bool = Field(default=True, description="Serve and probe the health service.")
    port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Port of the health service (default 51516 for gpus, 51515 for "
        "computeDomains).",
        json_schema_extra={"format": "int32"},
    )


class DRADriverKubeletPluginSpec(K8sModel):
    """One container of the DRA driver's kubelet-plugin DaemonSet."""

    env: list[EnvVar] | None = Field(default=None, description="Environment variables.")
    resources: ResourceRequirements | None = None
    healthcheck: DRADriverHealthcheckSpec | None = None


class DRADriverControllerSpec(K8sModel):
    """The compute-domain controller Deployment."""

    env: list[EnvVar] | None = Field(default=None, description="Environment variables.")
    resources: ResourceRequirements | None = None


class DRADriverGPUsSpec(K8sModel):
    """The gpu.nvidia.com capability of the DRA driver (always deployed)."""

    kubeletPlugin: DRADriverKubeletPluginSpec | None = None


class DRADriverComputeDomainsSpec(K8sModel):
    """The compute-domain capability of the DRA driver."""

    enabled: bool = Field(default=True, description="Deploy the compute-domain capability.")
    controller: DRADriverControllerSpec | None = None
    kubeletPlugin: DRADriverKubeletPluginSpec | None = None


class DRADriverSpec(K8sModel):
    """The NVIDIA DRA driver stack (gpus and computeDomains)."""

    repository: str | None = Field(default=None, description="Image registry and path.")
    image: str | None = Field(default=None, pattern=f"^{IMAGE_PATTERN}$", description="Image name.")
    version: str | None = Field(default=None, description="Image tag.")
    imagePullPolicy: str | None = None
    imagePullSecrets: list[str] | None = Field(
        default=None, description="Names of image pull secrets in the operator namespace."
    )
    featureGates: dict[str, bool] | None = Field(
        default=None, description="Feature gates of the DRA driver (its FEATURE_GATES env)."
    )
    gpus: DRADriverGPUsSpec | None = None
    computeDomains: DRADriverComputeDomainsSpec | None = None


class GPUClusterHostPathsSpec(K8sModel):
    """Host paths of the DRA stack (its host root is always /)."""

    driverInstallDir: str | None = Field(
        default=None, description="Where the driver is installed on the host."
    )
    kubeletRootDir: str = Field(default="/var/lib/kubelet", description="Kubelet root directory.")


class GPUClusterSpec(K8sModel):
    """The DRA-based stack: the DRA driver, DCGM and its exporter (not the driver itself, nor
    the device plugin)."""

    draDriver: DRADriverSpec
    dcgm: DCGMSpec | None = None
    dcgmExporter: DCGMExporterSpec | None = None
    hostPaths: GPUClusterHostPathsSpec | None = None
    daemonsets: DaemonsetsSpec | None = None


class GPUClusterStatus(K8sModel):
    """Observed state of the DRA-based stack."""

    state: Literal["ready", "notReady", "disabled"]
    namespace: str | None = Field(default=None, description="Namespace of the operands.")
    conditions: list[Condition] | None = None


class GPUCluster(K8sModel):
    """NVIDIA's DRA-based GPU stack of a cluster (one, named gpu-cluster)."""

    apiVersion: Literal["nvidia.com/v1alpha1"] = "nvidia.com/v1alpha1"
    kind: Literal["GPUCluster"] = "GPUCluster"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: GPUClusterSpec | None = None
    status: GPUClusterStatus | None = None
