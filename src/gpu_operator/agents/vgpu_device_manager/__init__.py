"""The vGPU device manager as a node agent: `gpu-operator agent vgpu-device-manager`.

Drop-in for upstream's `nvidia-k8s-vgpu-dm`: it reads the `vgpu-configs` file, follows the node
label `nvidia.com/vgpu.config` (default `DEFAULT_VGPU_CONFIG`), reports
`nvidia.com/vgpu.config.state` (`pending`, `success`, `failed`), pauses the sandbox device plugin
and validator while it changes the GPUs, and creates or deletes vGPUs: mediated devices on the
GPU (Turing) or on its SR-IOV VFs (Ampere), or a type written to each VF's
`nvidia/current_vgpu_type` (the vendor-specific VFIO framework of Ada and Hopper). Modules:
`config` (the file), `state` (the GPUs' vGPU state read from sysfs), `planner` (pure: state and
config in, actions or errors out), `apply` (the sysfs writes), `runner` (the label protocol).
"""
