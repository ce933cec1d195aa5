"""The `gpu-operator agent node-status-exporter` command (upstream: `nvidia-validator` with
`COMPONENT=metrics`)."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def register(app: typer.Typer) -> None:
    """Add the node status exporter command to the `agent` command group."""

    @app.command("node-status-exporter")
    def node_status_exporter(
        node_name: str | None = typer.Option(None, envvar="NODE_NAME"),
        port: int = typer.Option(8000, envvar="METRICS_PORT", help="Port of /metrics."),
        output_dir: Path = typer.Option(
            Path("/run/nvidia/validations"),
            envvar="OUTPUT_DIR",
            help="Directory of the validation markers (<component>-ready).",
        ),
        sysfs: Path = typer.Option(Path("/sys"), help="sysfs to count NVIDIA PCI functions in."),
        interval: float = typer.Option(
            30.0, help="Seconds between polls (driver and PCI: twice that)."
        ),
        kubeconfig: Path | None = typer.Option(None, envvar="KUBECONFIG"),
        backend: str = typer.Option("nvml", help="nvml (real GPUs) or mock."),
        machine: str | None = typer.Option(None, help="Mock machine preset, e.g. dgx-a100."),
        machine_file: Path | None = typer.Option(None, help="Mock machine YAML file."),
        seed: int | None = typer.Option(None, help="Seed for the mock machine."),
    ) -> None:
        """Export the node's GPU Operator status (validations, devices) for Prometheus."""
        from gpu_operator.agents.node_status_exporter import command

        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
        opts = command.Options(
            node_name=node_name,
            port=port,
            validations_dir=output_dir,
            sysfs=sysfs,
            interval=interval,
            kubeconfig=kubeconfig,
            backend=backend,
            machine=machine,
            machine_file=machine_file,
            seed=seed,
        )
        raise typer.Exit(command.execute(opts))
