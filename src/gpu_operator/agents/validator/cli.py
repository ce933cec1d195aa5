"""`gpu-operator agent validator`: one validation of the node (upstream `nvidia-validator`).

Flags mirror upstream's and read the same env variables; the bounds of the waits (ours) are env
only: WITH_WAIT_RETRIES (60 x SLEEP_INTERVAL_SECONDS), POD_CREATION_WAIT_RETRIES (60),
POD_CREATION_SLEEP_INTERVAL_SECONDS (5), GPU_RESOURCE_DISCOVERY_WAIT_RETRIES (30),
GPU_RESOURCE_DISCOVERY_INTERVAL_SECONDS (5), and TERMINATION_MESSAGE_PATH.
"""

from __future__ import annotations

import logging
import os

import typer

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def register(app: typer.Typer) -> None:
    """Add the `validator` command to the `agent` app."""
    app.command("validator")(validator)


def _flag(value: bool | None) -> str | None:
    return None if value is None else str(value).lower()


def validator(
    component: str | None = typer.Option(
        None,
        "--component",
        "-c",
        envvar="COMPONENT",
        help="driver, toolkit, cuda, plugin, nvidia-fs, gdrcopy, nvidia-peermem or mofed.",
    ),
    node_name: str | None = typer.Option(None, "--node-name", "-n", envvar="NODE_NAME"),
    namespace: str | None = typer.Option(
        None,
        "--namespace",
        "--ns",
        envvar="OPERATOR_NAMESPACE",
        help="Where the operator's objects (and the workload pods) are.",
    ),
    with_wait: bool | None = typer.Option(
        None,
        "--with-wait/--no-with-wait",
        "-w",
        envvar="WITH_WAIT",
        help="Retry until the check passes (bounded by WITH_WAIT_RETRIES).",
    ),
    with_workload: bool | None = typer.Option(
        None,
        "--with-workload/--no-with-workload",
        "-l",
        envvar="WITH_WORKLOAD",
        help="cuda/plugin: run the vectorAdd workload pod (default true).",
    ),
    cleanup_all: bool | None = typer.Option(
        None,
        "--cleanup-all/--no-cleanup-all",
        "-r",
        envvar="CLEANUP_ALL",
        help="Remove every file in the output dir first.",
    ),
    output_dir: str | None = typer.Option(None, "--output-dir", "-o", envvar="OUTPUT_DIR"),
    sleep_interval_seconds: str | None = typer.Option(
        None, "--sleep-interval-seconds", "-s", envvar="SLEEP_INTERVAL_SECONDS"
    ),
    mig_strategy: str | None = typer.Option(None, "--mig-strategy", "-m", envvar="MIG_STRATEGY"),
    disable_dev_char_symlink_creation: bool | None = typer.Option(
        None,
        "--disable-dev-char-symlink-creation/--dev-char-symlink-creation",
        envvar="DISABLE_DEV_CHAR_SYMLINK_CREATION",
    ),
    host_root: str | None = typer.Option(None, "--host-root", envvar="HOST_ROOT"),
    driver_install_dir: str | None = typer.Option(
        None, "--driver-install-dir", envvar="DRIVER_INSTALL_DIR"
    ),
    driver_install_dir_ctr_path: str | None = typer.Option(
        None, "--driver-install-dir-ctr-path", envvar="DRIVER_INSTALL_DIR_CTR_PATH"
    ),
    driver_validation_skip_gpu_init: bool | None = typer.Option(
        None,
        "--driver-validation-skip-gpu-init/--no-driver-validation-skip-gpu-init",
        envvar="DRIVER_VALIDATION_SKIP_GPU_INIT",
    ),
    skip_validation: bool | None = typer.Option(
        None,
        "--skip-validation/--no-skip-validation",
        envvar="SKIP_VALIDATION",
        help="toolkit, cuda, plugin: write the marker without checking.",
    ),
    kubeconfig: str | None = typer.Option(None, envvar="KUBECONFIG"),
) -> None:
    """Validate one component of the node's GPU stack and write its marker file."""
    from gpu_operator.agents.validator import command

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    given = {
        "COMPONENT": component,
        "NODE_NAME": node_name,
        "OPERATOR_NAMESPACE": namespace,
        "WITH_WAIT": _flag(with_wait),
        "WITH_WORKLOAD": _flag(with_workload),
        "CLEANUP_ALL": _flag(cleanup_all),
        "OUTPUT_DIR": output_dir,
        "SLEEP_INTERVAL_SECONDS": sleep_interval_seconds,
        "MIG_STRATEGY": mig_strategy,
        "DISABLE_DEV_CHAR_SYMLINK_CREATION": _flag(disable_dev_char_symlink_creation),
        "HOST_ROOT": host_root,
        "DRIVER_INSTALL_DIR": driver_install_dir,
        "DRIVER_INSTALL_DIR_CTR_PATH": driver_install_dir_ctr_path,
        "DRIVER_VALIDATION_SKIP_GPU_INIT": _flag(driver_validation_skip_gpu_init),
        "SKIP_VALIDATION": _flag(skip_validation),
    }
    env = {**os.environ, **{k: v for k, v in given.items() if v is not None}}
    raise typer.Exit(command.execute(env, kubeconfig))
