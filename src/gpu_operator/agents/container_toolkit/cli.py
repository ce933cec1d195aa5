"""`gpu-operator agent container-toolkit`: upstream's environment, plus the NVML backend choice."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from gpu_operator.agents.container_toolkit.runner import EventSink

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

# Where the kubelet reads a container's termination message (its default path).
TERMINATION_LOG = "/dev/termination-log"


def register(app: typer.Typer) -> None:
    """Add the `container-toolkit` command to the `agent` app."""
    app.command("container-toolkit")(container_toolkit)


def environment(env: Mapping[str, str], driver_ready: Path | None) -> dict[str, str]:
    """The environment with the validator's `driver-ready` values for the unset variables, as
    upstream's entrypoint sources that file before starting the toolkit."""
    from gpu_operator.agents.container_toolkit import settings

    out = dict(env)
    if driver_ready is not None and driver_ready.is_file():
        for key, value in settings.read_driver_ready(driver_ready.read_text()).items():
            out.setdefault(key, value)
    return out


def container_toolkit(
    backend: str = typer.Option("nvml", envvar="TOOLKIT_BACKEND", help="nvml (real GPUs) or mock."),
    machine: str | None = typer.Option(None, help="Mock machine preset, e.g. dgx-a100."),
    machine_file: Path | None = typer.Option(None, help="Mock machine YAML file."),
    seed: int | None = typer.Option(None, help="Seed for the mock machine."),
    driver_ready: Path | None = typer.Option(
        Path("/run/nvidia/validations/driver-ready"),
        help="The validator's driver-ready file (fills NVIDIA_DRIVER_ROOT and friends when unset).",
    ),
    simulate_binaries: bool = typer.Option(
        False, help="Write stand-ins for NVIDIA's runtime binaries (simulated nodes only)."
    ),
    kubeconfig: Path | None = typer.Option(None, envvar="KUBECONFIG"),
) -> None:
    """Install the NVIDIA container toolkit and configure the node's container runtime
    (upstream's nvidia-ctk-installer environment: RUNTIME, ROOT, RUNTIME_CONFIG, CDI_ENABLED)."""
    from gpu_operator import nvml
    from gpu_operator.agents import mock_backend
    from gpu_operator.agents.container_toolkit import runner, settings

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    try:
        s = settings.from_env(environment(os.environ, driver_ready))
    except settings.SettingsError as err:
        typer.echo(f"container-toolkit: {err}", err=True)
        raise typer.Exit(2) from None
    open_nvml: Callable[[], nvml.Nvml]
    if backend == "mock":
        try:
            open_nvml = mock_backend.machine(machine, machine_file, seed).nvml
        except mock_backend.MachineChoiceError as err:
            typer.echo(f"container-toolkit: {err}", err=True)
            raise typer.Exit(2) from None
    elif backend == "nvml":
        from gpu_operator.nvml import real

        # This pod runs without the NVIDIA runtime (it installs it): NVML comes from the driver
        # root, as nvidia-ctk loads it.
        open_nvml = real.opener(s.driver_root_ctr)
    else:
        typer.echo(
            f"container-toolkit: --backend: unknown backend {backend!r} (nvml or mock)", err=True
        )
        raise typer.Exit(2)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
            loop.add_signal_handler(sig, stop.set)
        events = _node_events(s.node_name, kubeconfig)
        agent = runner.Agent(
            s,
            restarter=runner.restarter_for(s, Path),
            open_nvml=open_nvml,
            events=events,
            stand_ins=simulate_binaries,
        )
        code = await agent.run(stop)
        if agent.failure is not None:
            # The kubelet reports this file as the container's termination message.
            with contextlib.suppress(OSError):
                Path(TERMINATION_LOG).write_text(agent.failure + "\n")
        return code

    raise typer.Exit(asyncio.run(main()))


def _node_events(node_name: str, kubeconfig: Path | None) -> EventSink | None:
    """Events on the node when NODE_NAME is set and a cluster is reachable; else None."""
    if not node_name:
        return None
    from gpu_operator.kube import client, node_watch

    try:
        api = client.connect(str(kubeconfig) if kubeconfig else None)
    except client.ConnectError as err:
        logging.getLogger("gpu_operator.agents.container_toolkit").warning(
            "no node Events: %s", err
        )
        return None
    return node_watch.NodeEvents(
        api, node_name, node_watch.own_namespace(), "nvidia-container-toolkit"
    )
