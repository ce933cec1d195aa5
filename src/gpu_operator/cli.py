"""The `gpu-operator` command: parse, call, print."""

from __future__ import annotations

import typer

import gpu_operator
from gpu_operator.agents import cli as agents_cli

app = typer.Typer(
    name="gpu-operator",
    help="An API-compatible NVIDIA GPU Operator for Kubernetes, in Python.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(agents_cli.app)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpu-operator {gpu_operator.__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """An API-compatible NVIDIA GPU Operator for Kubernetes, in Python."""


def main() -> None:
    app()
