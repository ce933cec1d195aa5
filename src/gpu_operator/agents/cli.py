"""The `gpu-operator agent ...` sub-commands: one thin command per node program."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="agent",
    help="Run a node program (the operands' entry points).",
    no_args_is_help=True,
)
