"""An API-compatible NVIDIA GPU Operator for Kubernetes, in Python."""

from importlib import metadata

try:
    __version__ = metadata.version("gpu-operator-py")
except metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"
