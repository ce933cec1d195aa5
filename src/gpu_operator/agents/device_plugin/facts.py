"""What the device plugin reads from the node: NVML devices, MIG capability minors, NUMA, links.

This is the only part of device discovery that touches NVML or the filesystem; naming, Allocate and
preferred allocation are pure functions of these records.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpu_operator import nvml
from gpu_operator.nvml import migname, pciaddr
from gpu_operator.nvml.protocol import TopologyLevel

log = logging.getLogger("gpu_operator.agents.device_plugin")

MIG_MINORS_FILE = "proc/driver/nvidia-caps/mig-minors"
# NVML allows at most this many NVLinks per GPU (NVML_NVLINK_MAX_LINKS).
NVLINK_MAX_LINKS = 18
# The kernel module numbers MIG capability minors in a fixed grid (config 1, monitor 2, then per GPU
# minor 15 GPU instances of one access node plus 8 compute-instance nodes each): the documented
# content of mig-minors, used when the file cannot be read (simulated nodes have no /proc/driver).
_CAPS_FIRST = 3
_CAPS_PER_GI = 9
_CAPS_PER_GPU = 15 * _CAPS_PER_GI


@dataclass(frozen=True)
class MigFacts:
    """One MIG device (a compute instance) on its parent GPU."""

    index: int
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    memory_mib: int
    # Every NVML attribute of the device, compared as a whole by the `single` MIG strategy.
    attributes: tuple[int, ...] = ()


@dataclass(frozen=True)
class GpuFacts:
    """One full GPU with its MIG devices (when MIG is enabled)."""

    index: int
    uuid: str
    name: str
    minor: int
    bus_id: str
    memory_mib: int
    compute_capability: tuple[int, int]
    mig_enabled: bool = False
    migs: tuple[MigFacts, ...] = ()
    numa_node: int | None = None


@dataclass(frozen=True)
class Link:
    """How two GPUs are connected: the PCIe common ancestor and the NVLinks between them."""

    level: TopologyLevel | None
    nvlinks: int = 0


@dataclass(frozen=True)
class NodeFacts:
    """Everything device discovery needs, read once per plugin start."""

    gpus: tuple[GpuFacts, ...]
    mig_minors: Mapping[str, int] = field(default_factory=dict)
    # Keyed by (GPU index, GPU index) for i != j; missing pairs score nothing.
    links: Mapping[tuple[int, int], Link] = field(default_factory=dict)


def parse_mig_minors(text: str) -> dict[str, int]:
    """`gpu0/gi1/access 12` lines into a mapping; malformed lines are skipped, as upstream does."""
    minors: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            continue
        minors[parts[0]] = int(parts[1])
    return minors


def standard_mig_minors(gpu_minors: tuple[int, ...]) -> dict[str, int]:
    """The mig-minors table the NVIDIA kernel module publishes for these GPU minors."""
    minors = {"config": 1, "monitor": 2}
    for g in gpu_minors:
        for gi in range(15):
            base = _CAPS_FIRST + g * _CAPS_PER_GPU + gi * _CAPS_PER_GI
            minors[f"gpu{g}/gi{gi}/access"] = base
            for ci in range(8):
                minors[f"gpu{g}/gi{gi}/ci{ci}/access"] = base + 1 + ci
    return minors


def sysfs_pci_name(bus_id: str) -> str:
    """NVML's bus id (`00000000:07:00.0`) as sysfs names the device (`0000:07:00.0`)."""
    return pciaddr.sysfs_name(bus_id)


def read_numa_node(sys_root: Path, bus_id: str) -> int | None:
    """The GPU's NUMA node from sysfs; None when unknown (negative or unreadable), as upstream."""
    path = sys_root / "sys/bus/pci/devices" / sysfs_pci_name(bus_id) / "numa_node"
    try:
        value = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def read_mig_minors(
    driver_root: Path, gpu_minors: tuple[int, ...], proc_root: Path = Path("/")
) -> dict[str, int]:
    """mig-minors from procfs (the kernel's, which every container sees), else under the driver
    root, else the kernel module's standard table."""
    tried = []
    for root in dict.fromkeys((proc_root, driver_root)):
        path = root / MIG_MINORS_FILE
        tried.append(str(path))
        try:
            return parse_mig_minors(path.read_text())
        except OSError:
            continue
    log.info("no %s; using the kernel module's standard MIG capability minors", " or ".join(tried))
    return standard_mig_minors(gpu_minors)


