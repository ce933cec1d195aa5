"""The VFIO manager as a node agent: `gpu-operator agent vfio-manager` (upstream `vfio-manage`).

Binds the node's NVIDIA GPUs (with their graphics audio functions, and NVSwitches on request) to
vfio-pci, or to the vfio variant driver `modules.alias` names for the device, so that KubeVirt can
pass them through to VMs; unbinds them on stop. Modules: `aliases` (variant choice), `plan` (pure:
sysfs facts in, the devices to bind or unbind out), `manage` (the sysfs writes, through a
`Kernel`), `command` (the container's lifetime: bind, serve, unbind), `cli`.
"""
