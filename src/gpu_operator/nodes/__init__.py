"""Node labelling planner: gpu.present, gpu.deploy.*, workload config, label ownership. Pure."""
