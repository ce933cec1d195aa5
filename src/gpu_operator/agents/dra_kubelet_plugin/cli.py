"""`gpu-operator agent dra-kubelet-plugin` (NVIDIA's `gpu-kubelet-plugin` entry point)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the `dra-kubelet-plugin` command to the `agent` app."""
    app.command("dra-kubelet-plugin")(dra_kubelet_plugin)


def dra_kubelet_plugin(
    node_name: str = typer.Option("", "--node-name", envvar="NODE_NAME"),
    feature_gates: str = typer.Option(
        "", "--feature-gates", envvar="FEATURE_GATES", help="e.g. TimeSlicingSettings=true"
    ),
    cdi_root: Path = typer.Option(Path("/var/run/cdi"), "--cdi-root", envvar="CDI_ROOT"),
    nvidia_driver_root: str = typer.Option(
        "/", "--nvidia-driver-root", envvar="NVIDIA_DRIVER_ROOT", help="The driver on the host."
    ),
    container_driver_root: Path = typer.Option(
        Path("/driver-root"),
        "--container-driver-root",
        envvar="CONTAINER_DRIVER_ROOT",
        help="Where this container sees the driver root.",
    ),
    kubelet_root: str = typer.Option(
        "/var/lib/kubelet", "--kubelet-root", envvar="KUBELET_ROOT_DIR"
    ),
    backend: str = typer.Option("nvml", help="nvml (real GPUs) or mock."),
    machine: str | None = typer.Option(None, help="Mock machine preset, e.g. dgx-a100."),
    seed: int | None = typer.Option(None, help="Seed for the mock machine."),
    kubeconfig: str = typer.Option("", envvar="KUBECONFIG"),
) -> None:
    """Publish the node's GPUs for Dynamic Resource Allocation and prepare their claims."""
    from gpu_operator.agents.dra import cli
    from gpu_operator.agents.dra_kubelet_plugin import plugin
    from gpu_operator.kube.resource_slices import SliceApi

    name = "gpu-kubelet-plugin"
    gates = cli.start(name, node_name, feature_gates)
    driver_found = container_driver_root.exists()
    open_nvml = cli.open_nvml(
        name, backend, machine, seed, driver_view=container_driver_root if driver_found else None
    )
    settings = plugin.Settings(
        node_name=node_name,
        kubelet_root_view=Path(kubelet_root),
        kubelet_root=kubelet_root,
        cdi_root=cdi_root,
        driver_root_view=container_driver_root if driver_found else Path(nvidia_driver_root),
        driver_root=nvidia_driver_root,
        gates=gates,
    )
    api = cli.connect(name, kubeconfig)

    async def serve(stop: asyncio.Event) -> None:
        p = plugin.Plugin(
            settings,
            open_nvml,
            SliceApi(api, node_name, "gpu.nvidia.com"),
            simulated=backend == "mock",
        )
        await p.run(stop)

    cli.run_until_signalled(name, serve, (plugin.StartError,))
    raise typer.Exit(cli.EXIT_OK)
