"""The compute-domain kubelet plugin: `gpu-operator agent compute-domain-kubelet-plugin`.

Stands in for NVIDIA's `compute-domain-kubelet-plugin` (DRA driver `compute-domain.nvidia.com`):
it publishes the node's IMEX channel and daemon devices with the node's NVLink clique, prepares
a workload's channel claim (labels the node for the domain, waits until the domain's IMEX daemon
on this node is ready, injects `/dev/nvidia-caps-imex-channels/channel0` through CDI) and the
daemon's claim (its config directory mounted at `/imexd`). Modules: `devices` (pure: clique,
slices, prepare plans), `plugin` (I/O), `cli`. docs/compute-domains.md describes it.
"""
