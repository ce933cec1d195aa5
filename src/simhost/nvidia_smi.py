"""`nvidia-smi` in the demo's GPU containers, from the node's mock NVML.

A real GPU container gets `nvidia-smi` from the NVIDIA container runtime when GPUs are injected;
the demo registers this program with kubesim (`Cluster.register_program`) for containers whose
allocation names NVIDIA devices. It shows exactly the devices the container was given (numbered
from 0, as inside a container), in nvidia-smi's layout, and answers what runbooks ask: the table,
`-L`, `-q [-d TYPES]`, `-i IDS` (indices, UUIDs, PCI bus ids), `--query-gpu=...
--format=csv[,noheader][,nounits]`, `topo -m` and `mig -lgip|-lgi|-lci`, with nvidia-smi's errors
and exit codes. Formatting is pure (`format_table`, `format_list`, `format_report`,
`format_topology`, `format_query`); `collect`, `report`, `topology` and `query_rows` read NVML.

`scripts/gpu-check --mock` compares the agents with its listings, and it runs on its own against
a preset: `python -m simhost.nvidia_smi --machine dgx-h100 topo -m`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from gpu_operator import nvml
from gpu_operator.nvml import catalog

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# The volume-mounts device list strategy: one mount per device under this directory.
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
# CDI kinds whose devices are NVIDIA GPUs (the plugin's own and the toolkit's).
CDI_GPU_KINDS = ("k8s.device-plugin.nvidia.com/gpu", "nvidia.com/gpu", "management.nvidia.com/gpu")

# nvidia-smi's exit codes (its man page): 0 ok, 2 bad arguments, 6 no devices found,
# 15 a GPU fell off the bus.
EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NOT_FOUND = 6
EXIT_GPU_LOST = 15

NO_DEVICES = "No devices were found"
USAGE_ERROR = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
WIDTH = 89  # between the outer borders
CELLS = (41, 24, 22)
MIG_CELLS = (18, 34, 11, 23)


# ----- what is shown (plain records) ------------------------------------------------------------


@dataclass(frozen=True)
class GpuRow:
    """One GPU as nvidia-smi shows it (index is the container's numbering)."""

    index: int
    name: str
    uuid: str
    bus_id: str
    temperature_c: int | None
    power_w: int | None
    power_cap_w: int | None
    memory_used_mib: int
    memory_total_mib: int
    utilization: int | None  # None: N/A (MIG mode)
    ecc_uncorrected: int | None
    mig_mode: bool | None  # None: not MIG capable
    persistence: bool = True
    performance_state: str = "P0"
    compute_mode: str = "Default"


@dataclass(frozen=True)
class MigRow:
    """One MIG device: its GPU (container numbering), GI/CI ids and index on that GPU."""

    gpu: int
    gpu_instance: int
    compute_instance: int
    index: int
    profile: str
    uuid: str
    memory_used_mib: int
    memory_total_mib: int
    multiprocessors: int
    copy_engines: int
    encoders: int
    decoders: int
    ofa: int
    jpeg: int


@dataclass(frozen=True)
class ProcessRow:
    gpu: int
    gpu_instance: int | None
    compute_instance: int | None
    pid: int
    used_mib: int
    kind: str = "C"
    name: str = "N/A"


@dataclass(frozen=True)
class SmiView:
    """Everything one `nvidia-smi` run prints."""

    timestamp: str
    driver_version: str
    cuda_version: str
    gpus: tuple[GpuRow, ...]
    migs: tuple[MigRow, ...] = ()
    processes: tuple[ProcessRow, ...] = ()


# ----- formatting (pure) --------------------------------------------------------------------


def _row(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "|" + "|".join(c[:w].ljust(w) for c, w in zip(cells, widths, strict=True)) + "|"


def _rule(widths: Sequence[int], char: str = "-", edge: str = "+") -> str:
    return edge + "+".join(char * w for w in widths) + edge


def _full(text: str) -> str:
    return "|" + text[:WIDTH].ljust(WIDTH) + "|"


def _spread(left: str, right: str) -> str:
    return left + right.rjust(WIDTH - len(left))


def _na(value: object | None, suffix: str = "") -> str:
    return "N/A" if value is None else f"{value}{suffix}"


def _name(name: str, width: int = 29) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def _gpu_lines(gpu: GpuRow) -> list[str]:
    on_off = "On" if gpu.persistence else "Off"
    first = (
        f"{gpu.index:>4}  {_name(gpu.name):<29}{on_off:>4}  ",
        f" {gpu.bus_id:>18} {'Off':>3} ",
        f" {_na(gpu.ecc_uncorrected):>20} ",
    )
    power = f"{_na(gpu.power_w, 'W')} / {_na(gpu.power_cap_w, 'W'):>5}"
    second = (
        f" {'N/A':>3}   {_na(gpu.temperature_c, 'C'):>3}    {gpu.performance_state:<2}{power:>24} ",
        f"{gpu.memory_used_mib}MiB / {gpu.memory_total_mib:>6}MiB".rjust(23) + " ",
        f"{_na(gpu.utilization, '%'):>8}{gpu.compute_mode:>13} ",
    )
    mig = "N/A" if gpu.mig_mode is None else ("Enabled" if gpu.mig_mode else "Disabled")
    third = ("", "", f"{mig:>21} ")
    return [_row(first, CELLS), _row(second, CELLS), _row(third, CELLS)]


def _mig_lines(migs: Sequence[MigRow]) -> list[str]:
    lines = [
        _rule([WIDTH]),
        _full(" MIG devices:"),
        _rule(MIG_CELLS),
        _row(
            (
                " GPU  GI  CI  MIG ",
                "Memory-Usage ".rjust(34),
                "        Vol",
                "        Shared         ",
            ),
            MIG_CELLS,
        ),
        _row(("      ID  ID  Dev ", "", " SM     Unc", " CE ENC  DEC  OFA  JPG "), MIG_CELLS),
        _row(("", "", "        ECC", ""), MIG_CELLS),
        _rule(MIG_CELLS, "=", "|"),
    ]
    for m in migs:
        memory = f"{m.memory_used_mib}MiB / {m.memory_total_mib}MiB".rjust(30) + "    "
        engines = f"{m.copy_engines:>3}{m.encoders:>4}{m.decoders:>5}{m.ofa:>5}{m.jpeg:>5} "
        cells = (
            f"{m.gpu:>3}{m.gpu_instance:>5}{m.compute_instance:>4}{m.index:>4}  ",
            memory,
            f" {m.multiprocessors:>2}{'0':>7} ",
            engines,
        )
        lines.append(_row(cells, MIG_CELLS))
        lines.append(_rule(MIG_CELLS))
    return lines


def _process_lines(processes: Sequence[ProcessRow]) -> list[str]:
    lines = [
        _rule([WIDTH]),
        _full(" Processes:"),
        _full(_spread("  GPU   GI   CI        PID   Type   Process name", "GPU Memory ")),
        _full(_spread("        ID   ID", "Usage      ")),
        "|" + "=" * WIDTH + "|",
    ]
    if not processes:
        lines.append(_full("  No running processes found"))
    for proc in processes:
        gi = _na(proc.gpu_instance)
        ci = _na(proc.compute_instance)
        left = f" {proc.gpu:>4} {gi:>4} {ci:>4} {proc.pid:>10} {proc.kind:>6}   {proc.name}"
        text = _spread(left, f"{proc.used_mib}MiB ")
        lines.append(_full(text))
    lines.append(_rule([WIDTH]))
    return lines


def format_table(view: SmiView) -> str:
    """The default `nvidia-smi` output: header, one block per GPU, MIG devices, processes."""
    header = (
        f" NVIDIA-SMI {view.driver_version:<22}Driver Version: {view.driver_version:<15}"
        f"CUDA Version: {view.cuda_version}"
    )
    lines = [
        view.timestamp,
        _rule([WIDTH]),
        _full(header),
        "|" + _rule(CELLS)[1:],
        _row(
            (
                " GPU  Name                 Persistence-M",
                " Bus-Id          Disp.A",
                " Volatile Uncorr. ECC",
            ),
            CELLS,
        ),
        _row(
            (
                " Fan  Temp   Perf          Pwr:Usage/Cap",
                "           Memory-Usage",
                " GPU-Util  Compute M.",
            ),
            CELLS,
        ),
        _row(("", "", "               MIG M."), CELLS),
        _rule(CELLS, "=", "|"),
    ]
    for gpu in view.gpus:
        lines.extend(_gpu_lines(gpu))
        lines.append(_rule(CELLS))
    lines.append(" " * (WIDTH + 2))
    if view.migs:
        lines.extend(_mig_lines(view.migs))
        lines.append(" " * (WIDTH + 2))
    lines.extend(_process_lines(view.processes))
    return "\n".join(line.rstrip() if not line.strip() else line for line in lines) + "\n"


def format_list(gpus: Sequence[GpuRow], migs: Sequence[MigRow]) -> str:
    """`nvidia-smi -L`: one line per GPU, its MIG devices indented under it."""
    lines = []
    for gpu in gpus:
        lines.append(f"GPU {gpu.index}: {gpu.name} (UUID: {gpu.uuid})")
        for mig in (m for m in migs if m.gpu == gpu.index):
            lines.append(f"  MIG {mig.profile:<12}Device {mig.index:>2}: (UUID: {mig.uuid})")
    return "".join(line + "\n" for line in lines)


def cuda_version(version: int) -> str:
    """NVML's CUDA driver version (12040) as nvidia-smi prints it (12.4)."""
    return f"{version // 1000}.{version % 1000 // 10}"


def timestamp(now: dt.datetime) -> str:
    """As nvidia-smi (and C's ctime) writes it: the day of the month padded with a space."""
    return f"{now:%a %b} {now.day:>2} {now:%H:%M:%S %Y}"


# ----- which devices a container sees ---------------------------------------------------------


@dataclass(frozen=True)
class Visible:
    """The devices a container was given: everything, nothing, or these IDs (GPU/MIG UUIDs,
    GPU indices `i`, MIG indices `i:j`)."""

    all: bool = False
    ids: tuple[str, ...] = field(default=())

    @property
    def none(self) -> bool:
        return not self.all and not self.ids


def _cdi_ids(names: Iterable[str]) -> list[str]:
    ids: list[str] = []
    for name in names:
        kind, _, device = name.partition("=")
        if kind in CDI_GPU_KINDS and device:
            ids.append(device)
    return ids


def visible_devices(env: Mapping[str, str], allocation: Any = None) -> Visible | None:
    """What the NVIDIA runtime injects for this environment and allocation: None when it
    injects nothing (no `NVIDIA_VISIBLE_DEVICES`, `void`, empty, and no NVIDIA CDI devices),
    so the container has no `nvidia-smi` at all."""
    ids: list[str] = []
    if allocation is not None:
        ids += _cdi_ids(getattr(allocation, "cdi_devices", ()) or ())
        annotations: Mapping[str, str] = getattr(allocation, "annotations", None) or {}
        for key, names in annotations.items():
            if key.startswith("cdi.k8s.io/") or "/nvidia-device-plugin_" in key:
                ids += _cdi_ids(v.strip() for v in names.split(","))
    value = env.get(VISIBLE_DEVICES)
    if value == VOLUME_MOUNTS_ROOT and allocation is not None:
        prefix = VOLUME_MOUNTS_ROOT + "/"
        for mount in getattr(allocation, "mounts", ()) or ():
            path = str(getattr(mount, "container_path", ""))
            if path.startswith(prefix) and "/" not in path[len(prefix) :]:
                ids.append(path[len(prefix) :])
    elif value is not None:
        value = value.strip()
        if value == "all":
            return Visible(all=True)
        if value == "none":
            return Visible(ids=tuple(dict.fromkeys(ids)))  # the driver, but no devices
        if value not in ("", "void"):
            ids += [v.strip() for v in value.split(",") if v.strip()]
    if not ids:
        return None if value in (None, "", "void") else Visible()
    return Visible(ids=tuple(dict.fromkeys(ids)))


def has_nvidia_smi(env: Mapping[str, str], allocation: Any = None) -> bool:
    """Whether the NVIDIA runtime would put nvidia-smi into such a container."""
    return visible_devices(env, allocation) is not None


# ----- reading NVML -------------------------------------------------------------------------


class GpuLostError(Exception):
    """A visible GPU does not answer (it fell off the bus); `which` names it."""

    def __init__(self, which: str) -> None:
        super().__init__(which)
        self.which = which

    @property
    def message(self) -> str:
        return (
            f"Unable to determine the device handle for GPU {self.which}: GPU is lost.  "
            "Reboot the system to recover this GPU"
        )


class NoDevicesError(Exception):
    """`-i` named a GPU the container does not have (nvidia-smi: exit code 6)."""


def _mig_devices(gpu: nvml.Device) -> list[nvml.Device]:
    found = []
    try:
        count = gpu.max_mig_device_count()
    except nvml.NvmlError:
        return []
    for index in range(count):
        try:
            found.append(gpu.mig_device_by_index(index))
        except nvml.NvmlError:
            continue
    return found


@dataclass(frozen=True)
class _Slot:
    """One GPU a container sees: its number there, its handle (None once it is lost) and the
    MIG devices it was given (every one when it was given the whole GPU)."""

    index: int
    gpu: nvml.Device | None
    migs: tuple[nvml.Device, ...] = ()
    uuid: str = ""

    def device(self) -> nvml.Device:
        if self.gpu is None:
            raise GpuLostError(str(self.index))
        return self.gpu


def _slots(lib: nvml.Nvml, visible: Visible) -> list[_Slot]:
    """Every GPU the container sees, numbered from 0 in host order. A lost GPU stays in its
    place (NVML answers GPU_IS_LOST for it, and nvidia-smi fails when it reaches it)."""
    live: dict[int, tuple[nvml.Device, str]] = {}
    lost: list[int] = []
    for host_index in range(lib.device_count()):
        try:
            gpu = lib.device_by_index(host_index)
            live[host_index] = (gpu, gpu.uuid())
        except nvml.GpuLost:
            lost.append(host_index)
    chosen: dict[int, list[nvml.Device] | None] = {}  # host index -> MIG devices (None: lost)
    if visible.all:
        chosen = {i: (_mig_devices(live[i][0]) if i in live else None) for i in live.keys() | lost}
    for ident in () if visible.all else visible.ids:
        host = _claim(lib, live, lost, chosen, ident)
        if host is None:
            continue
        if host in lost:
            chosen[host] = None
            continue
        gpu, uuid = live[host]
        migs = _mig_devices(gpu)
        if ident in (uuid, str(host)):
            chosen[host] = migs
            continue
        picked = [m for j, m in enumerate(migs) if ident in (m.uuid(), f"{host}:{j}")]
        current = chosen.setdefault(host, [])
        if current is not None:
            current.extend(m for m in picked if m not in current)
    slots = []
    for index, host in enumerate(sorted(chosen)):
        given = chosen[host]
        if given is None:
            slots.append(_Slot(index, None))
        else:
            slots.append(_Slot(index, live[host][0], tuple(given), live[host][1]))
    return slots


def _claim(
    lib: nvml.Nvml,
    live: Mapping[int, tuple[nvml.Device, str]],
    lost: Sequence[int],
    chosen: Mapping[int, object],
    ident: str,
) -> int | None:
    """The host index of the GPU that a visible-devices id names (a GPU index or UUID, a MIG
    index `i:j` or UUID); None when there is no such device."""
    head = ident.split(":", 1)[0]
    if head.isdigit() and (int(head) in live or int(head) in lost):
        return int(head)
    for host, (gpu, uuid) in live.items():
        if ident == uuid or any(ident == m.uuid() for m in _mig_devices(gpu)):
            return host
    try:
        lib.device_by_uuid(ident)
    except nvml.GpuLost:
        # NVML cannot say which GPU a lost UUID was: the first lost one not yet taken.
        return next((i for i in lost if i not in chosen), None)
    except nvml.NvmlError:
        return None
    return None


def _bus_key(bus_id: str) -> tuple[int, int, int, int] | None:
    """A PCI address (`00000000:07:00.0`, `0000:07:00.0` or `07:00.0`, any case) as numbers."""
    parts = bus_id.strip().split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3 or "." not in parts[2]:
        return None
    device, _, function = parts[2].partition(".")
    try:
        return int(parts[0], 16), int(parts[1], 16), int(device, 16), int(function, 16)
    except ValueError:
        return None


def _targets(slots: Sequence[_Slot], ids: Sequence[str]) -> list[_Slot]:
    """The slots `-i` names (by index in the container, UUID or PCI bus id), in index order;
    NoDevicesError when one names nothing."""
    if not ids:
        return list(slots)
    picked: dict[int, _Slot] = {}
    for ident in ids:
        found = None
        for slot in slots:
            if ident.isdigit() and int(ident) == slot.index:
                found = slot
            elif slot.gpu is not None and ident.lower() == slot.uuid.lower():
                found = slot
            elif slot.gpu is not None and _bus_key(ident) is not None:
                with contextlib.suppress(nvml.NvmlError):
                    if _bus_key(slot.gpu.pci_info().bus_id) == _bus_key(ident):
                        found = slot
            if found is not None:
                break
        if found is None:
            raise NoDevicesError(ident)
        picked[found.index] = found
    return [picked[i] for i in sorted(picked)]


def _profile(mig: nvml.Device) -> str:
    name = mig.name()
    return name.split(" MIG ", 1)[1] if " MIG " in name else name


def collect(lib: nvml.Nvml, visible: Visible, now: dt.datetime, ids: Sequence[str] = ()) -> SmiView:
    """What `nvidia-smi [-i IDS]` would print for these devices (GpuLostError if one is lost,
    NoDevicesError if `ids` names a GPU the container does not have)."""
    gpus: list[GpuRow] = []
    migs: list[MigRow] = []
    processes: list[ProcessRow] = []
    for slot in _targets(_slots(lib, visible), ids):
        index, gpu, mig_devices = slot.index, slot.device(), slot.migs
        try:
            gpus.append(_gpu_row(index, gpu))
        except nvml.GpuLost:
            raise GpuLostError(str(index)) from None
        for j, mig in enumerate(mig_devices):
            attrs = mig.mig_attributes()
            memory = mig.memory_info()
            migs.append(
                MigRow(
                    gpu=index,
                    gpu_instance=mig.gpu_instance_id(),
                    compute_instance=mig.compute_instance_id(),
                    index=j,
                    profile=_profile(mig),
                    uuid=mig.uuid(),
                    memory_used_mib=memory.used >> 20,
                    memory_total_mib=memory.total >> 20,
                    multiprocessors=attrs.multiprocessor_count,
                    copy_engines=attrs.shared_copy_engine_count,
                    encoders=attrs.shared_encoder_count,
                    decoders=attrs.shared_decoder_count,
                    ofa=attrs.shared_ofa_count,
                    jpeg=attrs.shared_jpeg_count,
                )
            )
        processes.extend(_processes(index, gpu, mig_devices))
    return SmiView(
        timestamp=timestamp(now),
        driver_version=lib.driver_version(),
        cuda_version=cuda_version(lib.cuda_driver_version()),
        gpus=tuple(gpus),
        migs=tuple(migs),
        processes=tuple(processes),
    )


def _processes(
    index: int, gpu: nvml.Device, mig_devices: Sequence[nvml.Device]
) -> list[ProcessRow]:
    """The GPU's processes the container may see (those in its MIG devices' GPU instances)."""
    mig_ids = {m.gpu_instance_id() for m in mig_devices}
    found = []
    for proc in gpu.running_processes():
        if mig_devices and proc.gpu_instance_id not in mig_ids:
            continue  # another container's MIG device
        found.append(
            ProcessRow(
                gpu=index,
                gpu_instance=proc.gpu_instance_id,
                compute_instance=proc.compute_instance_id,
                pid=proc.pid,
                used_mib=proc.used_gpu_memory >> 20,
            )
        )
    return found


def _gpu_row(index: int, gpu: nvml.Device) -> GpuRow:
    memory = gpu.memory_info()
    try:
        mig: bool | None = gpu.mig_mode().current
    except nvml.NotSupported:
        mig = None
    try:
        utilization: int | None = gpu.utilization().gpu
    except nvml.NotSupported:
        utilization = None
    try:
        ecc: int | None = gpu.total_ecc_errors(
            nvml.EccErrorType.UNCORRECTED, nvml.EccCounterType.VOLATILE
        )
    except nvml.NotSupported:
        ecc = None
    name = gpu.name()
    model = catalog.by_nvml_name(name)
    return GpuRow(
        index=index,
        name=name,
        uuid=gpu.uuid(),
        bus_id=gpu.pci_info().bus_id,
        temperature_c=gpu.temperature(),
        power_w=round(gpu.power_usage() / 1000),
        power_cap_w=model.tdp_watts if model is not None else None,
        memory_used_mib=memory.used >> 20,
        memory_total_mib=memory.total >> 20,
        utilization=utilization,
        ecc_uncorrected=ecc,
        mig_mode=mig,
    )


# ----- read-only listings: --query-gpu and mig -lgip/-lgi/-lci -------------------------------

# Each queryable field: its unit (shown unless `nounits`; temperatures never carry one).
QUERY_FIELDS: dict[str, str] = {
    "index": "",
    "count": "",
    "uuid": "",
    "name": "",
    "pci.bus_id": "",
    "driver_version": "",
    "compute_cap": "",
    "memory.total": "MiB",
    "memory.used": "MiB",
    "memory.free": "MiB",
    "memory.reserved": "MiB",
    "temperature.gpu": "",
    "power.draw": "W",
    "utilization.gpu": "%",
    "mig.mode.current": "",
    "mig.mode.pending": "",
}
NOT_AVAILABLE = "[N/A]"
MIG_LISTINGS = {
    "-lgip": "profiles",
    "--list-gpu-instance-profiles": "profiles",
    "-lgi": "gpu-instances",
    "--list-gpu-instances": "gpu-instances",
    "-lci": "compute-instances",
    "--list-compute-instances": "compute-instances",
}
NO_MIG_DEVICES = "No MIG-enabled devices found."
NO_GPU_INSTANCES = "No GPU instances found: Not Found"
NO_COMPUTE_INSTANCES = "No compute instances found: Not Found"


class QueryError(ValueError):
    """A `--query-gpu` invocation nvidia-smi would refuse (the message is its own)."""


@dataclass(frozen=True)
class Query:
    fields: tuple[str, ...]
    header: bool = True
    units: bool = True


def parse_query(args: Sequence[str]) -> Query:
    """`--query-gpu=a,b --format=csv[,noheader][,nounits]` (QueryError otherwise)."""
    fields: tuple[str, ...] = ()
    formats: list[str] | None = None
    for arg in args:
        if arg.startswith("--query-gpu="):
            fields = tuple(f.strip() for f in arg.split("=", 1)[1].split(",") if f.strip())
        elif arg.startswith("--format="):
            formats = [f.strip() for f in arg.split("=", 1)[1].split(",") if f.strip()]
        else:
            raise QueryError(USAGE_ERROR)
    if formats is None or "csv" not in formats:
        raise QueryError('"--format=csv" is required with "--query-gpu".')
    unknown = [f for f in formats if f not in ("csv", "noheader", "nounits")]
    if unknown:
        raise QueryError(f'"{unknown[0]}" is not a valid format option.')
    for name in fields:
        if name not in QUERY_FIELDS:
            raise QueryError(f'Field "{name}" is not a valid field to query.')
    if not fields:
        raise QueryError(USAGE_ERROR)
    return Query(fields, header="noheader" not in formats, units="nounits" not in formats)


def _mode_text(gpu: nvml.Device, pending: bool) -> str:
    try:
        mode = gpu.mig_mode()
    except nvml.NotSupported:
        return NOT_AVAILABLE
    return "Enabled" if (mode.pending if pending else mode.current) else "Disabled"


def _query_value(lib: nvml.Nvml, gpu: nvml.Device, index: int, count: int, name: str) -> str:
    memory = gpu.memory_info() if name.startswith("memory.") else None
    match name:
        case "index":
            return str(index)
        case "count":
            return str(count)
        case "uuid":
            return gpu.uuid()
        case "name":
            return gpu.name()
        case "pci.bus_id":
            return gpu.pci_info().bus_id
        case "driver_version":
            return lib.driver_version()
        case "compute_cap":
            major, minor = gpu.cuda_compute_capability()
            return f"{major}.{minor}"
        case "temperature.gpu":
            return str(gpu.temperature())
        case "power.draw":
            return f"{gpu.power_usage() / 1000:.2f}"
        case "utilization.gpu":
            try:
                return str(gpu.utilization().gpu)
            except nvml.NotSupported:
                return NOT_AVAILABLE
        case "mig.mode.current" | "mig.mode.pending":
            return _mode_text(gpu, pending=name.endswith("pending"))
    assert memory is not None
    # nvidia-smi reads memory v2: the driver's reservation is not part of `used`.
    values = {
        "memory.total": memory.total,
        "memory.used": memory.used,
        "memory.free": memory.free,
        "memory.reserved": memory.reserved,
    }
    return str(values[name] >> 20)


def query_rows(
    lib: nvml.Nvml, visible: Visible, fields: Sequence[str], ids: Sequence[str] = ()
) -> list[list[str]]:
    """The values of `fields` for each visible GPU, or those `ids` names (GpuLostError if one
    is lost, NoDevicesError if `ids` names a GPU the container does not have)."""
    slots = _slots(lib, visible)
    rows = []
    for slot in _targets(slots, ids):
        try:
            gpu = slot.device()
            rows.append([_query_value(lib, gpu, slot.index, len(slots), f) for f in fields])
        except nvml.GpuLost:
            raise GpuLostError(str(slot.index)) from None
    return rows


def format_query(query: Query, rows: Sequence[Sequence[str]]) -> str:
    """CSV as nvidia-smi writes it: `, `-separated, units after values unless `nounits`."""
    lines = []
    if query.header:
        lines.append(
            ", ".join(f"{f} [{QUERY_FIELDS[f]}]" if QUERY_FIELDS[f] else f for f in query.fields)
        )
    for row in rows:
        cells = []
        for name, value in zip(query.fields, row, strict=True):
            unit = QUERY_FIELDS[name]
            shown = value != NOT_AVAILABLE and query.units and unit
            cells.append(f"{value} {unit}" if shown else value)
        lines.append(", ".join(cells))
    return "".join(line + "\n" for line in lines)


def _gi_profiles(gpu: nvml.Device) -> dict[int, nvml.protocol.GpuInstanceProfileInfo]:
    """The GPU-instance profiles this GPU offers, by their NVML_GPU_INSTANCE_PROFILE_* index."""
    found = {}
    for index in range(catalog.GI_PROFILE_COUNT):
        try:
            found[index] = gpu.gpu_instance_profile_info(index)
        except nvml.NvmlError:
            continue
    return found


def _short(name: str) -> str:
    return name.removeprefix("MIG ")


def _boxed(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    width = max(len(line) for line in [title, *header, *(r for row in rows for r in row)]) + 2
    rule = "+" + "-" * width + "+"
    lines = [rule, "| " + title.ljust(width - 1) + "|"]
    lines += ["| " + h.ljust(width - 1) + "|" for h in header]
    lines.append("|" + "=" * width + "|")
    for row in rows:
        lines += ["| " + r.ljust(width - 1) + "|" for r in row]
        lines.append(rule)
    return "".join(line + "\n" for line in lines)


def _profile_rows(index: int, gpu: nvml.Device) -> list[list[str]]:
    rows = []
    for enum_index, info in _gi_profiles(gpu).items():
        try:
            free = gpu.gpu_instance_remaining_capacity(enum_index)
        except nvml.NvmlError:
            free = 0
        name = "MIG " + _short(info.name)
        memory = f"{info.memory_size_mb / 1024:.2f}"
        p2p = "Yes" if info.is_p2p_supported else "No"
        first = (
            f"{index:>3}  {name:<18}{info.id:>4}   {free:>3}/{info.instance_count:<3}"
            f"   {memory:>7}    {p2p:<3} {info.multiprocessor_count:>5} "
            f"{info.decoder_count:>5} {info.encoder_count:>5}"
        )
        second = f"{'':>59}{info.copy_engine_count:>5} {info.jpeg_count:>5} {info.ofa_count:>5}"
        rows.append([first, second])
    return rows


def _gpu_instances(gpu: nvml.Device) -> list[tuple[nvml.protocol.GpuInstanceProfileInfo, Any]]:
    found = []
    for enum_index, info in _gi_profiles(gpu).items():
        try:
            found += [(info, gi) for gi in gpu.gpu_instances(enum_index)]
        except nvml.NvmlError:
            continue
    return sorted(found, key=lambda pair: pair[1].info().id)


def _gi_rows(index: int, gpu: nvml.Device) -> list[list[str]]:
    rows = []
    for profile, gi in _gpu_instances(gpu):
        info = gi.info()
        name = "MIG " + _short(profile.name)
        where = f"{info.placement.start}:{info.placement.size}"
        rows.append([f"{index:>3}  {name:<18}{info.profile_id:>5}{info.id:>10}{where:>13}"])
    return rows


def _ci_rows(index: int, gpu: nvml.Device) -> list[list[str]]:
    names = {(m.gpu_instance_id(), m.compute_instance_id()): _profile(m) for m in _mig_devices(gpu)}
    rows = []
    for profile, gi in _gpu_instances(gpu):
        gi_id = gi.info().id
        found = []
        for ci_profile in range(catalog.CI_PROFILE_COUNT):
            try:
                found += [ci.info() for ci in gi.compute_instances(ci_profile)]
            except nvml.NvmlError:
                continue
        for ci in sorted(found, key=lambda c: c.id):
            name = "MIG " + names.get((gi_id, ci.id), _short(profile.name))
            where = f"{ci.placement.start}:{ci.placement.size}"
            rows.append(
                [f"{index:>3}  {gi_id:>6}       {name:<18}{ci.profile_id:>5}{ci.id:>10}{where:>13}"]
            )
    return rows


_MIG_TABLES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "profiles": (
        "GPU instance profiles:",
        (
            "GPU   Name               ID    Instances   Memory     P2P    SM    DEC   ENC",
            "                              Free/Total   GiB              CE    JPEG  OFA",
        ),
        "",
    ),
    "gpu-instances": (
        "GPU instances:",
        (
            "GPU   Name             Profile  Instance   Placement",
            "                         ID       ID      Start:Size",
        ),
        NO_GPU_INSTANCES,
    ),
    "compute-instances": (
        "Compute instances:",
        (
            "GPU     GPU       Name             Profile  Instance   Placement",
            "      Instance                       ID       ID      Start:Size",
            "        ID",
        ),
        NO_COMPUTE_INSTANCES,
    ),
}


def mig_list(
    lib: nvml.Nvml, visible: Visible, kind: str, ids: Sequence[str] = ()
) -> tuple[int, str]:
    """`nvidia-smi mig [-i IDS] -lgip|-lgi|-lci` (`kind`: profiles, gpu-instances,
    compute-instances) over the visible MIG-enabled GPUs: (exit code, output)."""
    build = {"profiles": _profile_rows, "gpu-instances": _gi_rows, "compute-instances": _ci_rows}
    rows: list[list[str]] = []
    enabled = 0
    for slot in _targets(_slots(lib, visible), ids):
        index, gpu = slot.index, slot.device()
        try:
            if not gpu.mig_mode().current:
                continue
        except nvml.NotSupported:
            continue
        except nvml.GpuLost:
            raise GpuLostError(str(index)) from None
        enabled += 1
        rows += build[kind](index, gpu)
    if not enabled:
        return EXIT_NOT_FOUND, NO_MIG_DEVICES + "\n"
    title, header, empty = _MIG_TABLES[kind]
    if not rows:
        return EXIT_NOT_FOUND, empty + "\n"
    return EXIT_OK, _boxed(title, header, rows)


# ----- the query report: -q [-d SECTIONS] ---------------------------------------------------

# The -d display types nvidia-smi knows, and those the simulation renders (in the report's own
# order); the others exist on real GPUs but have nothing behind them in the mock.
DISPLAY_TYPES = (
    "MEMORY", "UTILIZATION", "ECC", "TEMPERATURE", "POWER", "CLOCK", "COMPUTE", "PIDS",
    "PERFORMANCE", "SUPPORTED_CLOCKS", "PAGE_RETIREMENT", "ACCOUNTING", "ENCODER_STATS",
    "SUPPORTED_GPU_TARGET_TEMP", "VOLTAGE", "FBC_STATS", "ROW_REMAPPER", "RESET_STATUS",
    "GSP_FIRMWARE_VERSION",
)  # fmt: skip
SECTIONS = (
    "RESET_STATUS", "PERFORMANCE", "MEMORY", "COMPUTE", "UTILIZATION", "ECC", "ROW_REMAPPER",
    "TEMPERATURE", "POWER", "CLOCK", "PIDS",
)  # fmt: skip
# Parts of the full report that no -d type selects.
_IDENTITY, _PCI, _FABRIC = "identity", "pci", "fabric"
_FULL_ORDER = (_IDENTITY, "RESET_STATUS", _PCI, *SECTIONS[1:-1], _FABRIC, "PIDS")
KEY_WIDTH = 42  # values start after `: ` at this column
NA = "N/A"
# NVML's brand names as nvidia-smi prints them.
_BRANDS = {"Nvidia": "NVIDIA", "NvidiaRTX": "NVIDIA RTX", "QuadroRTX": "Quadro RTX"}
_RECOVERY = {
    nvml.protocol.RecoveryAction.NONE: "None",
    nvml.protocol.RecoveryAction.GPU_RESET: "Reset",
    nvml.protocol.RecoveryAction.NODE_REBOOT: "Reboot",
    nvml.protocol.RecoveryAction.DRAIN_P2P: "Drain P2P",
    nvml.protocol.RecoveryAction.DRAIN_AND_RESET: "Drain and Reset",
}
_FABRIC_STATES = {0: "Not Supported", 1: "Not Started", 2: "In Progress", 3: "Completed"}
# nvmlErrorString for the codes a fabric probe ends with.
_NVML_STRINGS = {0: "Success", 2: "Invalid Argument", 3: "Not Supported", 10: "Timeout"}
_REASONS = (
    "Applications Clocks Setting", "SW Power Cap", "HW Slowdown", "Sync Boost",
    "SW Thermal Slowdown", "Display Clock Setting",
)  # fmt: skip


@dataclass(frozen=True)
class Entry:
    """One line of the report: a `name : value` pair, or a heading (value None), at a depth."""

    depth: int
    name: str
    value: str | None = None


Section = tuple[Entry, ...]


@dataclass(frozen=True)
class ReportGpu:
    """One GPU of the report: its bus id and its lines by section (a -d type, or a part of
    the full report only)."""

    bus_id: str
    sections: Mapping[str, Section]


@dataclass(frozen=True)
class Report:
    timestamp: str
    driver_version: str
    cuda_version: str
    attached: int
    gpus: tuple[ReportGpu, ...]


def _line(entry: Entry) -> str:
    key = "    " * entry.depth + entry.name
    if entry.value is None:
        return key
    return (
        f"{key:<{KEY_WIDTH}}: {entry.value}" if len(key) < KEY_WIDTH else f"{key} : {entry.value}"
    )


def format_report(report: Report, sections: Sequence[str] = ()) -> str:
    """`nvidia-smi -q` (everything) or `-q -d A,B` (those sections, in the report's order)."""
    order = [s for s in SECTIONS if s in sections] if sections else list(_FULL_ORDER)
    lines = [
        "",
        "==============NVSMI LOG==============",
        "",
        _line(Entry(0, "Timestamp", report.timestamp)),
        _line(Entry(0, "Driver Version", report.driver_version)),
        _line(Entry(0, "CUDA Version", report.cuda_version)),
        "",
        _line(Entry(0, "Attached GPUs", str(report.attached))),
    ]
    for gpu in report.gpus:
        lines.append(f"GPU {gpu.bus_id}")
        for name in order:
            lines.extend(_line(e) for e in gpu.sections.get(name, ()))
        lines.append("")
    return "".join(line + "\n" for line in lines)


def _try(read: Callable[[], Any], shown: Callable[[Any], str] = str) -> str:
    """A value as nvidia-smi shows it: N/A where NVML does not answer (a lost GPU aside)."""
    try:
        return shown(read())
    except nvml.GpuLost:
        raise
    except nvml.NvmlError:
        return NA


def _enabled(flag: bool) -> str:
    return "Enabled" if flag else "Disabled"


def _identity(gpu: nvml.Device, migs: Sequence[nvml.Device]) -> Section:
    try:
        mode: nvml.MigMode | None = gpu.mig_mode()
    except nvml.NotSupported:
        mode = None
    entries = [
        Entry(1, "Product Name", gpu.name()),
        Entry(1, "Product Brand", _try(gpu.brand, lambda b: _BRANDS.get(b, b))),
        Entry(1, "Product Architecture", _try(gpu.architecture)),
        Entry(1, "Persistence Mode", "Enabled"),
        Entry(1, "MIG Mode"),
        Entry(2, "Current", NA if mode is None else _enabled(mode.current)),
        Entry(2, "Pending", NA if mode is None else _enabled(mode.pending)),
    ]
    if mode is not None and mode.current and migs:
        entries.append(Entry(1, "MIG Devices"))
        for j, mig in enumerate(migs):
            attrs = mig.mig_attributes()
            memory = mig.memory_info()
            entries += [
                Entry(2, "MIG Device"),
                Entry(3, "Index", str(j)),
                Entry(3, "GPU Instance ID", str(mig.gpu_instance_id())),
                Entry(3, "Compute Instance ID", str(mig.compute_instance_id())),
                Entry(3, "Device Attributes"),
                Entry(4, "Shared"),
                Entry(5, "Multiprocessor count", str(attrs.multiprocessor_count)),
                Entry(5, "Copy Engine count", str(attrs.shared_copy_engine_count)),
                Entry(5, "Encoder count", str(attrs.shared_encoder_count)),
                Entry(5, "Decoder count", str(attrs.shared_decoder_count)),
                Entry(5, "OFA count", str(attrs.shared_ofa_count)),
                Entry(5, "JPG count", str(attrs.shared_jpeg_count)),
                *_memory(memory, depth=3),
            ]
    entries += [Entry(1, "GPU UUID", gpu.uuid()), Entry(1, "Minor Number", _try(gpu.minor_number))]
    return tuple(entries)


def _reset_status(gpu: nvml.Device) -> Section:
    try:
        action = gpu.gpu_recovery_action()
    except nvml.NotSupported:
        # Drivers before R565 have no recovery-action field for nvidia-smi to show.
        return (
            Entry(1, "GPU Reset Status"),
            Entry(2, "Reset Required", NA),
            Entry(2, "Drain and Reset Recommended", NA),
        )
    shown = _RECOVERY.get(action, action.name.replace("_", " ").title())
    return (Entry(1, "GPU Recovery Action", shown),)


def _pci(gpu: nvml.Device) -> Section:
    info = gpu.pci_info()
    key = _bus_key(info.bus_id) or (0, 0, 0, 0)
    tx = nvml.protocol.PcieUtilCounter.TX_BYTES
    rx = nvml.protocol.PcieUtilCounter.RX_BYTES
    return (
        Entry(1, "PCI"),
        Entry(2, "Bus", f"0x{key[1]:02X}"),
        Entry(2, "Device", f"0x{key[2]:02X}"),
        Entry(2, "Domain", f"0x{key[0]:04X}"),
        Entry(2, "Device Id", f"0x{info.device_id:08X}"),
        Entry(2, "Bus Id", info.bus_id),
        Entry(2, "Replays Since Reset", _try(gpu.pcie_replay_counter)),
        Entry(2, "Tx Throughput", _try(partial(gpu.pcie_throughput, tx), lambda v: f"{v} KB/s")),
        Entry(2, "Rx Throughput", _try(partial(gpu.pcie_throughput, rx), lambda v: f"{v} KB/s")),
        Entry(1, "Fan Speed", NA),
    )


def _performance(gpu: nvml.Device) -> Section:
    idle = not gpu.running_processes()
    return (
        Entry(1, "Performance State", "P0"),
        Entry(1, "Clocks Event Reasons"),
        Entry(2, "Idle", "Active" if idle else "Not Active"),
        *(Entry(2, reason, "Not Active") for reason in _REASONS),
    )


def _memory(memory: nvml.protocol.MemoryInfo | None, depth: int = 1) -> Section:
    values = (
        ("Total", memory.total if memory else None),
        ("Reserved", memory.reserved if memory else None),
        ("Used", memory.used if memory else None),
        ("Free", memory.free if memory else None),
    )
    return (
        Entry(depth, "FB Memory Usage"),
        *(Entry(depth + 1, k, NA if v is None else f"{v >> 20} MiB") for k, v in values),
    )


def _utilization(gpu: nvml.Device) -> Section:
    # NVML answers NOT_SUPPORTED with MIG enabled: nvidia-smi shows N/A.
    util = _try(gpu.utilization, lambda u: f"{u.gpu} %")
    memory = _try(gpu.utilization, lambda u: f"{u.memory} %")
    return (
        Entry(1, "Utilization"),
        Entry(2, "Gpu", util),
        Entry(2, "Memory", memory),
        Entry(2, "Encoder", _try(gpu.encoder_utilization, lambda v: f"{v} %")),
        Entry(2, "Decoder", _try(gpu.decoder_utilization, lambda v: f"{v} %")),
    )


def _ecc(gpu: nvml.Device) -> Section:
    entries = [Entry(1, "ECC Mode"), Entry(2, "Current", "Enabled"), Entry(2, "Pending", "Enabled")]
    entries.append(Entry(1, "ECC Errors"))
    for counter, title in ((nvml.EccCounterType.VOLATILE, "Volatile"),
                           (nvml.EccCounterType.AGGREGATE, "Aggregate")):  # fmt: skip
        # The simulated errors are framebuffer (DRAM) errors; on-chip SRAM never errs.
        corrected = _try(partial(gpu.total_ecc_errors, nvml.EccErrorType.CORRECTED, counter))
        uncorrected = _try(partial(gpu.total_ecc_errors, nvml.EccErrorType.UNCORRECTED, counter))
        entries += [
            Entry(2, title),
            Entry(3, "SRAM Correctable", "0"),
            Entry(3, "SRAM Uncorrectable", "0"),
            Entry(3, "DRAM Correctable", corrected),
            Entry(3, "DRAM Uncorrectable", uncorrected),
        ]
    return tuple(entries)


def _row_remapper(gpu: nvml.Device) -> Section:
    try:
        rows = gpu.remapped_rows()
    except nvml.NotSupported:
        return (Entry(1, "Remapped Rows", NA),)
    return (
        Entry(1, "Remapped Rows"),
        Entry(2, "Correctable Error", str(rows.correctable)),
        Entry(2, "Uncorrectable Error", str(rows.uncorrectable)),
        Entry(2, "Pending", "Yes" if rows.pending else "No"),
        Entry(2, "Remapping Failure Occurred", "Yes" if rows.failure else "No"),
    )


def _temperature(gpu: nvml.Device) -> Section:
    return (
        Entry(1, "Temperature"),
        Entry(2, "GPU Current Temp", _try(gpu.temperature, lambda t: f"{t} C")),
        Entry(2, "Memory Current Temp", _try(gpu.memory_temperature, lambda t: f"{t} C")),
    )


def _watts(milliwatts: int) -> str:
    return f"{milliwatts / 1000:.2f} W"


def _power(gpu: nvml.Device, model: catalog.GpuModel | None) -> Section:
    limit = NA if model is None else f"{model.tdp_watts:.2f} W"
    return (
        Entry(1, "GPU Power Readings"),
        Entry(2, "Average Power Draw", _try(gpu.power_usage, _watts)),
        Entry(2, "Instantaneous Power Draw", _try(gpu.power_usage_instant, _watts)),
        Entry(2, "Current Power Limit", limit),
        Entry(2, "Requested Power Limit", limit),
        Entry(2, "Default Power Limit", limit),
    )


def _clocks(gpu: nvml.Device, model: catalog.GpuModel | None) -> Section:
    kinds = (("Graphics", nvml.ClockType.GRAPHICS), ("SM", nvml.ClockType.SM),
             ("Memory", nvml.ClockType.MEM), ("Video", nvml.ClockType.VIDEO))  # fmt: skip
    entries = [Entry(1, "Clocks")]
    for name, kind in kinds:
        entries.append(Entry(2, name, _try(partial(gpu.clock, kind), lambda v: f"{v} MHz")))
    if model is not None:
        entries += [
            Entry(1, "Max Clocks"),
            Entry(2, "Graphics", f"{model.max_sm_clock_mhz} MHz"),
            Entry(2, "SM", f"{model.max_sm_clock_mhz} MHz"),
            Entry(2, "Memory", f"{model.memory_clock_mhz} MHz"),
        ]
    return tuple(entries)


def _fabric(gpu: nvml.Device) -> Section:
    try:
        info = gpu.fabric_info()
    except nvml.GpuLost:
        raise
    except nvml.NvmlError:
        return (Entry(1, "Fabric"), Entry(2, "State", NA), Entry(2, "Status", NA))
    status = _NVML_STRINGS.get(info.status, "Unknown Error")
    return (
        Entry(1, "Fabric"),
        Entry(2, "State", _FABRIC_STATES.get(info.state, NA)),
        Entry(2, "Status", status),
        Entry(2, "CliqueId", str(info.clique_id)),
        Entry(2, "ClusterUUID", info.cluster_uuid),
        *_fabric_health(info),
    )


def _fabric_health(info: nvml.protocol.FabricInfo) -> Section:
    """The Health block under Fabric: every row N/A when the driver reports no health bits."""
    health = nvml.protocol.FabricHealth
    true_false = {
        nvml.protocol.FABRIC_HEALTH_TRUE: "True",
        nvml.protocol.FABRIC_HEALTH_FALSE: "False",
    }
    bandwidth = {
        nvml.protocol.FABRIC_HEALTH_TRUE: "Degraded",
        nvml.protocol.FABRIC_HEALTH_FALSE: "Full",
    }
    if info.health_mask == 0:
        summary = NA
    elif not info.unhealthy():
        summary = "Healthy"
    elif info.unhealthy() == ["bandwidth degraded"]:
        summary = "Limited Capacity"
    else:
        summary = "Unhealthy"
    config = info.health(health.INCORRECT_CONFIGURATION)
    recovery = true_false.get(info.health(health.ROUTE_RECOVERY), NA)
    return (
        Entry(2, "Health"),
        Entry(3, "Summary", summary),
        Entry(3, "Bandwidth", bandwidth.get(info.health(health.DEGRADED_BANDWIDTH), NA)),
        Entry(3, "Route Recovery in progress", recovery),
        Entry(3, "Route Unhealthy", true_false.get(info.health(health.ROUTE_UNHEALTHY), NA)),
        Entry(3, "Access Timeout Recovery",
              true_false.get(info.health(health.ACCESS_TIMEOUT_RECOVERY), NA)),
        Entry(3, "Incorrect Configuration",
              nvml.protocol.FABRIC_MISCONFIGURATIONS.get(config, NA)),
    )  # fmt: skip


def _pids(processes: Sequence[ProcessRow]) -> Section:
    if not processes:
        return (Entry(1, "Processes", "None"),)
    entries = [Entry(1, "Processes")]
    for proc in processes:
        entries += [
            Entry(2, "GPU instance ID", _na(proc.gpu_instance)),
            Entry(2, "Compute instance ID", _na(proc.compute_instance)),
            Entry(2, "Process ID", str(proc.pid)),
            Entry(3, "Type", proc.kind),
            Entry(3, "Name", proc.name),
            Entry(3, "Used GPU Memory", f"{proc.used_mib} MiB"),
        ]
    return tuple(entries)


def _report_gpu(slot: _Slot) -> ReportGpu:
    gpu = slot.device()
    model = catalog.by_nvml_name(gpu.name())
    try:
        memory: nvml.protocol.MemoryInfo | None = gpu.memory_info()
    except nvml.GpuLost:
        raise
    except nvml.NvmlError:
        memory = None
    sections = {
        _IDENTITY: _identity(gpu, slot.migs),
        "RESET_STATUS": _reset_status(gpu),
        _PCI: _pci(gpu),
        "PERFORMANCE": _performance(gpu),
        "MEMORY": _memory(memory),
        "COMPUTE": (Entry(1, "Compute Mode", "Default"),),
        "UTILIZATION": _utilization(gpu),
        "ECC": _ecc(gpu),
        "ROW_REMAPPER": _row_remapper(gpu),
        "TEMPERATURE": _temperature(gpu),
        "POWER": _power(gpu, model),
        "CLOCK": _clocks(gpu, model),
        _FABRIC: _fabric(gpu),
        "PIDS": _pids(_processes(slot.index, gpu, slot.migs)),
    }
    return ReportGpu(gpu.pci_info().bus_id, sections)


def report(lib: nvml.Nvml, visible: Visible, now: dt.datetime, ids: Sequence[str] = ()) -> Report:
    """What `nvidia-smi -q [-i IDS]` reports (GpuLostError if a reported GPU is lost,
    NoDevicesError if `ids` names a GPU the container does not have)."""
    slots = _slots(lib, visible)
    gpus = []
    for slot in _targets(slots, ids):
        try:
            gpus.append(_report_gpu(slot))
        except nvml.GpuLost:
            raise GpuLostError(str(slot.index)) from None
    return Report(
        timestamp=timestamp(now),
        driver_version=lib.driver_version(),
        cuda_version=cuda_version(lib.cuda_driver_version()),
        attached=len(slots),
        gpus=tuple(gpus),
    )


# ----- topo -m: the topology matrix ---------------------------------------------------------

NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS
_LEVELS = {
    nvml.protocol.TopologyLevel.INTERNAL: "X",
    nvml.protocol.TopologyLevel.SINGLE: "PIX",
    nvml.protocol.TopologyLevel.MULTIPLE: "PXB",
    nvml.protocol.TopologyLevel.HOSTBRIDGE: "PHB",
    nvml.protocol.TopologyLevel.NODE: "NODE",
    nvml.protocol.TopologyLevel.SYSTEM: "SYS",
}
LEGEND = (
    "  X    = Self",
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes "
    "(e.g., QPI/UPI)",
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges "
    "within a NUMA node",
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host "
    "Bridge)",
    "  PIX  = Connection traversing at most a single PCIe bridge",
    "  NV#  = Connection traversing a bonded set of # NVLinks",
)


class HostNic(Protocol):
    """An RDMA NIC of the host (nvidia-smi finds them on the PCI bus, not through NVML)."""

    @property
    def name(self) -> str: ...
    @property
    def bus_id(self) -> str: ...


class HostPci(Protocol):
    """The host's PCI devices beyond the GPUs: its NICs and where any two devices' paths meet
    (sysfs on a real node; `gpu_operator.nvml.mock.MockMachine` in the simulation)."""

    @property
    def nics(self) -> Sequence[HostNic]: ...
    def pci_common_ancestor(self, bus_a: str, bus_b: str) -> nvml.protocol.TopologyLevel: ...


@dataclass(frozen=True)
class Topology:
    """The matrix: a row per device (GPUs then NICs) and its cells (`X` on the diagonal), with
    each GPU's CPU and NUMA affinity; `nic_names` are the NICs' device names."""

    rows: tuple[str, ...]
    cells: tuple[tuple[str, ...], ...]
    cpu_affinity: tuple[str, ...]
    numa_affinity: tuple[str, ...]
    nic_names: tuple[str, ...] = ()


def ranges(ids: Iterable[int]) -> str:
    """Sorted ids as nvidia-smi writes CPU sets: `0-63,128-191`."""
    spans: list[list[int]] = []
    for i in sorted(set(ids)):
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def format_topology(topo: Topology) -> str:
    """`nvidia-smi topo -m`: the tab-separated matrix, then its legends."""
    gpus = len(topo.cpu_affinity)
    lines = ["\t" + "\t".join([*topo.rows, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])]
    for r, (name, cells) in enumerate(zip(topo.rows, topo.cells, strict=True)):
        shown = "\t".join(" X " if c == "X" else c for c in cells)
        if r < gpus:
            lines.append(f"{name}\t{shown}\t{topo.cpu_affinity[r]}\t{topo.numa_affinity[r]}\t\tN/A")
        else:
            lines.append(f"{name}\t{shown}\t\t\t\t")
    lines += ["", "Legend:", "", *LEGEND]
    if topo.nic_names:
        lines += ["", "NIC Legend:", ""]
        lines += [f"  NIC{k}: {name}" for k, name in enumerate(topo.nic_names)]
    return "".join(line + "\n" for line in lines)


def _nvlink_remotes(gpu: nvml.Device) -> list[str]:
    """The PCI bus id at the far end of each active NVLink of `gpu`."""
    remotes = []
    for link in range(NVLINK_MAX_LINKS):
        try:
            if gpu.nvlink_state(link):
                remotes.append(gpu.nvlink_remote_pci_bus_id(link).upper())
        except (nvml.NotSupported, nvml.InvalidArgument):
            break  # no NVLink, or past the GPU's last link
        except nvml.GpuLost:
            raise
        except nvml.NvmlError:
            continue
    return remotes


def topology(lib: nvml.Nvml, visible: Visible, host: HostPci | None = None) -> Topology:
    """`nvidia-smi topo -m` over the container's GPUs and the host's NICs: NV<n> where n
    NVLinks join two GPUs (directly or through the same NVSwitches), else the PCIe level
    (GpuLostError if a GPU is lost)."""
    slots = _slots(lib, visible)
    gpus: list[tuple[nvml.Device, str]] = []
    links: list[list[str]] = []
    cpus: list[str] = []
    numa: list[str] = []
    for slot in slots:
        gpu = slot.device()
        try:
            gpus.append((gpu, gpu.pci_info().bus_id.upper()))
            links.append(_nvlink_remotes(gpu))
            cpus.append(_try(gpu.cpu_affinity, ranges))
            numa.append(_try(gpu.memory_affinity, ranges))
        except nvml.GpuLost:
            raise GpuLostError(str(slot.index)) from None
    nics = list(host.nics) if host is not None else []
    buses = [bus for _, bus in gpus] + [nic.bus_id.upper() for nic in nics]
    cells: list[tuple[str, ...]] = []
    for a, bus_a in enumerate(buses):
        row = []
        for b, bus_b in enumerate(buses):
            if a == b:
                row.append("X")
            elif a < len(gpus) and b < len(gpus):
                row.append(_gpu_link(gpus, links, a, b))
            else:
                assert host is not None  # NIC rows and columns come from the host
                row.append(_LEVELS[host.pci_common_ancestor(bus_a, bus_b)])
        cells.append(tuple(row))
    return Topology(
        rows=tuple([f"GPU{i}" for i in range(len(gpus))] + [f"NIC{k}" for k in range(len(nics))]),
        cells=tuple(cells),
        cpu_affinity=tuple(cpus),
        numa_affinity=tuple(numa),
        nic_names=tuple(nic.name for nic in nics),
    )


def _gpu_link(
    gpus: Sequence[tuple[nvml.Device, str]], links: Sequence[Sequence[str]], a: int, b: int
) -> str:
    """NV<n> for the NVLinks of GPU `a` that reach GPU `b` (directly, or through an NVSwitch
    both link to), else the PCIe level between them."""
    own = {bus for _, bus in gpus}
    switches = set(links[b]) - own
    count = sum(1 for remote in links[a] if remote == gpus[b][1] or remote in switches)
    if count:
        return f"NV{count}"
    try:
        level = gpus[a][0].topology_common_ancestor(gpus[b][0])
    except nvml.GpuLost:
        raise GpuLostError(str(a)) from None
    return _LEVELS[level]


# ----- the program --------------------------------------------------------------------------

HELP = """NVIDIA System Management Interface (simulated in the gpu-operator demo).

    nvidia-smi [-i IDS]     the table of this container's GPUs (or those -i names)
    nvidia-smi -L           list them (and their MIG devices) with UUIDs
    nvidia-smi -q [-i IDS] [-d TYPES]
                            the query report; -d picks sections: MEMORY, UTILIZATION, ECC,
                            TEMPERATURE, POWER, CLOCK, COMPUTE, PIDS, PERFORMANCE,
                            ROW_REMAPPER, RESET_STATUS (comma-separated)
    nvidia-smi [-i IDS] --query-gpu=index,name,... --format=csv[,noheader][,nounits]
    nvidia-smi topo -m      the topology matrix (NVLink, PCIe, CPU and NUMA affinity, NICs)
    nvidia-smi mig [-i IDS] -lgip | -lgi | -lci
                            GPU instance profiles, GPU instances, compute instances
    nvidia-smi -r -i N      reset GPU N (driver container only)
    nvidia-smi --version    the driver's versions (no GPU is initialised)

    IDS: comma-separated GPU indices (as this container numbers them), UUIDs or PCI bus ids.
"""
EXIT_NO_PERMISSION = 4
EXIT_IN_USE = 14
DRIVER_ERROR = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
EXIT_DRIVER = 9
_FLAGS = {"-h": "help", "--help": "help", "-L": "list", "--list-gpus": "list",
          "-q": "query", "--query": "query", "--version": "version"}  # fmt: skip
_VALUES = {"-i": "id", "--id": "id", "-d": "display", "--display": "display",
           "--query-gpu": "query-gpu", "--format": "format"}  # fmt: skip
TOPO_MATRIX = ("-m", "--matrix")


class UsageError(ValueError):
    """An invocation nvidia-smi refuses with exit code 2; the message is what it prints."""


def not_recognized(option: str) -> UsageError:
    return UsageError(
        f"ERROR: Option {option} is not recognized. Please run 'nvidia-smi -h' for help."
    )


@dataclass(frozen=True)
class Invocation:
    """One parsed command line: `mode` is table, list, help, query (-q), query-gpu, mig or
    topo; `ids` what -i names; `sections` the -d types; `query` the --query-gpu request;
    `mig` the listing (profiles, gpu-instances, compute-instances)."""

    mode: str
    ids: tuple[str, ...] = ()
    sections: tuple[str, ...] = ()
    query: Query | None = None
    mig: str = ""


def _options(words: Sequence[str]) -> tuple[set[str], dict[str, str]]:
    """Flags and `option value` / `--option=value` pairs (UsageError for anything else)."""
    flags: set[str] = set()
    values: dict[str, str] = {}
    i = 0
    while i < len(words):
        word = words[i]
        name, eq, attached = word.partition("=") if word.startswith("--") else (word, "", "")
        if name in _FLAGS and not eq:
            flags.add(_FLAGS[name])
        elif name in _VALUES:
            if not eq:
                i += 1
                if i >= len(words):
                    raise UsageError(f"ERROR: Option {name} requires a value. {USAGE_ERROR}")
                attached = words[i]
            values[_VALUES[name]] = attached
        else:
            raise not_recognized(word)
        i += 1
    return flags, values


def _ids(text: str | None) -> tuple[str, ...]:
    if text is None:
        return ()
    ids = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    if not ids:
        raise UsageError(f"ERROR: Option -i needs a GPU index, UUID or PCI bus id. {USAGE_ERROR}")
    return ids


def _sections(text: str) -> tuple[str, ...]:
    wanted = [v.strip().upper() for v in text.split(",") if v.strip()]
    if not wanted:
        raise UsageError(f"ERROR: Option -d needs a display type. {USAGE_ERROR}")
    for name in wanted:
        if name not in DISPLAY_TYPES:
            raise UsageError(
                f'ERROR: "{name}" is not a valid display type for -d (one of: '
                f"{', '.join(DISPLAY_TYPES)}). Please run 'nvidia-smi -h' for help."
            )
        if name not in SECTIONS:
            raise UsageError(
                f"nvidia-smi (gpu-operator demo): -d {name} is not simulated; the mock GPUs "
                f"report {', '.join(sorted(SECTIONS))}."
            )
    return tuple(dict.fromkeys(wanted))


def _subcommand(words: Sequence[str]) -> Invocation:
    command, rest = words[0], list(words[1:])
    if command == "topo":
        if rest and all(w in TOPO_MATRIX for w in rest):
            return Invocation("topo")
        unknown = next((w for w in rest if w not in TOPO_MATRIX), "")
        raise UsageError(
            "nvidia-smi topo (gpu-operator demo): only -m (--matrix) is simulated"
            + (f"; {unknown!r} is not" if unknown else "; give -m")
            + "."
        )
    listings = [w for w in rest if w in MIG_LISTINGS]
    try:
        flags, values = _options([w for w in rest if w not in MIG_LISTINGS])
    except UsageError:
        flags, values = {"?"}, {}
    if len(listings) != 1 or flags or set(values) - {"id"}:
        raise UsageError(
            "nvidia-smi mig (gpu-operator demo): the simulation only lists, with one of -lgip, "
            "-lgi or -lci (and optionally -i IDS); MIG changes go through the MIG manager "
            "(node label nvidia.com/mig.config)."
        )
    return Invocation("mig", ids=_ids(values.get("id")), mig=MIG_LISTINGS[listings[0]])


def parse_args(args: Sequence[str]) -> Invocation:
    """What an nvidia-smi command line asks for (UsageError with nvidia-smi's complaint)."""
    words = list(args)
    if words and words[0] in ("mig", "topo"):
        return _subcommand(words)
    flags, values = _options(words)
    if "help" in flags:
        return Invocation("help")
    if "version" in flags:
        if flags != {"version"} or values:
            raise UsageError(USAGE_ERROR)
        return Invocation("version")
    ids = _ids(values.get("id"))
    selective = "query-gpu" in values or "format" in values
    if "display" in values and "query" not in flags:
        raise UsageError(USAGE_ERROR)
    if "list" in flags:
        if flags != {"list"} or values:
            raise UsageError(USAGE_ERROR)
        return Invocation("list")
    if selective:
        if flags:
            raise UsageError(USAGE_ERROR)
        request = [f"--{k}={values[k]}" for k in ("query-gpu", "format") if k in values]
        try:
            query = parse_query(request)
        except QueryError as err:
            raise UsageError(str(err)) from None
        return Invocation("query-gpu", ids=ids, query=query)
    if "query" in flags:
        shown = _sections(values["display"]) if "display" in values else ()
        return Invocation("query", ids=ids, sections=shown)
    return Invocation("table", ids=ids)


def _reset(args: Sequence[str], reset: Callable[[int], str] | None) -> tuple[int, str]:
    rest = [a for a in args if a != "-r"]
    if len(rest) != 2 or rest[0] not in ("-i", "--id") or not rest[1].isdigit():
        return EXIT_USAGE, USAGE_ERROR + "\n"
    if reset is None:
        return EXIT_NO_PERMISSION, "Insufficient Permissions\n"
    try:
        bus_id = reset(int(rest[1]))
    except nvml.InUse:
        return EXIT_IN_USE, (
            f"Unable to reset GPU {rest[1]} because it's being used by some other process.\n"
        )
    except (nvml.NvmlError, IndexError, ValueError):
        return EXIT_NOT_FOUND, f"No devices were found with index {rest[1]}\n"
    return EXIT_OK, f"GPU {bus_id} was successfully reset.\nAll done.\n"


def run(
    lib: nvml.Nvml,
    visible: Visible,
    args: Sequence[str],
    now: dt.datetime,
    *,
    reset: Callable[[int], str] | None = None,
    host: HostPci | None = None,
) -> tuple[int, str]:
    """One nvidia-smi invocation: (exit code, what it prints). `reset(i)` resets host GPU i
    and returns its bus id; None where the container may not (`Insufficient Permissions`).
    `host` has the node's NICs and PCI layout for `topo -m` (none: GPUs only)."""
    if "-r" in args or "--gpu-reset" in args:
        return _reset(["-r" if a == "--gpu-reset" else a for a in args], reset)
    try:
        call = parse_args(args)
    except UsageError as err:
        return EXIT_USAGE, f"{err}\n"
    if call.mode == "help":
        return EXIT_OK, HELP
    if call.mode == "version":  # the driver's versions only: no GPU is initialised
        return _version(lib)
    if visible.none:
        return EXIT_NOT_FOUND, NO_DEVICES + "\n"
    try:
        lib.init()
    except nvml.NvmlError:
        return EXIT_DRIVER, DRIVER_ERROR + "\n"
    try:
        return _answer(lib, visible, call, now, host)
    except GpuLostError as err:
        return EXIT_GPU_LOST, err.message + "\n"
    except NoDevicesError:
        return EXIT_NOT_FOUND, NO_DEVICES + "\n"
    finally:
        with contextlib.suppress(nvml.NvmlError):
            lib.shutdown()


def _version(lib: nvml.Nvml) -> tuple[int, str]:
    """`nvidia-smi --version`: the tool's, NVML's and the driver's versions and the CUDA
    version the driver supports, without touching a GPU (the validator's check where GPUs may be
    bound to vfio-pci)."""
    try:
        lib.init()
    except nvml.NvmlError:
        return EXIT_DRIVER, DRIVER_ERROR + "\n"
    try:
        driver = lib.driver_version()
        lines = [
            ("NVIDIA-SMI version", driver),
            ("NVML version", lib.nvml_version()),
            ("DRIVER version", driver),
            ("CUDA Version", cuda_version(lib.cuda_driver_version())),
        ]
    finally:
        with contextlib.suppress(nvml.NvmlError):
            lib.shutdown()
    return EXIT_OK, "".join(f"{name:<20}: {value}\n" for name, value in lines)


def _answer(
    lib: nvml.Nvml, visible: Visible, call: Invocation, now: dt.datetime, host: HostPci | None
) -> tuple[int, str]:
    if call.mode == "query-gpu":
        assert call.query is not None
        rows = query_rows(lib, visible, call.query.fields, call.ids)
        return (EXIT_OK, format_query(call.query, rows)) if rows else (EXIT_NOT_FOUND, "")
    if call.mode == "mig":
        return mig_list(lib, visible, call.mig, call.ids)
    if call.mode == "topo":
        matrix = topology(lib, visible, host)
        if not matrix.cpu_affinity:
            return EXIT_NOT_FOUND, NO_DEVICES + "\n"
        return EXIT_OK, format_topology(matrix)
    if call.mode == "query":
        found = report(lib, visible, now, call.ids)
        if not found.attached:
            return EXIT_NOT_FOUND, NO_DEVICES + "\n"
        return EXIT_OK, format_report(found, call.sections)
    view = collect(lib, visible, now, call.ids)
    if not view.gpus:
        return EXIT_NOT_FOUND, NO_DEVICES + "\n"
    return EXIT_OK, format_list(view.gpus, view.migs) if call.mode == "list" else format_table(view)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m simhost.nvidia_smi (--machine PRESET | --machine-file FILE)
    [--seed N] [ARGS...]`: nvidia-smi on a mock machine's GPUs, all visible, resets refused."""
    from gpu_operator.agents import mock_backend

    args = list(sys.argv[1:] if argv is None else argv)
    chosen: dict[str, str] = {}
    while args and args[0] in ("--machine", "--machine-file", "--seed"):
        if len(args) < 2:
            sys.stderr.write(f"nvidia-smi: {args[0]} needs a value\n")
            return EXIT_USAGE
        chosen[args[0]] = args[1]
        args = args[2:]
    seed = chosen.get("--seed")
    if seed is not None and not seed.isdigit():
        sys.stderr.write(f"nvidia-smi: --seed {seed!r}: expected a number\n")
        return EXIT_USAGE
    try:
        machine = mock_backend.machine(
            chosen.get("--machine"),
            chosen.get("--machine-file"),
            int(seed) if seed is not None else None,
        )
    except mock_backend.MachineChoiceError as err:
        sys.stderr.write(f"nvidia-smi: {err}\n")
        return EXIT_USAGE
    code, text = run(machine.nvml(), Visible(all=True), args, dt.datetime.now(), host=machine)
    (sys.stdout if code == EXIT_OK else sys.stderr if not text.strip() else sys.stdout).write(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
