"""ClusterPolicy (nvidia.com/v1, cluster-scoped): the one object that describes the whole GPU stack.

Field names are upstream's spellings (they are a contract); defaults are upstream's CRD defaults.
`enabled` fields stay None when unset: `enablement` knows what None means for each section.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from gpu_operator.api.base import FreeForm, K8sModel
from gpu_operator.api.core_types import (
    Condition,
    ContainerProbeSpec,
    DriverManagerSpec,
    EnvVar,
    ImageSpec,
    PodSecurityContext,
    ResourceRequirements,
    Toleration,
)
from gpu_operator.api.upgrade_policy import DriverUpgradePolicySpec

GROUP = "nvidia.com"
VERSION = "v1"
KIND = "ClusterPolicy"
PLURAL = "clusterpolicies"

# Prometheus durations as upstream's CRD accepts them (promv1.Duration): units y, w, d, h, m, s
# and ms in that order, or "0"; the empty string means unset.
DURATION_PATTERN = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)


class ContainerSpec(ImageSpec):
    """Image plus resources, args and env overrides of an operand's main container."""

    resources: ResourceRequirements | None = None
    args: list[str] | None = Field(default=None, description="Replace the container's args.")
    env: list[EnvVar] | None = Field(
        default=None, description="Environment variables, applied after the operator's own."
    )


HOST_NETWORK_DESCRIPTION = (
    "Run the operand pods in the host's network namespace (dnsPolicy ClusterFirstWithHostNet)."
)


class OperandSpec(ContainerSpec):
    """An operand that can be switched on and off."""

    enabled: bool | None = Field(default=None, description="Deploy this operand.")
    hostNetwork: bool | None = Field(default=None, description=HOST_NETWORK_DESCRIPTION)


class InitContainerSpec(ImageSpec):
    """Deprecated CUDA base image used for init containers."""


class ServiceMonitorSpec(K8sModel):
    """Prometheus-operator ServiceMonitor settings."""

    enabled: bool | None = None
    interval: str | None = Field(
        default=None,
        pattern=DURATION_PATTERN,
        description="How often Prometheus scrapes, e.g. 15s; unset: its global interval.",
    )
    scrapeTimeout: str | None = Field(
        default=None,
        pattern=DURATION_PATTERN,
        description="Scrape timeout, at most the interval, e.g. 10s; unset: its global timeout.",
    )
    honorLabels: bool | None = None
    additionalLabels: dict[str, str] | None = None
    relabelings: list[RelabelConfig] | None = None


class RelabelConfig(K8sModel):
    """A Prometheus relabelling rule applied to scraped targets."""

    sourceLabels: list[str] | None = None
    separator: str | None = None
    targetLabel: str | None = None
    regex: str | None = None
    modulus: int | None = Field(default=None, ge=0)
    replacement: str | None = None
    action: str | None = None


class OperatorMetricsSpec(K8sModel):
    """How the operator's own metrics are scraped."""

    serviceMonitor: ServiceMonitorSpec | None = None


class OperatorSpec(K8sModel):
    """Settings of the operator itself."""

    defaultRuntime: Literal["docker", "crio", "containerd"] = Field(
        default="docker", description="Deprecated and ignored: the runtime is detected per node."
    )
    runtimeClass: str = Field(default="nvidia", description="RuntimeClass given to operand pods.")
    initContainer: InitContainerSpec | None = Field(
        default=None, description="Deprecated CUDA base image."
    )
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    use_ocp_driver_toolkit: bool | None = Field(
        default=None, description="Build drivers with the OpenShift Driver Toolkit."
    )
    metrics: OperatorMetricsSpec | None = None


class RollingUpdateSpec(K8sModel):
    """Rolling update settings of the operand DaemonSets."""

    maxUnavailable: str | None = Field(
        default=None, description='Pods unavailable during an update: "1" or "25%".'
    )


