"""Wire the MIG manager from upstream's flags and env: the config source (a file, or a config
generated from the node's GPUs with the default file as fallback), GPUs, host, API, then the loop.

Errors the user can fix (no node name, unreadable config, unknown machine) exit 2 with one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpu_operator import nvml
from gpu_operator.agents import mock_backend
from gpu_operator.agents.mig_manager import config as cfg
from gpu_operator.agents.mig_manager import generate, readiness, reconfigure, retry, runner
from gpu_operator.agents.mig_manager import gpus as gpus_mod
from gpu_operator.agents.mig_manager import host as host_mod
from gpu_operator.api import keys

log = logging.getLogger("gpu_operator.agents.mig_manager")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
GENERATED_CONFIG_FILE = "/etc/nvidia-mig-manager/generated-config.yaml"


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit status 2."""


@dataclass
class Options:
    """The command line and environment, with upstream's names and defaults."""

    node_name: str = ""
    config_file: str = ""
    default_config_file: str = ""
    generated_config_file: str = GENERATED_CONFIG_FILE
    gpu_clients_file: str = ""
    host_root_mount: str = "/host"
    host_nvidia_dir: str = "/usr/local/nvidia"
    host_mig_manager_state_file: str = (
        "/etc/systemd/system/nvidia-mig-manager.service.d/override.conf"
    )
    host_kubelet_systemd_service: str = "kubelet.service"
    with_reboot: bool = False
    with_shutdown_host_gpu_clients: bool = False
    default_gpu_clients_namespace: str = "default"
    cdi_enabled: bool = False
    pod_name: str = ""
    pod_namespace: str = ""
    kubeconfig: str | None = None
    clients_timeout: float = 300.0
    # Where the driver container's ready marker is (ours): while a containerised driver is not
    # ready the GPUs are left alone, and its return triggers a retry ('' or missing: not seen).
    validations_dir: str = "/run/nvidia/validations"
    backend: str = "nvml"
    machine: str | None = None
    machine_file: Path | None = None
    seed: int | None = None
    # Where this container sees the driver root (NVML is loaded from there first).
    driver_root_ctr_path: str = "/run/nvidia/driver"


def read_gpu_clients(path: str) -> list[str]:
    """The host systemd services of the GPU clients file (`systemd-services:`); none without one."""
    if not path:
        return []
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise UsageError(f"{path}: cannot read the GPU clients file: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise UsageError(f"{path}: not valid YAML: {err}") from None
    if data is None:
        return []
    services = data.get("systemd-services") or [] if isinstance(data, dict) else None
    if not isinstance(services, list) or not all(isinstance(s, str) for s in services):
        raise UsageError(f"{path}: systemd-services: expected a list of service names")
    return services


@dataclass
class ConfigSource:
    """Where configs come from: a loader (re-read on each change) and, if generated, its text."""

    load: Callable[[], cfg.MigConfigFile]
    generated: str | None = None
    origin: str = ""


def config_source(o: Options, gpus: gpus_mod.Gpus) -> ConfigSource:
    """CONFIG_FILE if given; else generated from the profiles the GPUs report; else (no MIG
    GPU, or a driver that reports no profiles) DEFAULT_CONFIG_FILE, as upstream falls back."""
    if o.config_file:
        path = Path(o.config_file)
        cfg.load(path)  # fail early: a bad file is a usage error at start
        return ConfigSource(lambda: cfg.load(path), origin=str(path))
    tables = gpus.profiles()
    document: dict[str, Any] | None = None
    if tables:
        try:
            document = generate.generate(tables)
        except generate.GenerationError as err:
            log.warning("cannot generate a MIG config from the GPUs (%s)", err)
    if document is not None:
        text = generate.to_yaml(document)
        parsed = cfg.parse(document, "generated config")
        if o.generated_config_file:
            try:
                target = Path(o.generated_config_file)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
            except OSError as err:
                log.warning("could not write %s: %s", o.generated_config_file, err)
        return ConfigSource(lambda: parsed, text, "generated from this node's GPUs")
    if o.default_config_file and Path(o.default_config_file).is_file():
        why = "no MIG-capable GPU found" if not tables else "no generated config"
        log.info("%s; using %s", why, o.default_config_file)
        path = Path(o.default_config_file)
        cfg.load(path)
        return ConfigSource(lambda: cfg.load(path), origin=str(path))
    raise UsageError(
        "no MIG config: CONFIG_FILE is not set, "
        + (
            "the GPUs report no MIG profiles to generate one from"
            if tables
            else "this node has no MIG-capable GPU to generate one from"
        )
        + ", and DEFAULT_CONFIG_FILE is not a file"
    )


def settings_for(o: Options) -> reconfigure.Settings:
    return reconfigure.Settings(
        clients_namespace=o.default_gpu_clients_namespace,
        with_reboot=o.with_reboot,
        with_shutdown_host_gpu_clients=o.with_shutdown_host_gpu_clients,
        host_gpu_client_services=read_gpu_clients(o.gpu_clients_file),
        host_kubelet_service=o.host_kubelet_systemd_service,
        clients_timeout=o.clients_timeout,
    )


async def serve(
    o: Options,
    *,
    open_nvml: Callable[[], nvml.Nvml],
    host: host_mod.Host,
    api: Any,
    stop: asyncio.Event,
    on_idle: Callable[[], None] = lambda: None,
    poll_interval: float = 1.0,
) -> None:
    """Run the manager for one node with the given GPUs, host and `mig_node.NodeApi`."""
    gpus = gpus_mod.Gpus(open_nvml, host)
    marker = readiness.DriverMarker(o.validations_dir)
    source = await _wait_for_config_source(o, gpus, marker, stop, poll_interval)
    if source is None:
        return  # stopped while waiting for the driver
    log.info("MIG configs: %s", source.origin)
    if source.generated is not None and o.pod_name and o.pod_namespace:
        try:
            await api.publish_config(o.pod_namespace, o.pod_name, source.generated)
            log.info("published the generated config as %s-mig-config", o.node_name)
        except Exception as err:  # upstream only warns: the file is what the manager uses
            log.warning("could not publish %s-mig-config: %s", o.node_name, err)
    settings = settings_for(o)
    settings.poll_interval = poll_interval
    reconfigurer = reconfigure.Reconfigurer(
        api, gpus, source.load, settings, driver_marker=marker.present
    )
    await runner.run(
        reconfigurer,
        api.label_values(keys.MIG_CONFIG),
        stop=stop,
        on_idle=on_idle,
        driver_ready=marker.changes(poll_interval),
    )


async def _wait_for_config_source(
    o: Options,
    gpus: gpus_mod.Gpus,
    marker: readiness.DriverMarker,
    stop: asyncio.Event,
    poll_interval: float,
) -> ConfigSource | None:
    """`config_source`, tried again while the driver it reads the GPUs through is missing (a
    manager started while the driver pod is replaced); None when stopped meanwhile."""
    loop = asyncio.get_running_loop()
    backoff = retry.Backoff()
    attempt = 0
    while True:
        try:
            return await asyncio.to_thread(config_source, o, gpus)
        except nvml.NvmlError as err:
            if not retry.transient_code(err.code):
                raise
            attempt += 1
            delay = backoff.delay(attempt)
            log.warning(
                "cannot read the GPUs for the MIG configs yet (%s); retrying in %.0fs, or as "
                "soon as the driver container is ready",
                err,
                delay,
            )
        end = loop.time() + delay
        was = marker.present()
        while loop.time() < end:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), min(poll_interval, end - loop.time()))
            if stop.is_set():
                return None
            now = marker.present()
            if now and was is False:
                break
            was = now


