"""kubesim: an in-memory Kubernetes API server and core controllers. Knows nothing about GPUs."""