class DaemonsetsSpec(K8sModel):
    """Settings applied to every operand DaemonSet."""

    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    tolerations: list[Toleration] | None = Field(
        default=None, description="Replace the default nvidia.com/gpu toleration."
    )
    priorityClassName: str | None = None
    updateStrategy: Literal["RollingUpdate", "OnDelete"] = "RollingUpdate"
    rollingUpdate: RollingUpdateSpec | None = None
    podSecurityContext: PodSecurityContext | None = None


class GPUDirectRDMASpec(K8sModel):
    """GPUDirect RDMA (nvidia-peermem) settings."""

    enabled: bool | None = None
    useHostMofed: bool | None = Field(
        default=None, description="The MOFED driver is installed on the host."
    )


class DriverRepoConfigSpec(K8sModel):
    """Custom package repository configuration for driver builds."""

    configMapName: str | None = None


class DriverCertConfigSpec(K8sModel):
    """Custom certificates for driver builds."""

    name: str | None = None


class DriverLicensingConfigSpec(K8sModel):
    """vGPU guest driver licensing."""

    configMapName: str | None = Field(default=None, description="Deprecated: use secretName.")
    secretName: str | None = None
    nlsEnabled: bool | None = None


class VirtualTopologyConfigSpec(K8sModel):
    """vGPU virtual topology daemon configuration."""

    config: str | None = Field(default=None, description="ConfigMap with the topology config.")


class KernelModuleConfigSpec(K8sModel):
    """Kernel module parameters for the driver."""

    name: str | None = Field(default=None, description="ConfigMap with module parameter files.")


class DriverSpec(OperandSpec):
    """The NVIDIA driver container."""

    useNvidiaDriverCRD: bool | None = Field(
        default=None, description="Manage drivers through NVIDIADriver objects instead."
    )
    usePrecompiled: bool | None = Field(
        default=None, description="Use precompiled driver images, one per kernel."
    )
    useOpenKernelModules: bool | None = Field(
        default=None, description="Deprecated: use kernelModuleType."
    )
    kernelModuleType: Literal["auto", "open", "proprietary"] = "auto"
    startupProbe: ContainerProbeSpec | None = None
    livenessProbe: ContainerProbeSpec | None = None
    readinessProbe: ContainerProbeSpec | None = None
    rdma: GPUDirectRDMASpec | None = None
    upgradePolicy: DriverUpgradePolicySpec | None = None
    manager: DriverManagerSpec | None = None
    repoConfig: DriverRepoConfigSpec | None = None
    certConfig: DriverCertConfigSpec | None = None
    licensingConfig: DriverLicensingConfigSpec | None = None
    virtualTopology: VirtualTopologyConfigSpec | None = None
    kernelModuleConfig: KernelModuleConfigSpec | None = None
    secretEnv: str | None = Field(
        default=None, description="Secret whose keys become driver container env vars."
    )


class ToolkitSpec(OperandSpec):
    """The NVIDIA container toolkit (runtime configuration and CDI)."""

    installDir: str = Field(default="/usr/local/nvidia", description="Host install directory.")


class DevicePluginConfig(K8sModel):
    """ConfigMap with device-plugin configs (shared with GFD and the MPS daemon)."""

    name: str | None = None
    default: str | None = Field(default=None, description="Key of the config used by default.")


class MPSConfig(K8sModel):
    """MPS control daemon settings."""

    root: str = Field(default="/run/nvidia/mps", description="Host directory for MPS pipes.")


class DevicePluginSpec(OperandSpec):
    """The kubelet device plugin."""

    config: DevicePluginConfig | None = None
    mps: MPSConfig | None = None


class DCGMExporterMetricsConfig(K8sModel):
    """ConfigMap with the exporter's metrics CSV (key dcgm-metrics.csv)."""

    name: str | None = None


