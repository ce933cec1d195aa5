"""The GPU DRA kubelet plugin as a node agent: `gpu-operator agent dra-kubelet-plugin`.

Stands in for NVIDIA's `gpu-kubelet-plugin` (driver `gpu.nvidia.com`): it publishes the node's
GPUs and MIG devices in ResourceSlices with NVIDIA's attribute and capacity names, registers with
the kubelet over the plugin-registration socket, serves the DRA gRPC service (v1 and v1beta1),
prepares claims into per-claim CDI specs (exactly the claim's devices visible), applies
NVIDIA's opaque `GpuConfig` sharing behind the same feature gates, keeps prepared claims in a
checkpoint and republishes when device health or the MIG layout changes.

Modules, by concern: `inventory` (NVML in), `gates` and `gpuconfig` (feature gates and opaque
configs, pure), `slices` (what is published, pure), `prepare` (claim preparation, pure),
`checkpoint` (format pure, file I/O apart), `plugin` (the gRPC services and the main loop),
`cli` (wiring). docs/dra.md describes the behaviour.
"""
