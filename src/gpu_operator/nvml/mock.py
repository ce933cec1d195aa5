"""A simulated NVML: live GPUs built from the catalog, with real MIG rules, telemetry and faults.

`MockMachine` holds the state of one node's GPUs (thread-safe, one lock); `MockNvml` is the
library handle agents use through the `gpu_operator.nvml.Nvml` Protocol. Everything that varies
(UUIDs, telemetry jitter) derives from the machine seed and an injectable clock: tests are stable.
"""

from __future__ import annotations

import collections
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpu_operator.nvml import catalog, driver_branches, errors, library, machines
from gpu_operator.nvml import protocol as p
from gpu_operator.nvml.catalog import Placement

XID_FALLEN_OFF_BUS = 79
# What NVML's nvmlErrorString says for NVML_ERROR_DRIVER_NOT_LOADED.
DRIVER_NOT_LOADED = "Driver Not Loaded"
# XIDs after which the driver asks for a GPU reset (recovery action GPU_RESET), after NVIDIA's XID
# catalogue: double-bit ECC, micro-controller halt, row-remap/retirement pending, NVLink failure,
# fallen off the bus, uncontained ECC, GSP errors, unrecovered ECC. Others need no recovery action.
RESET_XIDS = frozenset({48, 62, 63, 64, 74, 79, 95, 119, 120, 140})
_ALL_EVENTS = (
    p.EventType.SINGLE_BIT_ECC
    | p.EventType.DOUBLE_BIT_ECC
    | p.EventType.PSTATE
    | p.EventType.XID_CRITICAL
    | p.EventType.CLOCK
)
# Models with HBM memory: they report a memory temperature and remap rows after ECC errors.
_HBM_MODELS = ("A100", "A30", "H100", "H200", "B200")
# Bus numbers of the eight GPUs on a DGX A100/H100 baseboard; other machines count up.
_BOARD_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)
# Driver branches that introduced what the mock emulates per branch (NVML change log).
BRANCH_RECOVERY_ACTION_FIELD = 565  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (field 230)
BRANCH_GPM = 520  # GPU performance monitoring (Hopper and later)
BRANCH_MIG_QUERIES_WITHOUT_MIG = 550  # profile info and placements answer with MIG off
_GPM_ARCHITECTURES = ("Hopper", "Blackwell", "Rubin")