class DCGMExporterServiceConfig(K8sModel):
    """The exporter's Service."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] | None = None
    internalTrafficPolicy: Literal["Cluster", "Local"] | None = None


class DCGMExporterHPCJobMappingConfig(K8sModel):
    """HPC job to GPU mapping."""

    enabled: bool | None = None
    directory: str = "/var/lib/dcgm-exporter/job-mapping"


class DCGMExporterSpec(OperandSpec):
    """The DCGM Prometheus exporter."""

    config: DCGMExporterMetricsConfig | None = None
    serviceMonitor: ServiceMonitorSpec | None = None
    service: DCGMExporterServiceConfig | None = None
    annotations: dict[str, str] | None = Field(
        default=None, description="Annotations added to the exporter pods."
    )
    hostPID: bool | None = Field(default=None, description="Run in the host's PID namespace.")
    hpcJobMapping: DCGMExporterHPCJobMappingConfig | None = None
    enablePodLabels: bool | None = Field(
        default=None,
        description="Add the labels of the pod using a GPU to its metrics (reads all pods).",
    )
    enablePodUID: bool | None = Field(
        default=None,
        description="Add the UID of the pod using a GPU to its metrics (reads all pods).",
    )
    podLabelAllowlistRegex: list[str] | None = Field(
        default=None,
        description="Regular expressions of the pod labels kept in metrics; empty keeps all.",
    )


class DCGMSpec(OperandSpec):
    """The standalone DCGM host engine."""

    hostPort: int | None = Field(default=None, description="Deprecated and ignored.")


class NodeStatusExporterSpec(OperandSpec):
    """The node status exporter (validation results as metrics)."""


class GPUFeatureDiscoverySpec(OperandSpec):
    """GPU feature discovery (node labels describing the GPUs)."""


class MIGSpec(K8sModel):
    """How MIG devices are exposed."""

    strategy: Literal["none", "single", "mixed"] | None = None


class MIGPartedConfigSpec(K8sModel):
    """ConfigMap with mig-parted configurations."""

    name: str | None = None
    default: Literal["all-disabled", ""] = "all-disabled"


class MIGGPUClientsConfigSpec(K8sModel):
    """ConfigMap listing the host GPU clients stopped during MIG changes."""

    name: str | None = None


class MIGManagerSpec(OperandSpec):
    """The MIG manager."""

    config: MIGPartedConfigSpec | None = None
    gpuClientsConfig: MIGGPUClientsConfigSpec | None = None


class PSPSpec(K8sModel):
    """Deprecated pod security policies."""

    enabled: bool | None = None


class PSASpec(K8sModel):
    """Pod security admission labels on the operator namespace."""

    enabled: bool | None = None


class ComponentValidatorSpec(K8sModel):
    """Extra env for one validation step."""

    env: list[EnvVar] | None = None


class ValidatorSpec(ContainerSpec):
    """The operator validator (always deployed)."""

    plugin: ComponentValidatorSpec | None = None
    toolkit: ComponentValidatorSpec | None = None
    driver: ComponentValidatorSpec | None = None
    cuda: ComponentValidatorSpec | None = None
    vfioPCI: ComponentValidatorSpec | None = None
    vgpuManager: ComponentValidatorSpec | None = None
    vgpuDevices: ComponentValidatorSpec | None = None
    hostNetwork: bool | None = Field(default=None, description=HOST_NETWORK_DESCRIPTION)


class SidecarSpec(ImageSpec):
    """A driver sidecar (GDS nvidia-fs, GDRCopy) with no resources of its own."""

    enabled: bool | None = None
    args: list[str] | None = None
    env: list[EnvVar] | None = None


class SandboxWorkloadsSpec(K8sModel):
    """VM (KubeVirt or Kata) workloads on GPU nodes."""

    enabled: bool | None = None
    defaultWorkload: Literal["container", "vm-passthrough", "vm-vgpu"] = "container"
    mode: Literal["kubevirt", "kata"] = "kubevirt"


class VFIOManagerSpec(OperandSpec):
    """Binds GPUs to vfio-pci for passthrough."""

    driverManager: DriverManagerSpec | None = None


class VGPUManagerSpec(OperandSpec):
    """The vGPU host driver."""

    driverManager: DriverManagerSpec | None = None
    kernelModuleConfig: KernelModuleConfigSpec | None = None


class VGPUDevicesConfigSpec(K8sModel):
    """ConfigMap with vGPU device configurations."""

    name: str | None = None
    default: str = "default"


class VGPUDeviceManagerSpec(OperandSpec):
    """Creates vGPU devices on the host."""

    config: VGPUDevicesConfigSpec | None = None


class SandboxDevicePluginSpec(OperandSpec):
    """The KubeVirt GPU device plugin."""


class KataSandboxDevicePluginSpec(OperandSpec):
    """The Kata GPU device plugin."""


class KataManagerSpec(OperandSpec):
    """Deprecated: never deployed."""

    config: FreeForm | None = None


class CCManagerSpec(OperandSpec):
    """Confidential computing mode manager."""

    defaultMode: Literal["on", "off", "devtools"] | None = None


class CDIConfigSpec(K8sModel):
    """Container Device Interface settings."""

    enabled: bool = Field(default=True, description="Use CDI to inject GPUs into containers.")
    default: bool = Field(default=False, description="Deprecated and ignored.")
    nriPluginEnabled: bool = Field(
        default=False, description="Inject GPUs through the NRI plugin (needs CDI and toolkit)."
    )


class HostPathsSpec(K8sModel):
    """Host paths operands use."""

    rootFS: str = Field(default="/", description="Host root filesystem.")
    driverInstallDir: str = Field(
        default="/run/nvidia/driver", description="Where the driver is installed on the host."
    )
    kubeletRootDir: str = Field(default="/var/lib/kubelet", description="Kubelet root directory.")


class ClusterPolicySpec(K8sModel):
    """Desired state of the GPU software stack."""

    operator: OperatorSpec
    daemonsets: DaemonsetsSpec
    driver: DriverSpec
    toolkit: ToolkitSpec
    devicePlugin: DevicePluginSpec
    dcgmExporter: DCGMExporterSpec
    dcgm: DCGMSpec
    nodeStatusExporter: NodeStatusExporterSpec
    gfd: GPUFeatureDiscoverySpec
    mig: MIGSpec | None = None
    migManager: MIGManagerSpec | None = None
    psp: PSPSpec | None = None
    psa: PSASpec | None = None
    validator: ValidatorSpec | None = None
    gds: SidecarSpec | None = None
    gdrcopy: SidecarSpec | None = None
    sandboxWorkloads: SandboxWorkloadsSpec | None = None
    vfioManager: VFIOManagerSpec | None = None
    vgpuManager: VGPUManagerSpec | None = None
    vgpuDeviceManager: VGPUDeviceManagerSpec | None = None
    sandboxDevicePlugin: SandboxDevicePluginSpec | None = None
    kataSandboxDevicePlugin: KataSandboxDevicePluginSpec | None = None
    kataManager: KataManagerSpec | None = None
    ccManager: CCManagerSpec | None = None
    cdi: CDIConfigSpec | None = None
    hostPaths: HostPathsSpec | None = None


State = Literal["ignored", "ready", "notReady"]


class OperandStateStatus(K8sModel):
    """One operand state as last observed (not in upstream's status: our per-state summary)."""

    name: str
    state: Literal["ready", "notReady", "disabled", "failed"]
    message: str | None = Field(default=None, description="The first concrete problem found.")


class ClusterPolicyStatus(K8sModel):
    """Observed state of the GPU software stack."""

    state: State
    namespace: str | None = Field(default=None, description="Namespace of the operands.")
    conditions: list[Condition] | None = None
    states: list[OperandStateStatus] | None = Field(
        default=None, description="Each operand state and why it is not ready."
    )


class ClusterPolicy(K8sModel):
    """The GPU stack of a cluster; the oldest one wins, others are ignored."""

    apiVersion: Literal["nvidia.com/v1"] = "nvidia.com/v1"
    kind: Literal["ClusterPolicy"] = "ClusterPolicy"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: ClusterPolicySpec
    status: ClusterPolicyStatus | None = None

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))


ServiceMonitorSpec.model_rebuild()
