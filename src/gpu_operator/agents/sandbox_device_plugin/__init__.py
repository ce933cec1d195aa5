"""The KubeVirt GPU device plugin as a node agent: `gpu-operator agent sandbox-device-plugin`.

Drop-in for NVIDIA's kubevirt-gpu-device-plugin: it advertises the NVIDIA PCI functions bound to
vfio (passthrough, one resource per device name, such as `nvidia.com/GA100_A100_SXM4_40GB`) and
the node's vGPUs (one resource per vGPU type, such as `nvidia.com/NVIDIA_A100-4C`) to the kubelet,
and answers Allocate with the VFIO device nodes and the `PCI_RESOURCE_NVIDIA_COM_<NAME>` /
`MDEV_PCI_RESOURCE_NVIDIA_COM_<NAME>` variables KubeVirt's virt-launcher reads. It reuses the
NVIDIA device plugin's gRPC endpoint (`device_plugin.server.Endpoint`). Modules: `discovery`
(sysfs in, resources out), `allocate` (pure), `server`, `manager` (start, health, kubelet
restarts), `cli`.
"""
