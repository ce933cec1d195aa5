"""How many GPU devices a node advertises: the sum of its `nvidia.com/gpu*` and
`nvidia.com/mig-*` capacity (what the node status exporter reports; lightkube stays in `kube`)."""

from __future__ import annotations

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

GPU_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")


def count_gpu_resources(capacity: dict[str, str]) -> int:
    """The sum of the GPU resources in a capacity map (a non-integer quantity counts as 0)."""
    total = 0
    for name, quantity in capacity.items():
        if name.startswith(GPU_PREFIXES) and quantity.isdigit():
            total += int(quantity)
    return total


async def gpu_device_count(api: AsyncClient, node: str) -> int:
    """The node's GPU devices from its capacity (raises lightkube's ApiError on failure)."""
    obj = await api.get(Node, node)
    capacity = (obj.status.capacity if obj.status else None) or {}
    return count_gpu_resources(dict(capacity))
