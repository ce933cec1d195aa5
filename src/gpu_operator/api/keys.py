"""Label, annotation and env-var keys shared with upstream: these names are a contract."""

from __future__ import annotations

PREFIX = "nvidia.com/"

# GPU node detection (NFD PCI vendor labels, all three upstream spellings).
NFD_GPU_LABELS = (
    "feature.node.kubernetes.io/pci-10de.present",
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
)
NFD_LABEL_PREFIX = "feature.node.kubernetes.io/"
NFD_OS_ID = "feature.node.kubernetes.io/system-os_release.ID"
NFD_OS_VERSION_ID = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
NFD_OS_VERSION_MAJOR = "feature.node.kubernetes.io/system-os_release.VERSION_ID.major"
NFD_OSTREE_VERSION = "feature.node.kubernetes.io/system-os_release.OSTREE_VERSION"
NFD_KERNEL_FULL = "feature.node.kubernetes.io/kernel-version.full"
NFD_MELLANOX = "feature.node.kubernetes.io/pci-15b3.present"

GPU_PRESENT = "nvidia.com/gpu.present"
GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_WORKLOAD_CONFIG = "nvidia.com/gpu.workload.config"
DEPLOY_OPERANDS = "nvidia.com/gpu.deploy.operands"
DEPLOY_PREFIX = "nvidia.com/gpu.deploy."
DEPLOY_DRIVER = "nvidia.com/gpu.deploy.driver"
# k8s-driver-manager's value of DEPLOY_DRIVER on a node whose host already runs a driver
# (`nvidia-smi` works in the host root): the driver DaemonSet then leaves the node.
DRIVER_PREINSTALLED = "pre-installed"
# A node the admin moved to DRA under a ClusterPolicy (`true`): the operator's device plugin stays
# off there and a DRA kubelet plugin serves its GPUs (the label NVIDIA's DRA docs use as the DRA
# driver chart's `kubeletPlugin.nodeSelector` and as the driver manager's eviction label).
DRA_NODE = "nvidia.com/dra-kubelet-plugin"
MIG_CAPABLE = "nvidia.com/mig.capable"
MIG_CONFIG = "nvidia.com/mig.config"
MIG_CONFIG_STATE = "nvidia.com/mig.config.state"
# Ours, beside the state label: why the last MIG change failed (removed on success).
MIG_CONFIG_STATE_MESSAGE = "nvidia.com/mig.config.state.message"
MPS_CAPABLE = "nvidia.com/mps.capable"
CC_CAPABLE = "nvidia.com/cc.capable"
VGPU_HOST_DRIVER_VERSION = "nvidia.com/vgpu.host-driver-version"
DRIVER_OWNER = "nvidia.com/gpu-operator.driver.owner"
OPERATOR_STATE_LABEL = "nvidia.com/gpu-operator.state"
PRECOMPILED = "nvidia.com/precompiled"
NODE_OS_VERSION = "nvidia.com/node.os-version"

# Driver upgrades (k8s-operator-libs keys with driver name "gpu").
UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"
UPGRADE_SKIP = "nvidia.com/gpu-driver-upgrade.skip"
UPGRADE_DRAIN_SKIP = "nvidia.com/gpu-driver-upgrade-drain.skip"
UPGRADE_ENABLED = "nvidia.com/gpu-driver-upgrade-enabled"
UPGRADE_SAFE_LOAD = "nvidia.com/gpu-driver-upgrade.driver-wait-for-safe-load"
UPGRADE_INITIAL_UNSCHEDULABLE = "nvidia.com/gpu-driver-upgrade.node-initial-state.unschedulable"
UPGRADE_WAIT_FOR_POD_COMPLETION_START = (
    "nvidia.com/gpu-driver-upgrade-wait-for-pod-completion-start-time"
)
UPGRADE_VALIDATION_START = "nvidia.com/gpu-driver-upgrade-validation-start-time"
UPGRADE_REQUESTED = "nvidia.com/gpu-driver-upgrade-requested"

# Objects the operator writes.
LAST_APPLIED_HASH = "nvidia.com/last-applied-hash"

# Workload configurations a GPU node can be put into.
WORKLOAD_CONTAINER = "container"
WORKLOAD_VM_PASSTHROUGH = "vm-passthrough"
WORKLOAD_VM_VGPU = "vm-vgpu"
WORKLOADS = (WORKLOAD_CONTAINER, WORKLOAD_VM_PASSTHROUGH, WORKLOAD_VM_VGPU)
