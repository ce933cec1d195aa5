"""What our DRA kubelet plugins share: a library, not an agent.

Each DRA kubelet plugin keeps its own agent package (`dra_kubelet_plugin` for `gpu.nvidia.com`,
`compute_domain_plugin` for `compute-domain.nvidia.com`); both build on these modules:
`serving` (the kubelet's paths, the DRA service v1 and v1beta1 on one socket, the registration
socket, the prepare/unprepare loops and the checkpoint of prepared claims) and `cli` (the
command-line wiring their `gpu-operator agent ...` commands have in common).
"""
