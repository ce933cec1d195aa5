"""A simulated host's PCI layer: the sysfs tree of a node's root directory, and a kernel that
applies writes to it as Linux would.

`prepare(root)` adds to the PCI functions a node already has in its tree (written by the demo's
hardware module: `vendor`, `device`, `class`, ...) what the VM agents need: `modalias`,
`driver_override`, IOMMU groups (`/sys/kernel/iommu_groups/N/devices/...` and each device's
`iommu_group` link; a GPU and its audio function share one), SR-IOV attributes on vGPU-capable
GPUs, the drivers bound at boot, and `/lib/modules/<release>/modules.{alias,dep}`.

`SimulatedKernel(root)` is the `Kernel` of such a host. It keeps no state of its own: the files
are the state, so every agent on a node can make its own instance. Writes behave like the
kernel's sysfs handlers, including their errors: `driver_override`; `drivers/<drv>/bind`
(ENODEV for an unknown device or a driver that does not match, EBUSY when already bound, EINVAL
for a vfio driver on a device without an IOMMU group); `drivers/<drv>/unbind` (ENODEV when not
bound to it); `drivers_probe`; `sriov_numvfs` (ENOENT without an SR-IOV capable driver, ERANGE
over `sriov_totalvfs`, EBUSY to change a non-zero count); mdev `create` (EINVAL for a bad UUID,
EEXIST, EUSERS when no instance is available) and `remove`; and the vendor vGPU file
`current_vgpu_type`. Binding a device to a vfio driver creates `/dev/vfio/<group>` (a plain file
here: a character device in Linux), releasing the last one of a group removes it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import uuid as uuid_mod
from dataclasses import dataclass
from pathlib import Path

from gpu_operator.agents.pci import models, sysfs
from gpu_operator.agents.pci.kernel import KernelError, refused

# Modules a simulated host can load (`modprobe` finds them in modules.dep), the PCI driver each
# registers (None: no PCI driver), and their dependencies.
_VFIO_DEPS = ("vfio", "vfio_iommu_type1", "vfio_pci_core")


@dataclass(frozen=True)
class Module:
    name: str
    driver: str | None
    path: str
    deps: tuple[str, ...] = ()


MODULES: dict[str, Module] = {
    m.name: m
    for m in (
        Module("vfio", None, "kernel/drivers/vfio/vfio.ko"),
        Module("vfio_iommu_type1", None, "kernel/drivers/vfio/vfio_iommu_type1.ko", ("vfio",)),
        Module("vfio_pci_core", None, "kernel/drivers/vfio/pci/vfio-pci-core.ko", ("vfio",)),
        Module("vfio_pci", sysfs.VFIO_PCI, "kernel/drivers/vfio/pci/vfio-pci.ko", _VFIO_DEPS),
        Module("nvgrace_gpu_vfio_pci", "nvgrace_gpu_vfio_pci",
               "kernel/drivers/vfio/pci/nvgrace-gpu/nvgrace-gpu-vfio-pci.ko", _VFIO_DEPS),
        Module("mlx5_vfio_pci", "mlx5_vfio_pci",
               "kernel/drivers/vfio/pci/mlx5/mlx5-vfio-pci.ko", _VFIO_DEPS),
        Module("igb", "igb", "kernel/drivers/net/ethernet/intel/igb/igb.ko"),
        Module("ast", "ast", "kernel/drivers/gpu/drm/ast/ast.ko"),
        Module("snd_hda_intel", "snd_hda_intel", "kernel/sound/pci/hda/snd-hda-intel.ko"),
    )
}  # fmt: skip
# vfio variant drivers bind only devices whose driver_override names them; these are the ids
# their modules declare (the kernel's PCI_DRIVER_OVERRIDE_DEVICE_VFIO tables).
VARIANT_IDS: dict[str, tuple[tuple[int, int], ...]] = {
    # Grace Hopper GH200 120GB, 480GB and the GH200 SKU 0x2348, GB200 and (since Linux 6.18) GB300:
    # a Grace GPU's coherent memory needs this driver, plain vfio-pci cannot pass it through.
    "nvgrace_gpu_vfio_pci": tuple(
        (0x10DE, device) for device in (0x2342, 0x2345, 0x2348, 0x2941, 0x31C2)
    ),
    "mlx5_vfio_pci": ((0x15B3, 0x101E), (0x15B3, 0x1021)),
}
BOOT_MODULES = ("igb", "ast", "snd_hda_intel")
NVIDIA_MODULE = "nvidia"
VGPU_MODULE = "nvidia_vgpu_vfio"
# The NVIDIA driver's other modules and the modules each needs first (modprobe loads those; each
# dependent counts in its dependency's refcnt and `holders`, so rmmod refuses a module in use).
NVIDIA_DEPENDENCIES: dict[str, tuple[str, ...]] = {
    "nvidia_uvm": (NVIDIA_MODULE,),
    "nvidia_modeset": (NVIDIA_MODULE,),
    "nvidia_drm": ("nvidia_modeset",),
    "nvidia_peermem": (NVIDIA_MODULE,),
}
# The order in which the driver's modules come out (dependents before what they depend on).
NVIDIA_UNLOAD_ORDER = ("nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia_peermem")
# What `/proc/driver/nvidia/version` holds while the `nvidia` module is loaded; its first line
# names the version (as NVML and the driver container read it).
NVIDIA_VERSION_FILE = Path("proc/driver/nvidia/version")
DEFAULT_DRIVER_VERSION = "570.195.03"
_BUILD_DATE = "Tue Sep 23 10:08:59 UTC 2025"  # the build stamp after the version (any will do)
_NVRM_VERSION = re.compile(
    r"^NVRM version: NVIDIA UNIX .*?Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)"
)
# UEFI's SecureBoot variable (its last byte is 1 when enabled), as `mokutil --sb-state` reads it.
SECURE_BOOT_VARIABLE = Path(
    "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
)
MDEV_DRIVER = "vfio_mdev"
CREATABLE_HEADER = "ID    : vGPU Name"
VF_OFFSET = 4  # the first VF's function number: PF 0000:07:00.0 -> VFs 0000:07:00.4, ...
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def modalias(vendor: int, device: int, sub_vendor: int, sub_device: int, pci_class: int) -> str:
    """The `modalias` of a PCI function (`pci:v000010DEd000020B0sv...bc03sc02i00`)."""
    return (
        f"pci:v{vendor:08X}d{device:08X}sv{sub_vendor:08X}sd{sub_device:08X}"
        f"bc{pci_class >> 16:02X}sc{(pci_class >> 8) & 0xFF:02X}i{pci_class & 0xFF:02X}"
    )


def modules_alias() -> str:
    """`modules.alias` lines for the vfio variant drivers (what the VFIO manager matches)."""
    lines = ["# Aliases extracted from modules themselves."]
    for module, ids in VARIANT_IDS.items():
        for vendor, device in ids:
            lines.append(f"alias vfio_pci:v{vendor:08X}d{device:08X}sv*sd*bc*sc*i* {module}")
    lines.append("alias pci:v*d*sv*sd*bc04sc03i00* snd_hda_intel")
    return "\n".join(lines) + "\n"


def nvidia_version_text(version: str) -> str:
    """`/proc/driver/nvidia/version` of a loaded driver."""
    return (
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  {_BUILD_DATE}\n"
        "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"
    )


def nvidia_version(root: Path) -> str | None:
    """The NVIDIA driver version a host's `/proc/driver/nvidia/version` names (None: no driver
    loaded, or a file that names none)."""
    try:
        first = (root / NVIDIA_VERSION_FILE).read_text().split("\n", 1)[0]
    except OSError:
        return None
    found = _NVRM_VERSION.match(first)
    return found.group(1) if found else None


def modules_dep() -> str:
    return "".join(
        f"{m.path}: {' '.join(MODULES[d].path for d in m.deps)}".rstrip() + "\n"
        for m in MODULES.values()
    )


def _write(path: Path, text: str) -> None:
    """Write a file unless it already holds `text` (truncating writes are the slow part)."""
    try:
        if path.read_text() == text:
            return
    except OSError:
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _link(link: Path, target: Path) -> None:
    """A relative symlink `link -> target`, replacing any existing one."""
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _remove_tree(path: Path) -> None:
    if path.is_symlink():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def prepare(root: Path, *, iommu: bool = True) -> None:
    """Add the VM-facing attributes to the PCI functions of a host tree (see the module doc)."""
    host = SimulatedKernel(root)
    release = sysfs.kernel_release(root) or "unknown"
    _write(root / "lib" / "modules" / release / "modules.alias", modules_alias())
    _write(root / "lib" / "modules" / release / "modules.dep", modules_dep())
    _write(root / "sys" / "bus" / "pci" / "drivers_probe", "")
    (sysfs.mdev_devices_dir(root)).mkdir(parents=True, exist_ok=True)
    functions = sysfs.scan(root)
    group_of_slot: dict[str, int] = {}
    next_group = 0
    for function in functions:
        base = host.device_dir(function.address)
        alias = modalias(
            function.vendor,
            function.device,
            function.subsystem_vendor,
            function.subsystem_device,
            function.pci_class,
        )
        _write(base / "modalias", alias + "\n")
        _write(base / "driver_override", sysfs.NO_OVERRIDE + "\n")
        if function.nvidia and function.gpu:
            model = models.by_device_id(function.device)
            vfs = models.vm_facts(model).sriov_total_vfs if model else 0
            if vfs:
                _write(base / "sriov_totalvfs", f"{vfs}\n")
                _write(base / "sriov_numvfs", "0\n")
        if iommu:
            # Functions of one slot (a GPU and its audio function) share a group.
            group = group_of_slot.get(function.slot)
            if group is None:
                group = group_of_slot[function.slot] = next_group
                next_group += 1
            host.join_group(function.address, group)
    if iommu:
        (root / "sys" / "class" / "iommu" / "dmar0").mkdir(parents=True, exist_ok=True)
    for name in BOOT_MODULES:
        host.load(name, functions=functions)


class SimulatedKernel:
    """The kernel of a simulated host (see the module doc)."""

    def __init__(self, root: Path) -> None:
        self._root = root

    @property
    def root(self) -> Path:
        return self._root

    # -- paths -----------------------------------------------------------------------------

    def device_dir(self, address: str) -> Path:
        """The device's real directory (what `/sys/bus/pci/devices/<address>` links to)."""
        link = sysfs.devices_dir(self._root) / address
        try:
            return link.parent / os.readlink(link)
        except OSError:
            return link

    def _driver_dir(self, driver: str) -> Path:
        return sysfs.drivers_dir(self._root) / driver

    def _group_dir(self, group: int) -> Path:
        return self._root / "sys" / "kernel" / "iommu_groups" / str(group)

    def _vfio_dev(self, group: int) -> Path:
        return self._root / "dev" / "vfio" / str(group)

    # -- the Kernel protocol ---------------------------------------------------------------

    def write(self, path: Path, value: str) -> None:
        """Apply a write to a sysfs attribute as the kernel would (KernelError if refused)."""
        try:
            rel = Path(path).relative_to(self._root).parts
        except ValueError:
            raise refused(path, value, errno.EACCES) from None
        text = value.strip()
        match rel:
            case ("sys", "bus", "pci", "devices", address, "driver_override"):
                self._require_device(path, value, address)
                _write(self.device_dir(address) / "driver_override",
                       (text or sysfs.NO_OVERRIDE) + "\n")  # fmt: skip
            case ("sys", "bus", "pci", "devices", address, "driver", "unbind"):
                driver = sysfs.link_name(self.device_dir(address) / "driver")
                if driver is None:
                    raise refused(path, value, errno.ENOENT)
                self._unbind_write(path, value, driver, text)
            case ("sys", "bus", "pci", "drivers", driver, "bind" | "unbind") if not (
                self._driver_dir(driver).is_dir()
            ):
                raise refused(path, value, errno.ENOENT)  # the driver is not loaded
            case ("sys", "bus", "pci", "drivers", driver, "bind"):
                self._bind_write(path, value, driver, text)
            case ("sys", "bus", "pci", "drivers", driver, "unbind"):
                self._unbind_write(path, value, driver, text)
            case ("sys", "bus", "pci", "drivers_probe"):
                self._require_device(path, value, text)
                self.probe(text)
            case ("sys", "bus", "pci", "devices", address, "sriov_numvfs"):
                self._require_device(path, value, address)
                self._set_num_vfs(path, value, address, text)
            case ("sys", "bus", "pci", "devices", address, "mdev_supported_types", type_id,
                  "create"):  # fmt: skip
                self._create_mdev(path, value, address, type_id, text)
            case ("sys", "bus", "mdev", "devices", uuid, "remove"):
                self._remove_mdev(path, value, uuid)
            case ("sys", "bus", "pci", "devices", address, "nvidia", "current_vgpu_type"):
                self._set_vgpu_type(path, value, address, text)
            case _:
                if not Path(path).exists():
                    raise refused(path, value, errno.ENOENT)
                raise refused(path, value, errno.EACCES)

    def modprobe(self, module: str) -> None:
        """Load a module and its dependencies, if modules.dep lists it."""
        name = module.replace("-", "_")
        release = sysfs.kernel_release(self._root)
        dep = self._root / "lib" / "modules" / release / "modules.dep"
        try:
            listed = dep.read_text()
        except OSError:
            listed = ""
        known = MODULES.get(name)
        if known is None or f"{known.path}:" not in listed:
            raise KernelError(
                errno.ENOENT,
                f"modprobe: FATAL: Module {module} not found in directory /lib/modules/{release}",
            )
        for dependency in known.deps:
            self.load(dependency)
        self.load(name)

    # -- modules ---------------------------------------------------------------------------

    def loaded(self, module: str) -> bool:
        return sysfs.module_loaded(self._root, module)

    def load(
        self,
        module: str,
        *,
        driver: str | None = None,
        functions: list[sysfs.Function] | None = None,
        signed: bool = True,
        version: str | None = None,
    ) -> None:
        """Load a module: `/sys/module/<name>`, its PCI driver (which then probes the devices it
        matches: `functions`, when the caller has just read them, else a fresh scan) and a
        `/proc/modules` line. Loading a loaded module changes nothing.

        Modules the driver's other modules need are loaded first (as modprobe does). On a host
        with Secure Boot an unsigned module is refused with EKEYREJECTED; `version` is the
        `nvidia` module's (its `/proc/driver/nvidia/version`)."""
        name = module.replace("-", "_")
        if self.loaded(name):
            return
        if not signed and self.secure_boot():
            # The kernel's module signature check under Secure Boot (lockdown=integrity).
            raise KernelError(
                errno.EKEYREJECTED,
                f"modprobe: ERROR: could not insert '{name}': Key was rejected by service",
            )
        needs = NVIDIA_DEPENDENCIES.get(name, ())
        for dependency in needs:
            self.load(dependency, signed=signed, version=version)
        _write(self._root / "sys" / "module" / name / "refcnt", "0\n")
        for dependency in needs:
            _write(self._root / "sys" / "module" / dependency / "holders" / name, "")
            self._count(dependency, +1)
        self._proc_modules(add=name)
        if name == NVIDIA_MODULE:
            loaded = version or DEFAULT_DRIVER_VERSION
            _write(self._root / "sys" / "module" / name / "version", loaded + "\n")
            _write(self._root / NVIDIA_VERSION_FILE, nvidia_version_text(loaded))
        known = MODULES.get(name)
        pci_driver = driver or (known.driver if known else None)
        if name == NVIDIA_MODULE:
            pci_driver = NVIDIA_MODULE
        if name == "vfio":
            (self._root / "dev" / "vfio").mkdir(parents=True, exist_ok=True)
            _write(self._root / "dev" / "vfio" / "vfio", "")
        if pci_driver is not None:
            base = self._driver_dir(pci_driver)
            base.mkdir(parents=True, exist_ok=True)
            for attribute in ("bind", "unbind", "new_id", "remove_id"):
                _write(base / attribute, "")
            _write(base / "module", name + "\n")
            for function in functions if functions is not None else sysfs.scan(self._root):
                if function.driver is None:
                    self.probe(function.address, only=pci_driver, function=function)
        if name == VGPU_MODULE:
            for function in sysfs.scan(self._root):
                if function.driver == NVIDIA_MODULE:
                    self._vgpu_attach(function.address)

    def unload(self, module: str) -> None:
        """Unload a module: its devices are unbound first (EBUSY while vGPUs exist on them)."""
        name = module.replace("-", "_")
        if not self.loaded(name):
            raise KernelError(errno.ENOENT, f"rmmod: ERROR: Module {name} is not currently loaded")
        if name in (NVIDIA_MODULE, VGPU_MODULE) and self._vgpus_exist():
            raise KernelError(errno.EBUSY, f"rmmod: ERROR: Module {name} is in use")
        holders = self.holders(name)
        if holders:
            raise KernelError(
                errno.EBUSY, f"rmmod: ERROR: Module {name} is in use by: {' '.join(holders)}"
            )
        if self.refcount(name):
            raise KernelError(errno.EBUSY, f"rmmod: ERROR: Module {name} is in use")
        if name == NVIDIA_MODULE and self.loaded(VGPU_MODULE):
            self.unload(VGPU_MODULE)
        if name == VGPU_MODULE:
            for function in sysfs.scan(self._root):
                if function.driver == NVIDIA_MODULE:
                    self._vgpu_detach(function.address)
        known = MODULES.get(name)
        pci_driver = NVIDIA_MODULE if name == NVIDIA_MODULE else (known.driver if known else None)
        if pci_driver is not None:
            for function in sysfs.scan(self._root):
                if function.driver == pci_driver:
                    self.detach(function.address)
            _remove_tree(self._driver_dir(pci_driver))
        _remove_tree(self._root / "sys" / "module" / name)
        for dependency in NVIDIA_DEPENDENCIES.get(name, ()):
            _unlink(self._root / "sys" / "module" / dependency / "holders" / name)
            self._count(dependency, -1)
        if name == NVIDIA_MODULE:
            _unlink(self._root / NVIDIA_VERSION_FILE)
        self._proc_modules(remove=name)

    def refcount(self, module: str) -> int:
        """`/sys/module/<name>/refcnt` less the modules that depend on it: its other users."""
        name = module.replace("-", "_")
        try:
            count = int((self._root / "sys" / "module" / name / "refcnt").read_text())
        except (OSError, ValueError):
            return 0
        return max(count - len(self.holders(name)), 0)

    def holders(self, module: str) -> list[str]:
        """The loaded modules that use this one (`/sys/module/<name>/holders`)."""
        try:
            return sorted(os.listdir(self._root / "sys" / "module" / module / "holders"))
        except OSError:
            return []

    def hold(self, module: str) -> None:
        """A user opens the module's devices (a daemon such as nvidia-persistenced, a process)."""
        self._count(module.replace("-", "_"), +1)

    def release(self, module: str) -> None:
        """A user of the module goes away (see `hold`)."""
        self._count(module.replace("-", "_"), -1)

    def _count(self, name: str, delta: int) -> None:
        path = self._root / "sys" / "module" / name / "refcnt"
        try:
            count = int(path.read_text())
        except (OSError, ValueError):
            return  # not loaded
        _write(path, f"{max(count + delta, 0)}\n")
        self._proc_modules()

    def secure_boot(self) -> bool:
        """Whether the host booted with UEFI Secure Boot (the SecureBoot variable's data is 1)."""
        try:
            data = (self._root / SECURE_BOOT_VARIABLE).read_bytes()
        except OSError:
            return False
        return data[-1:] == b"\x01"

    def _proc_modules(self, *, add: str | None = None, remove: str | None = None) -> None:
        """Rewrite `/proc/modules`: name, size, use count, users ("-" for none), state."""
        path = self._root / "proc" / "modules"
        try:
            lines = path.read_text().splitlines()
        except OSError:
            lines = []
        names = [line.split(" ", 1)[0] for line in lines]
        names = [n for n in names if n not in (add, remove)]
        if add:
            names.append(add)
        out = []
        for name in names:
            users = self.holders(name)
            try:
                count = int((self._root / "sys" / "module" / name / "refcnt").read_text())
            except (OSError, ValueError):
                count = 0
            used_by = "".join(f"{u}," for u in users) or "-"
            out.append(f"{name} 16384 {count} {used_by} Live 0x0000000000000000")
        _write(path, "".join(line + "\n" for line in out))

    # -- binding ---------------------------------------------------------------------------

    def _require_device(self, path: Path, value: str, address: str) -> None:
        if not (sysfs.devices_dir(self._root) / address).exists():
            raise refused(path, value, errno.ENODEV)

    def matches(self, function: sysfs.Function, driver: str) -> bool:
        """Whether a driver would take a device (a driver_override decides alone)."""
        if function.driver_override is not None:
            return function.driver_override == driver
        if driver == NVIDIA_MODULE:
            return function.nvidia and (function.gpu or function.nvswitch)
        if driver == "snd_hda_intel":
            return function.audio
        if driver == "igb":
            return (function.vendor, function.device) == (0x8086, 0x1521)
        if driver == "ast":
            return (function.vendor, function.device) == (0x1A03, 0x2000)
        return False  # vfio-pci and the variants bind only on request (driver_override)

    def _bind_write(self, path: Path, value: str, driver: str, address: str) -> None:
        function = sysfs.read_function(self._root, address)
        if function is None:
            raise refused(path, value, errno.ENODEV)
        if function.driver is not None:
            raise refused(path, value, errno.EBUSY)
        if not self.matches(function, driver):
            raise refused(path, value, errno.ENODEV)
        if sysfs.is_vfio_driver(driver) and function.iommu_group is None:
            # vfio-pci's probe fails with -EINVAL for a device without an IOMMU group.
            raise refused(path, value, errno.EINVAL)
        self.attach(address, driver)

    def _unbind_write(self, path: Path, value: str, driver: str, address: str) -> None:
        function = sysfs.read_function(self._root, address)
        if function is None or function.driver != driver:
            raise refused(path, value, errno.ENODEV)
        self.detach(address)

    def probe(
        self, address: str, *, only: str | None = None, function: sysfs.Function | None = None
    ) -> None:
        """Bind an unbound device to the first loaded driver that matches (drivers_probe)."""
        function = function or sysfs.read_function(self._root, address)
        if function is None or function.driver is not None:
            return
        drivers_root = sysfs.drivers_dir(self._root)
        candidates = [only] if only else sorted(os.listdir(drivers_root))
        for driver in candidates:
            if not (drivers_root / driver).is_dir() or not self.matches(function, driver):
                continue
            if sysfs.is_vfio_driver(driver) and function.iommu_group is None:
                continue  # probe fails: the device stays unbound
            self.attach(address, driver)
            return

    def attach(self, address: str, driver: str, *, refresh: bool = True) -> None:
        """Bind a device to a driver (no checks: the callers made them)."""
        device = self.device_dir(address)
        _link(device / "driver", self._driver_dir(driver))
        _link(self._driver_dir(driver) / address, device)
        if not (sysfs.is_vfio_driver(driver) or driver == NVIDIA_MODULE):
            return  # nothing else happens for other drivers
        function = sysfs.read_function(self._root, address)
        if function is None:
            return
        if sysfs.is_vfio_driver(driver) and function.iommu_group is not None:
            _write(self._vfio_dev(function.iommu_group), "")
        if driver == NVIDIA_MODULE and self.loaded(VGPU_MODULE):
            self._vgpu_attach(address, refresh=refresh)

    def detach(self, address: str) -> None:
        """Unbind a device from its driver (a PF's VFs and vGPUs go with it)."""
        function = sysfs.read_function(self._root, address)
        if function is None or function.driver is None:
            return
        device = self.device_dir(address)
        if function.driver == NVIDIA_MODULE:
            self._vgpu_detach(address)
            if function.virtfns:
                self._disable_vfs(address)
        _unlink(self._driver_dir(function.driver) / address)
        _unlink(device / "driver")
        if sysfs.is_vfio_driver(function.driver) and function.iommu_group is not None:
            self._release_group(function.iommu_group)

    def _release_group(self, group: int) -> None:
        """Remove /dev/vfio/<group> when no device of the group is on a vfio driver."""
        members = self._group_dir(group) / "devices"
        try:
            names = os.listdir(members)
        except OSError:
            names = []
        for name in names:
            function = sysfs.read_function(self._root, name)
            if function is not None and sysfs.is_vfio_driver(function.driver):
                return
        _unlink(self._vfio_dev(group))

    def join_group(self, address: str, group: int) -> None:
        device = self.device_dir(address)
        _link(self._group_dir(group) / "devices" / address, device)
        _link(device / "iommu_group", self._group_dir(group))

    def _new_group(self) -> int:
        base = self._root / "sys" / "kernel" / "iommu_groups"
        try:
            used = [int(n) for n in os.listdir(base) if n.isdigit()]
        except OSError:
            used = []
        return max(used, default=-1) + 1

    # -- SR-IOV ----------------------------------------------------------------------------

    def _model(self, function: sysfs.Function) -> models.VmFacts | None:
        model = models.by_device_id(function.device) if function.nvidia else None
        return models.vm_facts(model) if model else None

    def _set_num_vfs(self, path: Path, value: str, address: str, text: str) -> None:
        function = sysfs.read_function(self._root, address)
        assert function is not None
        try:
            wanted = int(text, 0)
        except ValueError:
            raise refused(path, value, errno.EINVAL) from None
        if function.driver != NVIDIA_MODULE or not self.loaded(VGPU_MODULE):
            # Only the vGPU host driver implements sriov_configure for NVIDIA GPUs.
            raise refused(path, value, errno.ENOENT)
        if wanted < 0 or wanted > function.sriov_total_vfs:
            raise refused(path, value, errno.ERANGE)
        current = function.sriov_num_vfs
        if wanted == current:
            return
        if current and wanted:
            raise refused(path, value, errno.EBUSY)
        if wanted == 0:
            if any(self._vf_in_use(vf) for vf in function.virtfns):
                raise refused(path, value, errno.EBUSY)
            self._disable_vfs(address)
        else:
            self.enable_vfs(address, wanted)

    def enable_vfs(self, address: str, count: int) -> None:
        """Create a PF's VFs (bound to the nvidia driver, as its probe does in vGPU mode)."""
        pf = self.device_dir(address)
        function = sysfs.read_function(self._root, address)
        assert function is not None
        domain, bus, rest = address.split(":")
        slot = int(rest.split(".")[0], 16)
        for index in range(count):
            devfn = (slot << 3) + VF_OFFSET + index
            vf_address = f"{domain}:{bus}:{devfn >> 3:02x}.{devfn & 7:x}"
            vf = pf.parent / vf_address
            for name in ("vendor", "device", "class", "subsystem_vendor", "subsystem_device"):
                _write(vf / name, (pf / name).read_text())
            _write(vf / "modalias", (pf / "modalias").read_text())
            _write(vf / "driver_override", sysfs.NO_OVERRIDE + "\n")
            _link(sysfs.devices_dir(self._root) / vf_address, vf)
            _link(vf / "physfn", pf)
            _link(pf / f"virtfn{index}", vf)
            if function.iommu_group is not None:
                self.join_group(vf_address, self._new_group())
            self.attach(vf_address, NVIDIA_MODULE, refresh=False)
        _write(pf / "sriov_numvfs", f"{count}\n")
        self._refresh(address)

    def _disable_vfs(self, address: str) -> None:
        pf = self.device_dir(address)
        function = sysfs.read_function(self._root, address)
        if function is None:
            return
        for index, vf_address in enumerate(function.virtfns):
            vf = sysfs.read_function(self._root, vf_address)
            if vf is not None:
                self._vgpu_detach(vf_address)
                self.detach(vf_address)
                if vf.iommu_group is not None:
                    _remove_tree(self._group_dir(vf.iommu_group))
                    _unlink(self._vfio_dev(vf.iommu_group))
            _remove_tree(self.device_dir(vf_address))
            _unlink(sysfs.devices_dir(self._root) / vf_address)
            _unlink(pf / f"virtfn{index}")
        _write(pf / "sriov_numvfs", "0\n")

    # -- vGPU: mdev types and vendor vGPU files --------------------------------------------

    def _pf_of(self, function: sysfs.Function) -> sysfs.Function:
        if function.physfn:
            pf = sysfs.read_function(self._root, function.physfn)
            if pf is not None:
                return pf
        return function

    def _vgpu_attach(self, address: str, *, refresh: bool = True) -> None:
        """What the vGPU host driver adds to a device it binds: mdev types on a Turing PF or an
        Ampere VF, the vendor vGPU files on an Ada/Hopper VF."""
        function = sysfs.read_function(self._root, address)
        if function is None or not (function.gpu and function.nvidia):
            return
        facts = self._model(function)
        if facts is None or facts.framework is None:
            return
        device = self.device_dir(address)
        if (facts.framework == "mdev" and not function.vf) or (
            facts.framework == "mdev-sriov" and function.vf
        ):
            for vgpu in facts.vgpu_types:
                base = device / "mdev_supported_types" / f"nvidia-{vgpu.type_id}"
                _write(base / "name", vgpu.name + "\n")
                _write(base / "device_api", "vfio-pci\n")
                _write(
                    base / "description",
                    f"num_heads=4, frl_config=60, framebuffer={vgpu.framebuffer_mib}M, "
                    f"max_resolution=5120x2880, max_instance={vgpu.max_instances}\n",
                )
                _write(base / "create", "")
                (base / "devices").mkdir(exist_ok=True)
            _link(self._root / "sys" / "class" / "mdev_bus" / address, device)
        elif facts.framework == "vendor-vfio" and function.vf:
            _write(device / "nvidia" / "current_vgpu_type", "0\n")
            _write(device / "nvidia" / "creatable_vgpu_types", CREATABLE_HEADER + "\n")
        if refresh:
            self._refresh(self._pf_of(function).address)

    def _vgpu_detach(self, address: str) -> None:
        device = self.device_dir(address)
        for mdev in sysfs.mdevs(self._root):
            if mdev.parent == address:
                self._delete_mdev(mdev)
        _remove_tree(device / "mdev_supported_types")
        _unlink(self._root / "sys" / "class" / "mdev_bus" / address)
        function = sysfs.read_function(self._root, address)
        current = sysfs.current_vgpu_type(self._root, address)
        if function is not None and current and function.iommu_group is not None:
            _unlink(self._vfio_dev(function.iommu_group))
        _remove_tree(device / "nvidia")

    def _vgpus_exist(self) -> bool:
        if sysfs.mdevs(self._root):
            return True
        return any(sysfs.current_vgpu_type(self._root, f.address) for f in sysfs.scan(self._root))

    def _vf_in_use(self, address: str) -> bool:
        if any(m.parent == address for m in sysfs.mdevs(self._root)):
            return True
        function = sysfs.read_function(self._root, address)
        return bool(sysfs.current_vgpu_type(self._root, address)) or (
            function is not None and sysfs.is_vfio_driver(function.driver)
        )

    def _usage(self, pf: sysfs.Function) -> tuple[dict[int, int], set[str]]:
        """vGPUs on a GPU by type id, and its parent functions that hold one."""
        parents = {pf.address, *pf.virtfns}
        counts: dict[int, int] = {}
        busy: set[str] = set()
        for mdev in sysfs.mdevs(self._root):
            if mdev.parent in parents:
                type_id = int(mdev.type_id.removeprefix("nvidia-"))
                counts[type_id] = counts.get(type_id, 0) + 1
                busy.add(mdev.parent)
        for vf in pf.virtfns:
            current = sysfs.current_vgpu_type(self._root, vf)
            if current:
                counts[current] = counts.get(current, 0) + 1
                busy.add(vf)
        return counts, busy

    def available(
        self,
        pf: sysfs.Function,
        parent: str,
        vgpu: models.VgpuType,
        usage: tuple[dict[int, int], set[str]] | None = None,
    ) -> int:
        """Instances of a type one parent function can still take (one type per GPU at a time,
        `max_instances` per GPU, one vGPU per VF)."""
        counts, busy = usage if usage is not None else self._usage(pf)
        if any(t != vgpu.type_id for t in counts):
            return 0
        left = vgpu.max_instances - counts.get(vgpu.type_id, 0)
        if parent != pf.address:  # a VF takes a single vGPU
            return 0 if parent in busy else min(left, 1)
        return max(left, 0)

    def _refresh(self, pf_address: str) -> None:
        """Rewrite the availability files of a GPU and its VFs after a change."""
        pf = sysfs.read_function(self._root, pf_address)
        if pf is None:
            return
        facts = self._model(pf)
        if facts is None:
            return
        usage = self._usage(pf)
        for parent in (pf.address, *pf.virtfns):
            device = self.device_dir(parent)
            types_dir = device / "mdev_supported_types"
            for vgpu in facts.vgpu_types:
                target = types_dir / f"nvidia-{vgpu.type_id}" / "available_instances"
                if target.parent.is_dir():
                    _write(target, f"{self.available(pf, parent, vgpu, usage)}\n")
            creatable = device / "nvidia" / "creatable_vgpu_types"
            if creatable.exists():
                lines = [CREATABLE_HEADER]
                active = sysfs.current_vgpu_type(self._root, parent)
                for v in facts.vgpu_types:
                    # A configured VF lists only its own type (one of the driver's behaviours).
                    if v.type_id == active if active else self.available(pf, parent, v, usage):
                        lines.append(f"{v.type_id:<6}: {v.name}")
                _write(creatable, "\n".join(lines) + "\n")

    def _create_mdev(self, path: Path, value: str, address: str, type_id: str, text: str) -> None:
        function = sysfs.read_function(self._root, address)
        type_dir = self.device_dir(address) / "mdev_supported_types" / type_id
        if function is None or not type_dir.is_dir():
            raise refused(path, value, errno.ENOENT)
        if not _UUID.match(text):
            raise refused(path, value, errno.EINVAL)
        text = str(uuid_mod.UUID(text))
        if (sysfs.mdev_devices_dir(self._root) / text).exists():
            raise refused(path, value, errno.EEXIST)
        facts = self._model(function)
        vgpu = facts.vgpu_type_by_id(int(type_id.removeprefix("nvidia-"))) if facts else None
        if vgpu is None or self.available(self._pf_of(function), address, vgpu) < 1:
            raise refused(path, value, errno.EUSERS)
        device = self.device_dir(address) / text
        _write(device / "remove", "")
        _link(device / "mdev_type", type_dir)
        _link(type_dir / "devices" / text, device)
        _link(sysfs.mdev_devices_dir(self._root) / text, device)
        driver_dir = self._root / "sys" / "bus" / "mdev" / "drivers" / MDEV_DRIVER
        driver_dir.mkdir(parents=True, exist_ok=True)
        _link(device / "driver", driver_dir)
        group = self._new_group()
        _link(self._group_dir(group) / "devices" / text, device)
        _link(device / "iommu_group", self._group_dir(group))
        _write(self._vfio_dev(group), "")
        self._refresh(self._pf_of(function).address)

    def _remove_mdev(self, path: Path, value: str, uuid: str) -> None:
        for mdev in sysfs.mdevs(self._root):
            if mdev.uuid == uuid:
                parent = sysfs.read_function(self._root, mdev.parent)
                self._delete_mdev(mdev)
                if parent is not None:
                    self._refresh(self._pf_of(parent).address)
                return
        raise refused(path, value, errno.ENOENT)  # no such mdev: no such file

    def _delete_mdev(self, mdev: sysfs.Mdev) -> None:
        device = self.device_dir(mdev.parent) / mdev.uuid
        type_dir = self.device_dir(mdev.parent) / "mdev_supported_types" / mdev.type_id
        _unlink(type_dir / "devices" / mdev.uuid)
        _unlink(sysfs.mdev_devices_dir(self._root) / mdev.uuid)
        if mdev.iommu_group is not None:
            _remove_tree(self._group_dir(mdev.iommu_group))
            _unlink(self._vfio_dev(mdev.iommu_group))
        _remove_tree(device)

    def _set_vgpu_type(self, path: Path, value: str, address: str, text: str) -> None:
        function = sysfs.read_function(self._root, address)
        current = sysfs.current_vgpu_type(self._root, address)
        if function is None or current is None:
            raise refused(path, value, errno.ENOENT)
        try:
            wanted = int(text, 0)
        except ValueError:
            raise refused(path, value, errno.EINVAL) from None
        if wanted == current:
            return
        group = function.iommu_group
        if wanted == 0:
            _write(self.device_dir(address) / "nvidia" / "current_vgpu_type", "0\n")
            if group is not None:
                _unlink(self._vfio_dev(group))
        else:
            if current:
                raise refused(path, value, errno.EBUSY)
            creatable = sysfs.creatable_vgpu_types(self._root, address) or []
            if wanted not in {t.type_id for t in creatable}:
                raise refused(path, value, errno.EINVAL)
            _write(self.device_dir(address) / "nvidia" / "current_vgpu_type", f"{wanted}\n")
            if group is not None:
                _write(self._vfio_dev(group), "")
        self._refresh(self._pf_of(function).address)

    # -- the NVIDIA driver, as the driver containers load it ------------------------------

    def load_nvidia(
        self,
        *,
        version: str = DEFAULT_DRIVER_VERSION,
        vgpu: bool = False,
        enable_vfs: bool = False,
        signed: bool = True,
    ) -> None:
        """Load the NVIDIA driver `version` (with `vgpu`, the vGPU host driver; `enable_vfs`
        then enables every SR-IOV GPU's VFs, as the vGPU manager's `sriov-manage -e ALL` does).
        `/proc/driver/nvidia/version` names the version while the module is loaded."""
        self.load(NVIDIA_MODULE, signed=signed, version=version)
        if vgpu:
            self.load(VGPU_MODULE, signed=signed)
        if vgpu and enable_vfs:
            for function in sysfs.nvidia_gpus(sysfs.scan(self._root)):
                if (
                    function.driver == NVIDIA_MODULE
                    and function.sriov_total_vfs
                    and not function.sriov_num_vfs
                ):
                    self.enable_vfs(function.address, function.sriov_total_vfs)

    def unload_nvidia(self) -> None:
        """Unload the NVIDIA driver, its other modules first (KernelError EBUSY while vGPUs
        exist or something holds a module)."""
        for name in NVIDIA_UNLOAD_ORDER:
            if self.loaded(name):
                self.unload(name)
        if self.loaded(NVIDIA_MODULE):
            self.unload(NVIDIA_MODULE)

    def nvidia_version(self) -> str | None:
        """The loaded NVIDIA driver's version, or None when the driver is not loaded."""
        return nvidia_version(self._root)

    def vfio_addresses(self) -> list[str]:
        """The devices on a vfio driver."""
        return [f.address for f in sysfs.scan(self._root) if sysfs.is_vfio_driver(f.driver)]
