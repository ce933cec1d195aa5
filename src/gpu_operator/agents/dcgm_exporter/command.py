"""Wire the exporter from upstream's flags and environment variables, then serve until stopped.

Names follow dcgm-exporter (`DCGM_EXPORTER_COLLECTORS`, `DCGM_EXPORTER_LISTEN`,
`DCGM_EXPORTER_INTERVAL` in milliseconds, `DCGM_EXPORTER_KUBERNETES`, `NODE_NAME`, ...), so the
operator's DaemonSet runs it unchanged. Bad input (an unparseable counters file, a bad listen
address, an unknown device selector) exits 2 with one line; NVML failing to start exits 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gpu_operator import http_endpoint, nvml
from gpu_operator.agents import mock_backend
from gpu_operator.agents.dcgm_exporter import collector as collector_mod
from gpu_operator.agents.dcgm_exporter import counters as counters_mod
from gpu_operator.agents.dcgm_exporter import exposition, podresources, server

log = logging.getLogger("gpu_operator.agents.dcgm_exporter")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
# Upstream's image default; when it is absent we fall back to the built-in default counters.
DEFAULT_COUNTERS_PATH = "/etc/dcgm-exporter/default-counters.csv"
POD_LABELS_ENV = "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS"
POD_UID_ENV = "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID"


class UsageError(Exception):
    """Bad input from the user: one line, exit status 2."""


@dataclass
class Options:
    """The command line and environment as given."""

    collectors: str = DEFAULT_COUNTERS_PATH
    listen: str = ":9400"
    interval_ms: int = 30000
    kubernetes: bool = False
    kubernetes_gpu_id_type: str = "uid"
    devices: str = "f"
    use_old_namespace: bool = False
    no_hostname: bool = False
    hostname_label: str = "Hostname"
    replace_blanks_in_model_name: bool = False
    virtual_gpus: bool = False
    resource_names: tuple[str, ...] = ()
    pod_resources_socket: str = podresources.DEFAULT_SOCKET
    pod_resources_refresh: float = 5.0
    remote_hostengine: str | None = None
    node_name: str | None = None
    enable_pod_labels: bool = False
    enable_pod_uid: bool = False
    backend: str = "nvml"
    machine: str | None = None
    machine_file: Path | None = None
    seed: int | None = None


def hostname(o: Options) -> str:
    """The host label's value: NODE_NAME in a pod (as upstream), else this machine's name."""
    if o.no_hostname:
        return ""
    return o.node_name or socket.gethostname()


def counters_path(o: Options) -> Path | None:
    """The counters file to read; None means the built-in defaults. The image's own files
    (/etc/dcgm-exporter/default-counters.csv, and dcp-metrics-included.csv, which the GPU
    Operator's DaemonSet names) do not exist outside the image: the shipped copies stand in."""
    path = Path(o.collectors)
    if path.exists():
        return path
    if o.collectors == DEFAULT_COUNTERS_PATH:
        return None
    name = counters_mod.shipped(o.collectors)
    if name is not None:
        return Path(str(resources.files("gpu_operator.agents.dcgm_exporter").joinpath(name)))
    return path


def build_settings(o: Options) -> collector_mod.Settings:
    """Validate the options into collector settings; UsageError names the bad one."""
    if o.interval_ms <= 0:
        raise UsageError(f"collect interval {o.interval_ms} ms: must be positive")
    if o.devices not in ("f", "flex"):
        raise UsageError(
            f"devices {o.devices!r}: only the default 'f' (GPUs, and GPU instances of MIG GPUs)"
            " is supported"
        )
    if o.kubernetes_gpu_id_type not in ("uid", "device-name"):
        raise UsageError(
            f"kubernetes-gpu-id-type {o.kubernetes_gpu_id_type!r}: expected uid or device-name"
        )
    try:
        server.parse_listen(o.listen)
    except ValueError as err:
        raise UsageError(str(err)) from None
    options = exposition.Options(
        hostname=hostname(o),
        hostname_label=o.hostname_label,
        old_namespace=o.use_old_namespace,
        replace_blanks_in_model_name=o.replace_blanks_in_model_name,
        virtual_gpus=o.virtual_gpus,
    )
    return collector_mod.Settings(
        counters_path=counters_path(o),
        interval=o.interval_ms / 1000.0,
        options=options,
        extra_resources=o.resource_names,
    )


def open_backend(o: Options) -> Callable[[], nvml.Nvml]:
    if o.backend == "mock":
        try:
            return mock_backend.machine(o.machine, o.machine_file, o.seed).nvml
        except mock_backend.MachineChoiceError as err:
            raise UsageError(str(err)) from None
    if o.backend == "nvml":
        if o.machine is not None or o.machine_file is not None:
            raise UsageError("--machine and --machine-file need --backend mock")
        from gpu_operator.nvml import real

        return real.RealNvml
    raise UsageError(f"--backend: unknown backend {o.backend!r} (expected nvml or mock)")


def build_collector(o: Options, open_nvml: Callable[[], nvml.Nvml]) -> collector_mod.Collector:
    """The collector for `o` (counters read now: CsvError for a bad file)."""
    settings = build_settings(o)
    mapper = None
    if o.kubernetes:
        client = podresources.Client(o.pod_resources_socket)
        mapper = podresources.PodMapper(
            client.list,
            interval=o.pod_resources_refresh,
            socket_path=o.pod_resources_socket,
            close=client.close,
        )
    return collector_mod.Collector(open_nvml, settings, mapper)


def log_ignored(o: Options) -> None:
    """Say once which upstream settings have no effect here."""
    if o.remote_hostengine:
        log.info(
            "DCGM_REMOTE_HOSTENGINE_INFO=%s ignored: this exporter reads NVML directly",
            o.remote_hostengine,
        )
    if o.enable_pod_labels or o.enable_pod_uid:
        log.warning(
            "pod labels and pod UIDs (%s, %s) are not implemented; only pod, namespace and "
            "container are attached",
            POD_LABELS_ENV, POD_UID_ENV,
        )  # fmt: skip


async def serve(
    collector: collector_mod.Collector,
    listen: str,
    stop: asyncio.Event,
    *,
    install_signals: bool = True,
    serving: asyncio.Event | None = None,
) -> None:
    """Start collecting, listen on `listen`, and run until `stop` (SIGTERM/SIGINT set it);
    `serving` is set once the port is open."""
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    if install_signals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
                handled.append(sig)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, collector.reload)
            handled.append(signal.SIGHUP)
    host, port = server.parse_listen(listen)
    listener: http_endpoint.Endpoint | None = None
    collector.start()
    try:
        task = asyncio.create_task(collector.run(stop))
        # The first text is ready before the port opens: no scrape sees an empty body.
        await collector.attempted.wait()
        listener = await server.start(collector, host, port)
        log.info("serving GPU metrics on %s:%d (/metrics, /health)", host, port)
        if serving is not None:
            serving.set()
        await task
    finally:
        if listener is not None:
            listener.close()
            await listener.wait_closed()
        collector.stop()
        for sig in handled:
            loop.remove_signal_handler(sig)


def execute(o: Options) -> int:
    """Run the exporter for `o`; returns the process exit status."""
    try:
        open_nvml = open_backend(o)
        collector = build_collector(o, open_nvml)
    except (UsageError, counters_mod.CsvError) as err:
        print(f"dcgm-exporter: {err}", file=sys.stderr)
        return EXIT_USAGE
    log_ignored(o)
    try:
        asyncio.run(serve(collector, o.listen, asyncio.Event()))
    except nvml.NvmlError as err:
        print(f"dcgm-exporter: NVML: {err}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as err:
        print(f"dcgm-exporter: cannot listen on {o.listen}: {err}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
