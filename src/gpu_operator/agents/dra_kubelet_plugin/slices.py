"""What the plugin publishes: devices and the node's ResourceSlices. Pure.

Facts carried from NVIDIA's driver (`gpu.nvidia.com`): one pool per node named after the node; a
full GPU is `gpu-<minor>`; a MIG device `gpu-<parent minor>-mig-<profile>-<GI profile id>-
<placement start>` with the profile's dots removed (`1g.5gb` -> `1g5gb`, `+` -> `-`). Attributes:
`type` (`gpu`/`mig`), `uuid`, `productName`, `brand`, `architecture` (strings),
`cudaComputeCapability`, `driverVersion`, `cudaDriverVersion` (versions), the standard
`resource.kubernetes.io/pciBusID`; MIG devices add `profile` and `parentUUID` and carry their
parent's. Capacity `memory` (bytes); MIG devices add `multiprocessors`, `copyEngines`,
`decoders`, `encoders`, `jpegEngines`, `ofaEngines` and one `memorySlice<i>` per memory slice
they occupy. A MIG-enabled GPU is published through its MIG devices only.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_operator.agents.dra_kubelet_plugin.inventory import GpuInfo, Inventory, MigInfo

DRIVER = "gpu.nvidia.com"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
# resource.k8s.io/v1 allows at most 128 devices per ResourceSlice.
MAX_DEVICES_PER_SLICE = 128
_SUFFIXES = ((1 << 60, "Ei"), (1 << 50, "Pi"), (1 << 40, "Ti"), (1 << 30, "Gi"), (1 << 20, "Mi"))


def quantity(value: int) -> str:
    """Bytes or counts as a Kubernetes quantity in binary SI (`40Gi`, `7`)."""
    for factor, suffix in _SUFFIXES:
        if value >= factor and value % factor == 0:
            return f"{value // factor}{suffix}"
    return str(value)


def semver(text: str) -> str:
    """`8.0` -> `8.0.0`, `570.195.03` -> `570.195.3` (a version attribute is semver)."""
    parts = [str(int(p)) if p.isdigit() else p for p in text.split(".")]
    while len(parts) < 3:
        parts.append("0")
    return ".".join(parts[:3])


def _rfc1123(text: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", text.lower()).strip("-")


def gpu_name(gpu: GpuInfo) -> str:
    return f"gpu-{gpu.minor}"


def mig_name(gpu: GpuInfo, mig: MigInfo) -> str:
    profile = _rfc1123(mig.profile.replace(".", ""))
    return f"gpu-{gpu.minor}-mig-{profile}-{mig.gi_profile_id}-{mig.placement_start}"


def _common(gpu: GpuInfo, inv: Inventory) -> dict[str, dict[str, Any]]:
    return {
        "productName": {"string": gpu.product_name},
        "brand": {"string": gpu.brand},
        "architecture": {"string": gpu.architecture},
        "cudaComputeCapability": {"version": semver(gpu.cuda_compute_capability)},
        "driverVersion": {"version": semver(inv.driver_version)},
        "cudaDriverVersion": {"version": semver(inv.cuda_driver_version)},
        PCI_BUS_ID: {"string": gpu.pci_bus_id},
    }


def gpu_device(gpu: GpuInfo, inv: Inventory) -> dict[str, Any]:
    attributes = {"type": {"string": "gpu"}, "uuid": {"string": gpu.uuid}, **_common(gpu, inv)}
    return {
        "name": gpu_name(gpu),
        "attributes": attributes,
        "capacity": {"memory": {"value": quantity(gpu.memory_bytes)}},
    }


def mig_device(gpu: GpuInfo, mig: MigInfo, inv: Inventory) -> dict[str, Any]:
    attributes = {
        "type": {"string": "mig"},
        "uuid": {"string": mig.uuid},
        "parentUUID": {"string": gpu.uuid},
        "profile": {"string": mig.profile},
        **_common(gpu, inv),
    }
    capacity = {
        "multiprocessors": mig.multiprocessors,
        "copyEngines": mig.copy_engines,
        "decoders": mig.decoders,
        "encoders": mig.encoders,
        "jpegEngines": mig.jpeg_engines,
        "ofaEngines": mig.ofa_engines,
        "memory": mig.memory_bytes,
    }
    for i in range(mig.placement_start, mig.placement_start + mig.placement_size):
        capacity[f"memorySlice{i}"] = 1
    return {
        "name": mig_name(gpu, mig),
        "attributes": attributes,
        "capacity": {k: {"value": quantity(v)} for k, v in capacity.items()},
    }


@dataclass(frozen=True)
class PublishedDevice:
    """A device the plugin offers, with what preparing it needs."""

    name: str
    uuid: str
    gpu: GpuInfo
    mig: MigInfo | None = None


def allocatable(inv: Inventory) -> dict[str, PublishedDevice]:
    """Every device by name: full GPUs without MIG, MIG devices of MIG-enabled GPUs."""
    found: dict[str, PublishedDevice] = {}
    for gpu in inv.gpus:
        if gpu.mig_enabled:
            for mig in gpu.migs:
                found[mig_name(gpu, mig)] = PublishedDevice(mig_name(gpu, mig), mig.uuid, gpu, mig)
        else:
            found[gpu_name(gpu)] = PublishedDevice(gpu_name(gpu), gpu.uuid, gpu)
    return found


def devices(inv: Inventory, unhealthy: Collection[str] = ()) -> list[dict[str, Any]]:
    """The published devices, in GPU order, leaving out the unhealthy ones (device names or
    UUIDs): DRA device taints are alpha (off) in Kubernetes 1.35, so a device that must not be
    handed out is not published."""
    out: list[dict[str, Any]] = []
    for gpu in inv.gpus:
        if gpu.mig_enabled:
            for mig in gpu.migs:
                if mig_name(gpu, mig) in unhealthy or mig.uuid in unhealthy:
                    continue
                out.append(mig_device(gpu, mig, inv))
        elif gpu_name(gpu) not in unhealthy and gpu.uuid not in unhealthy:
            out.append(gpu_device(gpu, inv))
    return out


def slice_name(node: str, index: int) -> str:
    return f"{node}-{DRIVER}" if index == 0 else f"{node}-{DRIVER}-{index}"


def plan(
    node: str,
    published: Sequence[Mapping[str, Any]],
    devices_now: Sequence[Mapping[str, Any]],
    generation: int,
) -> tuple[int, list[dict[str, Any]]]:
    """The node's slices for `devices_now`, given the slices `published` now (objects from the
    API, possibly none) and the pool generation last used: the generation goes up whenever the
    content changes, so the scheduler never mixes old and new slices of the pool. Returns the
    generation and the slices to have (the caller creates, replaces and deletes to match)."""
    chunks = [
        list(devices_now[i : i + MAX_DEVICES_PER_SLICE])
        for i in range(0, len(devices_now), MAX_DEVICES_PER_SLICE)
    ] or [[]]
    current = {str((s.get("metadata") or {}).get("name")): s.get("spec") or {} for s in published}
    generations = [int(((s.get("pool") or {}).get("generation")) or 0) for s in current.values()]
    generation = max([generation, *generations])
    wanted_names = [slice_name(node, i) for i in range(len(chunks))]
    same = set(current) == set(wanted_names) and all(
        (current[n].get("devices") or []) == chunk
        and (current[n].get("pool") or {}).get("resourceSliceCount") == len(chunks)
        for n, chunk in zip(wanted_names, chunks, strict=True)
    )
    if not same or generation == 0:
        generation += 1
    return generation, [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": generation, "resourceSliceCount": len(chunks)},
                "devices": chunk,
            },
        }
        for name, chunk in zip(wanted_names, chunks, strict=True)
    ]
