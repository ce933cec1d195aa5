"""The driver manager as a node agent: `gpu-operator agent driver-manager uninstall_driver`
(upstream `k8s-driver-manager`, the init container of the driver, VFIO manager and vGPU manager
DaemonSets).

Before a driver container starts, it makes the node ready for it: a driver pre-installed on the
host is reported (label `nvidia.com/gpu.deploy.driver=pre-installed`) instead of fought; the GPU
operands are paused and their pods waited for; GPU pods are evicted (PodDisruptionBudgets
honoured); the old driver is unloaded, vfio and vGPUs released; then everything is restored
exactly. Modules: `settings` (the env contract), `selector`, `plan` (pure: state in, steps out),
`host` (real and simulated hosts), `runner` (executes a plan), `command`, `cli`.
"""
