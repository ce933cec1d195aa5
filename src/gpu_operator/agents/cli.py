"""The `gpu-operator agent ...` sub-commands: one thin command per node program."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

app = typer.Typer(
    name="agent",
    help="Run a node program (the operands' entry points).",
    no_args_is_help=True,
)


@app.command("gpu-feature-discovery")
def gpu_feature_discovery(
    backend: str = typer.Option("nvml", envvar="GFD_BACKEND", help="nvml (real GPUs) or mock."),
    machine: str | None = typer.Option(None, help="Mock machine preset, e.g. dgx-a100."),
    machine_file: Path | None = typer.Option(None, help="Mock machine YAML file."),
    seed: int | None = typer.Option(None, help="Seed for the mock machine (UUIDs, telemetry)."),
    config_file: Path | None = typer.Option(
        None,
        "--config",
        "--config-file",
        envvar=["GFD_CONFIG_FILE", "CONFIG_FILE"],
        help="Device-plugin config file (YAML or JSON).",
    ),
    oneshot: bool | None = typer.Option(
        None, "--oneshot/--no-oneshot", envvar="GFD_ONESHOT", help="Label once and exit."
    ),
    no_timestamp: bool | None = typer.Option(
        None,
        "--no-timestamp/--timestamp",
        envvar="GFD_NO_TIMESTAMP",
        help="Leave out nvidia.com/gfd.timestamp.",
    ),
    sleep_interval: str | None = typer.Option(
        None, envvar="GFD_SLEEP_INTERVAL", help="Relabel interval, e.g. 60s, or infinite."
    ),
    output: str | None = typer.Option(
        None,
        "--output",
        "--output-file",
        "-o",
        envvar="GFD_OUTPUT_FILE",
        help="features.d file to write, or - for stdout.",
    ),
    machine_type_file: str | None = typer.Option(None, envvar="GFD_MACHINE_TYPE_FILE"),
    mig_strategy: str | None = typer.Option(
        None, envvar=["GFD_MIG_STRATEGY", "MIG_STRATEGY"], help="none, single or mixed."
    ),
    fail_on_init_error: bool | None = typer.Option(
        None, "--fail-on-init-error/--no-fail-on-init-error", envvar="GFD_FAIL_ON_INIT_ERROR"
    ),
    use_node_feature_api: bool | None = typer.Option(
        None,
        "--use-node-feature-api/--no-use-node-feature-api",
        envvar="GFD_USE_NODE_FEATURE_API",
        help="Write a NodeFeature object (default).",
    ),
    node_labels: bool = typer.Option(False, help="Write labels directly onto the Node."),
    node_name: str | None = typer.Option(None, envvar="NODE_NAME"),
    namespace: str | None = typer.Option(None, envvar="NAMESPACE"),
    pod_name: str | None = typer.Option(None, envvar="POD_NAME"),
    kubeconfig: Path | None = typer.Option(None, envvar="KUBECONFIG"),
) -> None:
    """Label the node with its GPU features (GPU feature discovery)."""
    from gpu_operator.agents.gfd import command

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    opts = command.Options(
        backend=backend,
        machine=machine,
        machine_file=machine_file,
        seed=seed,
        config_file=config_file,
        oneshot=oneshot,
        no_timestamp=no_timestamp,
        sleep_interval=sleep_interval,
        output=output,
        machine_type_file=machine_type_file,
        mig_strategy=mig_strategy,
        fail_on_init_error=fail_on_init_error,
        use_node_feature_api=use_node_feature_api,
        node_labels=node_labels,
        node_name=node_name,
        namespace=namespace,
        pod_name=pod_name,
        kubeconfig=kubeconfig,
    )
    raise typer.Exit(command.execute(opts))
