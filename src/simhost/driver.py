"""The NVIDIA driver on the simulated host: the driver container (`nvidia-driver-ctr` of the
driver DaemonSets, from a ClusterPolicy or an NVIDIADriver, precompiled or not), the driver a
node image brings itself (a preinstalled driver, as on AKS without `--gpu-driver none`), and
what the mock NVML reads to know whether a driver is loaded.

The driver container is NVIDIA's image in a real cluster; here it acts on the node's simulated
kernel (`simhost.pci`) and prints what the image's `nvidia-driver init`
script prints, step by step: it unloads a driver left loaded (and fails when something holds
it), builds or installs the modules for the node's kernel (`uname -r`), loads `nvidia`,
`nvidia-uvm`, `nvidia-modeset` (and `nvidia-peermem` with GPUDirect RDMA and a Mellanox NIC),
shares its root at `/run/nvidia/driver`, then waits; on SIGTERM it unloads what it loaded when
nothing holds it. Its failures are upstream's: a precompiled image built for another kernel
(apt finds no modules for `uname -r`), an unsigned module on a Secure Boot host (the kernel's
EKEYREJECTED), a driver the host already runs. Each one exits non-zero (CrashLoopBackOff) and
leaves its lines as the container's termination message, so `kubectl describe pod` shows them.

Which images carry signed modules: precompiled images (their modules come from Canonical's
signed `linux-modules-nvidia-<branch>-server-<kernel>` packages) and images tagged `-signed`
(upstream's old `<branch>-signed-<os>` images). Images that compile modules at start (the
default `<version>-<os>` tag) load unsigned modules, which a Secure Boot host refuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import shutil
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpu_operator.agents.pci import kernel as kernel_mod
from gpu_operator.agents.pci import sysfs
from gpu_operator.nvml import driver_branches, mock
from gpu_operator.operands import driver as driver_operand
from kubesim import PodContext
from kubesim.controllers.volumes import PathNotMounted
from simhost import pci as simulated

DRIVER_CTR = driver_operand.DRIVER_CTR
RUN_DIR = "/run/nvidia"
READY_MARKER = ".driver-ctr-ready"  # in /run/nvidia/validations (the startup probe's touch)
PID_FILE = "nvidia-driver.pid"
STATE_FILE = "nvidia-driver.state"
ARCH = "x86_64"
MELLANOX = 0x15B3
# Seconds each step takes before time scaling (a build dominates; precompiled images skip it).
DELAYS = {"extract": 0.3, "build": 2.0, "install": 0.3, "load": 0.4}
# A released driver of each branch, for precompiled images (tagged by branch only, they install
# the newest driver of the branch built for the kernel).
LATEST_IN_BRANCH = {
    535: "535.183.01",
    550: "550.127.05",
    560: "560.35.03",
    565: "565.57.01",
    570: "570.195.03",
    575: "575.57.08",
    580: "580.95.05",
    590: "590.48.01",
    595: "595.91.07",
}
# The driver's modules, in the order the container loads them (`modprobe nvidia-peermem` only
# with GPUDirect RDMA).
MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset")
PEERMEM = "nvidia-peermem"
# What the driver root (and a host with a preinstalled driver) holds: programs and libraries.
PROGRAMS = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
            "nvidia-cuda-mps-server")  # fmt: skip
LIBRARIES = ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so", "libnvidia-nvvm.so",
             "libnvidia-cfg.so", "libcudadebugger.so", "libnvidia-opencl.so",
             "libnvidia-gpucomp.so")  # fmt: skip
LIB_DIR = f"usr/lib/{ARCH}-linux-gnu"
IN_USE = "Could not unload NVIDIA driver kernel modules, driver is in use"
# apt-get's exit status when it cannot install (the script runs with `set -e`).
EXIT_APT = 100
# The driver script ignores a failed unload on SIGTERM and keeps waiting until the kubelet kills it.
EXIT_KILLED = 137
_OS = r"(?P<os>[a-z]+\d+(\.\d+)?)"
_PRECOMPILED = re.compile(r"^(?P<branch>\d{3})-(?P<kernel>\d+\.\d+\.\d+-.+)-" + _OS + "$")
_VERSIONED = re.compile(r"^(?P<version>\d{3}(\.\d+){1,2})(?P<signed>-signed)?-" + _OS + "$")
_FULL_VERSION_PRECOMPILED = re.compile(r"^\d{3}\.\d+(\.\d+)?-\d+\.\d+\.\d+-")
_SIGNED_BRANCH = re.compile(r"^(?P<branch>\d{3})-signed-" + _OS + "$")


class ImageError(ValueError):
    """A driver image whose tag names no driver version."""


@dataclass(frozen=True)
class DriverImage:
    """What a driver image's tag says: version (or branch), kernel for precompiled images, OS."""

    image: str
    version: str
    os_tag: str
    kernel: str | None = None  # precompiled: the only kernel the image has modules for
    signed: bool = False

    @property
    def precompiled(self) -> bool:
        return self.kernel is not None

    @property
    def branch(self) -> int:
        return driver_branches.branch(self.version)


