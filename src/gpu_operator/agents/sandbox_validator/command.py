"""Running one sandbox validation: its marker files, waits and outcome."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from gpu_operator.agents.sandbox_validator import checks

log = logging.getLogger("gpu_operator.agents.sandbox_validator")

COMPONENTS = ("cc-manager", "vfio-pci", "vgpu-manager", "vgpu-devices")
WORKLOAD_FILE = "workload-type"
CC_CTR_READY = ".cc-manager-ctr-ready"
DRIVER_CTR_READY = ".driver-ctr-ready"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
Labels = Callable[[], Awaitable[dict[str, str]]]


@dataclass
class Settings:
    component: str
    root: Path
    validations_dir: Path
    default_workload: str | None = None
    with_wait: bool = True
    poll_interval: float = 1.0
    timeout: float | None = None  # vgpu-manager: upstream waits up to 5 minutes


def _marker(settings: Settings, name: str, text: str = "") -> None:
    settings.validations_dir.mkdir(parents=True, exist_ok=True)
    (settings.validations_dir / name).write_text(text)


def _clear(settings: Settings, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        (settings.validations_dir / name).unlink()


async def _until(
    settings: Settings, check: Callable[[], tuple[bool, str]], stop: asyncio.Event | None
) -> tuple[bool, str]:
    loop = asyncio.get_running_loop()
    deadline = None if settings.timeout is None else loop.time() + settings.timeout
    last = ""
    while True:
        ok, message = check()
        if ok or not settings.with_wait:
            return ok, message
        if message != last:
            log.info("%s: waiting: %s", settings.component, message)
            last = message
        if (stop is not None and stop.is_set()) or (
            deadline is not None and loop.time() >= deadline
        ):
            return False, message
        if stop is None:
            await asyncio.sleep(settings.poll_interval)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), settings.poll_interval)


async def validate(settings: Settings, labels: Labels, stop: asyncio.Event | None = None) -> int:
    """Run one component's validation; 0 on success (markers written), 1 on failure."""
    component = settings.component
    if component not in COMPONENTS:
        log.error("unknown component %r; expected one of %s", component, ", ".join(COMPONENTS))
        return EXIT_USAGE
    ready = f"{component}-ready"
    _clear(settings, ready)
    node_labels = await labels()
    workload = checks.workload_type(node_labels, settings.default_workload)
    if component == "cc-manager":
        if node_labels.get("nvidia.com/cc.capable") == "true":
            ok, message = await _until(
                settings,
                lambda: ((settings.validations_dir / CC_CTR_READY).exists(), "cc manager"),
                stop,
            )
            if not ok:
                log.error("cc-manager: the CC manager is not ready")
                return EXIT_FAILED
        _marker(settings, ready)
        log.info("cc-manager: validation successful")
        return EXIT_OK
    if component == "vfio-pci":
        _marker(settings, WORKLOAD_FILE, workload)
        log.info("workload type: %s", workload)
        if workload != checks.VM_PASSTHROUGH:
            log.info("vfio-pci: skipped on a %s node", workload)
            return EXIT_OK
        ok, message = await _until(settings, lambda: checks.vfio_pci(settings.root), stop)
    elif component == "vgpu-manager":
        for name in ("vgpu-manager-ready", "host-vgpu-manager-ready"):
            _clear(settings, name)
        if workload != checks.VM_VGPU:
            log.info("vgpu-manager: skipped on a %s node", workload)
            return EXIT_OK
        ok, message = await _until(settings, lambda: checks.vgpu_manager(settings.root), stop)
        if ok:
            in_container = (settings.validations_dir / DRIVER_CTR_READY).exists()
            ready = "vgpu-manager-ready" if in_container else "host-vgpu-manager-ready"
    else:  # vgpu-devices
        if workload != checks.VM_VGPU:
            log.info("vgpu-devices: skipped on a %s node", workload)
            return EXIT_OK
        ok, message = await _until(settings, lambda: checks.vgpu_devices(settings.root), stop)
    if not ok:
        log.error("%s: validation failed: %s", component, message)
        return EXIT_FAILED
    _marker(settings, ready)
    log.info("%s: validation successful: %s", component, message)
    return EXIT_OK


def plugin_missing(validations_dir: Path, *, vgpu: bool) -> str | None:
    """What the sandbox plugin's init container still waits for: the workload type, then
    `vfio-pci-ready` (passthrough) or `vgpu-devices-ready` (vGPU); None when nothing."""
    workload_file = validations_dir / WORKLOAD_FILE
    try:
        workload = workload_file.read_text().strip()
    except OSError:
        return WORKLOAD_FILE
    if workload == checks.VM_PASSTHROUGH:
        needed = "vfio-pci-ready"
    elif vgpu:
        needed = "vgpu-devices-ready"
    else:
        return None
    return None if (validations_dir / needed).exists() else needed


async def wait_for_plugin_prerequisites(
    validations_dir: Path, *, vgpu: bool, poll_interval: float, stop: asyncio.Event
) -> bool:
    """Wait until `plugin_missing` is None (False: stopped first)."""
    logged = None
    while (missing := plugin_missing(validations_dir, vgpu=vgpu)) is not None:
        if missing != logged:
            log.info("waiting for %s", validations_dir / missing)
            logged = missing
        if stop.is_set():
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), poll_interval)
    return True


def remove_ready_markers(validations_dir: Path) -> None:
    """The validator's preStop: remove every `*-ready` marker."""
    with contextlib.suppress(FileNotFoundError):
        for path in validations_dir.glob("*-ready"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
