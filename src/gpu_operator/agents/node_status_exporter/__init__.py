"""The node status exporter: the node's validation markers, driver health, advertised GPU devices
and NVIDIA PCI functions as Prometheus gauges with upstream's names, on port 8000."""