def _mig(
    parent: nvml.Device, mig: nvml.Device, index: int, total_mib: int, enums: dict[int, int]
) -> MigFacts:
    attrs = mig.mig_attributes()
    gi_id = mig.gpu_instance_id()
    ci_id = mig.compute_instance_id()
    # The suffix comes from the GPU-instance profile (`+me`, `+me.all`, `+gfx`, `-me`), found
    # from NVML's internal profile id as go-nvlib's MigProfile finds it; the attributes alone
    # cannot tell these profiles apart.
    profile = migname.device_profile(parent, mig, total_mib, enums, attrs)
    return MigFacts(
        index=index,
        uuid=mig.uuid(),
        gpu_instance_id=gi_id,
        compute_instance_id=ci_id,
        profile=profile,
        memory_mib=attrs.memory_size_mb,
        attributes=(
            attrs.multiprocessor_count,
            attrs.shared_copy_engine_count,
            attrs.shared_decoder_count,
            attrs.shared_encoder_count,
            attrs.shared_jpeg_count,
            attrs.shared_ofa_count,
            attrs.gpu_instance_slice_count,
            attrs.compute_instance_slice_count,
            attrs.memory_size_mb,
        ),
    )


def _gpu(dev: nvml.Device, sys_root: Path) -> GpuFacts:
    total_mib = dev.memory_info().total >> 20
    try:
        mig_enabled = dev.mig_mode().current
    except nvml.NotSupported:
        mig_enabled = False
    migs: list[MigFacts] = []
    if mig_enabled:
        enums = migname.profile_enums(dev)
        for j in range(dev.max_mig_device_count()):
            try:
                mig = dev.mig_device_by_index(j)
            except nvml.NotFound:
                continue
            migs.append(_mig(dev, mig, j, total_mib, enums))
    bus_id = dev.pci_info().bus_id
    return GpuFacts(
        index=dev.index(),
        uuid=dev.uuid(),
        name=dev.name(),
        minor=dev.minor_number(),
        bus_id=bus_id,
        memory_mib=total_mib,
        compute_capability=dev.cuda_compute_capability(),
        mig_enabled=mig_enabled,
        migs=tuple(migs),
        numa_node=read_numa_node(sys_root, bus_id),
    )


def _nvlink_peers(dev: nvml.Device) -> list[str]:
    """Remote PCI bus ids of the device's active NVLinks (empty without NVLink)."""
    peers: list[str] = []
    for link in range(NVLINK_MAX_LINKS):
        try:
            if not dev.nvlink_state(link):
                continue
            peers.append(dev.nvlink_remote_pci_bus_id(link).lower())
        except (nvml.NotSupported, nvml.InvalidArgument):
            continue
        except nvml.NvmlError as err:
            # Links only score preferred allocations: a link NVML cannot describe (NOT_FOUND,
            # UNKNOWN, a GPU lost meanwhile) counts as absent rather than failing discovery.
            log.debug("NVLink %d: %s", link, err)
            continue
    return peers


def count_nvlinks(
    peers_i: list[str], peers_j: list[str], bus_j: str, gpu_buses: frozenset[str]
) -> int:
    """NVLinks between GPU i and GPU j: direct links, plus paths through shared NVSwitches.

    Upstream counts only links whose far end is the other GPU (NVSwitch boards score nothing);
    here a link to a switch counts for every GPU on that switch, up to the links both have to it.
    """
    direct = sum(1 for peer in peers_i if peer == bus_j.lower())
    switched = 0
    for switch in {p for p in peers_i if p not in gpu_buses}:
        switched += min(peers_i.count(switch), peers_j.count(switch))
    return min(NVLINK_MAX_LINKS, direct + switched)


def _links(devices: list[nvml.Device], gpus: list[GpuFacts]) -> dict[tuple[int, int], Link]:
    peers = [_nvlink_peers(d) for d in devices]
    buses = frozenset(g.bus_id.lower() for g in gpus)
    links: dict[tuple[int, int], Link] = {}
    for i, di in enumerate(devices):
        for j, _dj in enumerate(devices):
            if i == j:
                continue
            try:
                level: TopologyLevel | None = di.topology_common_ancestor(devices[j])
            except nvml.NvmlError as err:
                log.debug("no topology between GPU %d and %d: %s", i, j, err)
                level = None
            nvlinks = count_nvlinks(peers[i], peers[j], gpus[j].bus_id, buses)
            links[(gpus[i].index, gpus[j].index)] = Link(level, nvlinks)
    return links


def collect(
    lib: nvml.Nvml, *, driver_root: Path, sys_root: Path, proc_root: Path = Path("/")
) -> NodeFacts:
    """Read the node's GPUs; `lib` must be initialised.

    A GPU that has fallen off the bus is left out (logged) so the others are still served; the
    health monitor reports the lost one. Every other NVML error fails the discovery.
    """
    devices: list[nvml.Device] = []
    gpus: list[GpuFacts] = []
    for i in range(lib.device_count()):
        try:
            device = lib.device_by_index(i)
            facts = _gpu(device, sys_root)
        except nvml.GpuLost as err:
            log.warning("GPU %d is left out: %s", i, err)
            continue
        devices.append(device)
        gpus.append(facts)
    minors: dict[str, int] = {}
    if any(g.mig_enabled for g in gpus):
        minors = read_mig_minors(driver_root, tuple(g.minor for g in gpus), proc_root)
    links: dict[tuple[int, int], Link] = {}
    if len(gpus) > 1:
        links = _links(devices, gpus)
    return NodeFacts(gpus=tuple(gpus), mig_minors=minors, links=links)
