"""The simulated hardware of a demo node, written into its host filesystem where Linux keeps it.

Node Feature Discovery reads hardware from files, so the demo writes each node's facts as a real
host would have them: PCI functions under `/sys/bus/pci/devices/<domain:bus:dev.fn>/` (`vendor`,
`device`, `class`, `subsystem_vendor`, `subsystem_device`; the standard layout, each a symlink to
`/sys/devices/pci<domain>:<bus>/...`), `/etc/os-release`, the kernel release in
`/proc/sys/kernel/osrelease` and its config in `/boot/config-<release>`, `/proc/cpuinfo` and
`/proc/modules`. Nothing here writes node labels: NFD derives them (`simhost.nfd`).
A Secure Boot host has UEFI's `SecureBoot` variable set; a pool with a preinstalled driver boots
with it loaded (`simhost.driver.install_host_driver`).
GPUs with display outputs also have their audio function (`.1`), and the VM-facing layer (IOMMU
groups, drivers, SR-IOV, `modules.alias`) comes from `simhost.pci`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpu_operator.agents.pci import models as vm_models
from gpu_operator.nvml import mock
from simhost import driver
from simhost import pci as pci_host

NVIDIA = 0x10DE
CLASS_ETHERNET = 0x020000
CLASS_VGA = 0x030000
CLASS_BRIDGE_OTHER = 0x068000


class HostFacts(Protocol):
    """What a node's host files are written from (a pool of the demo's fleet is one)."""

    @property
    def machine(self) -> str | None: ...  # the machine preset, None for a CPU-only node
    @property
    def os(self) -> str: ...  # `ID` in /etc/os-release: ubuntu, rhel, ...
    @property
    def os_version(self) -> str: ...
    @property
    def kernel(self) -> str: ...  # `uname -r`
    @property
    def secure_boot(self) -> bool: ...
    @property
    def host_driver(self) -> str | None: ...  # a driver the node image brings, loaded at boot


@dataclass(frozen=True)
class PciFunction:
    """One PCI function as sysfs shows it (`address` is `0000:07:00.0`)."""

    address: str
    vendor: int
    device: int
    pci_class: int  # 24 bits: class, subclass, programming interface
    subsystem_vendor: int
    subsystem_device: int


@dataclass(frozen=True)
class Cpu:
    """What `/proc/cpuinfo` says about the node's processors."""

    vendor_id: str  # GenuineIntel / AuthenticAMD
    family: int
    model: int
    model_name: str
    flags: tuple[str, ...]
    cores: int
    threads_per_core: int


_INTEL_COMMON = ("fpu", "ht", "sse4_1", "sse4_2", "avx", "avx2", "fma", "aes", "adx", "sha_ni")
_AVX512 = ("avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512_vnni")
CPUS = {
    "epyc-7742": Cpu("AuthenticAMD", 23, 49, "AMD EPYC 7742 64-Core Processor",
                     ("fpu", "ht", "sse4_1", "sse4_2", "sse4a", "avx", "avx2", "fma", "aes",
                      "adx", "sha_ni"), 64, 2),
    "xeon-8480c": Cpu("GenuineIntel", 6, 143, "Intel(R) Xeon(R) Platinum 8480C",
                      (*_INTEL_COMMON, *_AVX512, "avx512_bf16", "amx_bf16", "amx_tile",
                       "amx_int8"), 56, 2),
    "xeon-6338": Cpu("GenuineIntel", 6, 106, "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz",
                     (*_INTEL_COMMON, *_AVX512), 32, 2),
}  # fmt: skip

# The host CPU of each machine preset (the DGX A100 has AMD EPYC processors, later DGX and HGX
# systems Intel Xeon); PCIe servers and CPU-only nodes get a common Xeon.
MACHINE_CPUS = {
    "dgx-a100": "epyc-7742",
    "dgx-a100-80gb": "epyc-7742",
    "dgx-a100-mig-single": "epyc-7742",
    "dgx-a100-mig-mixed": "epyc-7742",
    "dgx-h100": "xeon-8480c",
    "dgx-h200": "xeon-8480c",
    "hgx-b200": "xeon-8480c",
}
DEFAULT_CPU = "xeon-6338"

OS_RELEASE = {
    "ubuntu": ("Ubuntu", "debian", "Ubuntu {v}{patch} LTS"),
    "rhel": ("Red Hat Enterprise Linux", "fedora", "Red Hat Enterprise Linux {v}"),
    "rocky": ("Rocky Linux", "rhel centos fedora", "Rocky Linux {v}"),
}
_UBUNTU_PATCH = {"22.04": ".5", "24.04": ".1"}
# Kernel options NFD's kernel source reports by default (kernel-config.<option> labels).
KERNEL_CONFIG = (
    "CONFIG_NO_HZ=y",
    "CONFIG_NO_HZ_IDLE=y",
    "CONFIG_PREEMPT_VOLUNTARY=y",
    "CONFIG_X86=y",
)
MODULES = ("nvme", "mlx5_core", "ipmi_msghandler", "i2c_core", "overlay", "br_netfilter")


