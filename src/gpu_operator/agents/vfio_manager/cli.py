"""`gpu-operator agent vfio-manager bind|unbind|run`: upstream `vfio-manage` on this host."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import typer

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
ACTIONS = ("bind", "unbind", "run")


def register(app: typer.Typer) -> None:
    """Add the `vfio-manager` command to the `agent` app."""
    app.command("vfio-manager")(vfio_manager)


def vfio_manager(
    action: str = typer.Argument(..., help="bind, unbind, or run (bind, await SIGTERM, unbind)."),
    all_devices: bool = typer.Option(False, "--all", "-a", help="Every NVIDIA GPU of the host."),
    device: str | None = typer.Option(None, "--device-id", "-d", help="One PCI address."),
    bind_nvswitches: bool = typer.Option(False, envvar="BIND_NVSWITCHES"),
    host_root: Path = typer.Option(Path("/"), envvar="HOST_ROOT", help="The host's /."),
    pod_resources_socket: Path = typer.Option(
        Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
        help="The kubelet's pod-resources socket (who holds which GPU).",
    ),
) -> None:
    """Bind the host's NVIDIA GPUs to vfio-pci for VM passthrough, or release them."""
    from gpu_operator.agents.pci import kernel
    from gpu_operator.agents.vfio_manager import command, holders

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    err = typer.echo
    if action not in ACTIONS:
        err(f"error: unknown action {action!r}; expected one of {', '.join(ACTIONS)}", err=True)
        raise typer.Exit(2)
    if all_devices == (device is not None):
        err("error: give exactly one of --all and --device-id", err=True)
        raise typer.Exit(2)
    options = command.Options(device=device, nvswitches=bind_nvswitches)
    host = kernel.LinuxKernel(host_root)

    async def main() -> int:
        socket = host_root / str(pod_resources_socket).lstrip("/")
        gate = holders.Holders(socket)
        try:
            if action == "bind":
                return await command.bind(host, options, gate)
            if action == "unbind":
                return await command.unbind(host, options, gate)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            return await command.run(host, options, gate, stop)
        finally:
            await gate.close()

    raise typer.Exit(asyncio.run(main()))
