"""The GPU metrics exporter (dcgm-exporter compatible): counters CSV -> NVML readings -> text.

`fields` and `counters` are pure (the operator imports them to check a user's counters
ConfigMap); `readers` talks to NVML, `podresources` to the kubelet, `collector` and `server` run it.
"""
