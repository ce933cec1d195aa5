"""`gpu-operator agent driver-manager uninstall_driver`: upstream k8s-driver-manager's command,
configured by its environment variables (docs/node-chain.md, "The driver manager")."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import typer

LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"


def register(app: typer.Typer) -> None:
    """Add the `driver-manager` command to the `agent` app."""
    app.command("driver-manager")(driver_manager)


def driver_manager(
    command: str = typer.Argument(
        "uninstall_driver", help="uninstall_driver (make the node ready for a driver container)."
    ),
    host_root: Path = typer.Option(
        Path("/host"), envvar="HOST_ROOT", help="Where the host's / is mounted (nvidia-smi)."
    ),
) -> None:
    """Prepare the node for the NVIDIA driver container (driver manager): settings come from
    NODE_NAME, ENABLE_GPU_POD_EVICTION, ENABLE_AUTO_DRAIN, DRAIN_* and the others."""
    from gpu_operator.agents.driver_manager import command as command_mod

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    raise typer.Exit(command_mod.execute(command, os.environ, host_root))
