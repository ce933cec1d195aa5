"""`gpu-operator agent mig-manager`: upstream nvidia-mig-manager's flags and environment names."""

from __future__ import annotations

import logging
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the `mig-manager` command to the `agent` app."""
    app.command("mig-manager")(mig_manager)


def mig_manager(
    node_name: str = typer.Option("", "--node-name", "-n", envvar="NODE_NAME"),
    config_file: str = typer.Option(
        "",
        "--config-file",
        "-f",
        envvar="CONFIG_FILE",
        help="mig-parted config file; without it the config is generated from the GPUs.",
    ),
    default_config_file: str = typer.Option(
        "",
        envvar="DEFAULT_CONFIG_FILE",
        help="Used when no config file is given and no MIG-capable GPU can generate one.",
    ),
    gpu_clients_file: str = typer.Option("", "--gpu-clients-file", "-g", envvar="GPU_CLIENTS_FILE"),
    host_root_mount: str = typer.Option(
        "/host", "--host-root-mount", "-m", envvar="HOST_ROOT_MOUNT"
    ),
    host_nvidia_dir: str = typer.Option(
        "/usr/local/nvidia", "--host-nvidia-dir", "-i", envvar="HOST_NVIDIA_DIR"
    ),
    host_mig_manager_state_file: str = typer.Option(
        "/etc/systemd/system/nvidia-mig-manager.service.d/override.conf",
        "--host-mig-manager-state-file",
        "-o",
        envvar="HOST_MIG_MANAGER_STATE_FILE",
    ),
    host_kubelet_systemd_service: str = typer.Option(
        "kubelet.service",
        "--host-kubelet-systemd-service",
        "-k",
        envvar="HOST_KUBELET_SYSTEMD_SERVICE",
    ),
    with_reboot: bool = typer.Option(False, "--with-reboot", "-r", envvar="WITH_REBOOT"),
    with_shutdown_host_gpu_clients: bool = typer.Option(
        False, "--with-shutdown-host-gpu-clients", "-d", envvar="WITH_SHUTDOWN_HOST_GPU_CLIENTS"
    ),
    default_gpu_clients_namespace: str = typer.Option(
        "default", "--default-gpu-clients-namespace", "-p", envvar="DEFAULT_GPU_CLIENTS_NAMESPACE"
    ),
    cdi_enabled: bool = typer.Option(False, "--cdi-enabled", envvar="CDI_ENABLED"),
    nvidia_driver_root: str = typer.Option(
        "/run/nvidia/driver", "--nvidia-driver-root", envvar=["NVIDIA_DRIVER_ROOT", "DRIVER_ROOT"]
    ),
    driver_root_ctr_path: str = typer.Option("/run/nvidia/driver", envvar="DRIVER_ROOT_CTR_PATH"),
    dev_root: str = typer.Option("", envvar="NVIDIA_DEV_ROOT"),
    dev_root_ctr_path: str = typer.Option("", envvar="DEV_ROOT_CTR_PATH"),
    nvidia_cdi_hook_path: str = typer.Option(
        "/usr/local/nvidia/toolkit/nvidia-cdi-hook", envvar="NVIDIA_CDI_HOOK_PATH"
    ),
    pod_name: str = typer.Option("", envvar="POD_NAME"),
    pod_namespace: str = typer.Option("", envvar="POD_NAMESPACE"),
    kubeconfig: str = typer.Option("", envvar="KUBECONFIG"),
    clients_timeout: float = typer.Option(
        300.0,
        envvar="GPU_CLIENTS_TIMEOUT",
        help="Seconds to wait for GPU-client pods to leave the node before failing.",
    ),
    validations_dir: str = typer.Option(
        "/run/nvidia/validations",
        envvar="VALIDATIONS_DIR",
        help="Where the driver container's .driver-ctr-ready marker says the driver is ready.",
    ),
    backend: str = typer.Option(
        "nvml", envvar="MIG_MANAGER_BACKEND", help="nvml (real GPUs) or mock."
    ),
    machine: str | None = typer.Option(None, help="Mock machine preset, e.g. dgx-a100."),
    machine_file: Path | None = typer.Option(None, help="Mock machine YAML file."),
    seed: int | None = typer.Option(None, help="Seed for the mock machine."),
) -> None:
    """Apply the MIG layout the node's nvidia.com/mig.config label names (MIG manager)."""
    from gpu_operator.agents.mig_manager import command

    # Accepted for compatibility; CDI spec regeneration after a change is not implemented.
    del nvidia_driver_root, dev_root, dev_root_ctr_path
    del nvidia_cdi_hook_path
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    opts = command.Options(
        node_name=node_name,
        config_file=config_file,
        default_config_file=default_config_file,
        gpu_clients_file=gpu_clients_file,
        host_root_mount=host_root_mount,
        host_nvidia_dir=host_nvidia_dir,
        host_mig_manager_state_file=host_mig_manager_state_file,
        host_kubelet_systemd_service=host_kubelet_systemd_service,
        with_reboot=with_reboot,
        with_shutdown_host_gpu_clients=with_shutdown_host_gpu_clients,
        default_gpu_clients_namespace=default_gpu_clients_namespace,
        cdi_enabled=cdi_enabled,
        driver_root_ctr_path=driver_root_ctr_path,
        pod_name=pod_name,
        pod_namespace=pod_namespace,
        kubeconfig=kubeconfig or None,
        clients_timeout=clients_timeout,
        validations_dir=validations_dir,
        backend=backend,
        machine=machine,
        machine_file=machine_file,
        seed=seed,
    )
    raise typer.Exit(command.execute(opts))
