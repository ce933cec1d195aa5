"""The kubelet's gRPC APIs for node programs: device plugins (v1beta1) and pod resources (v1).

Generated message and service modules live in `deviceplugin.v1beta1` and `podresources.v1`; this
module holds the API's well-known paths and values. Shared by kubesim's kubelet and gpu_operator's
node agents, so it imports neither.
"""

from __future__ import annotations

# Device-plugin API (k8s.io/kubelet deviceplugin/v1beta1 constants).
DEVICE_PLUGIN_VERSION = "v1beta1"
SUPPORTED_VERSIONS = (DEVICE_PLUGIN_VERSION,)
DEVICE_PLUGIN_PATH = "/var/lib/kubelet/device-plugins/"
KUBELET_SOCKET = DEVICE_PLUGIN_PATH + "kubelet.sock"
CHECKPOINT_FILE = DEVICE_PLUGIN_PATH + "kubelet_internal_checkpoint"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# The kubelet gives a PreStartContainer call this long (seconds) before failing the start.
PRE_START_CONTAINER_TIMEOUT = 30.0

# Pod-resources API, read by monitoring agents such as a metrics exporter.
POD_RESOURCES_PATH = "/var/lib/kubelet/pod-resources/"
POD_RESOURCES_SOCKET = POD_RESOURCES_PATH + "kubelet.sock"
