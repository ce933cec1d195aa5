"""`python -m gpu_operator.agents.dcgm_exporter [flags]`: the exporter without the rest of the
`gpu-operator` command line, so its process loads only what it runs (same flags and env)."""

from __future__ import annotations

import typer

from gpu_operator.agents.dcgm_exporter import cli

app = typer.Typer(add_completion=False)
cli.register(app)

if __name__ == "__main__":
    app()
