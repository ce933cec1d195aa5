"""The simulated GPU node host: what pretends to be a node under kubesim (container runtimes,
the driver's kernel modules, PCI/sysfs, NFD, nvidia-smi, CUDA samples, GPU faults)."""