def _branch_version(branch: int) -> str:
    return LATEST_IN_BRANCH.get(branch, f"{branch}.0")


def parse_image(image: str, env: Mapping[str, str] | None = None) -> DriverImage:
    """The driver of an image: `<version>-<os>` (compiled at start), `<branch>-<kernel>-<os>`
    (precompiled, signed) or `<branch>-signed-<os>`; a digest-pinned image takes the version
    from the container's DRIVER_VERSION or DRIVER_BRANCH environment."""
    env = env or {}
    name, _, digest = image.partition("@")
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else ""
    if digest or not tag:
        version = env.get("DRIVER_VERSION") or ""
        branch = env.get("DRIVER_BRANCH") or ""
        if not version and branch.isdigit():
            version = _branch_version(int(branch))
        if not version:
            raise ImageError(
                f"image {image}: no tag to read the driver version from, and no DRIVER_VERSION "
                "or DRIVER_BRANCH in the container's environment"
            )
        driver_branches.branch(version)
        return DriverImage(image, version, env.get("OS_TAG", ""))
    found = _VERSIONED.match(tag)
    if found:
        return DriverImage(image, found["version"], found["os"], signed=bool(found["signed"]))
    found = _SIGNED_BRANCH.match(tag)
    if found:
        return DriverImage(image, _branch_version(int(found["branch"])), found["os"], signed=True)
    found = _PRECOMPILED.match(tag)
    if found:
        version = _branch_version(int(found["branch"]))
        return DriverImage(image, version, found["os"], kernel=found["kernel"], signed=True)
    if _FULL_VERSION_PRECOMPILED.match(tag):
        raise ImageError(
            f"image {image}: precompiled images are tagged by driver branch, not by a full "
            "version: set driver.version to a branch such as 580"
        )
    raise ImageError(
        f"image {image}: tag {tag!r} names no driver (expected <version>-<os> such as "
        "580.95.05-ubuntu22.04, or <branch>-<kernel>-<os> such as "
        "580-6.8.0-52-generic-ubuntu22.04)"
    )


# ----- the host side: files, the probe the mock NVML reads, a preinstalled driver -------------


def probe(root: Path) -> Callable[[], str | None]:
    """What a node's mock NVML asks: the loaded driver's version from `/proc/driver/nvidia`."""
    return lambda: simulated.nvidia_version(root)


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def write_driver_files(root: Path, version: str) -> None:
    """The driver's user-space files under `root`: its programs in `usr/bin` and its libraries
    (`libcuda.so.<version>` with the `.so.1` links the loader uses) in the multiarch directory."""
    for program in PROGRAMS:
        _executable(
            root / "usr" / "bin" / program,
            f"#!/bin/sh\n# NVIDIA {program} {version} (simulated host)\n",
        )
    lib_dir = root / LIB_DIR
    lib_dir.mkdir(parents=True, exist_ok=True)
    for library in LIBRARIES:
        (lib_dir / f"{library}.{version}").write_text(f"NVIDIA {library} {version}\n")
        link = lib_dir / f"{library}.1"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(f"{library}.{version}")


def install_host_driver(root: Path, version: str) -> None:
    """A node image with the NVIDIA driver built in: its files on the host, its modules loaded
    at boot, and nvidia-persistenced (started at boot) holding the driver open."""
    write_driver_files(root, version)
    kernel = simulated.SimulatedKernel(root)
    kernel.load_nvidia(version=version)
    for module in ("nvidia_uvm", "nvidia_modeset"):
        kernel.load(module, version=version)
    kernel.hold(simulated.NVIDIA_MODULE)
    pid = root / "run" / "nvidia-persistenced" / "nvidia-persistenced.pid"
    pid.parent.mkdir(parents=True, exist_ok=True)
    pid.write_text("1042\n")


# ----- the driver container -------------------------------------------------------------------


