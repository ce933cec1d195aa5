"""Wire the node status exporter from upstream's environment (`METRICS_PORT`, `NODE_NAME`,
the validations directory) and serve until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpu_operator import http_endpoint, nvml
from gpu_operator.agents import mock_backend
from gpu_operator.agents.node_status_exporter import runner

log = logging.getLogger("gpu_operator.agents.node_status_exporter")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
VALIDATIONS_DIR = "/run/nvidia/validations"


class UsageError(Exception):
    """Bad input from the user: one line, exit status 2."""


@dataclass
class Options:
    node_name: str | None = None
    port: int = 8000
    validations_dir: Path = Path(VALIDATIONS_DIR)
    sysfs: Path = Path("/sys")
    interval: float = 30.0
    kubeconfig: Path | None = None
    backend: str = "nvml"
    machine: str | None = None
    machine_file: Path | None = None
    seed: int | None = None


def open_backend(o: Options) -> tuple[Callable[[], nvml.Nvml], Callable[[], int] | None]:
    """The NVML factory, and for mock machines their GPU count (they have no sysfs)."""
    if o.backend == "mock":
        try:
            machine = mock_backend.machine(o.machine, o.machine_file, o.seed)
        except mock_backend.MachineChoiceError as err:
            raise UsageError(str(err)) from None
        return machine.nvml, lambda: len(machine.gpus)
    if o.backend == "nvml":
        from gpu_operator.nvml import real

        # No NVIDIA runtime class on this pod: NVML comes from the driver root it mounts (a
        # driver container's), or the host root (a host driver).
        return real.opener(["/run/nvidia/driver", "/host"]), None
    raise UsageError(f"--backend: unknown backend {o.backend!r} (expected nvml or mock)")


def build(o: Options) -> tuple[runner.Exporter, Callable[[], object]]:
    """The exporter for `o` and a closer for its API client."""
    if not o.node_name:
        raise UsageError("NODE_NAME (--node-name) is required")
    if not 0 < o.port < 65536:
        raise UsageError(f"port {o.port}: expected 1-65535")
    if o.interval <= 0:
        raise UsageError(f"interval {o.interval}: must be positive")
    open_nvml, mock_pci = open_backend(o)
    from gpu_operator.kube import node_capacity, node_features

    api = node_features.client(o.kubeconfig)
    node = o.node_name

    async def count_devices() -> int:
        return await node_capacity.gpu_device_count(api, node)

    probes = runner.Probes(
        validations_dir=o.validations_dir,
        open_nvml=open_nvml,
        count_devices=count_devices,
        count_pci=mock_pci or runner.pci_counter(o.sysfs),
    )
    return runner.Exporter(node, probes, interval=o.interval), api.close


async def serve(exporter: runner.Exporter, port: int, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
            handled.append(sig)
    listener: http_endpoint.Endpoint | None = None
    try:
        task = asyncio.create_task(exporter.run(stop))
        listener = await http_endpoint.start(
            exporter.routes(), "0.0.0.0", port, what="node status exporter"
        )
        log.info("serving node status metrics on :%d/metrics", port)
        await task
    finally:
        if listener is not None:
            await listener.aclose()
        for sig in handled:
            loop.remove_signal_handler(sig)


def execute(o: Options) -> int:
    try:
        exporter, close = build(o)
    except UsageError as err:
        print(f"node-status-exporter: {err}", file=sys.stderr)
        return EXIT_USAGE

    async def main() -> None:
        try:
            await serve(exporter, o.port, asyncio.Event())
        finally:
            result = close()
            if asyncio.iscoroutine(result):
                await result

    try:
        asyncio.run(main())
    except OSError as err:
        print(f"node-status-exporter: cannot listen on :{o.port}: {err}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
