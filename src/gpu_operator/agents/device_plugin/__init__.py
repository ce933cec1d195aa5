"""The NVIDIA device plugin as a node agent: `gpu-operator agent device-plugin`.

Drop-in for upstream's `nvidia-device-plugin` (same config file, flags and environment): it
advertises the node's GPUs, MIG devices and time-slicing/MPS replicas to the kubelet over the
device-plugin API v1beta1, one gRPC server per resource, and keeps their health current from NVML
events. Modules, by concern: `facts` (NVML and files in), `devices` (naming), `allocate`,
`preferred`, `cdi`, `health` (pure rules), `monitor` (the NVML event thread), `server` (gRPC),
`manager` (the main loop), `mps`/`mps_daemon` (MPS sharing), `settings`/`command`/`cli` (wiring).

Health recovery (better than upstream, where unhealthy is terminal): a faulted device is probed
every second and becomes healthy again only on positive evidence that the fault cleared — the
driver had asked for a recovery action (reset, reboot, drain) and now asks for none
(`nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)`), or a GPU that fell off the bus
answers NVML again. An XID after which the driver asks for nothing stays unhealthy. Each change is
logged and recorded as a `GPUUnhealthy`/`GPUHealthy` Event on the node.

In-process use (kubesim pods): build `settings.Settings` with the node's paths, then
`await manager.Manager(settings, machine.nvml, events=...).run(stop=..., reload=...,
install_signals=False)`.
"""
