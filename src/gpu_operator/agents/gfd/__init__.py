"""GPU feature discovery: node facts from NVML -> labels (a pure function) -> an output sink."""
