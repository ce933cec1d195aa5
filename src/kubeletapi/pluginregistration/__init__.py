"""The kubelet's plugin-registration API (generated modules in `v1`)."""
