"""The `gpu-operator agent dcgm-exporter` command: dcgm-exporter's flags and environment variables,
plus the backend options a simulated node needs."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# podresources.DEFAULT_SOCKET, spelled out so `gpu-operator --help` does not import gRPC.
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


def register(app: typer.Typer) -> None:
    """Add the exporter command to the `agent` command group."""

    @app.command("dcgm-exporter")
    def dcgm_exporter(
        collectors: str = typer.Option(
            "/etc/dcgm-exporter/default-counters.csv",
            "-f",
            "--collectors",
            envvar="DCGM_EXPORTER_COLLECTORS",
            help="Counters CSV (field, Prometheus type, help); built-in defaults if absent.",
        ),
        address: str = typer.Option(
            ":9400", "-a", "--address", envvar="DCGM_EXPORTER_LISTEN", help="[HOST]:PORT."
        ),
        collect_interval: int = typer.Option(
            30000,
            "-c",
            "--collect-interval",
            envvar="DCGM_EXPORTER_INTERVAL",
            help="Milliseconds between collections.",
        ),
        kubernetes: bool = typer.Option(
            False,
            "-k",
            "--kubernetes",
            envvar="DCGM_EXPORTER_KUBERNETES",
            help="Attribute GPUs to pods (kubelet pod-resources API).",
        ),
        kubernetes_gpu_id_type: str = typer.Option(
            "uid", envvar="DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE", help="uid or device-name."
        ),
        devices: str = typer.Option(
            "f", "-d", "--devices", envvar="DCGM_EXPORTER_DEVICES_STR", help="Only f (default)."
        ),
        use_old_namespace: bool = typer.Option(
            False,
            "-o",
            "--use-old-namespace",
            envvar="DCGM_EXPORTER_USE_OLD_NAMESPACE",
            help="Labels uuid, pod_name, pod_namespace, container_name.",
        ),
        no_hostname: bool = typer.Option(
            False, "--no-hostname", envvar="DCGM_EXPORTER_NO_HOSTNAME", help="No host label."
        ),
        hostname_label: str = typer.Option(
            "Hostname",
            envvar="DCGM_EXPORTER_HOSTNAME_LABEL",
            help="Name of the host label (dcgm-exporter 4.6+ writes hostname).",
        ),
        replace_blanks_in_model_name: bool = typer.Option(
            False,
            "--replace-blanks-in-model-name",
            envvar="DCGM_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME",
        ),
        kubernetes_virtual_gpus: bool = typer.Option(
            False,
            "--kubernetes-virtual-gpus",
            envvar="KUBERNETES_VIRTUAL_GPUS",
            help="Label shared GPUs' samples with vgpu=<replica>.",
        ),
        resource_names: str = typer.Option(
            "", envvar="NVIDIA_RESOURCE_NAMES", help="More GPU resource names, comma-separated."
        ),
        pod_resources_socket: str = typer.Option(
            POD_RESOURCES_SOCKET,
            "--pod-resources-kubelet-socket",
            envvar="DCGM_POD_RESOURCES_KUBELET_SOCKET",
        ),
        pod_resources_refresh: float = typer.Option(
            5.0, help="Seconds between pod-resources List calls (never on the scrape path)."
        ),
        remote_hostengine_info: str | None = typer.Option(
            None,
            "-r",
            "--remote-hostengine-info",
            envvar="DCGM_REMOTE_HOSTENGINE_INFO",
            help="Accepted and ignored: NVML is read directly.",
        ),
        enable_pod_labels: bool = typer.Option(
            False,
            "--kubernetes-enable-pod-labels",
            envvar="DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS",
        ),
        enable_pod_uid: bool = typer.Option(
            False, "--kubernetes-enable-pod-uid", envvar="DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID"
        ),
        node_name: str | None = typer.Option(None, envvar="NODE_NAME"),
        debug: bool = typer.Option(False, "--debug", envvar="DCGM_EXPORTER_DEBUG"),
        backend: str = typer.Option("nvml", help="nvml (real GPUs) or mock."),
        machine: str | None = typer.Option(None, help="Mock machine preset, e.g. dgx-a100."),
        machine_file: Path | None = typer.Option(None, help="Mock machine YAML file."),
        seed: int | None = typer.Option(None, help="Seed for the mock machine."),
    ) -> None:
        """Export GPU metrics for Prometheus (dcgm-exporter compatible)."""
        from gpu_operator.agents.dcgm_exporter import command

        logging.basicConfig(level=logging.DEBUG if debug else logging.INFO, format=LOG_FORMAT)
        opts = command.Options(
            collectors=collectors,
            listen=address,
            interval_ms=collect_interval,
            kubernetes=kubernetes,
            kubernetes_gpu_id_type=kubernetes_gpu_id_type,
            devices=devices,
            use_old_namespace=use_old_namespace,
            no_hostname=no_hostname,
            hostname_label=hostname_label,
            replace_blanks_in_model_name=replace_blanks_in_model_name,
            virtual_gpus=kubernetes_virtual_gpus,
            resource_names=tuple(n.strip() for n in resource_names.split(",") if n.strip()),
            pod_resources_socket=pod_resources_socket,
            pod_resources_refresh=pod_resources_refresh,
            remote_hostengine=remote_hostengine_info,
            node_name=node_name,
            enable_pod_labels=enable_pod_labels,
            enable_pod_uid=enable_pod_uid,
            backend=backend,
            machine=machine,
            machine_file=machine_file,
            seed=seed,
        )
        raise typer.Exit(command.execute(opts))
