"""Wire the device plugin and the MPS control daemon from command-line options.

Errors the user can fix (bad config, unknown machine) exit 2 with one line; NVML failures with
`failOnInitError` and device layouts the config rejects exit 1, as upstream's plugin exits.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_operator import nvml
from gpu_operator.agents import mock_backend
from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.device_plugin import devices, endpoint, health, manager, mps_daemon
from gpu_operator.agents.device_plugin import settings as dp_settings

log = logging.getLogger("gpu_operator.agents.device_plugin")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit status 2."""


@dataclass
class Options:
    """The command line as given; None means "not set", so the config file decides."""

    backend: str = "nvml"
    machine: str | None = None
    machine_file: Path | None = None
    seed: int | None = None
    config_file: Path | None = None
    # Upstream flags that map onto config keys (see settings.OVERRIDES).
    flags: dict[str, Any] = field(default_factory=dict)
    kubelet_socket: str | None = None
    device_plugin_path: Path | None = None
    cdi_root: Path = dp_settings.DEFAULT_CDI_ROOT
    sys_root: Path = Path("/")
    mps_root_view: Path = dp_settings.MPS_CONTAINER_ROOT
    cdi_disable_hooks: bool = False
    cdi_feature_flags: str | None = None
    disable_healthchecks: str | None = None
    enable_healthchecks: str | None = None
    health_recovery: bool = True
    recheck_interval: float = 1.0
    retry_interval: float = dp_settings.RETRY_INTERVAL
    health_port: int = 0
    node_name: str | None = None
    kubeconfig: Path | None = None


def build_settings(o: Options) -> dp_settings.Settings:
    """The effective settings (file + env + flags); ConfigError names the bad key."""
    if o.kubelet_socket == "":
        kubelet: Path | None = None
        plugin_dir = o.device_plugin_path or dp_settings.DEFAULT_PLUGIN_DIR
    else:
        kubelet = Path(o.kubelet_socket) if o.kubelet_socket else dp_settings.DEFAULT_KUBELET_SOCKET
        plugin_dir = o.device_plugin_path or kubelet.parent
    if o.cdi_feature_flags:
        log.info("CDI_FEATURE_FLAGS=%s: no CDI feature flags are implemented", o.cdi_feature_flags)
    s = dp_settings.build(
        o.config_file,
        o.flags,
        kubelet_socket=kubelet,
        plugin_dir=plugin_dir,
        cdi_root=o.cdi_root,
        sys_root=o.sys_root,
        mps_root_view=o.mps_root_view,
        health_policy=health.parse_policy(o.disable_healthchecks, o.enable_healthchecks),
        health_recovery=o.health_recovery,
        recheck_interval=o.recheck_interval,
        retry_interval=o.retry_interval,
        cdi_disable_hooks=o.cdi_disable_hooks,
    )
    s.driver_root_view = Path(s.config.flags.plugin.container_driver_root)
    s.dev_root_view = Path(s.config.flags.nvidia_dev_root or s.config.flags.nvidia_driver_root)
    if o.backend == "nvml" and not s.driver_root_view.exists():
        # Outside the plugin's pod the driver is where the config says it is on this host.
        s.driver_root_view = Path(s.config.flags.nvidia_driver_root)
    return s


def open_backend(o: Options, s: dp_settings.Settings | None = None) -> Callable[[], nvml.Nvml]:
    """A factory for the chosen NVML backend (real NVML loads from the driver root first)."""
    if o.backend == "mock":
        try:
            machine = mock_backend.machine(o.machine, o.machine_file, o.seed)
        except mock_backend.MachineChoiceError as err:
            raise UsageError(str(err)) from None
        return machine.nvml
    if o.backend == "nvml":
        if o.machine is not None or o.machine_file is not None:
            raise UsageError("--machine and --machine-file need --backend mock")
        from gpu_operator.nvml import real

        return real.opener(s.driver_root_view if s is not None else None)
    raise UsageError(f"--backend: unknown backend {o.backend!r} (expected nvml or mock)")


def node_events(o: Options, component: str) -> manager.EventSink | None:
    """Events on the node when NODE_NAME is known and a cluster is reachable; else None."""
    if not o.node_name:
        return None
    from gpu_operator.kube import client, node_watch

    try:
        api = client.connect(str(o.kubeconfig) if o.kubeconfig else None)
    except client.ConnectError as err:
        log.warning("no node Events: %s", err)
        return None
    return node_watch.NodeEvents(api, o.node_name, node_watch.own_namespace(), component)


async def _serve(o: Options, s: dp_settings.Settings, open_nvml: Callable[[], nvml.Nvml]) -> None:
    m = manager.Manager(s, open_nvml, events=node_events(o, manager.COMPONENT))
    server = await endpoint.serve(m, o.health_port) if o.health_port else None
    try:
        await m.run()
    finally:
        if server is not None:
            server.close()


def execute(o: Options) -> int:
    """Run the device plugin for `o`; returns the process exit status."""
    try:
        s = build_settings(o)
        open_nvml = open_backend(o, s)
    except (UsageError, pc.ConfigError) as err:
        print(f"nvidia-device-plugin: {err}", file=sys.stderr)
        return EXIT_USAGE
    log.info(
        "starting config=%s kubelet_socket=%s plugin_dir=%s",
        o.config_file,
        s.kubelet_socket,
        s.plugin_dir,
    )
    log.info("running with config:\n%s", s.config.model_dump_json(by_alias=True, indent=2))
    try:
        asyncio.run(_serve(o, s, open_nvml))
    except (manager.InitFailed, manager.FatalError) as err:
        print(f"nvidia-device-plugin: {err}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def execute_mps(o: Options, *, mount_shm: bool = False) -> int:
    """Run the MPS control daemon (or, with `mount_shm`, only prepare `<root>/shm`)."""
    simulated = o.backend == "mock"
    if mount_shm:
        try:
            asyncio.run(mps_daemon.mount_shm(o.mps_root_view, simulated=simulated))
        except mps_daemon.DaemonError as err:
            print(f"mps-control-daemon: {err}", file=sys.stderr)
            return EXIT_FAILED
        return EXIT_OK
    try:
        s = build_settings(o)
        open_nvml = open_backend(o, s)
    except (UsageError, pc.ConfigError) as err:
        print(f"mps-control-daemon: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        asyncio.run(mps_daemon.run(s, open_nvml, simulated=simulated))
    except (mps_daemon.DaemonError, devices.DeviceError, nvml.NvmlError) as err:
        print(f"mps-control-daemon: {err}", file=sys.stderr)
        return EXIT_FAILED
    except pc.ConfigError as err:
        print(f"mps-control-daemon: {err}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK
