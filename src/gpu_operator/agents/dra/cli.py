"""The command-line wiring our DRA kubelet plugins' `gpu-operator agent ...` commands share:
logging, the required node name, the feature gates, the NVML backend, the API connection and
running until SIGTERM/SIGINT. A usage error exits 2, a failure 1, each with `<name>: <why>`."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer

if TYPE_CHECKING:
    from gpu_operator import nvml
    from gpu_operator.kube.client import AsyncClient

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def fail(name: str, message: object, code: int) -> NoReturn:
    print(f"{name}: {message}", file=sys.stderr)
    raise typer.Exit(code)


def start(name: str, node_name: str, feature_gates: str) -> dict[str, bool]:
    """Set up logging, insist on the node name and parse `--feature-gates`."""
    from gpu_operator.agents.dra_kubelet_plugin import gpuconfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if not node_name:
        fail(name, "--node-name (NODE_NAME) is required", EXIT_USAGE)
    try:
        return gpuconfig.parse_gates(feature_gates)
    except gpuconfig.ConfigError as err:
        fail(name, err, EXIT_USAGE)


def open_nvml(
    name: str,
    backend: str,
    machine: str | None,
    seed: int | None = None,
    *,
    driver_view: Path | None = None,
    any_backend_is_nvml: bool = False,
) -> Callable[[], nvml.Nvml]:
    """The NVML opener for `--backend`: `mock` (a preset machine) or `nvml` (the real library,
    loaded from `driver_view` when given). With `any_backend_is_nvml` every other value means
    `nvml` too; else it is a usage error."""
    from gpu_operator.agents import mock_backend

    if backend == "mock":
        try:
            return mock_backend.machine(machine, None, seed).nvml
        except mock_backend.MachineChoiceError as err:
            fail(name, err, EXIT_USAGE)
    if backend != "nvml" and not any_backend_is_nvml:
        fail(name, f"--backend: unknown backend {backend!r} (nvml or mock)", EXIT_USAGE)
    from gpu_operator.nvml import real

    return real.opener(driver_view)


def connect(name: str, kubeconfig: str) -> AsyncClient:
    from gpu_operator.kube import client

    try:
        return client.connect(kubeconfig or None)
    except client.ConnectError as err:
        fail(name, err, EXIT_FAILED)


def run_until_signalled(
    name: str,
    main: Callable[[asyncio.Event], Awaitable[None]],
    start_errors: tuple[type[Exception], ...] = (),
) -> None:
    """Run `main(stop)`; SIGTERM or SIGINT sets `stop`. One of `start_errors` exits 1."""

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    try:
        asyncio.run(serve())
    except start_errors as err:
        fail(name, err, EXIT_FAILED)
