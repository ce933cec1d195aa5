"""The `gpu-operator` command line: one module per command group.

`main` holds the root typer app (controller, validate, render, crds, demo, ...) and mounts the
groups: `adopt`, `explain`, `images`, `upgrade`; the agents' own commands live with the agents
(`gpu_operator.agents.cli`). `render`, `image_list` and `upgrade_plan` are the offline logic those
commands share. `app` and `main` are re-exported here: the console script is
`gpu_operator.cli:main`.
"""

from gpu_operator.cli.main import app, main

__all__ = ["app", "main"]
