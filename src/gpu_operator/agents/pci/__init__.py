"""The host's PCI layer as the VM agents see it: sysfs read as Linux lays it out, and writes to
sysfs attributes that take effect through a `Kernel` (the real one, or the simulated kernel of a
demo node). Modules: `models` (per-GPU-model VM facts: PCI names, audio functions, SR-IOV, vGPU
types), `sysfs` (reading), `kernel` (writing), `simulated` (the simulated host and its kernel).
"""
