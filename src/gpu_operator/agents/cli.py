"""The `gpu-operator agent ...` sub-commands: one thin command per node program."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from gpu_operator.agents.compute_domain_plugin import cli as _compute_domain_cli
from gpu_operator.agents.container_toolkit import cli as _container_toolkit_cli
from gpu_operator.agents.container_toolkit import guard_cli as _guard_cli
from gpu_operator.agents.dcgm_exporter import cli as _dcgm_exporter_cli
from gpu_operator.agents.device_plugin import cli as _device_plugin_cli
from gpu_operator.agents.dra_kubelet_plugin import cli as _dra_kubelet_plugin_cli
from gpu_operator.agents.driver_manager import cli as _driver_manager_cli
from gpu_operator.agents.mig_manager import cli as _mig_manager_cli
from gpu_operator.agents.node_status_exporter import cli as _node_status_exporter_cli
from gpu_operator.agents.sandbox_device_plugin import cli as _sandbox_device_plugin_cli
from gpu_operator.agents.sandbox_validator import cli as _sandbox_validator_cli
from gpu_operator.agents.validator import cli as _validator_cli
from gpu_operator.agents.vfio_manager import cli as _vfio_manager_cli
from gpu_operator.agents.vgpu_device_manager import cli as _vgpu_device_manager_cli

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


@app.command("config-manager")
def config_manager(
    node_name: str = typer.Option("", envvar="NODE_NAME", help="The node whose label is watched."),
    node_label: str = typer.Option(
        "nvidia.com/device-plugin.config", envvar="NODE_LABEL", help="The label naming the config."
    ),
    config_file_srcdir: str = typer.Option(
        "", envvar="CONFIG_FILE_SRCDIR", help="Directory of the available configs (a ConfigMap)."
    ),
    config_file_dst: str = typer.Option(
        "", envvar="CONFIG_FILE_DST", help="The symlink to point at the chosen config."
    ),
    default_config: str = typer.Option(
        "", envvar="DEFAULT_CONFIG", help="The config to use when the label is not set."
    ),
    fallback_strategies: str = typer.Option(
        "",
        envvar="FALLBACK_STRATEGIES",
        help="Without label or default: comma-separated named, single, empty (in order).",
    ),
    oneshot: bool = typer.Option(
        False, "--oneshot/--no-oneshot", envvar="ONESHOT", help="Update once and exit."
    ),
    send_signal: bool = typer.Option(
        True, "--send-signal/--no-send-signal", envvar="SEND_SIGNAL", help="Signal on a change."
    ),
    signal_number: int = typer.Option(1, "--signal", envvar="SIGNAL", help="Signal number."),
    process_to_signal: str = typer.Option(
        "nvidia-device-plugin", envvar="PROCESS_TO_SIGNAL", help="argv[0] of the process."
    ),
    recheck_interval: float = typer.Option(
        5.0,
        envvar="CONFIG_RECHECK_INTERVAL",
        help="Seconds between re-checks of the mounted configs (0: only on label changes).",
    ),
    kubeconfig: str = typer.Option("", envvar="KUBECONFIG"),
) -> None:
    """Point the device-plugin config at the one the node label names (config manager)."""
    from gpu_operator.agents.config_manager import command

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    opts = command.Options(
        node_name=node_name,
        node_label=node_label,
        config_file_srcdir=config_file_srcdir,
        config_file_dst=config_file_dst,
        default_config=default_config,
        fallback_strategies=fallback_strategies,
        oneshot=oneshot,
        send_signal=send_signal,
        signal=signal_number,
        process_to_signal=process_to_signal,
        recheck_interval=recheck_interval,
        kubeconfig=Path(kubeconfig) if kubeconfig else None,
    )
    raise typer.Exit(command.execute(opts))


@app.command("vector-add")
def vector_add() -> None:
    """Add two vectors on the first CUDA device and check the result (the validator's CUDA
    workload, NVIDIA's `vectorAdd` sample; needs the driver the NVIDIA runtime injects)."""
    from gpu_operator.agents.validator import vector_add as sample

    raise typer.Exit(sample.main())


# The device plugin and its MPS control daemon keep their many options in their own module.
_device_plugin_cli.register(app)
_mig_manager_cli.register(app)
_dcgm_exporter_cli.register(app)
_node_status_exporter_cli.register(app)
# The node readiness chain's checks (docs/node-chain.md).
_validator_cli.register(app)
# The driver DaemonSets' init container (also the VFIO and vGPU managers').
_driver_manager_cli.register(app)
# The toolkit DaemonSet's main container (the node's container runtime config).
_container_toolkit_cli.register(app)
# The runtime-config guard next to a toolkit that is not ours (NVIDIA's).
_guard_cli.register(app)
# The VM-workload agents (KubeVirt): docs/vm-workloads.md.
_vfio_manager_cli.register(app)
_vgpu_device_manager_cli.register(app)
_sandbox_device_plugin_cli.register(app)
_sandbox_validator_cli.register(app)
# The GPU DRA kubelet plugin (docs/dra.md).
_dra_kubelet_plugin_cli.register(app)
# Compute domains: the controller and the kubelet plugin (docs/compute-domains.md).
_compute_domain_cli.register(app)
