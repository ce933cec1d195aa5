"""The `kubesim` command."""

from __future__ import annotations

import typer

app = typer.Typer(name="kubesim", help="An in-memory Kubernetes API server.", no_args_is_help=True)


@app.callback()
def _root() -> None:
    """An in-memory Kubernetes API server for tests and demos."""


def main() -> None:
    app()
