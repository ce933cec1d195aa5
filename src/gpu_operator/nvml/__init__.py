"""GPU access: a Protocol, a real backend on nvidia-ml-py and a mock backend with real GPU models."""
