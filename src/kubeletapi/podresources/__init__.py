"""Pod-resources API of the kubelet."""
