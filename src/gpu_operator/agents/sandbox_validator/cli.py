"""`gpu-operator agent sandbox-validator`: one sandbox validation (upstream `nvidia-validator`)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import typer

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def register(app: typer.Typer) -> None:
    """Add the `sandbox-validator` command to the `agent` app."""
    app.command("sandbox-validator")(sandbox_validator)


def sandbox_validator(
    component: str = typer.Option(
        ...,
        "--component",
        "-c",
        envvar="COMPONENT",
        help="cc-manager, vfio-pci, vgpu-manager or vgpu-devices.",
    ),
    node_name: str = typer.Option("", envvar="NODE_NAME"),
    host_root: Path = typer.Option(Path("/"), envvar="HOST_ROOT", help="The host's /."),
    output_dir: Path = typer.Option(Path("/run/nvidia/validations"), envvar="OUTPUT_DIR"),
    default_workload: str | None = typer.Option(None, envvar="DEFAULT_GPU_WORKLOAD_CONFIG"),
    with_wait: bool = typer.Option(True, envvar="WITH_WAIT"),
    kubeconfig: str | None = typer.Option(None, envvar="KUBECONFIG"),
) -> None:
    """Validate one link of a VM-workload node and write its marker."""
    from gpu_operator.agents.sandbox_validator import command
    from gpu_operator.kube import mig_node

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    if not node_name:
        typer.echo("error: NODE_NAME is required (--node-name)", err=True)
        raise typer.Exit(command.EXIT_USAGE)
    settings = command.Settings(
        component=component,
        root=host_root,
        validations_dir=output_dir,
        default_workload=default_workload,
        with_wait=with_wait,
        timeout=300.0 if component == "vgpu-manager" else None,
    )

    async def main() -> int:
        node = mig_node.NodeApi(mig_node.connect(kubeconfig), node_name, "", "sandbox-validator")
        try:

            async def labels() -> dict[str, str]:
                return (await node.metadata())[0]

            return await command.validate(settings, labels)
        finally:
            await node.close()

    raise typer.Exit(asyncio.run(main()))
