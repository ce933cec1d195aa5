"""What GPU feature discovery knows about a node, read once from NVML into plain records.

Collecting is the only part that touches NVML; labels are then a pure function of these facts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from gpu_operator import nvml
from gpu_operator.nvml import catalog, migname

log = logging.getLogger(__name__)

_NO_FABRIC = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class MigDeviceFacts:
    """One MIG device: its profile name (`1g.5gb`, `1g.24gb+gfx`) and NVML attributes."""

    profile: str
    memory_mb: int
    multiprocessors: int
    slices_gi: int
    slices_ci: int
    engines_copy: int
    engines_decoder: int
    engines_encoder: int
    engines_jpeg: int
    engines_ofa: int


@dataclass(frozen=True)
class GpuFacts:
    name: str
    memory_mib: int
    compute_capability: tuple[int, int]
    mig_capable: bool = False
    mig_enabled: bool = False
    pci_class: int | None = catalog.PCI_CLASS_3D
    fabric: tuple[str, int] | None = None
    mig_devices: tuple[MigDeviceFacts, ...] = ()


@dataclass(frozen=True)
class VgpuFacts:
    host_driver_version: str
    host_driver_branch: str


@dataclass(frozen=True)
class NodeFacts:
    driver_version: str
    cuda_driver_version: int
    machine_type: str
    gpus: tuple[GpuFacts, ...]
    vgpu: VgpuFacts | None = None


def read_machine_type(path: str | Path) -> str:
    """The DMI product name, or `unknown` when it cannot be read (as upstream)."""
    try:
        return Path(path).read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def _mig_device(
    parent: nvml.Device, mig: nvml.Device, total_mib: int, enums: dict[int, int]
) -> MigDeviceFacts:
    attrs = mig.mig_attributes()
    # Named from the GPU-instance profile (found from NVML's internal id), so `+me`, `+gfx`,
    # `-me` and `+me.all` keep their suffix.
    profile = migname.device_profile(parent, mig, total_mib, enums, attrs)
    return MigDeviceFacts(
        profile=profile,
        memory_mb=attrs.memory_size_mb,
        multiprocessors=attrs.multiprocessor_count,
        slices_gi=attrs.gpu_instance_slice_count,
        slices_ci=attrs.compute_instance_slice_count,
        engines_copy=attrs.shared_copy_engine_count,
        engines_decoder=attrs.shared_decoder_count,
        engines_encoder=attrs.shared_encoder_count,
        engines_jpeg=attrs.shared_jpeg_count,
        engines_ofa=attrs.shared_ofa_count,
    )


def _gpu(dev: nvml.Device) -> GpuFacts:
    total_mib = dev.memory_info().total >> 20
    try:
        mode = dev.mig_mode()
        capable, enabled = True, mode.current
    except nvml.NotSupported:
        capable, enabled = False, False
    migs: list[MigDeviceFacts] = []
    if enabled:
        enums = migname.profile_enums(dev)
        for i in range(dev.max_mig_device_count()):
            try:
                mig = dev.mig_device_by_index(i)
            except nvml.NotFound:
                continue
            migs.append(_mig_device(dev, mig, total_mib, enums))
    try:
        pci_class: int | None = dev.pci_class()
    except nvml.NvmlError:
        pci_class = None
    fabric = None
    try:
        info = dev.fabric_info()
        # Completed *and* successful: a probe that completed with an error (a timeout) leaves
        # the GPU outside any clique, as DCGM and UCX read it.
        if info.completed and info.cluster_uuid != _NO_FABRIC:
            fabric = (info.cluster_uuid, info.clique_id)
        elif info.state == nvml.protocol.FABRIC_STATE_COMPLETED and info.status:
            log.warning(
                "GPU %s: NVLink fabric registration completed with NVML error %d; no clique",
                dev.uuid(),
                info.status,
            )
    except nvml.NvmlError as err:
        # Older drivers lack the fabric call altogether; no fabric just means no clique label.
        log.debug("no fabric info for %s: %s", dev.name(), err)
    return GpuFacts(
        name=dev.name(),
        memory_mib=total_mib,
        compute_capability=dev.cuda_compute_capability(),
        mig_capable=capable,
        mig_enabled=enabled,
        pci_class=pci_class,
        fabric=fabric,
        mig_devices=tuple(migs),
    )


def collect(lib: nvml.Nvml, *, machine_type: str, vgpu: VgpuFacts | None = None) -> NodeFacts:
    """Read every fact the labels need; `lib` must be initialised.

    A GPU that has fallen off the bus is left out (logged), so the node keeps the labels of the
    GPUs that work; any other NVML error fails the collection.
    """
    found: list[GpuFacts] = []
    for i in range(lib.device_count()):
        try:
            found.append(_gpu(lib.device_by_index(i)))
        except nvml.GpuLost as err:
            log.warning("GPU %d is left out of the labels: %s", i, err)
    gpus = tuple(found)
    return NodeFacts(
        driver_version=lib.driver_version(),
        cuda_driver_version=lib.cuda_driver_version(),
        machine_type=machine_type,
        gpus=gpus,
        vgpu=vgpu,
    )
