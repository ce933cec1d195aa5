"""The kubelet's gRPC APIs for node programs: device plugins (v1beta1), pod resources (v1),
plugin registration (v1) and DRA plugins (v1, v1beta1).

Generated message and service modules live in `deviceplugin.v1beta1`, `podresources.v1`,
`pluginregistration.v1` and `dra.v1` / `dra.v1beta1`; this module holds the APIs' well-known
paths and values. Shared by kubesim's kubelet and gpu_operator's
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

# Plugin registration (pluginregistration/v1): node plugins put their registration socket here.
PLUGINS_REGISTRY_PATH = "/var/lib/kubelet/plugins_registry/"
# PluginInfo.type of a DRA driver's kubelet plugin.
DRA_PLUGIN_TYPE = "DRAPlugin"
# The DRA plugin services kubelet 1.35 can call, newest first; a plugin lists those it serves in
# PluginInfo.supported_versions and the kubelet takes the first of the plugin's list it knows.
DRA_PLUGIN_SERVICE_V1 = "v1.DRAPlugin"
DRA_PLUGIN_SERVICE_V1BETA1 = "v1beta1.DRAPlugin"
DRA_PLUGIN_SERVICES = (DRA_PLUGIN_SERVICE_V1, DRA_PLUGIN_SERVICE_V1BETA1)
# Where a DRA driver's kubelet plugin conventionally keeps its own sockets (not read by the
# kubelet: the registration names the endpoint).
DRA_PLUGINS_PATH = "/var/lib/kubelet/plugins/"
# The kubelet's record of prepared claims (survives kubelet restarts).
DRA_CHECKPOINT_FILE = "/var/lib/kubelet/dra_manager_state"
# How long the kubelet gives a DRA plugin to answer NodePrepareResources/NodeUnprepareResources.
DRA_CALL_TIMEOUT = 45.0
