"""Device-plugin API of the kubelet."""