def _address(nvml_bus_id: str) -> str:
    """NVML's `00000000:07:00.0` as sysfs spells it: `0000:07:00.0`."""
    domain, rest = nvml_bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def pci_functions(machine: mock.MockMachine | None) -> list[PciFunction]:
    """Every PCI function of a node: its GPUs and NVSwitches, plus the on-board NIC and the
    BMC's VGA controller every server has."""
    functions = [
        PciFunction("0000:02:00.0", 0x8086, 0x1521, CLASS_ETHERNET, 0x8086, 0x0001),  # I350
        PciFunction("0000:03:00.0", 0x1A03, 0x2000, CLASS_VGA, 0x1A03, 0x2000),  # ASPEED BMC
    ]
    if machine is None:
        return functions
    for gpu in machine.gpus:
        device = gpu.model.pci_device_id >> 16
        functions.append(
            PciFunction(_address(gpu.bus_id), NVIDIA, device, gpu.pci_class << 8, NVIDIA,
                        0x1000 + gpu.index)
        )  # fmt: skip
        audio = vm_models.AUDIO_FUNCTIONS.get(gpu.model.key)
        if audio is not None:  # the graphics audio function of a GPU with display outputs
            address = _address(gpu.bus_id).rsplit(".", 1)[0] + ".1"
            functions.append(PciFunction(address, NVIDIA, audio, vm_models.CLASS_AUDIO, NVIDIA,
                                         0x1000 + gpu.index))  # fmt: skip
    # A multi-node NVLink tray (NVL72) reaches its NVSwitches in the rack's switch trays: none
    # sit on its own PCI bus.
    if machine.nvswitch and machine.spec.fabric is None:
        hopper_or_later = machine.gpus[0].model.key not in ("A100-SXM4-40GB", "A100-SXM4-80GB")
        device, count = (0x22A3, 4) if hopper_or_later else (0x1AF1, 6)
        for index in range(count):
            functions.append(
                PciFunction(f"0000:{0xC4 + index:02x}:00.0", NVIDIA, device, CLASS_BRIDGE_OTHER,
                            NVIDIA, 0x1000)
            )  # fmt: skip
    return functions


def cpu_of(pool: HostFacts) -> Cpu:
    return CPUS[MACHINE_CPUS.get(pool.machine or "", DEFAULT_CPU)]


def os_release(pool: HostFacts) -> str:
    """The `/etc/os-release` of the pool's OS."""
    name, like, pretty = OS_RELEASE.get(pool.os, (pool.os.capitalize(), "", "{v}"))
    version = pool.os_version
    patch = _UBUNTU_PATCH.get(version, "") if pool.os == "ubuntu" else ""
    lines = [
        f'NAME="{name}"',
        f'VERSION="{version}{patch}"',
        f"ID={pool.os}",
        f'ID_LIKE="{like}"' if like else "",
        f'PRETTY_NAME="{pretty.format(v=version, patch=patch)}"',
        f'VERSION_ID="{version}"',
    ]
    return "\n".join(line for line in lines if line) + "\n"


def cpuinfo(cpu: Cpu) -> str:
    """`/proc/cpuinfo` for every logical CPU (the fields NFD's cpu source relies on)."""
    blocks = []
    threads = cpu.cores * cpu.threads_per_core
    for index in range(threads):
        blocks.append(
            "\n".join(
                (
                    f"processor\t: {index}",
                    f"vendor_id\t: {cpu.vendor_id}",
                    f"cpu family\t: {cpu.family}",
                    f"model\t\t: {cpu.model}",
                    f"model name\t: {cpu.model_name}",
                    f"siblings\t: {threads}",
                    f"core id\t\t: {index % cpu.cores}",
                    f"cpu cores\t: {cpu.cores}",
                    f"flags\t\t: {' '.join(cpu.flags)}",
                )
            )
        )
    return "\n\n".join(blocks) + "\n"


def write(
    root: Path, pool: HostFacts, machine: mock.MockMachine | None, *, iommu: bool = True
) -> None:
    """Write a node's hardware and OS files under its root directory (its `/`); `iommu=False`
    is a host booted without an IOMMU (no groups: no VFIO passthrough)."""
    _file(root / "etc" / "os-release", os_release(pool))
    _file(root / "proc" / "sys" / "kernel" / "osrelease", pool.kernel + "\n")
    _file(root / "proc" / "cpuinfo", cpuinfo(cpu_of(pool)))
    _file(
        root / "proc" / "modules",
        "".join(f"{m} 16384 0 - Live 0x0000000000000000\n" for m in MODULES),
    )
    _file(root / "proc" / "swaps", "Filename\tType\tSize\tUsed\tPriority\n")
    _file(root / "boot" / f"config-{pool.kernel}", "\n".join(KERNEL_CONFIG) + "\n")
    for function in pci_functions(machine):
        domain, bus, _ = function.address.split(":")
        device_dir = root / "sys" / "devices" / f"pci{domain}:{bus}" / function.address
        _file(device_dir / "vendor", f"0x{function.vendor:04x}\n")
        _file(device_dir / "device", f"0x{function.device:04x}\n")
        _file(device_dir / "class", f"0x{function.pci_class:06x}\n")
        _file(device_dir / "subsystem_vendor", f"0x{function.subsystem_vendor:04x}\n")
        _file(device_dir / "subsystem_device", f"0x{function.subsystem_device:04x}\n")
        link = root / "sys" / "bus" / "pci" / "devices" / function.address
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(Path("../../../devices") / f"pci{domain}:{bus}" / function.address)
    # What VM workloads need on top: IOMMU groups, drivers, SR-IOV, modules (agents.pci).
    pci_host.prepare(root, iommu=iommu)
    if pool.secure_boot:
        # The EFI variable: 4 bytes of attributes (non-volatile, boot and runtime access), then
        # the value; the kernel then enforces module signatures (lockdown "integrity").
        variable = root / pci_host.SECURE_BOOT_VARIABLE
        variable.parent.mkdir(parents=True, exist_ok=True)
        variable.write_bytes(b"\x06\x00\x00\x00\x01")
        _file(root / "sys" / "kernel" / "security" / "lockdown",
              "none [integrity] confidentiality\n")  # fmt: skip
    if pool.host_driver is not None:
        driver.install_host_driver(root, pool.host_driver)


def _file(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