def open_backend(o: Options) -> tuple[Callable[[], nvml.Nvml], host_mod.Host]:
    """The NVML factory and host for `--backend nvml` (this node) or `mock` (a simulated one)."""
    root = Path(o.host_root_mount)
    if o.backend == "mock":
        try:
            machine = mock_backend.machine(o.machine, o.machine_file, o.seed)
        except mock_backend.MachineChoiceError as err:
            raise UsageError(str(err)) from None
        host = host_mod.MockHost(
            machine, root if root.is_dir() else None, o.host_mig_manager_state_file
        )
        return machine.nvml, host
    if o.backend == "nvml":
        if o.machine is not None or o.machine_file is not None:
            raise UsageError("--machine and --machine-file need --backend mock")
        from gpu_operator.nvml import real

        opener = real.opener([o.driver_root_ctr_path, root])
        return opener, host_mod.NodeHost(root, o.host_mig_manager_state_file)
    raise UsageError(f"--backend: unknown backend {o.backend!r} (expected nvml or mock)")


def execute(o: Options) -> int:
    """Run the MIG manager for `o`; returns the process exit status."""
    if not o.node_name:
        print("mig-manager: NODE_NAME (--node-name) must not be empty", file=sys.stderr)
        return EXIT_USAGE
    try:
        open_nvml, host = open_backend(o)
        read_gpu_clients(o.gpu_clients_file)
        if o.config_file:
            cfg.load(o.config_file)
    except (UsageError, cfg.ConfigError) as err:
        print(f"mig-manager: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        asyncio.run(_main(o, open_nvml, host))
    except (UsageError, cfg.ConfigError) as err:
        print(f"mig-manager: {err}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as err:
        log.debug("mig-manager failed", exc_info=True)
        print(f"mig-manager: {type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


async def _main(o: Options, open_nvml: Callable[[], nvml.Nvml], host: host_mod.Host) -> None:
    from gpu_operator.kube import mig_node, node_watch

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    namespace = o.pod_namespace or node_watch.own_namespace(o.default_gpu_clients_namespace)
    api = mig_node.NodeApi(mig_node.connect(o.kubeconfig), o.node_name, namespace)
    try:
        await serve(o, open_nvml=open_nvml, host=host, api=api, stop=stop)
    finally:
        await api.close()
