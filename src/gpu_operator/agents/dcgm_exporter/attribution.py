"""Which pod holds which exported entity: kubelet device ids -> entity keys (pure).

The kubelet's pod-resources `List` names, per container, the device ids a device plugin allocated.
They are resolved as dcgm-exporter resolves them (reference §3.3): `GPU-<uuid>` is the GPU itself;
`MIG-<uuid>` is looked up in the collection's MIG table (no NVML call, so a MIG device of another
node costs a dictionary miss, not a failing NVML lookup per scrape); a `::<n>` suffix (a
time-slicing or MPS replica) is stripped and kept as the replica; GKE's `nvidia<i>` and
`nvidia<i>/gi<j>` name a GPU and a GPU instance by index. Unlike upstream, every pod sharing a GPU
is attributed (one sample each), not only the last one listed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpu_operator.agents.dcgm_exporter.exposition import PodRef

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_GKE = re.compile(r"^nvidia(\d+)(?:/gi(\d+)|/vgpu\d+)?$")


@dataclass(frozen=True)
class Allocation:
    """One device id the kubelet reports for one container."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str


@dataclass(frozen=True)
class Topology:
    """What resolving ids needs from the latest collection."""

    mig_keys: Mapping[str, str]  # MIG device UUID -> `<gpu>-<instance>`
    index_keys: Mapping[int, str]  # GPU index -> GPU UUID


def gpu_resource(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether a resource names NVIDIA GPUs: `nvidia.com/gpu` (also renamed `.shared`
    replicas), any `nvidia.com/mig-*`, or one of NVIDIA_RESOURCE_NAMES."""
    shared_or_mig = (GPU_RESOURCE + ".", MIG_RESOURCE_PREFIX)
    return name == GPU_RESOURCE or name.startswith(shared_or_mig) or name in extra


def device_key(device_id: str, topology: Topology) -> tuple[str, str | None] | None:
    """The entity key a device id names, and its replica; None when it is not on this node."""
    base, sep, replica = device_id.partition("::")
    rep = replica if sep else None
    if base.startswith("MIG-"):
        key = topology.mig_keys.get(base)
        return (key, rep) if key is not None else None
    if base.startswith("GPU-"):
        return base, rep
    gke = _GKE.match(base)
    if gke is not None:
        index = int(gke.group(1))
        if gke.group(2) is not None:
            return f"{index}-{int(gke.group(2))}", rep
        key = topology.index_keys.get(index)
        return (key, rep) if key is not None else None
    return None


def holders(
    allocations: Iterable[Allocation],
    topology: Topology,
    extra_resources: Iterable[str] = (),
) -> dict[str, tuple[PodRef, ...]]:
    """Entity key -> the containers holding it, in (namespace, pod, container, replica) order."""
    extra = frozenset(extra_resources)
    found: dict[str, set[PodRef]] = {}
    for a in allocations:
        if not gpu_resource(a.resource, extra):
            continue
        resolved = device_key(a.device_id, topology)
        if resolved is None:
            continue
        key, replica = resolved
        found.setdefault(key, set()).add(PodRef(a.namespace, a.pod, a.container, replica))
    return {
        key: tuple(sorted(refs, key=lambda r: (r.namespace, r.pod, r.container, r.replica or "")))
        for key, refs in found.items()
    }


def one_per_container(refs: tuple[PodRef, ...]) -> tuple[PodRef, ...]:
    """Without per-replica labels a container holding two replicas of one GPU is one holder."""
    seen: dict[tuple[str, str, str], PodRef] = {}
    for r in refs:
        seen.setdefault((r.namespace, r.pod, r.container), r)
    return tuple(seen.values())
