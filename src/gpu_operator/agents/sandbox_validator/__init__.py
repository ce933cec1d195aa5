"""The sandbox validator's checks (`nvidia-validator` with `COMPONENT=vfio-pci|vgpu-manager|
vgpu-devices|cc-manager` in the `nvidia-sandbox-validator` DaemonSet), as a node agent:
`gpu-operator agent sandbox-validator --component ...`. Each check removes its marker under
`/run/nvidia/validations` first and writes it again on success; with `WITH_WAIT` it waits until
the check passes. Modules: `checks` (pure-ish reads of the host), `command` (markers and waits).
"""
