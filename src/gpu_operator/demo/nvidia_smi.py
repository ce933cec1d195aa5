"""`nvidia-smi` in the demo's GPU containers, from the node's mock NVML.

A real GPU container gets `nvidia-smi` from the NVIDIA container runtime when GPUs are injected;
the demo registers this program with kubesim (`Cluster.register_program`) for containers whose
allocation names NVIDIA devices. It shows exactly the devices the container was given (numbered
from 0, as inside a container), in nvidia-smi's layout. Formatting is pure (`format_table`,
`format_list`); `collect` reads NVML.

It also answers the read-only listings `scripts/gpu-check --mock` compares the agents with
(`--query-gpu=... --format=csv[,noheader][,nounits]`, `mig -lgip`, `mig -lgi`, `mig -lci`), and runs
on its own against a preset: `python -m gpu_operator.demo.nvidia_smi --machine dgx-h100 -L`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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
    return now.strftime("%a %b %d %H:%M:%S %Y")


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


def _select(lib: nvml.Nvml, visible: Visible) -> list[tuple[nvml.Device, list[nvml.Device]]]:
    """(GPU, its visible MIG devices) in host order."""
    handles: dict[int, tuple[nvml.Device, str]] = {}
    for host_index in range(lib.device_count()):
        try:
            gpu = lib.device_by_index(host_index)
            handles[host_index] = (gpu, gpu.uuid())
        except nvml.GpuLost:
            # Only a container that was given this GPU notices (by index, or all GPUs).
            if visible.all or str(host_index) in visible.ids:
                raise GpuLostError(str(host_index)) from None
    if visible.all:
        return [(gpu, _mig_devices(gpu)) for gpu, _ in handles.values()]
    chosen: dict[int, list[nvml.Device]] = {}
    for ident in visible.ids:
        for host_index, (gpu, uuid) in handles.items():
            migs = _mig_devices(gpu)
            if ident in (uuid, str(host_index)):
                chosen[host_index] = migs
                break
            picked = [m for j, m in enumerate(migs) if ident in (m.uuid(), f"{host_index}:{j}")]
            if picked:
                current = chosen.setdefault(host_index, [])
                current.extend(m for m in picked if m not in current)
                break
    return [(handles[i][0], chosen[i]) for i in sorted(chosen)]


def _profile(mig: nvml.Device) -> str:
    name = mig.name()
    return name.split(" MIG ", 1)[1] if " MIG " in name else name


def collect(lib: nvml.Nvml, visible: Visible, now: dt.datetime) -> SmiView:
    """What `nvidia-smi` would print for these devices (GpuLostError if one is lost)."""
    gpus: list[GpuRow] = []
    migs: list[MigRow] = []
    processes: list[ProcessRow] = []
    for index, (gpu, mig_devices) in enumerate(_select(lib, visible)):
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
        mig_ids = {m.gpu_instance_id() for m in mig_devices}
        for proc in gpu.running_processes():
            if mig_devices and proc.gpu_instance_id not in mig_ids:
                continue  # another container's MIG device
            processes.append(
                ProcessRow(
                    gpu=index,
                    gpu_instance=proc.gpu_instance_id,
                    compute_instance=proc.compute_instance_id,
                    pid=proc.pid,
                    used_mib=proc.used_gpu_memory >> 20,
                )
            )
    return SmiView(
        timestamp=timestamp(now),
        driver_version=lib.driver_version(),
        cuda_version=cuda_version(lib.cuda_driver_version()),
        gpus=tuple(gpus),
        migs=tuple(migs),
        processes=tuple(processes),
    )


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


def query_rows(lib: nvml.Nvml, visible: Visible, fields: Sequence[str]) -> list[list[str]]:
    """The values of `fields` for each visible GPU (GpuLostError if one is lost)."""
    selected = _select(lib, visible)
    rows = []
    for index, (gpu, _) in enumerate(selected):
        try:
            rows.append([_query_value(lib, gpu, index, len(selected), f) for f in fields])
        except nvml.GpuLost:
            raise GpuLostError(str(index)) from None
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


def mig_list(lib: nvml.Nvml, visible: Visible, kind: str) -> tuple[int, str]:
    """`nvidia-smi mig -lgip|-lgi|-lci` (`kind`: profiles, gpu-instances, compute-instances)
    over the visible MIG-enabled GPUs: (exit code, output)."""
    build = {"profiles": _profile_rows, "gpu-instances": _gi_rows, "compute-instances": _ci_rows}
    rows: list[list[str]] = []
    enabled = 0
    for index, (gpu, _) in enumerate(_select(lib, visible)):
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


# ----- the program --------------------------------------------------------------------------

HELP = """NVIDIA System Management Interface (simulated in the gpu-operator demo).

    nvidia-smi              the table of this container's GPUs
    nvidia-smi -L           list them (and their MIG devices) with UUIDs
    nvidia-smi --query-gpu=index,name,... --format=csv[,noheader][,nounits]
    nvidia-smi mig -lgip    GPU instance profiles (MIG-enabled GPUs)
    nvidia-smi mig -lgi     GPU instances
    nvidia-smi mig -lci     compute instances
    nvidia-smi -r -i N      reset GPU N (driver container only)
"""
EXIT_NO_PERMISSION = 4
EXIT_IN_USE = 14
DRIVER_ERROR = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
EXIT_DRIVER = 9


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
) -> tuple[int, str]:
    """One nvidia-smi invocation: (exit code, what it prints). `reset(i)` resets host GPU i
    and returns its bus id; None where the container may not (`Insufficient Permissions`)."""
    if "-r" in args or "--gpu-reset" in args:
        return _reset(["-r" if a == "--gpu-reset" else a for a in args], reset)
    query: Query | None = None
    mig_listing: str | None = None
    if args in ([], ()):
        listing = False
    elif list(args) in (["-L"], ["--list-gpus"]):
        listing = True
    elif list(args) in (["-h"], ["--help"]):
        return EXIT_OK, HELP
    elif len(args) == 2 and args[0] == "mig" and args[1] in MIG_LISTINGS:
        mig_listing = MIG_LISTINGS[args[1]]
    elif any(a.startswith("--query-gpu=") for a in args):
        try:
            query = parse_query(args)
        except QueryError as err:
            return EXIT_USAGE, f"{err}\n"
    else:
        return EXIT_USAGE, USAGE_ERROR + "\n"
    if visible.none:
        return EXIT_NOT_FOUND, NO_DEVICES + "\n"
    try:
        lib.init()
    except nvml.NvmlError:
        return EXIT_DRIVER, DRIVER_ERROR + "\n"
    try:
        if query is not None:
            rows = query_rows(lib, visible, query.fields)
            return (EXIT_OK, format_query(query, rows)) if rows else (EXIT_NOT_FOUND, "")
        if mig_listing is not None:
            return mig_list(lib, visible, mig_listing)
        view = collect(lib, visible, now)
    except GpuLostError as err:
        return EXIT_GPU_LOST, err.message + "\n"
    finally:
        with contextlib.suppress(nvml.NvmlError):
            lib.shutdown()
    if not view.gpus:
        return EXIT_NOT_FOUND, NO_DEVICES + "\n"
    return EXIT_OK, format_list(view.gpus, view.migs) if listing else format_table(view)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m gpu_operator.demo.nvidia_smi (--machine PRESET | --machine-file FILE)
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
    code, text = run(machine.nvml(), Visible(all=True), args, dt.datetime.now())
    (sys.stdout if code == EXIT_OK else sys.stderr if not text.strip() else sys.stdout).write(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
