"""The `gpu-operator agent device-plugin` and `mps-control-daemon` commands: upstream's flags and
environment variables, plus the backend and path options a simulated node needs."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def _common_flags(
    mig_strategy: str | None,
    fail_on_init_error: bool | None,
    nvidia_driver_root: str | None,
    dev_root: str | None,
    mps_root: str | None,
    device_discovery_strategy: str | None,
) -> dict[str, object]:
    return {
        "mig_strategy": mig_strategy,
        "fail_on_init_error": fail_on_init_error,
        "nvidia_driver_root": nvidia_driver_root,
        "dev_root": dev_root,
        "mps_root": mps_root,
        "device_discovery_strategy": device_discovery_strategy,
    }


def register(app: typer.Typer) -> None:
    """Add the device-plugin commands to the `agent` command group."""

    @app.command("device-plugin")
    def device_plugin(
        config_file: Path | None = typer.Option(
            None, envvar="CONFIG_FILE", help="Config file (YAML or JSON, version v1)."
        ),
        mig_strategy: str | None = typer.Option(
            None, envvar="MIG_STRATEGY", help="MIG devices: none, single or mixed."
        ),
        fail_on_init_error: bool | None = typer.Option(
            None,
            "--fail-on-init-error/--no-fail-on-init-error",
            envvar="FAIL_ON_INIT_ERROR",
            help="Exit when NVML fails (else wait indefinitely).",
        ),
        nvidia_driver_root: str | None = typer.Option(
            None,
            "--nvidia-driver-root",
            "--driver-root",
            envvar="NVIDIA_DRIVER_ROOT",
            help="Host path of the driver installation.",
        ),
        dev_root: str | None = typer.Option(
            None, envvar="NVIDIA_DEV_ROOT", help="Host prefix of /dev (default: driver root)."
        ),
        pass_device_specs: bool | None = typer.Option(
            None,
            "--pass-device-specs/--no-pass-device-specs",
            envvar="PASS_DEVICE_SPECS",
            help="Return DeviceSpecs from Allocate.",
        ),
        device_list_strategy: str | None = typer.Option(
            None,
            envvar="DEVICE_LIST_STRATEGY",
            help="envvar, volume-mounts, cdi-annotations, cdi-cri (comma-separated).",
        ),
        device_id_strategy: str | None = typer.Option(
            None, envvar="DEVICE_ID_STRATEGY", help="uuid or index."
        ),
        gds_enabled: bool | None = typer.Option(
            None, "--gds-enabled/--no-gds-enabled", envvar="GDS_ENABLED"
        ),
        mofed_enabled: bool | None = typer.Option(
            None, "--mofed-enabled/--no-mofed-enabled", envvar="MOFED_ENABLED"
        ),
        gdrcopy_enabled: bool | None = typer.Option(
            None, "--gdrcopy-enabled/--no-gdrcopy-enabled", envvar="GDRCOPY_ENABLED"
        ),
        cdi_annotation_prefix: str | None = typer.Option(None, envvar="CDI_ANNOTATION_PREFIX"),
        nvidia_cdi_hook_path: str | None = typer.Option(
            None,
            "--nvidia-cdi-hook-path",
            "--nvidia-ctk-path",
            envvar=["NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH"],
            help="Hook binary written into the CDI spec.",
        ),
        container_driver_root: str | None = typer.Option(
            None,
            "--driver-root-ctr-path",
            "--container-driver-root",
            envvar=["DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"],
            help="Where the host driver root is mounted in this container.",
        ),
        mps_root: str | None = typer.Option(
            None, envvar="MPS_ROOT", help="Host MPS root (needed for MPS sharing)."
        ),
        device_discovery_strategy: str | None = typer.Option(
            None, envvar="DEVICE_DISCOVERY_STRATEGY", help="auto, nvml or tegra."
        ),
        shared_devices_allocation_policy: str | None = typer.Option(
            None, envvar="SHARED_DEVICES_ALLOCATION_POLICY", help="distributed or packed."
        ),
        imex_channel_ids: str | None = typer.Option(
            None, envvar="IMEX_CHANNEL_IDS", help="IMEX channels to inject ('' or 0)."
        ),
        imex_required: bool | None = typer.Option(
            None, "--imex-required/--no-imex-required", envvar="IMEX_REQUIRED"
        ),
        kubelet_socket: str | None = typer.Option(
            None,
            envvar="KUBELET_SOCKET",
            help="The kubelet's registration socket; '' serves without registering.",
        ),
        cdi_feature_flags: str | None = typer.Option(None, envvar="CDI_FEATURE_FLAGS"),
        cdi_disable_hooks: bool = typer.Option(
            False, "--cdi-disable-hooks/--cdi-enable-hooks", envvar="CDI_DISABLE_HOOKS"
        ),
        disable_healthchecks: str | None = typer.Option(
            None,
            envvar="DP_DISABLE_HEALTHCHECKS",
            help="'all' (or 'xids'), or XIDs to ignore besides the application XIDs.",
        ),
        enable_healthchecks: str | None = typer.Option(
            None,
            envvar="DP_ENABLE_HEALTHCHECKS",
            help="XIDs (or 'all') that count as fatal even if ignored otherwise.",
        ),
        health_recovery: bool = typer.Option(
            True,
            "--health-recovery/--no-health-recovery",
            envvar="DP_HEALTH_RECOVERY",
            help="Mark a device healthy again once its fault has cleared.",
        ),
        recheck_interval: float = typer.Option(
            1.0, envvar="DP_HEALTH_RECHECK_INTERVAL", help="Seconds between recovery probes."
        ),
        health_port: int = typer.Option(
            0, envvar="DP_HEALTH_PORT", help="Serve GET /health on this port (0: off)."
        ),
        device_plugin_path: Path | None = typer.Option(
            None, envvar="DEVICE_PLUGIN_PATH", help="Socket directory (default: the kubelet's)."
        ),
        cdi_root: Path = typer.Option(Path("/var/run/cdi"), envvar="CDI_ROOT"),
        backend: str = typer.Option("nvml", envvar="DP_BACKEND", help="nvml (real GPUs) or mock."),
        machine: str | None = typer.Option(None, help="Mock machine preset, e.g. dgx-a100."),
        machine_file: Path | None = typer.Option(None, help="Mock machine YAML file."),
        seed: int | None = typer.Option(None, help="Seed for the mock machine."),
        node_name: str | None = typer.Option(None, envvar="NODE_NAME"),
        kubeconfig: Path | None = typer.Option(None, envvar="KUBECONFIG"),
    ) -> None:
        """Advertise the node's GPUs to the kubelet (NVIDIA device plugin)."""
        from gpu_operator.agents.device_plugin import command

        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
        flags = _common_flags(
            mig_strategy,
            fail_on_init_error,
            nvidia_driver_root,
            dev_root,
            mps_root,
            device_discovery_strategy,
        )
        flags.update(
            pass_device_specs=pass_device_specs,
            device_list_strategy=device_list_strategy,
            device_id_strategy=device_id_strategy,
            gds_enabled=gds_enabled,
            mofed_enabled=mofed_enabled,
            gdrcopy_enabled=gdrcopy_enabled,
            cdi_annotation_prefix=cdi_annotation_prefix,
            nvidia_cdi_hook_path=nvidia_cdi_hook_path,
            container_driver_root=container_driver_root,
            shared_devices_allocation_policy=shared_devices_allocation_policy,
            imex_channel_ids=imex_channel_ids,
            imex_required=imex_required,
        )
        opts = command.Options(
            backend=backend,
            machine=machine,
            machine_file=machine_file,
            seed=seed,
            config_file=config_file,
            flags=flags,
            kubelet_socket=kubelet_socket,
            device_plugin_path=device_plugin_path,
            cdi_root=cdi_root,
            cdi_disable_hooks=cdi_disable_hooks,
            cdi_feature_flags=cdi_feature_flags,
            disable_healthchecks=disable_healthchecks,
            enable_healthchecks=enable_healthchecks,
            health_recovery=health_recovery,
            recheck_interval=recheck_interval,
            health_port=health_port,
            node_name=node_name,
            kubeconfig=kubeconfig,
        )
        raise typer.Exit(command.execute(opts))

    @app.command("mps-control-daemon")
    def mps_control_daemon(
        action: str = typer.Argument(
            "run", help="run (the daemons) or mount-shm (prepare <mps root>/shm and exit)."
        ),
        config_file: Path | None = typer.Option(None, envvar="CONFIG_FILE"),
        mig_strategy: str | None = typer.Option(None, envvar="MIG_STRATEGY"),
        fail_on_init_error: bool | None = typer.Option(
            None, "--fail-on-init-error/--no-fail-on-init-error", envvar="FAIL_ON_INIT_ERROR"
        ),
        nvidia_driver_root: str | None = typer.Option(
            None, "--nvidia-driver-root", "--driver-root", envvar="NVIDIA_DRIVER_ROOT"
        ),
        mps_root: str | None = typer.Option(None, envvar="MPS_ROOT"),
        mps_root_view: Path = typer.Option(
            Path("/mps"), help="Where the MPS root is mounted in this container."
        ),
        backend: str = typer.Option("nvml", envvar="DP_BACKEND", help="nvml or mock."),
        machine: str | None = typer.Option(None, help="Mock machine preset."),
        machine_file: Path | None = typer.Option(None, help="Mock machine YAML file."),
        seed: int | None = typer.Option(None),
    ) -> None:
        """Run the MPS control daemons for the resources the config shares with MPS."""
        from gpu_operator.agents.device_plugin import command

        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
        if action not in ("run", "mount-shm"):
            typer.echo(
                f"mps-control-daemon: unknown action {action!r} (run or mount-shm)", err=True
            )
            raise typer.Exit(command.EXIT_USAGE)
        opts = command.Options(
            backend=backend,
            machine=machine,
            machine_file=machine_file,
            seed=seed,
            config_file=config_file,
            flags=_common_flags(
                mig_strategy, fail_on_init_error, nvidia_driver_root, None, mps_root, None
            ),
            kubelet_socket="",
            mps_root_view=mps_root_view,
        )
        raise typer.Exit(command.execute_mps(opts, mount_shm=action == "mount-shm"))
