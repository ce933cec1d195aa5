"""`gpu-operator agent sandbox-device-plugin`: the KubeVirt GPU device plugin on this host."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import typer

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def register(app: typer.Typer) -> None:
    """Add the `sandbox-device-plugin` command to the `agent` app."""
    app.command("sandbox-device-plugin")(sandbox_device_plugin)


def sandbox_device_plugin(
    host_root: Path = typer.Option(Path("/"), envvar="HOST_ROOT", help="The host's /."),
    plugin_dir: Path = typer.Option(
        Path("/var/lib/kubelet/device-plugins"), help="The kubelet's device-plugin directory."
    ),
    pci_ids: Path = typer.Option(
        Path("/usr/pci.ids"), envvar="PCI_IDS_PATH", help="pci.ids for the device names."
    ),
    poll_interval: float = typer.Option(1.0, help="Seconds between health checks."),
) -> None:
    """Advertise passthrough GPUs and vGPUs to the kubelet for KubeVirt VMs."""
    from gpu_operator.agents.sandbox_device_plugin import discovery, manager

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    settings = manager.Settings(
        root=host_root,
        plugin_dir=plugin_dir,
        kubelet_socket=plugin_dir / "kubelet.sock",
        pci_ids=discovery.read_pci_ids(pci_ids),
        poll_interval=poll_interval,
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await manager.Manager(settings).run(stop)

    asyncio.run(main())
