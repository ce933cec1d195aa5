"""`gpu-operator agent compute-domain-kubelet-plugin` and `... compute-domain-controller`
(NVIDIA's `compute-domain-kubelet-plugin` and `compute-domain-controller` entry points)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("compute-domain-kubelet-plugin")(compute_domain_kubelet_plugin)
    app.command("compute-domain-controller")(compute_domain_controller)


def compute_domain_kubelet_plugin(
    node_name: str = typer.Option("", "--node-name", envvar="NODE_NAME"),
    namespace: str = typer.Option("nvidia-dra-driver-gpu", "--namespace", envvar="NAMESPACE"),
    feature_gates: str = typer.Option("", "--feature-gates", envvar="FEATURE_GATES"),
    cdi_root: Path = typer.Option(Path("/var/run/cdi"), "--cdi-root", envvar="CDI_ROOT"),
    kubelet_root: str = typer.Option(
        "/var/lib/kubelet", "--kubelet-root", envvar="KUBELET_ROOT_DIR"
    ),
    backend: str = typer.Option("nvml", help="nvml (real GPUs) or mock."),
    machine: str | None = typer.Option(None, help="Mock machine preset, e.g. gb200-nvl72."),
    kubeconfig: str = typer.Option("", envvar="KUBECONFIG"),
) -> None:
    """Publish the node's IMEX channel and daemon devices and prepare their claims."""
    from gpu_operator.agents.compute_domain_plugin import plugin
    from gpu_operator.agents.dra import cli
    from gpu_operator.kube.computedomains import ComputeDomainApi
    from gpu_operator.kube.resource_slices import SliceApi

    name = "compute-domain-kubelet-plugin"
    gates = cli.start(name, node_name, feature_gates)
    open_nvml = cli.open_nvml(name, backend, machine, any_backend_is_nvml=True)
    settings = plugin.Settings(
        node_name=node_name,
        kubelet_root_view=Path(kubelet_root),
        kubelet_root=kubelet_root,
        cdi_root=cdi_root,
        crash_on_fabric_errors=gates.get(plugin.CRASH_GATE, False),
    )
    api = cli.connect(name, kubeconfig)

    async def serve(stop: asyncio.Event) -> None:
        p = plugin.Plugin(
            settings, open_nvml, SliceApi(api, node_name, "compute-domain.nvidia.com"),
            ComputeDomainApi(api, namespace, name),
        )  # fmt: skip
        await p.run(stop)

    cli.run_until_signalled(name, serve, (plugin.StartError,))


def compute_domain_controller(
    namespace: str = typer.Option("nvidia-dra-driver-gpu", "--namespace", envvar="NAMESPACE"),
    image: str = typer.Option("", "--image-name", envvar="IMAGE_NAME"),
    kubeconfig: str = typer.Option("", envvar="KUBECONFIG"),
    verbosity: int = typer.Option(4, "-v", help="Log verbosity (accepted for NVIDIA's flags)."),
) -> None:
    """Reconcile ComputeDomains: claim templates, IMEX DaemonSets, cliques and status."""
    from gpu_operator.agents.dra import cli
    from gpu_operator.controller import computedomain

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    name = "compute-domain-controller"
    if not image:
        cli.fail(name, "--image-name (IMAGE_NAME) is required: the IMEX daemons run it",
                 cli.EXIT_USAGE)  # fmt: skip
    api = cli.connect(name, kubeconfig)

    async def serve(stop: asyncio.Event) -> None:
        await computedomain.serve(api, namespace, image, stop)

    cli.run_until_signalled(name, serve)