@dataclass
class Host:
    """What the demo gives a driver container besides its pod: the node's mock GPUs (processes
    on them hold the driver) and how long a step takes."""

    machine: mock.MockMachine | None
    delay: Callable[[float, str], Awaitable[None]]


def handles(ctx: PodContext) -> bool:
    """The driver container of a driver pod (ClusterPolicy's or an NVIDIADriver's)."""
    return ctx.container_name == DRIVER_CTR and is_driver_pod(ctx.labels)


def is_driver_pod(labels: Mapping[str, str]) -> bool:
    return labels.get("app.kubernetes.io/component") == driver_operand.COMPONENT or labels.get(
        "app", ""
    ).startswith(driver_operand.DS_NAME)


class _Failed(Exception):
    """The script stops with this exit status (its last lines are the termination message)."""

    def __init__(self, code: int, lines: Sequence[str]) -> None:
        super().__init__(code)
        self.code = code
        self.lines = list(lines)


class _Stopped(Exception):
    """SIGTERM arrived while the script was still installing."""


class DriverContainer:
    """`nvidia-driver init` on the simulated host (see the module doc)."""

    def __init__(self, ctx: PodContext, host: Host) -> None:
        self.ctx = ctx
        self.host = host
        self.root = ctx.node_root
        self.kernel = simulated.SimulatedKernel(self.root)
        self.release = sysfs.kernel_release(self.root) or "unknown"

    # -- output --------------------------------------------------------------------------------

    def out(self, *lines: str) -> None:
        for line in lines:
            self.ctx.log(line)

    def err(self, *lines: str) -> None:
        for line in lines:
            self.ctx.log(line, "stderr")

    async def step(self, what: str) -> None:
        """A step's time; SIGTERM meanwhile ends the script (its `trap ... exit 1`)."""
        waiting = asyncio.ensure_future(self.host.delay(DELAYS[what], what))
        stopping = asyncio.ensure_future(self.ctx.stopping.wait())
        try:
            await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiting, stopping):
                task.cancel()
            await asyncio.gather(waiting, stopping, return_exceptions=True)
        if self.ctx.stopping.is_set():
            raise _Stopped

    # -- paths ---------------------------------------------------------------------------------

    def run_dir(self) -> Path:
        try:
            return self.ctx.path(RUN_DIR, write=True)
        except PathNotMounted as err:
            message = f"{RUN_DIR} is not mounted into the driver container: {err}"
            raise _Failed(1, [message]) from None

    # -- the script ----------------------------------------------------------------------------

    async def run(self) -> int:
        try:
            image = parse_image(self.ctx.image, self.ctx.env)
        except (ImageError, driver_branches.DriverVersionError) as err:
            self.err(str(err))
            self.ctx.write_termination_message(str(err) + "\n")
            return 1
        run_dir = None
        try:
            run_dir = self.run_dir()
            await self.install(image, run_dir)
        except _Failed as failed:
            self.err(*failed.lines)
            self.ctx.write_termination_message("".join(line + "\n" for line in failed.lines))
            self.shutdown(run_dir)  # the script's EXIT trap
            return failed.code
        except _Stopped:
            self.out("Caught signal")
            self.shutdown(run_dir)
            return 1
        self.out("Done, now waiting for signal")
        self.ready(run_dir, image)
        try:
            await self.ctx.stopping.wait()
        finally:
            self.out("Caught signal")
            self.ctx.set_ready(False)
            with contextlib.suppress(OSError):
                (run_dir / "validations" / READY_MARKER).unlink()  # its preStop hook
        return 0 if self.shutdown(run_dir) else EXIT_KILLED

    async def install(self, image: DriverImage, run_dir: Path) -> None:
        version = image.version
        if not image.precompiled:
            self.out(
                f"DRIVER_ARCH is {ARCH}",
                f"Creating directory NVIDIA-Linux-{ARCH}-{version}",
                "Verifying archive integrity... OK",
                f"Uncompressing NVIDIA Accelerated Graphics Driver for Linux-{ARCH} {version}",
            )
            await self.step("extract")
        self.out("", "========== NVIDIA Software Installer ==========", "")
        what = f"branch {image.branch}" if image.precompiled else f"version {version}"
        self.out(f"Starting installation of NVIDIA driver {what} for Linux kernel version "
                 f"{self.release}", "")  # fmt: skip
        (run_dir / PID_FILE).write_text(f"{self.pid()}\n")
        digest = self.ctx.env.get("DRIVER_CONFIG_DIGEST", "")
        if digest and self.kernel.loaded("nvidia") and self.state(run_dir) == digest:
            # The newer driver script's fast path: the loaded driver already has this config
            # (the driver manager left it loaded for that reason), so it is kept as it is.
            self.out("NVIDIA driver is already loaded with the desired configuration, skipping "
                     "the kernel module reload")  # fmt: skip
        else:
            self.unload_previous()
            self.out("Unmounting NVIDIA driver rootfs...")
            self.unmount(run_dir)
            if image.precompiled:
                await self.install_packages(image)
            else:
                await self.build(image)
            await self.load(image)
        self.out("Mounting NVIDIA driver rootfs...")
        self.mount(run_dir, image)

    def unload_previous(self) -> None:
        """`_unload_driver` before installing: a loaded driver goes, unless something holds it."""
        self.out(
            "Stopping NVIDIA persistence daemon...", "Unloading NVIDIA driver kernel modules..."
        )
        if not self.kernel.loaded("nvidia"):
            return
        if self.in_use():
            raise _Failed(1, [*self.lsmod(), IN_USE])
        try:
            self.kernel.unload_nvidia()
        except kernel_mod.KernelError as err:
            raise _Failed(1, [str(err)]) from None

    async def install_packages(self, image: DriverImage) -> None:
        """A precompiled image installs the modules packaged for `uname -r`: only the kernel it
        was built for has them."""
        assert image.kernel is not None
        kind = "Open" if self.open_modules(image) else "Closed"
        self.out(f"Installing {kind} NVIDIA driver kernel modules...")
        self.out("Reading package lists...", "Building dependency tree...",
                 "Reading state information...")  # fmt: skip
        if image.kernel != self.release:
            branch = image.branch
            packages = [
                f"linux-objects-nvidia-{branch}-server-{self.release}",
                f"linux-signatures-nvidia-{self.release}",
                f"linux-modules-nvidia-{branch}-server-{self.release}",
            ]
            lines = []
            for package in packages:
                # apt treats a name with dots as a pattern too, and says so.
                lines += [
                    f"E: Unable to locate package {package}",
                    f"E: Couldn't find any package by glob '{package}'",
                    f"E: Couldn't find any package by regex '{package}'",
                ]
            raise _Failed(EXIT_APT, lines)
        await self.step("install")
        self.out(f"Setting up linux-modules-nvidia-{image.branch}-server-{self.release} ...")

    async def build(self, image: DriverImage) -> None:
        """The default image compiles the modules against the node's kernel headers."""
        release = self.release
        self.out(
            "Checking NVIDIA driver packages...",
            "Updating the package cache...",
            "Resolving Linux kernel version...",
            f"Proceeding with Linux kernel version {release}",
            "Installing Linux kernel headers...",
            "Installing Linux kernel module files...",
            "Generating Linux kernel version string...",
            "Compiling NVIDIA driver kernel modules...",
        )
        await self.step("build")
        self.out(
            "Relinking NVIDIA driver kernel modules...",
            f"Building NVIDIA driver package nvidia-modules-{release.rsplit('-', 1)[0]}...",
            "Installing NVIDIA driver kernel modules...",
        )

    async def load(self, image: DriverImage) -> None:
        self.out("Parsing kernel module parameters...",
                 "Loading ipmi and i2c_core kernel modules...",
                 "Loading NVIDIA driver kernel modules...")  # fmt: skip
        await self.step("load")
        modules = list(MODULES)
        if self.rdma():
            modules.append(PEERMEM)
        for module in modules:
            if module == PEERMEM:
                self.out("Loading NVIDIA Peer Memory kernel module...")
            self.err(f"+ modprobe {module}")
            try:
                self.kernel.load(module, signed=image.signed, version=image.version)
            except kernel_mod.KernelError as err:
                raise _Failed(1, [str(err)]) from None
        self.err("+ set +o xtrace -o nounset")
        self.out("Starting NVIDIA persistence daemon...")

    def rdma(self) -> bool:
        """GPUDirect RDMA asked for and a Mellanox NIC present (the script's check, with its
        messages)."""
        if (self.ctx.env.get("GPU_DIRECT_RDMA_ENABLED") or "").lower() != "true":
            return False
        for function in sysfs.scan(self.root):
            if function.vendor == MELLANOX:
                self.out(f"Mellanox device found at {function.address}")
                return True
        self.out("No Mellanox devices were found...")
        return False

    def open_modules(self, image: DriverImage) -> bool:
        env = self.ctx.env
        kind = (env.get("KERNEL_MODULE_TYPE") or "auto").lower()
        if kind == "auto":
            # Upstream's auto choice: open modules from the 560 branch on.
            return (env.get("OPEN_KERNEL_MODULES_ENABLED") == "true") or image.branch >= 560
        return kind == "open"

    # -- ready and stop ------------------------------------------------------------------------

    def mount(self, run_dir: Path, image: DriverImage) -> None:
        """`mount --rbind / /run/nvidia/driver`: the container's root, seen from the host."""
        root = run_dir / "driver"
        write_driver_files(root, image.version)
        os_release = self.root / "etc" / "os-release"
        (root / "etc").mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            (root / "etc" / "os-release").write_text(os_release.read_text())
        modules = root / "lib" / "modules" / self.release / "kernel" / "drivers" / "video"
        modules.mkdir(parents=True, exist_ok=True)
        for module in (*MODULES, PEERMEM, "nvidia-drm"):
            (modules / f"{module}.ko").write_text(f"{module} {image.version}\n")
        (root / "usr" / "src" / f"nvidia-{image.version}").mkdir(parents=True, exist_ok=True)
        firmware = root / "lib" / "firmware" / "nvidia" / image.version
        firmware.mkdir(parents=True, exist_ok=True)
        for blob in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
            (firmware / blob).write_text(f"GSP firmware {image.version}\n")

    def unmount(self, run_dir: Path | None) -> None:
        """`umount -l -R /run/nvidia/driver`: the directory stays, empty."""
        if run_dir is None:
            return
        root = run_dir / "driver"
        if root.is_dir():
            for child in root.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()

    def ready(self, run_dir: Path, image: DriverImage) -> None:
        """The startup probe passes (`nvidia-smi && touch .driver-ctr-ready`) and the digest of
        this configuration is recorded for the driver manager."""
        digest = self.ctx.env.get("DRIVER_CONFIG_DIGEST")
        if digest:
            (run_dir / STATE_FILE).write_text(digest)
        marker = run_dir / "validations" / READY_MARKER
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("")
        self.ctx.set_ready(True)

    def shutdown(self, run_dir: Path | None) -> bool:
        """`_shutdown` (on SIGTERM, and on exit after a failure): unload the driver unless
        something holds it, then unmount the root and remove the pid file. False when the
        driver had to stay loaded (then the root stays mounted too)."""
        self.out(
            "Stopping NVIDIA persistence daemon...", "Unloading NVIDIA driver kernel modules..."
        )
        if self.kernel.loaded("nvidia"):
            if self.in_use():
                self.err(*self.lsmod(), IN_USE)
                return False
            try:
                self.kernel.unload_nvidia()
            except kernel_mod.KernelError as err:
                self.err(str(err))
                return False
            if run_dir is not None:
                # The recorded configuration described the driver that just went.
                with contextlib.suppress(OSError):
                    (run_dir / STATE_FILE).unlink()
        self.out("Unmounting NVIDIA driver rootfs...")
        self.unmount(run_dir)
        if run_dir is not None:
            with contextlib.suppress(OSError):
                (run_dir / PID_FILE).unlink()
        return True

    # -- facts ---------------------------------------------------------------------------------

    def in_use(self) -> bool:
        """Something other than the driver's own modules holds it: a daemon that opened it (a
        host's nvidia-persistenced), or processes on the GPUs. NVML handles of the operands are
        not counted: the driver manager evicts those pods before a driver goes."""
        if any(self.kernel.refcount(m) for m in ("nvidia", "nvidia_uvm", "nvidia_modeset")):
            return True
        machine = self.host.machine
        return machine is not None and any(gpu.processes for gpu in machine.gpus)

    def lsmod(self) -> list[str]:
        """`lsmod | grep nvidia`, which the script prints before giving up."""
        lines = []
        for name in ("nvidia_modeset", "nvidia_uvm", "nvidia_peermem", "nvidia"):
            if not self.kernel.loaded(name):
                continue
            users = self.kernel.holders(name)
            count = self.kernel.refcount(name) + len(users)
            lines.append(f"{name:<24}{16384:>8}  {count} {','.join(users)}".rstrip())
        return lines

    def state(self, run_dir: Path) -> str:
        try:
            return (run_dir / STATE_FILE).read_text().strip()
        except OSError:
            return ""

    def pid(self) -> int:
        digest = hashlib.sha256(f"{self.ctx.namespace}/{self.ctx.name}".encode()).digest()
        return 20_000 + int.from_bytes(digest[:2], "big") % 10_000


async def run(ctx: PodContext, host: Host) -> int:
    """The driver container of a driver pod."""
    return await DriverContainer(ctx, host).run()
