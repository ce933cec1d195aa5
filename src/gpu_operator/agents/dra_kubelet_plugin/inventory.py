"""What the plugin reads from NVML: the node's GPUs and MIG devices with the facts it publishes.

The only module of the plugin that touches NVML. The device plugin's collector supplies the device
nodes (GPU minors, MIG capability minors); this adds what ResourceSlices carry (brand,
architecture, driver versions, MIG profile ids and placements, capacities).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpu_operator import nvml
from gpu_operator.agents.device_plugin import facts as dp_facts
from gpu_operator.nvml import pciaddr


@dataclass(frozen=True)
class MigInfo:
    """A live MIG device (a compute instance) with its GPU-instance profile facts."""

    uuid: str
    profile: str
    gi_id: int
    ci_id: int
    gi_profile_id: int  # NVML's internal GPU-instance profile id
    placement_start: int
    placement_size: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    memory_bytes: int


@dataclass(frozen=True)
class GpuInfo:
    """A full GPU."""

    index: int
    minor: int
    uuid: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str
    pci_bus_id: str  # sysfs form, lower case: 0000:07:00.0
    memory_bytes: int
    mig_enabled: bool = False
    migs: tuple[MigInfo, ...] = ()


@dataclass(frozen=True)
class Inventory:
    """Everything publishing and preparing need, read at start and after changes."""

    driver_version: str
    cuda_driver_version: str  # "12.4"
    gpus: tuple[GpuInfo, ...]
    node: dp_facts.NodeFacts  # device nodes for the CDI specs


def cuda_version_text(value: int) -> str:
    """NVML's CUDA driver version integer (12040) as `12.4`."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def _mig(parent: nvml.Device, base: dp_facts.MigFacts, lib_device: nvml.Device) -> MigInfo:
    attrs = lib_device.mig_attributes()
    gi = parent.gpu_instance_by_id(base.gpu_instance_id).info()
    return MigInfo(
        uuid=base.uuid,
        profile=base.profile,
        gi_id=base.gpu_instance_id,
        ci_id=base.compute_instance_id,
        gi_profile_id=gi.profile_id,
        placement_start=gi.placement.start,
        placement_size=gi.placement.size,
        multiprocessors=attrs.multiprocessor_count,
        copy_engines=attrs.shared_copy_engine_count,
        decoders=attrs.shared_decoder_count,
        encoders=attrs.shared_encoder_count,
        jpeg_engines=attrs.shared_jpeg_count,
        ofa_engines=attrs.shared_ofa_count,
        memory_bytes=attrs.memory_size_mb << 20,
    )


def collect(
    lib: nvml.Nvml, *, driver_root: Path, sys_root: Path, proc_root: Path = Path("/")
) -> Inventory:
    """Read the node's GPUs; `lib` must be initialised. A GPU that fell off the bus is left out."""
    node = dp_facts.collect(lib, driver_root=driver_root, sys_root=sys_root, proc_root=proc_root)
    gpus: list[GpuInfo] = []
    for g in node.gpus:
        dev = lib.device_by_index(g.index)
        migs: list[MigInfo] = []
        for m in g.migs:
            migs.append(_mig(dev, m, dev.mig_device_by_index(m.index)))
        major, minor = g.compute_capability
        gpus.append(
            GpuInfo(
                index=g.index,
                minor=g.minor,
                uuid=g.uuid,
                product_name=g.name,
                brand=dev.brand(),
                architecture=dev.architecture(),
                cuda_compute_capability=f"{major}.{minor}",
                pci_bus_id=pciaddr.sysfs_name(g.bus_id).lower(),
                memory_bytes=dev.memory_info().total,
                mig_enabled=g.mig_enabled,
                migs=tuple(migs),
            )
        )
    return Inventory(
        driver_version=lib.driver_version(),
        cuda_driver_version=cuda_version_text(lib.cuda_driver_version()),
        gpus=tuple(gpus),
        node=node,
    )
