"""`gpu-operator agent vgpu-device-manager`: upstream `nvidia-k8s-vgpu-dm`'s flags and env."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import typer

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def register(app: typer.Typer) -> None:
    """Add the `vgpu-device-manager` command to the `agent` app."""
    app.command("vgpu-device-manager")(vgpu_device_manager)


def vgpu_device_manager(
    node_name: str = typer.Option("", "--node-name", "-n", envvar="NODE_NAME"),
    namespace: str = typer.Option("", "--namespace", envvar="NAMESPACE"),
    config_file: Path | None = typer.Option(None, "--config-file", "-f", envvar="CONFIG_FILE"),
    default_vgpu_config: str = typer.Option(
        "", "--default-vgpu-config", "-d", envvar="DEFAULT_VGPU_CONFIG"
    ),
    host_root: Path = typer.Option(Path("/"), envvar="HOST_ROOT", help="The host's /."),
    kubeconfig: str | None = typer.Option(None, envvar="KUBECONFIG"),
) -> None:
    """Create the vGPUs the node's nvidia.com/vgpu.config label names."""
    from gpu_operator.agents.pci import kernel
    from gpu_operator.agents.vgpu_device_manager import runner
    from gpu_operator.kube import mig_node

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    missing = [
        flag
        for flag, value in (
            ("node-name", node_name),
            ("namespace", namespace),
            ("config-file", config_file),
            ("default-vgpu-config", default_vgpu_config),
        )
        if not value
    ]
    if missing:
        typer.echo(f"error: invalid <{missing[0]}> flag: must not be empty string", err=True)
        raise typer.Exit(2)
    assert config_file is not None
    settings = runner.Settings(config_file=config_file, default_config=default_vgpu_config)

    async def main() -> None:
        node = mig_node.NodeApi(
            mig_node.connect(kubeconfig), node_name, namespace, "nvidia-vgpu-device-manager"
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await runner.Manager(settings, node, kernel.LinuxKernel(host_root)).run(stop)
        finally:
            await node.close()

    asyncio.run(main())