def _mix(*values: int) -> int:
    """A splitmix64-style hash: cheap, stable across runs and Python versions."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
        h = h * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 29
    return h


def _uuid(*values: int) -> str:
    a = _mix(*values, 1)
    b = _mix(*values, 2)
    hx = f"{a:016x}{b:016x}"
    return f"{hx[:8]}-{hx[8:12]}-4{hx[13:16]}-{hx[16:20]}-{hx[20:32]}"


def _protocol_calls() -> frozenset[str]:
    names: set[str] = set()
    for proto in (p.Nvml, p.Device, p.GpuInstance, p.ComputeInstance, p.EventSet):
        names.update(n for n in vars(proto) if not n.startswith("_"))
    return frozenset(names)


CALL_NAMES = _protocol_calls()


@dataclass
class _Process:
    pid: int
    used_bytes: int
    load: int
    gpu_instance_id: int | None
    compute_instance_id: int | None
    started: float = float("-inf")


@dataclass
class _Ci:
    id: int
    profile: catalog.ComputeProfile
    placement: Placement
    uuid: str


@dataclass
class _Gi:
    id: int
    profile: catalog.MigProfile
    placement: Placement
    cis: dict[int, _Ci] = field(default_factory=dict)


@dataclass
class _Gpu:
    index: int
    model: catalog.GpuModel
    uuid: str
    bus_id: str
    pci_class: int
    phase: float
    mig_current: bool = False
    mig_pending: bool = False
    gis: dict[int, _Gi] = field(default_factory=dict)
    lost: bool = False
    recovery: p.RecoveryAction = p.RecoveryAction.NONE
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)
    processes: dict[int, _Process] = field(default_factory=dict)
    energy_mj: float = 0.0
    energy_at: float | None = None
    # The GPU's NVLink fabric registration (the machine's, until `set_fabric` changes it).
    fabric: machines.Fabric | None = None

    def mig_devices(self) -> list[tuple[_Gi, _Ci]]:
        return [(gi, ci) for gi in sorted(self.gis.values(), key=lambda g: g.id)
                for ci in sorted(gi.cis.values(), key=lambda c: c.id)]  # fmt: skip


@dataclass(frozen=True)
class Nic:
    """An RDMA NIC of the host (`mlx5_<n>`), on the PCIe switch of GPU `gpu`. NVML does not
    report NICs; `nvidia-smi topo -m` finds them on the PCI bus, as `MockMachine.nics` stands in."""

    name: str
    bus_id: str
    gpu: int


@dataclass(frozen=True)
class Workload:
    """A simulated job started by `MockMachine.start_workload`: (GPU index, pid) per device."""

    processes: tuple[tuple[int, int], ...]


@dataclass
class _Fault:
    call: str
    gpu: int | None
    error: errors.NvmlError
    remaining: int | None


class MockMachine:
    """The simulated GPUs of one node, plus fault injection and a simulated GPU reset."""

    def __init__(
        self,
        spec: machines.MachineSpec,
        *,
        clock: Callable[[], float] | None = None,
        seed: int | None = None,
    ) -> None:
        self.spec = spec
        self.seed = spec.seed if seed is None else seed
        self.clock: Callable[[], float] = clock or time.monotonic
        self.lock = threading.RLock()
        self._changed = threading.Condition(self.lock)
        self._faults: list[_Fault] = []
        self._event_sets: list[MockEventSet] = []
        self._mig_serial = 0
        self._workload_pids = itertools.count(40_000)
        self.nvswitch = spec.has_nvswitch()
        # Whether `libnvidia-ml.so.1` is on the agent's loader path (the NVIDIA runtime injected
        # it, or the driver is on the host). When not, only a `driver_root` that holds the
        # library (see `nvml.library`) lets NVML initialise, as in the toolkit's own pod.
        self.library_on_loader_path = True
        # nvmlDeviceGetPcieThroughput samples for 20 ms on real GPUs; tests may emulate the wait
        # (spent outside the machine lock, so concurrent readers overlap as on real NVML).
        self.pcie_sample_seconds = 0.0
        self.pcie_peak_concurrency = 0
        self._pcie_active = 0
        # The host's loaded driver version, None when no driver is loaded; None as the probe
        # itself means the spec's driver is always loaded (unit tests). The demo reads the
        # node's /proc/driver/nvidia/version.
        self.driver_probe: Callable[[], str | None] | None = None
        models = spec.gpu_models()
        board = len(models) == 8
        self.gpus: list[_Gpu] = []
        for i, gpu_model in enumerate(models):
            bus = _BOARD_BUSES[i] if board else 0x10 + 0x10 * i
            self.gpus.append(
                _Gpu(
                    index=i,
                    model=gpu_model,
                    uuid="GPU-" + _uuid(self.seed, i),
                    bus_id=f"00000000:{bus:02X}:00.0",
                    pci_class=gpu_model.pci_class,
                    phase=(_mix(self.seed, i, 7) % 6283) / 1000.0,
                    fabric=spec.fabric,
                )
            )
        self.nics: list[Nic] = []
        for k in range(spec.host.nics):
            near = k * len(self.gpus) // spec.host.nics
            beside = sum(1 for nic in self.nics if nic.gpu == near)
            domain, gpu_bus, rest = self.gpus[near].bus_id.split(":")
            nic_bus = int(gpu_bus, 16) + 2 + beside
            self.nics.append(Nic(f"mlx5_{k}", f"{domain}:{nic_bus:02X}:{rest}", near))
        self._apply_initial_layout()

    @classmethod
    def from_preset(cls, name: str, **kwargs: object) -> MockMachine:
        """Build a machine from a preset such as `dgx-a100` (UnknownMachine if there is none);
        `driver="570.195.03"` emulates another driver branch, `clock` and `seed` as for
        MockMachine."""
        return cls._build(machines.preset(name), kwargs)

    @classmethod
    def from_file(cls, path: str | Path, **kwargs: object) -> MockMachine:
        """Build a machine from a YAML file (MachineFileError names the bad field)."""
        return cls._build(machines.load(path), kwargs)

    @classmethod
    def _build(cls, spec: machines.MachineSpec, kwargs: dict[str, object]) -> MockMachine:
        clock = kwargs.pop("clock", None)
        seed = kwargs.pop("seed", None)
        driver = kwargs.pop("driver", None)
        if kwargs:
            raise TypeError(f"unexpected arguments: {', '.join(kwargs)}")
        if isinstance(driver, str):
            # Another driver branch for the same GPUs (what NVML offers follows the branch).
            cuda = driver_branches.cuda_driver_version(driver)
            spec = spec.model_copy(update={"driver_version": driver, "cuda_driver_version": cuda})
        return cls(
            spec,
            clock=clock if callable(clock) else None,
            seed=seed if isinstance(seed, int) else None,
        )

    def _apply_initial_layout(self) -> None:
        index = 0
        for group in self.spec.gpus:
            for _ in range(group.count):
                gpu = self.gpus[index]
                index += 1
                if group.pci_class is not None:
                    gpu.pci_class = group.pci_class
                if not group.mig_enabled:
                    continue
                gpu.mig_current = gpu.mig_pending = True
                if not self._fit_layout(gpu, group.mig_devices):
                    raise machines.MachineFileError(
                        f"{self.spec.name}: GPU {gpu.index} cannot hold MIG layout "
                        f"{list(group.mig_devices)}: no order of creation fits the placement rules"
                    )

    def _fit_layout(self, gpu: _Gpu, names: tuple[str, ...]) -> bool:
        # NVML picks the first free placement, so creation order matters; like mig-parted, try
        # the distinct orderings (largest first) until one fits.
        ordered = sorted(names, key=lambda n: -gpu.model.mig_profile(n).slice_count)
        seen: set[tuple[str, ...]] = set()
        for order in itertools.permutations(ordered):
            if order in seen:
                continue
            seen.add(order)
            try:
                for name in order:
                    profile = gpu.model.mig_profile(name)
                    gi = self._create_gi(gpu, profile.profile_id, None)
                    full = catalog.CI_PROFILE_BY_SLICES[profile.slice_count]
                    self._create_ci(gpu, gi, full, None)
                return True
            except errors.NvmlError:
                gpu.gis.clear()
        return False

    # -- library handles -------------------------------------------------------------------

    def nvml(self, *, privileged: bool = True, driver_root: str | Path | None = None) -> MockNvml:
        """A fresh library handle (call `init()` on it, as with real NVML).

        `privileged=False` is an agent running as a non-root user: the calls NVML reserves for
        privileged users raise NoPermission. `driver_root` is where the agent looks for the
        library when it is not on its loader path (`library_on_loader_path`).
        """
        return MockNvml(self, privileged=privileged, driver_root=driver_root)

    @property
    def driver_branch(self) -> int:
        """The loaded driver's branch (550 for 550.54.15); 0 when unknown or not loaded."""
        version = self.loaded_driver()
        if version is None:
            return 0
        try:
            return driver_branches.branch(version)
        except driver_branches.DriverVersionError:
            return 0

    def loaded_driver(self) -> str | None:
        """The driver version loaded on the host (see `driver_probe`), or None."""
        if self.driver_probe is None:
            return self.spec.driver_version
        return self.driver_probe()

    def _require_driver(self) -> str:
        version = self.loaded_driver()
        if version is None:
            raise errors.DriverNotLoaded(DRIVER_NOT_LOADED)
        return version

    # -- fault injection -------------------------------------------------------------------

    def fail_next(
        self,
        call: str,
        error: errors.NvmlError | type[errors.NvmlError],
        *,
        gpu: int | None = None,
        times: int | None = 1,
    ) -> None:
        """Make the next `times` calls of `call` (a Protocol method name) raise `error`.

        `gpu` limits the fault to one GPU's handles; `times=None` fails until `clear_faults()`.
        """
        if call not in CALL_NAMES:
            raise ValueError(f"unknown NVML call {call!r}; use a Protocol method name")
        if times is not None and times < 1:
            raise ValueError("times must be >= 1 or None")
        exc = error() if isinstance(error, type) else error
        with self.lock:
            self._faults.append(_Fault(call, gpu, exc, times))

    def clear_faults(self) -> None:
        with self.lock:
            self._faults.clear()

    def inject_xid(
        self,
        gpu: int,
        xid: int,
        *,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
        recovery: p.RecoveryAction | None = None,
    ) -> None:
        """Raise an XID critical-error event on `gpu` (optionally scoped to a MIG instance).

        The GPU's recovery action becomes `recovery`, by default GPU_RESET for `RESET_XIDS`.
        """
        if recovery is None:
            recovery = p.RecoveryAction.GPU_RESET if xid in RESET_XIDS else p.RecoveryAction.NONE
        with self.lock:
            g = self._gpu(gpu)
            if g.recovery is p.RecoveryAction.NONE:  # a pending action stays until the reset
                g.recovery = recovery
            self._emit(g, p.EventType.XID_CRITICAL, xid, gpu_instance_id, compute_instance_id)
            # XID 79 is the driver saying the GPU fell off the bus: from then on NVML answers
            # GPU_IS_LOST for every call on it (no utilisation, memory or power) until a reset.
            if xid == XID_FALLEN_OFF_BUS:
                g.lost = True

    def inject_ecc_error(self, gpu: int, *, uncorrected: bool = False, count: int = 1) -> None:
        """Count `count` ECC errors on `gpu` and raise the matching single/double-bit event."""
        if count < 1:
            raise ValueError("count must be >= 1")
        kind = p.EccErrorType.UNCORRECTED if uncorrected else p.EccErrorType.CORRECTED
        with self.lock:
            g = self._gpu(gpu)
            for counter in p.EccCounterType:
                key = (int(kind), int(counter))
                g.ecc[key] = g.ecc.get(key, 0) + count
            # Uncorrectable memory errors leave pages to retire: the driver wants a reset.
            if uncorrected and g.recovery is p.RecoveryAction.NONE:
                g.recovery = p.RecoveryAction.GPU_RESET
            event = p.EventType.DOUBLE_BIT_ECC if uncorrected else p.EventType.SINGLE_BIT_ECC
            self._emit(g, event, 0, None, None)

    def set_fabric(
        self,
        gpu: int | None = None,
        *,
        state: int | None = None,
        status: int | None = None,
        health_mask: int | None = None,
    ) -> None:
        """Change the NVLink fabric registration of `gpu` (every GPU when None): the probe's
        `state` (protocol.FABRIC_STATE_*), its `status` (an NVML return code) and the
        `health_mask` (protocol.fabric_health_mask). ValueError on a machine without a fabric.
        The fabric manager, not a GPU reset, changes these; they survive `reset`."""
        if self.spec.fabric is None:
            raise ValueError(f"machine {self.spec.name} has no NVLink fabric")
        changes: dict[str, int] = {}
        for key, value in (("state", state), ("status", status), ("health_mask", health_mask)):
            if value is not None:
                changes[key] = value
        with self.lock:
            targets = self.gpus if gpu is None else [self._gpu(gpu)]
            for g in targets:
                current = g.fabric or self.spec.fabric
                data = {**current.model_dump(), **changes}
                g.fabric = machines.Fabric.model_validate(data)
            self._changed.notify_all()

    def fall_off_bus(self, gpu: int) -> None:
        """Lose `gpu`: XID 79 is raised and every later call on it fails with GpuLost."""
        self.inject_xid(gpu, XID_FALLEN_OFF_BUS)

    def reset(self, gpu: int) -> None:
        """Simulate `nvidia-smi -r`: apply pending MIG mode, clear volatile ECC and the recovery
        action, recover a lost GPU.

        Only the simulated machine offers this; agents never reset GPUs through the Protocol.
        """
        with self.lock:
            g = self._gpu(gpu)
            if g.processes:
                raise errors.InUse(f"GPU {gpu} cannot be reset: processes are running on it")
            g.lost = False
            g.recovery = p.RecoveryAction.NONE
            if g.mig_pending != g.mig_current:
                g.mig_current = g.mig_pending
                g.gis.clear()
            for kind in p.EccErrorType:
                g.ecc.pop((int(kind), int(p.EccCounterType.VOLATILE)), None)
            self._changed.notify_all()

    def reboot(self) -> None:
        """Simulate a node reboot: processes end, pending MIG modes apply, and every GPU and
        compute instance is gone (MIG mode survives a reboot, the instances do not)."""
        with self.lock:
            for g in self.gpus:
                self._advance_energy(g)
                g.processes.clear()
                g.gis.clear()
            for index in range(len(self.gpus)):
                self.reset(index)

    # -- workload simulation ---------------------------------------------------------------

    def start_process(
        self,
        gpu: int,
        pid: int,
        *,
        used_memory_mib: int,
        load: int = 100,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
    ) -> None:
        """Run a simulated CUDA process: it uses memory and drives utilization, power and heat."""
        if not 0 <= load <= 100:
            raise ValueError("load must be within 0..100")
        with self.lock:
            g = self._gpu(gpu)
            if gpu_instance_id is not None and gpu_instance_id not in g.gis:
                raise ValueError(f"GPU {gpu} has no GPU instance {gpu_instance_id}")
            self._advance_energy(g)
            g.processes[pid] = _Process(
                pid,
                used_memory_mib << 20,
                load,
                gpu_instance_id,
                compute_instance_id,
                started=self.clock(),
            )

    def stop_process(self, gpu: int, pid: int) -> None:
        with self.lock:
            g = self._gpu(gpu)
            self._advance_energy(g)
            g.processes.pop(pid, None)

    def start_workload(
        self, uuids: Iterable[str], *, load: int = 90, memory_mib: int | None = None
    ) -> Workload:
        """Run a job on exactly the GPUs or MIG devices named by UUID (what a pod was allocated).

        Each device gets one process with `load` and `memory_mib` (default: a quarter of the
        device's memory), so utilization, memory, power and temperature move on those alone.
        """
        if not 0 <= load <= 100:
            raise ValueError("load must be within 0..100")
        with self.lock:
            targets = [self._resolve_uuid(u) for u in uuids]
            started: list[tuple[int, int]] = []
            for g, gi, ci in targets:
                total = gi.profile.memory_mb if gi is not None else g.model.memory_mib
                pid = next(self._workload_pids)
                self.start_process(
                    g.index,
                    pid,
                    used_memory_mib=total // 4 if memory_mib is None else memory_mib,
                    load=load,
                    gpu_instance_id=gi.id if gi is not None else None,
                    compute_instance_id=ci.id if ci is not None else None,
                )
                started.append((g.index, pid))
            return Workload(tuple(started))

    def stop_workload(self, workload: Workload) -> None:
        """End a job started with `start_workload` (its processes leave their GPUs)."""
        with self.lock:
            for gpu, pid in workload.processes:
                self.stop_process(gpu, pid)

    def _resolve_uuid(self, uuid: str) -> tuple[_Gpu, _Gi | None, _Ci | None]:
        for g in self.gpus:
            if g.uuid == uuid:
                return g, None, None
            for gi, ci in g.mig_devices():
                if ci.uuid == uuid:
                    return g, gi, ci
        raise ValueError(f"{self.spec.name} has no GPU or MIG device with UUID {uuid!r}")

    # -- internals shared with handles -----------------------------------------------------

    def socket_of(self, gpu: int) -> int:
        """The socket (NUMA node) GPU `gpu` hangs off: four GPUs per socket in index order, the
        last socket taking any others."""
        return min(gpu // 4, self.spec.host.sockets - 1)

    def _slot(self, bus_id: str) -> tuple[int, int] | None:
        """(PCIe switch, socket) of the GPU or NIC at `bus_id`; two GPUs share a switch."""
        wanted = bus_id.upper()
        for g in self.gpus:
            if g.bus_id == wanted:
                return g.index // 2, self.socket_of(g.index)
        for nic in self.nics:
            if nic.bus_id == wanted:
                return nic.gpu // 2, self.socket_of(nic.gpu)
        return None

    def pci_common_ancestor(self, bus_a: str, bus_b: str) -> p.TopologyLevel:
        """Where the paths of two of the host's PCI devices (GPUs, NICs; NVML bus ids) meet:
        the same switch (SINGLE), the same socket (NODE) or across sockets (SYSTEM)."""
        a, b = self._slot(bus_a), self._slot(bus_b)
        if a is None or b is None:
            raise ValueError(f"{self.spec.name} has no PCI device {bus_a if a is None else bus_b}")
        if bus_a.upper() == bus_b.upper():
            return p.TopologyLevel.INTERNAL
        if a[0] == b[0]:
            return p.TopologyLevel.SINGLE
        if a[1] == b[1]:
            return p.TopologyLevel.NODE
        return p.TopologyLevel.SYSTEM

    def _gpu(self, index: int) -> _Gpu:
        if not 0 <= index < len(self.gpus):
            raise ValueError(f"{self.spec.name} has no GPU {index} (it has {len(self.gpus)})")
        return self.gpus[index]

    def _check_fault(self, call: str, gpu: int | None) -> None:
        for fault in self._faults:
            if fault.call == call and (fault.gpu is None or fault.gpu == gpu):
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining == 0:
                        self._faults.remove(fault)
                raise fault.error

    def _emit(
        self,
        g: _Gpu,
        event_type: p.EventType,
        data: int,
        gi: int | None,
        ci: int | None,
    ) -> None:
        event = p.EventData(g.uuid, event_type, data, gi, ci)
        for event_set in self._event_sets:
            event_set._offer(g.index, event)
        self._changed.notify_all()

    def _advance_energy(self, g: _Gpu) -> None:
        now = self.clock()
        if g.energy_at is not None and now > g.energy_at:
            g.energy_mj += self._power_mw(g, now) * (now - g.energy_at)
        g.energy_at = now

    def _load(self, g: _Gpu, gi: int | None = None, at: float | None = None) -> int:
        procs = [
            x
            for x in g.processes.values()
            if (gi is None or x.gpu_instance_id == gi) and (at is None or x.started <= at)
        ]
        return min(100, sum(x.load for x in procs))

    def _utilization(self, g: _Gpu, now: float) -> int:
        load = self._load(g, at=now)
        wave = 0.5 + 0.5 * math.sin(2 * math.pi * now / 60.0 + g.phase)
        jitter = (_mix(self.seed, g.index, int(now)) % 2001) / 1000.0 - 1.0
        if load == 0:
            return max(0, min(100, round(1 + jitter)))
        return max(0, min(100, round(load * (0.85 + 0.15 * wave) + 2 * jitter)))

    def _power_mw(self, g: _Gpu, now: float) -> int:
        util = self._utilization(g, now)
        m = g.model
        return round((m.idle_watts + (m.tdp_watts - m.idle_watts) * util / 100.0) * 1000)

    def _temperature(self, g: _Gpu, now: float) -> int:
        wave = math.sin(2 * math.pi * now / 300.0 + g.phase)
        return round(30 + 0.45 * self._utilization(g, now) + 2 * wave)

    def _create_gi(self, g: _Gpu, profile_id: int, placement: Placement | None) -> _Gi:
        if not g.mig_current:
            raise errors.NotSupported(f"MIG mode is not enabled on GPU {g.index}")
        profile = self._gi_profile(g, profile_id)
        same = [gi for gi in g.gis.values() if gi.profile.profile_id == profile_id]
        if len(same) >= profile.instance_count:
            raise errors.InsufficientResources(
                f"GPU {g.index}: {profile.name} allows at most {profile.instance_count} instances"
            )
        if profile.media_extensions and any(gi.profile.media_extensions for gi in g.gis.values()):
            raise errors.InsufficientResources(
                f"GPU {g.index}: the media engines already belong to another +me instance"
            )
        used = sum(gi.profile.slice_count for gi in g.gis.values())
        if used + profile.slice_count > g.model.mig_compute_slices:
            raise errors.InsufficientResources(
                f"GPU {g.index}: {profile.name} needs {profile.slice_count} compute slices, "
                f"{g.model.mig_compute_slices - used} free"
            )
        taken = [gi.placement for gi in g.gis.values()]
        chosen = self._place(profile.name, profile.placements, taken, placement, g.index)
        gi_id = next(i for i in range(1, 64) if i not in g.gis)
        gi = _Gi(gi_id, profile, chosen)
        g.gis[gi_id] = gi
        return gi

    def _gi_profile(self, g: _Gpu, profile_id: int) -> catalog.MigProfile:
        if not 0 <= profile_id < catalog.GI_PROFILE_COUNT:
            raise errors.InvalidArgument(f"invalid GPU instance profile id {profile_id}")
        profile = g.model.mig_profile_by_id(profile_id)
        if profile is None:
            raise errors.NotSupported(
                f"GPU instance profile {profile_id} is not supported by {g.model.key}"
            )
        branch = self.driver_branch
        if branch and profile.min_driver_branch > branch:
            raise errors.NotSupported(
                f"GPU instance profile {profile.name} needs a R{profile.min_driver_branch} "
                f"driver; this one is R{branch}"
            )
        return profile

    def _gi_profile_by_nvml_id(self, g: _Gpu, nvml_id: int) -> catalog.MigProfile:
        """The profile NVML addresses by internal id `nvml_id` (the raw library's view)."""
        profile = g.model.mig_profile_by_nvml_id(nvml_id)
        if profile is None:
            raise errors.InvalidArgument(f"invalid GPU instance profile id {nvml_id}")
        return self._gi_profile(g, profile.profile_id)

    def _pcie_sample(self) -> None:
        """Wait out the sampling window (outside the lock), counting overlapping samplers."""
        window = self.pcie_sample_seconds
        if window <= 0:
            return
        with self.lock:
            self._pcie_active += 1
            self.pcie_peak_concurrency = max(self.pcie_peak_concurrency, self._pcie_active)
        try:
            time.sleep(window)
        finally:
            with self.lock:
                self._pcie_active -= 1

    @staticmethod
    def _place(
        name: str,
        valid: tuple[Placement, ...],
        taken: list[Placement],
        wanted: Placement | None,
        gpu: int,
    ) -> Placement:
        if wanted is not None:
            if wanted not in valid:
                allowed = ", ".join(f"{v.start}:{v.size}" for v in valid)
                raise errors.InvalidArgument(
                    f"placement {wanted.start}:{wanted.size} is not valid for {name} "
                    f"(valid: {allowed})"
                )
            if any(wanted.overlaps(t) for t in taken):
                raise errors.InsufficientResources(
                    f"GPU {gpu}: placement {wanted.start}:{wanted.size} for {name} overlaps "
                    "an existing instance"
                )
            return wanted
        for candidate in valid:
            if not any(candidate.overlaps(t) for t in taken):
                return candidate
        raise errors.InsufficientResources(f"GPU {gpu}: no free placement left for {name}")

    def _create_ci(self, g: _Gpu, gi: _Gi, profile_id: int, placement: Placement | None) -> _Ci:
        profile = self._ci_profile(gi, profile_id)
        same = [c for c in gi.cis.values() if c.profile.profile_id == profile_id]
        if len(same) >= profile.instance_count:
            raise errors.InsufficientResources(
                f"GPU {g.index} GI {gi.id}: compute profile {profile.slice_count}c allows at "
                f"most {profile.instance_count} instances"
            )
        used = sum(c.profile.slice_count for c in gi.cis.values())
        if used + profile.slice_count > gi.profile.slice_count:
            raise errors.InsufficientResources(
                f"GPU {g.index} GI {gi.id}: not enough compute slices left "
                f"({gi.profile.slice_count - used} free, {profile.slice_count} needed)"
            )
        taken = [c.placement for c in gi.cis.values()]
        label = f"{profile.slice_count}c in {gi.profile.name}"
        chosen = self._place(label, profile.placements, taken, placement, g.index)
        ci_id = next(i for i in range(64) if i not in gi.cis)
        self._mig_serial += 1
        ci = _Ci(
            ci_id, profile, chosen, "MIG-" + _uuid(self.seed, g.index, 1000 + self._mig_serial)
        )
        gi.cis[ci_id] = ci
        return ci

    @staticmethod
    def _ci_profile(gi: _Gi, profile_id: int) -> catalog.ComputeProfile:
        if not 0 <= profile_id < catalog.CI_PROFILE_COUNT:
            raise errors.InvalidArgument(f"invalid compute instance profile id {profile_id}")
        profile = gi.profile.compute_profile(profile_id)
        if profile is None:
            raise errors.NotSupported(
                f"compute instance profile {profile_id} is not available in {gi.profile.name}"
            )
        return profile

    def _remaining_gis(self, g: _Gpu, profile: catalog.MigProfile) -> int:
        taken = [gi.placement for gi in g.gis.values()]
        count = sum(1 for gi in g.gis.values() if gi.profile.profile_id == profile.profile_id)
        used = sum(gi.profile.slice_count for gi in g.gis.values())
        me_taken = any(gi.profile.media_extensions for gi in g.gis.values())
        n = 0
        for candidate in profile.placements:
            if count + n >= profile.instance_count:
                break
            if used + profile.slice_count * (n + 1) > g.model.mig_compute_slices:
                break
            if profile.media_extensions and (me_taken or n >= 1):
                break
            if not any(candidate.overlaps(t) for t in taken):
                taken.append(candidate)
                n += 1
        return n


class _Handle:
    """Common plumbing of handles: liveness and fault checks under the machine lock."""

    def __init__(self, lib: MockNvml, gpu: _Gpu) -> None:
        self._lib = lib
        self._m = lib.machine
        self._g = gpu

    def _enter(self, call: str) -> None:
        self._lib._require_init()
        self._m._check_fault(call, self._g.index)
        if self._g.lost:
            raise errors.GpuLost(f"GPU {self._g.index} ({self._g.uuid}) has fallen off the bus")

    def _privileged(self, call: str) -> None:
        """NVML reserves MIG management and GPU-instance lookups for privileged users."""
        if not self._lib.privileged:
            raise errors.NoPermission(
                f"{call}: {errors.NoPermission.hint} (the caller is not privileged)"
            )


class MockComputeInstance(_Handle):
    def __init__(self, lib: MockNvml, gpu: _Gpu, gi: _Gi, ci: _Ci) -> None:
        super().__init__(lib, gpu)
        self._gi = gi
        self._ci = ci

    def _live(self, call: str) -> None:
        self._enter(call)
        if self._g.gis.get(self._gi.id) is not self._gi or self._gi.cis.get(self._ci.id) is not (
            self._ci
        ):
            raise errors.InvalidArgument("compute instance no longer exists")

    def info(self) -> p.ComputeInstanceInfo:
        with self._m.lock:
            self._live("info")
            c = self._ci
            return p.ComputeInstanceInfo(c.id, c.profile.nvml_id, c.placement, self._gi.id)

    def destroy(self) -> None:
        with self._m.lock:
            self._live("destroy")
            self._privileged("destroy")
            if any(
                x.gpu_instance_id == self._gi.id and x.compute_instance_id == self._ci.id
                for x in self._g.processes.values()
            ):
                raise errors.InUse(f"compute instance {self._ci.id} has running processes")
            del self._gi.cis[self._ci.id]


class MockGpuInstance(_Handle):
    def __init__(self, lib: MockNvml, gpu: _Gpu, gi: _Gi) -> None:
        super().__init__(lib, gpu)
        self._gi = gi

    def _live(self, call: str) -> None:
        self._enter(call)
        if self._g.gis.get(self._gi.id) is not self._gi:
            raise errors.InvalidArgument("GPU instance no longer exists")

    def info(self) -> p.GpuInstanceInfo:
        with self._m.lock:
            self._live("info")
            # NVML reports the profile's internal id here, not the enum it was created with.
            return p.GpuInstanceInfo(self._gi.id, self._gi.profile.nvml_id, self._gi.placement)

    def compute_instance_profile_info(
        self, profile_id: int, engine_profile: int = 0
    ) -> p.ComputeInstanceProfileInfo:
        with self._m.lock:
            self._live("compute_instance_profile_info")
            if engine_profile != catalog.CI_ENGINE_PROFILE_SHARED:
                raise errors.NotSupported(f"engine profile {engine_profile} is not supported")
            prof = self._m._ci_profile(self._gi, profile_id)
            return p.ComputeInstanceProfileInfo(
                prof.profile_id, prof.slice_count, prof.instance_count, prof.multiprocessor_count
            )

    def compute_instance_possible_placements(self, profile_id: int) -> list[Placement]:
        with self._m.lock:
            self._live("compute_instance_possible_placements")
            return list(self._m._ci_profile(self._gi, profile_id).placements)

    def compute_instance_remaining_capacity(self, profile_id: int) -> int:
        with self._m.lock:
            self._live("compute_instance_remaining_capacity")
            prof = self._m._ci_profile(self._gi, profile_id)
            taken = [c.placement for c in self._gi.cis.values()]
            same = sum(1 for c in self._gi.cis.values() if c.profile.profile_id == profile_id)
            free_slices = self._gi.profile.slice_count - sum(t.size for t in taken)
            n = 0
            for pl in prof.placements:
                if same + n >= prof.instance_count or (n + 1) * prof.slice_count > free_slices:
                    break
                if not any(pl.overlaps(t) for t in taken):
                    taken.append(pl)
                    n += 1
            return n

    def create_compute_instance(
        self, profile_id: int, placement: Placement | None = None
    ) -> MockComputeInstance:
        with self._m.lock:
            self._live("create_compute_instance")
            self._privileged("create_compute_instance")
            ci = self._m._create_ci(self._g, self._gi, profile_id, placement)
            return MockComputeInstance(self._lib, self._g, self._gi, ci)

    def compute_instances(self, profile_id: int) -> list[p.ComputeInstance]:
        with self._m.lock:
            self._live("compute_instances")
            self._privileged("compute_instances")
            self._m._ci_profile(self._gi, profile_id)
            return [
                MockComputeInstance(self._lib, self._g, self._gi, c)
                for c in sorted(self._gi.cis.values(), key=lambda c: c.id)
                if c.profile.profile_id == profile_id
            ]

    def destroy(self) -> None:
        with self._m.lock:
            self._live("destroy")
            self._privileged("destroy")
            if self._gi.cis:
                raise errors.InUse(
                    f"GPU instance {self._gi.id} still has {len(self._gi.cis)} compute instances"
                )
            if any(x.gpu_instance_id == self._gi.id for x in self._g.processes.values()):
                raise errors.InUse(f"GPU instance {self._gi.id} has running processes")
            del self._g.gis[self._gi.id]


class MockDevice(_Handle):
    """A full-GPU handle."""

    def _mig_only(self, call: str) -> errors.NvmlError:
        return errors.NotSupported(
            f"{call} needs a MIG device handle; GPU {self._g.index} is not one"
        )

    def index(self) -> int:
        with self._m.lock:
            self._enter("index")
            return self._g.index

    def name(self) -> str:
        with self._m.lock:
            self._enter("name")
            return self._g.model.nvml_name

    def uuid(self) -> str:
        with self._m.lock:
            self._enter("uuid")
            return self._g.uuid

    def pci_info(self) -> p.PciInfo:
        with self._m.lock:
            self._enter("pci_info")
            return p.PciInfo(self._g.bus_id, self._g.model.pci_device_id, 0)

    def pci_class(self) -> int:
        with self._m.lock:
            self._enter("pci_class")
            return self._g.pci_class

    def minor_number(self) -> int:
        with self._m.lock:
            self._enter("minor_number")
            return self._g.index

    def memory_info(self) -> p.MemoryInfo:
        with self._m.lock:
            self._enter("memory_info")
            if self._g.mig_current and not self._lib.privileged:
                # NVML: with MIG on, the parent's aggregate memory needs privileges.
                self._privileged("memory_info")
            total = self._g.model.memory_mib << 20
            reserved = self._g.model.system_reserved_mib << 20
            used = sum(x.used_bytes for x in self._g.processes.values())
            used = min(total - reserved, used)
            return p.MemoryInfo(total, total - reserved - used, used, reserved)

    def cuda_compute_capability(self) -> tuple[int, int]:
        with self._m.lock:
            self._enter("cuda_compute_capability")
            return self._g.model.compute_capability

    def architecture(self) -> str:
        with self._m.lock:
            self._enter("architecture")
            return self._g.model.architecture

    def brand(self) -> str:
        with self._m.lock:
            self._enter("brand")
            return self._g.model.brand

    def is_mig_device(self) -> bool:
        with self._m.lock:
            self._enter("is_mig_device")
            return False

    def _require_mig_capable(self) -> None:
        if not self._g.model.mig_capable:
            raise errors.NotSupported(f"GPU {self._g.index} ({self._g.model.key}) has no MIG")

    def _require_mig_for_queries(self) -> None:
        branch = self._m.driver_branch
        if not self._g.mig_current and branch and branch < BRANCH_MIG_QUERIES_WITHOUT_MIG:
            raise errors.NotSupported(
                f"MIG mode is not enabled on GPU {self._g.index} (R{branch} drivers answer "
                "profile queries only with MIG on)"
            )

    def mig_mode(self) -> p.MigMode:
        with self._m.lock:
            self._enter("mig_mode")
            self._require_mig_capable()
            return p.MigMode(self._g.mig_current, self._g.mig_pending)

    def set_mig_mode(self, enabled: bool) -> None:
        with self._m.lock:
            self._enter("set_mig_mode")
            self._require_mig_capable()
            self._privileged("set_mig_mode")
            if self._g.gis:
                raise errors.InUse(
                    f"GPU {self._g.index}: destroy all GPU instances before changing MIG mode"
                )
            # The new mode is pending until the GPU is reset, as on bare-metal A100s. Running
            # processes do not stop the request (the driver reports "pending ... in use by
            # another client"); they stop the reset that would make it current.
            self._g.mig_pending = enabled

    def max_mig_device_count(self) -> int:
        with self._m.lock:
            self._enter("max_mig_device_count")
            if not self._g.model.mig_capable or not self._g.mig_current:
                return 0
            return self._g.model.mig_compute_slices

    def mig_device_by_index(self, index: int) -> MockMigDevice:
        with self._m.lock:
            self._enter("mig_device_by_index")
            self._require_mig_capable()
            if not self._g.mig_current:
                raise errors.NotSupported(f"MIG mode is not enabled on GPU {self._g.index}")
            devices = self._g.mig_devices()
            if not 0 <= index < self._g.model.mig_compute_slices:
                raise errors.InvalidArgument(f"MIG device index {index} out of range")
            if index >= len(devices):
                raise errors.NotFound(f"GPU {self._g.index} has no MIG device {index}")
            gi, ci = devices[index]
            return MockMigDevice(self._lib, self._g, gi, ci)

    def parent(self) -> p.Device:
        raise self._mig_only("parent")

    def gpu_instance_id(self) -> int:
        raise self._mig_only("gpu_instance_id")

    def compute_instance_id(self) -> int:
        raise self._mig_only("compute_instance_id")

    def mig_attributes(self) -> p.MigDeviceAttributes:
        raise self._mig_only("mig_attributes")

    def gpu_instance_profile_info(self, profile_id: int) -> p.GpuInstanceProfileInfo:
        with self._m.lock:
            self._enter("gpu_instance_profile_info")
            self._require_mig_capable()
            self._require_mig_for_queries()
            prof = self._m._gi_profile(self._g, profile_id)
            return p.GpuInstanceProfileInfo(
                id=prof.nvml_id,
                profile_id=prof.profile_id,
                name=f"MIG {prof.name}",
                slice_count=prof.slice_count,
                instance_count=prof.instance_count,
                multiprocessor_count=prof.multiprocessor_count,
                memory_size_mb=prof.memory_mb,
                copy_engine_count=prof.copy_engines,
                decoder_count=prof.decoders,
                encoder_count=prof.encoders,
                jpeg_count=prof.jpegs,
                ofa_count=prof.ofas,
                is_p2p_supported=prof.p2p_supported,
            )

    def gpu_instance_possible_placements(self, profile_id: int) -> list[Placement]:
        with self._m.lock:
            self._enter("gpu_instance_possible_placements")
            self._require_mig_capable()
            self._require_mig_for_queries()
            return list(self._m._gi_profile(self._g, profile_id).placements)

    def gpu_instance_remaining_capacity(self, profile_id: int) -> int:
        with self._m.lock:
            self._enter("gpu_instance_remaining_capacity")
            self._require_mig_capable()
            if not self._g.mig_current:
                raise errors.NotSupported(f"MIG mode is not enabled on GPU {self._g.index}")
            return self._m._remaining_gis(self._g, self._m._gi_profile(self._g, profile_id))

    def create_gpu_instance(
        self, profile_id: int, placement: Placement | None = None
    ) -> MockGpuInstance:
        with self._m.lock:
            self._enter("create_gpu_instance")
            self._require_mig_capable()
            self._privileged("create_gpu_instance")
            gi = self._m._create_gi(self._g, profile_id, placement)
            return MockGpuInstance(self._lib, self._g, gi)

    def gpu_instances(self, profile_id: int) -> list[p.GpuInstance]:
        with self._m.lock:
            self._enter("gpu_instances")
            self._require_mig_capable()
            self._privileged("gpu_instances")
            self._m._gi_profile(self._g, profile_id)
            return [
                MockGpuInstance(self._lib, self._g, gi)
                for gi in sorted(self._g.gis.values(), key=lambda g: g.id)
                if gi.profile.profile_id == profile_id
            ]

    def gpu_instance_by_id(self, gpu_instance_id: int) -> MockGpuInstance:
        with self._m.lock:
            self._enter("gpu_instance_by_id")
            self._require_mig_capable()
            self._privileged("gpu_instance_by_id")
            gi = self._g.gis.get(gpu_instance_id)
            if gi is None:
                raise errors.NotFound(f"GPU {self._g.index} has no GPU instance {gpu_instance_id}")
            return MockGpuInstance(self._lib, self._g, gi)

    def utilization(self) -> p.Utilization:
        with self._m.lock:
            self._enter("utilization")
            if self._g.mig_current:
                raise errors.NotSupported("utilization is not reported while MIG is enabled")
            util = self._m._utilization(self._g, self._m.clock())
            return p.Utilization(util, round(util * 0.6))

    def temperature(self) -> int:
        with self._m.lock:
            self._enter("temperature")
            return self._m._temperature(self._g, self._m.clock())

    def power_usage(self) -> int:
        with self._m.lock:
            self._enter("power_usage")
            self._m._advance_energy(self._g)
            # Since Ampere NVML averages the board power over the last second.
            now = self._m.clock()
            samples = [self._m._power_mw(self._g, now - k * 0.25) for k in range(5)]
            return round(sum(samples) / len(samples))

    def power_usage_instant(self) -> int:
        with self._m.lock:
            self._enter("power_usage_instant")
            self._m._advance_energy(self._g)
            return self._m._power_mw(self._g, self._m.clock())

    def total_energy_consumption(self) -> int:
        with self._m.lock:
            self._enter("total_energy_consumption")
            self._m._advance_energy(self._g)
            return int(self._g.energy_mj)

    def clock(self, clock_type: p.ClockType) -> int:
        with self._m.lock:
            self._enter("clock")
            model = self._g.model
            if clock_type == p.ClockType.MEM:
                return model.memory_clock_mhz
            busy = self._m._load(self._g) > 0
            sm = model.max_sm_clock_mhz if busy else 345
            if clock_type == p.ClockType.VIDEO:
                return round(sm * 0.9)
            return sm

    def encoder_utilization(self) -> int:
        with self._m.lock:
            self._enter("encoder_utilization")
            self._no_mig_utilization()
            return 0  # simulated jobs do compute only

    def decoder_utilization(self) -> int:
        with self._m.lock:
            self._enter("decoder_utilization")
            self._no_mig_utilization()
            return 0

    def _no_mig_utilization(self) -> None:
        if self._g.mig_current:
            raise errors.NotSupported("utilization is not reported while MIG is enabled")

    def memory_temperature(self) -> int:
        with self._m.lock:
            self._enter("memory_temperature")
            # Only HBM boards have a memory sensor NVML reports; GDDR boards answer NotSupported.
            if not self._g.model.key.startswith(_HBM_MODELS):
                raise errors.NotSupported(f"{self._g.model.key} reports no memory temperature")
            return self._m._temperature(self._g, self._m.clock()) + 4

    def pcie_throughput(self, counter: p.PcieUtilCounter) -> int:
        with self._m.lock:
            self._enter("pcie_throughput")
        self._m._pcie_sample()
        with self._m.lock:
            self._enter("pcie_throughput")
            # KB/s: busy GPUs stream inputs in (RX) and results out (TX) at a few GB/s.
            util = self._m._utilization(self._g, self._m.clock())
            per_percent = 24_000 if counter == p.PcieUtilCounter.RX_BYTES else 9_000
            return util * per_percent + 120

    def pcie_replay_counter(self) -> int:
        with self._m.lock:
            self._enter("pcie_replay_counter")
            return 0  # the simulated PCIe links never retry

    def remapped_rows(self) -> p.RemappedRows:
        with self._m.lock:
            self._enter("remapped_rows")
            if not self._g.model.key.startswith(_HBM_MODELS):
                raise errors.NotSupported(f"{self._g.model.key} has no row remapper")
            # An uncorrectable error remaps its row at once; the remap is applied at the next reset.
            unc = int(p.EccErrorType.UNCORRECTED)
            aggregate = self._g.ecc.get((unc, int(p.EccCounterType.AGGREGATE)), 0)
            volatile = self._g.ecc.get((unc, int(p.EccCounterType.VOLATILE)), 0)
            return p.RemappedRows(0, aggregate, volatile > 0, False)

    def total_ecc_errors(self, error_type: p.EccErrorType, counter_type: p.EccCounterType) -> int:
        with self._m.lock:
            self._enter("total_ecc_errors")
            return self._g.ecc.get((int(error_type), int(counter_type)), 0)

    def supported_event_types(self) -> p.EventType:
        with self._m.lock:
            self._enter("supported_event_types")
            return _ALL_EVENTS

    def gpu_recovery_action(self) -> p.RecoveryAction:
        with self._m.lock:
            self._enter("gpu_recovery_action")
            branch = self._m.driver_branch
            if branch and branch < BRANCH_RECOVERY_ACTION_FIELD:
                raise errors.NotSupported(
                    f"driver R{branch} has no GPU recovery-action field (added in "
                    f"R{BRANCH_RECOVERY_ACTION_FIELD})"
                )
            return self._g.recovery

    def running_processes(self) -> list[p.ProcessInfo]:
        with self._m.lock:
            self._enter("running_processes")
            return [
                p.ProcessInfo(x.pid, x.used_bytes, x.gpu_instance_id, x.compute_instance_id)
                for x in sorted(self._g.processes.values(), key=lambda x: x.pid)
            ]

    def gpm_sample(self, gpu_instance_id: int | None = None) -> MockGpmSample:
        with self._m.lock:
            self._enter("gpm_sample")
            branch = self._m.driver_branch
            if self._g.model.architecture not in _GPM_ARCHITECTURES or (
                branch and branch < BRANCH_GPM
            ):
                raise errors.NotSupported(
                    f"GPU {self._g.index} ({self._g.model.key}) has no GPU performance monitoring"
                )
            if gpu_instance_id is not None and gpu_instance_id not in self._g.gis:
                raise errors.NotFound(f"GPU {self._g.index} has no GPU instance {gpu_instance_id}")
            return MockGpmSample(self._g.index, gpu_instance_id, self._m.clock())

    def _require_nvlink(self, link: int) -> None:
        if not self._m.nvswitch or self._g.model.nvlink_count == 0:
            raise errors.NotSupported(f"GPU {self._g.index} has no NVLink connections")
        if not 0 <= link < self._g.model.nvlink_count:
            raise errors.InvalidArgument(
                f"NVLink {link} out of range (GPU has {self._g.model.nvlink_count} links)"
            )

    def nvlink_state(self, link: int) -> bool:
        with self._m.lock:
            self._enter("nvlink_state")
            self._require_nvlink(link)
            return True

    def nvlink_remote_pci_bus_id(self, link: int) -> str:
        with self._m.lock:
            self._enter("nvlink_remote_pci_bus_id")
            self._require_nvlink(link)
            # Links fan out evenly over the board's NVSwitches (6 on A100 boards, 4 later).
            switches = 6 if self._g.model.nvlink_count == 12 else 4
            return f"00000000:{0xC0 + link % switches:02X}:00.0"

    def topology_common_ancestor(self, other: p.Device) -> p.TopologyLevel:
        with self._m.lock:
            self._enter("topology_common_ancestor")
            j = other.index()
            return self._m.pci_common_ancestor(self._g.bus_id, self._m.gpus[j].bus_id)

    def cpu_affinity(self) -> tuple[int, ...]:
        with self._m.lock:
            self._enter("cpu_affinity")
            return self._m.spec.host.node_cpus(self._m.socket_of(self._g.index))

    def memory_affinity(self) -> tuple[int, ...]:
        with self._m.lock:
            self._enter("memory_affinity")
            return (self._m.socket_of(self._g.index),)

    def fabric_info(self) -> p.FabricInfo:
        with self._m.lock:
            self._enter("fabric_info")
            fabric = self._g.fabric
            if fabric is None:
                raise errors.NotSupported(
                    f"GPU {self._g.index} is not attached to an NVLink fabric"
                )
            return p.FabricInfo(
                fabric.cluster_uuid,
                fabric.clique_id,
                fabric.state,
                fabric.status,
                fabric.health_mask,
            )


class MockMigDevice(MockDevice):
    """A MIG device handle (one compute instance inside one GPU instance)."""

    def __init__(self, lib: MockNvml, gpu: _Gpu, gi: _Gi, ci: _Ci) -> None:
        super().__init__(lib, gpu)
        self._gi = gi
        self._ci = ci

    def _enter(self, call: str) -> None:
        super()._enter(call)
        if self._g.gis.get(self._gi.id) is not self._gi or self._gi.cis.get(self._ci.id) is not (
            self._ci
        ):
            raise errors.InvalidArgument("MIG device no longer exists")

    def _not_for_mig(self, call: str) -> errors.NvmlError:
        return errors.NotSupported(f"{call} is not supported on a MIG device handle")

    def index(self) -> int:
        raise self._not_for_mig("index")

    def minor_number(self) -> int:
        raise self._not_for_mig("minor_number")

    def name(self) -> str:
        with self._m.lock:
            self._enter("name")
            return f"{self._g.model.nvml_name} MIG {self._profile_name()}"

    def _profile_name(self) -> str:
        gi = self._gi.profile
        return catalog.mig_profile_name(
            gi.slice_count,
            self._ci.profile.slice_count,
            gi.memory_mb,
            self._g.model.memory_mib,
            suffix=gi.suffix,
        )

    def uuid(self) -> str:
        with self._m.lock:
            self._enter("uuid")
            return self._ci.uuid

    def memory_info(self) -> p.MemoryInfo:
        with self._m.lock:
            self._enter("memory_info")  # a MIG device's own memory needs no privileges
            total = self._gi.profile.memory_mb << 20
            used = sum(
                x.used_bytes for x in self._g.processes.values() if x.gpu_instance_id == self._gi.id
            )
            used = min(total, used)
            return p.MemoryInfo(total, total - used, used)

    def is_mig_device(self) -> bool:
        with self._m.lock:
            self._enter("is_mig_device")
            return True

    def mig_mode(self) -> p.MigMode:
        raise self._not_for_mig("mig_mode")

    def set_mig_mode(self, enabled: bool) -> None:
        raise self._not_for_mig("set_mig_mode")

    def max_mig_device_count(self) -> int:
        raise self._not_for_mig("max_mig_device_count")

    def mig_device_by_index(self, index: int) -> MockMigDevice:
        raise self._not_for_mig("mig_device_by_index")

    def parent(self) -> MockDevice:
        with self._m.lock:
            self._enter("parent")
            return MockDevice(self._lib, self._g)

    def gpu_instance_id(self) -> int:
        with self._m.lock:
            self._enter("gpu_instance_id")
            return self._gi.id

    def compute_instance_id(self) -> int:
        with self._m.lock:
            self._enter("compute_instance_id")
            return self._ci.id

    def mig_attributes(self) -> p.MigDeviceAttributes:
        with self._m.lock:
            self._enter("mig_attributes")
            gi = self._gi.profile
            return p.MigDeviceAttributes(
                multiprocessor_count=self._ci.profile.multiprocessor_count,
                shared_copy_engine_count=gi.copy_engines,
                shared_decoder_count=gi.decoders,
                shared_encoder_count=gi.encoders,
                shared_jpeg_count=gi.jpegs,
                shared_ofa_count=gi.ofas,
                gpu_instance_slice_count=gi.slice_count,
                compute_instance_slice_count=self._ci.profile.slice_count,
                memory_size_mb=gi.memory_mb,
            )

    def gpu_instance_profile_info(self, profile_id: int) -> p.GpuInstanceProfileInfo:
        raise self._not_for_mig("gpu_instance_profile_info")

    def gpu_instance_possible_placements(self, profile_id: int) -> list[Placement]:
        raise self._not_for_mig("gpu_instance_possible_placements")

    def gpu_instance_remaining_capacity(self, profile_id: int) -> int:
        raise self._not_for_mig("gpu_instance_remaining_capacity")

    def create_gpu_instance(
        self, profile_id: int, placement: Placement | None = None
    ) -> MockGpuInstance:
        raise self._not_for_mig("create_gpu_instance")

    def gpu_instances(self, profile_id: int) -> list[p.GpuInstance]:
        raise self._not_for_mig("gpu_instances")

    def gpu_instance_by_id(self, gpu_instance_id: int) -> MockGpuInstance:
        raise self._not_for_mig("gpu_instance_by_id")

    def utilization(self) -> p.Utilization:
        raise self._not_for_mig("utilization")

    def temperature(self) -> int:
        raise self._not_for_mig("temperature")

    def encoder_utilization(self) -> int:
        raise self._not_for_mig("encoder_utilization")

    def decoder_utilization(self) -> int:
        raise self._not_for_mig("decoder_utilization")

    def memory_temperature(self) -> int:
        raise self._not_for_mig("memory_temperature")

    def pcie_throughput(self, counter: p.PcieUtilCounter) -> int:
        raise self._not_for_mig("pcie_throughput")

    def pcie_replay_counter(self) -> int:
        raise self._not_for_mig("pcie_replay_counter")

    def remapped_rows(self) -> p.RemappedRows:
        raise self._not_for_mig("remapped_rows")

    def power_usage(self) -> int:
        raise self._not_for_mig("power_usage")

    def power_usage_instant(self) -> int:
        raise self._not_for_mig("power_usage_instant")

    def gpm_sample(self, gpu_instance_id: int | None = None) -> MockGpmSample:
        raise self._not_for_mig("gpm_sample (sample the parent with the GPU instance id)")

    def total_energy_consumption(self) -> int:
        raise self._not_for_mig("total_energy_consumption")

    def running_processes(self) -> list[p.ProcessInfo]:
        with self._m.lock:
            self._enter("running_processes")
            return [
                p.ProcessInfo(x.pid, x.used_bytes, x.gpu_instance_id, x.compute_instance_id)
                for x in sorted(self._g.processes.values(), key=lambda x: x.pid)
                if x.gpu_instance_id == self._gi.id
            ]

    def nvlink_state(self, link: int) -> bool:
        raise self._not_for_mig("nvlink_state")

    def nvlink_remote_pci_bus_id(self, link: int) -> str:
        raise self._not_for_mig("nvlink_remote_pci_bus_id")

    def cpu_affinity(self) -> tuple[int, ...]:
        raise self._not_for_mig("cpu_affinity")

    def memory_affinity(self) -> tuple[int, ...]:
        raise self._not_for_mig("memory_affinity")


class MockEventSet:
    """An NVML event set: registrations per GPU and a queue that `wait` blocks on."""

    def __init__(self, lib: MockNvml) -> None:
        self._lib = lib
        self._m = lib.machine
        self._masks: dict[int, p.EventType] = {}
        self._queue: collections.deque[p.EventData] = collections.deque()
        self._freed = False

    def _offer(self, gpu: int, event: p.EventData) -> None:
        mask = self._masks.get(gpu)
        if mask is not None and event.event_type & mask:
            self._queue.append(event)

    def register(self, device: p.Device, event_types: p.EventType) -> None:
        if not isinstance(device, MockDevice):
            raise errors.InvalidArgument("device handle belongs to another backend")
        with self._m.lock:
            self._lib._require_init()
            self._m._check_fault("register", device._g.index)
            if self._freed:
                raise errors.InvalidArgument("event set has been freed")
            if device._g.lost:
                raise errors.GpuLost(f"GPU {device._g.index} has fallen off the bus")
            unsupported = event_types & ~_ALL_EVENTS
            if unsupported:
                raise errors.NotSupported(f"event types {int(unsupported):#x} are not supported")
            index = device._g.index
            self._masks[index] = self._masks.get(index, p.EventType(0)) | event_types

    def wait(self, timeout_ms: int) -> p.EventData:
        with self._m.lock:
            self._lib._require_init()
            self._m._check_fault("wait", None)
            if self._freed:
                raise errors.InvalidArgument("event set has been freed")
            self._m._changed.wait_for(lambda: bool(self._queue), max(0, timeout_ms) / 1000.0)
            if not self._queue:
                raise errors.Timeout(f"no event within {timeout_ms} ms")
            return self._queue.popleft()

    def free(self) -> None:
        with self._m.lock:
            self._freed = True
            self._queue.clear()
            if self in self._m._event_sets:
                self._m._event_sets.remove(self)


@dataclass
class MockGpmSample:
    """A GPU performance-monitoring snapshot: when, of which GPU (and GPU instance)."""

    gpu: int
    gpu_instance_id: int | None
    taken_at: float
    freed: bool = False

    def free(self) -> None:
        self.freed = True


class MockNvml:
    """The library handle over a `MockMachine`; implements the `Nvml` Protocol."""

    def __init__(
        self,
        machine: MockMachine,
        *,
        privileged: bool = True,
        driver_root: str | Path | None = None,
    ) -> None:
        self.machine = machine
        self.privileged = privileged
        self.driver_root = driver_root
        self._library_loaded = False  # the caller loaded it itself (mock_pynvml's nvmlLib)
        self._refs = 0

    def _require_init(self) -> None:
        if self._refs <= 0:
            raise errors.Uninitialized()

    def _enter(self, call: str) -> None:
        self._require_init()
        self.machine._check_fault(call, None)

    def init(self) -> None:
        with self.machine.lock:
            self.machine._check_fault("init", None)
            if not self.machine.library_on_loader_path and not self._library_loaded:
                roots = [] if self.driver_root is None else [self.driver_root]
                if library.find(roots) is None:
                    raise errors.LibraryNotFound(
                        f"{errors.LibraryNotFound.hint} ({library.NVML_LIBRARY} is not on the "
                        f"loader path nor in {library.describe(roots)})"
                    )
            self.machine._require_driver()
            self._refs += 1

    def shutdown(self) -> None:
        with self.machine.lock:
            self._enter("shutdown")
            self._refs -= 1

    def driver_version(self) -> str:
        with self.machine.lock:
            self._enter("driver_version")
            return self.machine._require_driver()

    def cuda_driver_version(self) -> int:
        with self.machine.lock:
            self._enter("cuda_driver_version")
            if self.machine.driver_probe is None:
                return self.machine.spec.cuda_driver_version
            return driver_branches.cuda_driver_version(self.machine._require_driver())

    def nvml_version(self) -> str:
        with self.machine.lock:
            self._enter("nvml_version")
            if self.machine.driver_probe is None:
                return self.machine.spec.nvml_version
            return driver_branches.nvml_version(self.machine._require_driver())

    def device_count(self) -> int:
        with self.machine.lock:
            self._enter("device_count")
            return len(self.machine.gpus)

    def device_by_index(self, index: int) -> MockDevice:
        with self.machine.lock:
            self._enter("device_by_index")
            if not 0 <= index < len(self.machine.gpus):
                raise errors.InvalidArgument(f"GPU index {index} out of range")
            g = self.machine.gpus[index]
            if g.lost:
                raise errors.GpuLost(f"GPU {index} ({g.uuid}) has fallen off the bus")
            return MockDevice(self, g)

    def device_by_uuid(self, uuid: str) -> MockDevice:
        with self.machine.lock:
            self._enter("device_by_uuid")
            for g in self.machine.gpus:
                if g.uuid == uuid:
                    if g.lost:
                        raise errors.GpuLost(f"GPU {g.index} ({g.uuid}) has fallen off the bus")
                    return MockDevice(self, g)
                for gi, ci in g.mig_devices():
                    if ci.uuid == uuid:
                        if g.lost:
                            raise errors.GpuLost(
                                f"GPU {g.index} ({g.uuid}), the parent of {uuid}, has fallen "
                                "off the bus"
                            )
                        return MockMigDevice(self, g, gi, ci)
            raise errors.NotFound(f"no GPU or MIG device with UUID {uuid}")

    def event_set(self) -> MockEventSet:
        with self.machine.lock:
            self._enter("event_set")
            event_set = MockEventSet(self)
            self.machine._event_sets.append(event_set)
            return event_set

    def gpm_metrics(
        self, first: p.GpmSample, second: p.GpmSample, metrics: Sequence[p.GpmMetric]
    ) -> dict[p.GpmMetric, float]:
        """Activity between two samples of one GPU (instance), from the simulated load."""
        if not isinstance(first, MockGpmSample) or not isinstance(second, MockGpmSample):
            raise errors.InvalidArgument("GPM samples belong to another backend")
        with self.machine.lock:
            self._enter("gpm_metrics")
            if first.freed or second.freed:
                raise errors.InvalidArgument("GPM sample has been freed")
            same = (first.gpu, first.gpu_instance_id) == (second.gpu, second.gpu_instance_id)
            if not same or second.taken_at <= first.taken_at:
                raise errors.InvalidArgument("GPM samples of different devices or out of order")
            g = self.machine._gpu(second.gpu)
            load = float(self.machine._load(g, second.gpu_instance_id))
            share = {
                p.GpmMetric.GRAPHICS_UTIL: 1.0,
                p.GpmMetric.SM_UTIL: 0.9,
                p.GpmMetric.SM_OCCUPANCY: 0.6,
                p.GpmMetric.ANY_TENSOR_UTIL: 0.5,
                p.GpmMetric.DRAM_BW_UTIL: 0.4,
                p.GpmMetric.FP64_UTIL: 0.0,
                p.GpmMetric.FP32_UTIL: 0.3,
                p.GpmMetric.FP16_UTIL: 0.2,
            }
            return {m: round(load * share[m], 2) for m in metrics}
