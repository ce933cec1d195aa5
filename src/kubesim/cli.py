"""The `kubesim` command."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from kubesim.images import ImageCatalog

app = typer.Typer(name="kubesim", help="An in-memory Kubernetes API server.", no_args_is_help=True)


@app.callback()
def _root() -> None:
    """An in-memory Kubernetes API server for tests and demos."""


@app.command()
def serve(
    port: int = typer.Option(0, help="TCP port on 127.0.0.1 (0 picks a free one)."),
    kubeconfig_out: Path | None = typer.Option(
        None, help="Write a kubeconfig for the server here."
    ),
    nodes: int = typer.Option(0, min=0, help="Create this many plain worker nodes."),
    instant: bool = typer.Option(False, help="Kubelet without delays (for scale runs)."),
    authentication: bool = typer.Option(
        True,
        help="Require a bearer token (the kubeconfig written carries the admin's); "
        "--no-authentication runs every request as the admin.",
    ),
    authorization: str = typer.Option(
        "open", help="open: everything allowed; rbac: Roles and bindings are enforced."
    ),
    anonymous: bool = typer.Option(
        False, help="Serve requests without a token as system:anonymous instead of 401."
    ),
    image: list[str] = typer.Option(
        [],
        "--image",
        help="An image the simulated registries hold besides the defaults, as [HOST/]PATH[:TAG] "
        "with globs (registry.local/* is every image there); repeatable.",
    ),
    registry: list[str] = typer.Option(
        [],
        "--registry",
        help="A registry host (HOST[:PORT]) that resolves, holding only the --image entries "
        "for it; repeatable.",
    ),
    pull_delay: float | None = typer.Option(
        None, "--pull-delay", min=0.0, help="Seconds an image pull takes (default 0.2)."
    ),
) -> None:
    """Run kubesim until interrupted."""
    from kubesim import images

    if authorization not in ("open", "rbac"):
        raise typer.BadParameter("choose open or rbac", param_hint="--authorization")
    try:
        catalog = images.ImageCatalog(image, registries=(*images.DEFAULT_REGISTRIES, *registry))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--image/--registry") from None
    asyncio.run(
        _serve(
            port,
            kubeconfig_out,
            nodes,
            instant,
            authentication,
            authorization,
            anonymous,
            catalog,
            pull_delay,
        )
    )


async def _serve(
    port: int,
    kubeconfig_out: Path | None,
    nodes: int,
    instant: bool,
    authentication: bool = True,
    authorization: str = "open",
    anonymous: bool = False,
    catalog: ImageCatalog | None = None,
    pull_delay: float | None = None,
) -> None:
    from kubesim.cluster import Cluster
    from kubesim.controllers.kubelet import KubeletConfig

    config = KubeletConfig(instant=instant, lease_interval=None if instant else 10.0)
    if pull_delay is not None:
        config.pull_delay = pull_delay
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with Cluster(
        nodes=nodes,
        port=port,
        kubeconfig_path=kubeconfig_out,
        kubelet=config,
        authorization=authorization,
        authentication=authentication,
        anonymous=anonymous,
        images=catalog or (),
    ) as sim:
        typer.echo(f"kubesim serving {sim.url} (kubeconfig: {sim.kubeconfig_path})", err=True)
        typer.echo(sim.url, err=False)
        await stop.wait()
    typer.echo("kubesim stopped", err=True)


def main() -> None:
    app()
