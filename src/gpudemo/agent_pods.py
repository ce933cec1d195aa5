"""Real node agents in the demo's operand pods: how each one gets its files, its API client, its
signals and its mock GPUs from the pod runner's context."""

from __future__ import annotations

import asyncio
import logging
import os
import posixpath
import signal
from collections.abc import Callable
from pathlib import Path

from gpu_operator import nvml
from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.config_manager import command as cm_command
from gpu_operator.agents.config_manager import files as cm_files
from gpu_operator.agents.config_manager import runner as cm_runner
from gpu_operator.agents.device_plugin import command as dp_command
from gpu_operator.agents.device_plugin import health, mps_daemon
from gpu_operator.agents.device_plugin import manager as dp_manager
from gpu_operator.agents.device_plugin import settings as dp_settings
from gpu_operator.agents.gfd import command as gfd_command
from gpu_operator.agents.gfd import labels as gfd_labels
from gpu_operator.agents.gfd import runner as gfd_runner
from gpu_operator.kube import node_features, node_watch
from gpu_operator.nvml import mock
from kubesim import PodContext
from simhost.processes import ProcessTable

log = logging.getLogger("gpu_operator.demo")

# What the operand containers run as (their argv[0] as the config manager looks for it).
GFD_PROCESS = "gpu-feature-discovery"


class ContainerFiles:
    """The config manager's `Files` view of a container: its paths through its volumeMounts."""

    def __init__(self, ctx: PodContext) -> None:
        self.ctx = ctx

    def path(self, container_path: str) -> Path:
        return self.ctx.path(container_path)


def env_bool(value: str | None) -> bool | None:
    if value is None or not value.strip():
        return None
    return value.strip().lower() in ("1", "true", "yes", "on", "t")


def _env_int(value: str | None, default: int) -> int:
    try:
        return int(value) if value else default
    except ValueError:
        return default


def config_manager_options(env: dict[str, str], oneshot_default: bool) -> cm_command.Options:
    """The config manager's options from a container environment (upstream's env names)."""
    oneshot = env_bool(env.get("ONESHOT"))
    send = env_bool(env.get("SEND_SIGNAL"))
    return cm_command.Options(
        node_name=env.get("NODE_NAME", ""),
        node_label=env.get("NODE_LABEL") or "nvidia.com/device-plugin.config",
        config_file_srcdir=env.get("CONFIG_FILE_SRCDIR", ""),
        config_file_dst=env.get("CONFIG_FILE_DST", ""),
        default_config=env.get("DEFAULT_CONFIG", ""),
        fallback_strategies=env.get("FALLBACK_STRATEGIES", ""),
        oneshot=oneshot_default if oneshot is None else oneshot,
        send_signal=True if send is None else send,
        signal=_env_int(env.get("SIGNAL"), int(signal.SIGHUP)),
        process_to_signal=env.get("PROCESS_TO_SIGNAL") or "nvidia-device-plugin",
        # kubesim rewrites mounted ConfigMaps at once, so a short re-check shows edits quickly.
        recheck_interval=float(env.get("CONFIG_RECHECK_INTERVAL") or 1.0),
    )


async def config_manager(ctx: PodContext, processes: ProcessTable) -> int:
    """The real config-manager agent (init or sidecar) on this pod's volumes and node."""
    options = config_manager_options(ctx.env, oneshot_default=ctx.init)
    try:
        settings = cm_command.build_settings(options)
    except cm_command.UsageError as err:
        log.error("config-manager: %s", err)
        return cm_command.EXIT_USAGE
    if not ctx.init:
        ctx.set_ready(True)  # the sidecar has no readiness probe: ready once started
    api = node_features.client(ctx.kubeconfig_path)
    events = node_watch.NodeEvents(api, ctx.node_name, ctx.namespace, "config-manager")
    manager = cm_runner.ConfigManager(
        settings, ContainerFiles(ctx), processes.signaller(ctx.pod), events
    )
    try:
        labels = node_watch.label_values(api, ctx.node_name, settings.node_label)
        return await manager.run(labels, ctx.stopping)
    finally:
        await api.close()


def resolve_config(ctx: PodContext, container_path: str | None) -> Path | None:
    """Where the operand's config file is on this machine now (None: no file configured;
    `/dev/null` when the config manager chose the empty config, as in the container).
    Resolved again on every reload, since the config manager swaps the symlink."""
    if not container_path:
        return None
    parent, name = posixpath.split(container_path)
    try:
        link = ctx.path(parent or "/") / name
        if link.is_symlink() and os.readlink(link) == cm_files.EMPTY_TARGET:
            return Path(cm_files.EMPTY_TARGET)  # the host's /dev/null reads the same
        return ctx.path(container_path)
    except FileNotFoundError as err:
        log.warning("config file %s is not reachable: %s", container_path, err)
        return None


class _ReadyAfterFirstWrite:
    """A GFD sink that marks the container ready once labels have been written."""

    def __init__(self, inner: node_features.NodeLabelWriter, on_write: Callable[[], None]) -> None:
        self.inner = inner
        self.on_write = on_write

    async def write(self, labels: gfd_labels.Labels) -> None:
        await self.inner.write(labels)
        self.on_write()

    async def remove(self) -> None:
        await self.inner.remove()


async def gpu_feature_discovery(
    ctx: PodContext, machine: mock.MockMachine | None, processes: ProcessTable
) -> int:
    """The real GFD agent, writing node labels with this node's mock GPUs and the config file
    the config manager chose (SIGHUP from the sidecar reloads it)."""
    if machine is None:
        log.warning("GFD pod on %s, which has no mock GPUs", ctx.node_name)
        await ctx.stopping.wait()
        return 0
    env = ctx.env
    config_name = env.get("GFD_CONFIG_FILE") or env.get("CONFIG_FILE")
    options = gfd_command.Options(
        backend="mock",
        config_file=resolve_config(ctx, config_name),
        mig_strategy=env.get("GFD_MIG_STRATEGY") or env.get("MIG_STRATEGY"),
        sleep_interval=env.get("GFD_SLEEP_INTERVAL"),
        oneshot=env_bool(env.get("GFD_ONESHOT")),
        no_timestamp=env_bool(env.get("GFD_NO_TIMESTAMP")),
        fail_on_init_error=env_bool(env.get("GFD_FAIL_ON_INIT_ERROR")),
        node_labels=True,
        node_name=ctx.node_name,
    )
    try:
        settings = gfd_command.build_settings(options)
    except pc.ConfigError as err:
        log.error("gpu-feature-discovery: %s", err)
        return gfd_command.EXIT_USAGE
    settings.machine_type = machine.spec.product_name or "unknown"
    reload = asyncio.Event()

    def on_signal(signum: int) -> None:
        if signum == signal.SIGHUP:
            settings.config_path = resolve_config(ctx, config_name)
            reload.set()
        else:
            ctx.stopping.set()  # GFD exits on any other signal

    api = node_features.client(ctx.kubeconfig_path)
    sink = _ReadyAfterFirstWrite(
        node_features.NodeLabelWriter(api, ctx.node_name), lambda: ctx.set_ready(True)
    )
    try:
        with processes.running(ctx.pod, GFD_PROCESS, on_signal):
            await gfd_runner.run(
                machine.nvml,
                sink,
                settings,
                stop=ctx.stopping,
                reload=reload,
                install_signals=False,
            )
    except pc.ConfigError as err:  # a reload found a bad file (the config manager checks first)
        log.error("gpu-feature-discovery: %s", err)
        return gfd_command.EXIT_USAGE
    finally:
        await api.close()
    return 0


# ----- the device plugin and the MPS control daemon -----------------------------------------

PLUGIN_PROCESS = "nvidia-device-plugin"
MPS_PROCESS = "/usr/bin/mps-control-daemon"
PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
# Where the driver container installs the driver on the host (the plugin's /driver-root).
DRIVER_ROOT = "/run/nvidia/driver"
# Upstream's environment variables -> the option each sets (as `gpu-operator agent
# device-plugin` reads them); booleans are parsed like the CLI does.
PLUGIN_ENV: dict[str, str] = {
    "MIG_STRATEGY": "mig_strategy",
    "FAIL_ON_INIT_ERROR": "fail_on_init_error",
    "NVIDIA_DRIVER_ROOT": "nvidia_driver_root",
    "NVIDIA_DEV_ROOT": "dev_root",
    "MPS_ROOT": "mps_root",
    "DEVICE_DISCOVERY_STRATEGY": "device_discovery_strategy",
    "PASS_DEVICE_SPECS": "pass_device_specs",
    "DEVICE_LIST_STRATEGY": "device_list_strategy",
    "DEVICE_ID_STRATEGY": "device_id_strategy",
    "GDS_ENABLED": "gds_enabled",
    "MOFED_ENABLED": "mofed_enabled",
    "GDRCOPY_ENABLED": "gdrcopy_enabled",
    "CDI_ANNOTATION_PREFIX": "cdi_annotation_prefix",
    "NVIDIA_CDI_HOOK_PATH": "nvidia_cdi_hook_path",
    "NVIDIA_CTK_PATH": "nvidia_cdi_hook_path",
    "DRIVER_ROOT_CTR_PATH": "container_driver_root",
    "CONTAINER_DRIVER_ROOT": "container_driver_root",
    "SHARED_DEVICES_ALLOCATION_POLICY": "shared_devices_allocation_policy",
    "IMEX_CHANNEL_IDS": "imex_channel_ids",
    "IMEX_REQUIRED": "imex_required",
}
BOOLEAN_OPTIONS = frozenset(
    {
        "fail_on_init_error",
        "pass_device_specs",
        "gds_enabled",
        "mofed_enabled",
        "gdrcopy_enabled",
        "imex_required",
    }
)


def plugin_flags(env: dict[str, str]) -> dict[str, object]:
    """The device plugin's options from a container environment (unset ones left out)."""
    flags: dict[str, object] = {}
    for name, option in PLUGIN_ENV.items():
        if name not in env or option in flags:
            continue
        value = env[name]
        flags[option] = env_bool(value) if option in BOOLEAN_OPTIONS else value
    return {k: v for k, v in flags.items() if v is not None}


def plugin_settings(
    ctx: PodContext, config_name: str | None, *, serves_kubelet: bool = True
) -> dp_settings.Settings:
    """The plugin's settings with every node path mapped into this pod's volumes (the
    privileged container sees the host's /dev and /sys: the node's root). The MPS control
    daemon (`serves_kubelet=False`) mounts only the MPS root; it registers nothing and reads
    the driver root from the host."""
    env = ctx.env
    node_root = ctx.node_root
    if serves_kubelet:
        plugin_dir = ctx.path(PLUGIN_DIR)
        kubelet: Path | None = plugin_dir / "kubelet.sock"
        cdi_root = ctx.path("/var/run/cdi")
        driver_root = ctx.path("/driver-root")
    else:
        plugin_dir = ctx.host_path(PLUGIN_DIR)
        kubelet = None
        cdi_root = ctx.host_path("/var/run/cdi")
        driver_root = ctx.host_path(DRIVER_ROOT)
    return dp_settings.build(
        resolve_config(ctx, config_name),
        plugin_flags(env),
        kubelet_socket=kubelet,
        plugin_dir=plugin_dir,
        cdi_root=cdi_root,
        driver_root_view=driver_root,
        dev_root_view=node_root,
        sys_root=node_root,
        proc_root=node_root,
        mps_root_view=ctx.path("/mps"),
        health_policy=health.parse_policy(env.get(health.DISABLE_ENV), env.get(health.ENABLE_ENV)),
    )


def _reloader(
    ctx: PodContext,
    settings: dp_settings.Settings,
    config_name: str | None,
    reload: asyncio.Event,
    stop: asyncio.Event,
) -> Callable[[int], None]:
    """What SIGHUP (reload the config the symlink now names) and other signals do."""

    def on_signal(signum: int) -> None:
        if signum == signal.SIGHUP:
            settings.config_path = resolve_config(ctx, config_name)
            reload.set()
        else:
            stop.set()

    return on_signal


async def device_plugin(
    ctx: PodContext,
    machine: mock.MockMachine | None,
    processes: ProcessTable,
    on_serving: Callable[[], None],
) -> int:
    """The real device-plugin agent on this node's mock GPUs, registering with the node's
    kubelet through the pod's `device-plugin` hostPath; `on_serving` runs once it serves."""
    config_name = ctx.env.get("CONFIG_FILE")
    try:
        settings = plugin_settings(ctx, config_name)
    except pc.ConfigError as err:
        log.error("nvidia-device-plugin: %s", err)
        return dp_command.EXIT_USAGE
    if machine is None:
        open_nvml: Callable[[], nvml.Nvml] = _no_driver
    else:
        open_nvml = machine.nvml
    api = node_features.client(ctx.kubeconfig_path)
    events = node_watch.NodeEvents(api, ctx.node_name, ctx.namespace, dp_manager.COMPONENT)
    plugin = dp_manager.Manager(settings, open_nvml, events=events)
    reload, stop = asyncio.Event(), asyncio.Event()

    async def report_serving() -> None:
        await plugin.state.serving.wait()
        ctx.set_ready(True)
        on_serving()

    async def follow_pod() -> None:
        await ctx.stopping.wait()
        stop.set()

    helpers = [asyncio.ensure_future(report_serving()), asyncio.ensure_future(follow_pod())]
    try:
        with processes.running(ctx.pod, PLUGIN_PROCESS, _reloader(ctx, settings, config_name,
                                                                 reload, stop)):  # fmt: skip
            await plugin.run(stop=stop, reload=reload, install_signals=False)
    except (dp_manager.InitFailed, dp_manager.FatalError) as err:
        # The plugin's own logger, so the line is in `kubectl logs` (this module's is not), and
        # the reason in the pod status too (`kubectl describe`, the ClusterPolicy status).
        dp_manager.log.error("nvidia-device-plugin: %s", err)
        ctx.write_termination_message(f"nvidia-device-plugin: {err}\n")
        return dp_command.EXIT_FAILED
    finally:
        for helper in helpers:
            helper.cancel()
        await api.close()
    return 0


def _no_driver() -> nvml.Nvml:
    raise nvml.LibraryNotFound("no NVIDIA GPUs on this simulated node")


async def mps_control_daemon(
    ctx: PodContext, machine: mock.MockMachine | None, processes: ProcessTable
) -> int:
    """The MPS control daemon agent (simulated daemons: no MPS server runs on mock GPUs)."""
    if ctx.init:
        await mps_daemon.mount_shm(ctx.path("/mps"), simulated=True)
        return 0
    config_name = ctx.env.get("CONFIG_FILE")
    try:
        settings = plugin_settings(ctx, config_name, serves_kubelet=False)
    except pc.ConfigError as err:
        log.error("mps-control-daemon: %s", err)
        return dp_command.EXIT_USAGE
    open_nvml: Callable[[], nvml.Nvml] = _no_driver if machine is None else machine.nvml
    reload, stop = asyncio.Event(), asyncio.Event()
    ctx.set_ready(True)

    async def follow_pod() -> None:
        await ctx.stopping.wait()
        stop.set()

    helper = asyncio.ensure_future(follow_pod())
    try:
        with processes.running(ctx.pod, MPS_PROCESS, _reloader(ctx, settings, config_name,
                                                              reload, stop)):  # fmt: skip
            await mps_daemon.run(
                settings, open_nvml, simulated=True, stop=stop, reload=reload,
                install_signals=False,
            )  # fmt: skip
    except (mps_daemon.DaemonError, nvml.NvmlError) as err:
        log.error("mps-control-daemon: %s", err)
        return dp_command.EXIT_FAILED
    except pc.ConfigError as err:
        log.error("mps-control-daemon: %s", err)
        return dp_command.EXIT_USAGE
    finally:
        helper.cancel()
    return 0


# ----- the GPU DRA kubelet plugin (a GPUCluster's kubelet-plugin DaemonSet) -------------------


async def dra_kubelet_plugin(ctx: PodContext, machine: mock.MockMachine | None) -> int:
    """Our GPU DRA kubelet plugin (`gpu-operator agent dra-kubelet-plugin`) in the `gpus`
    container, on this node's mock GPUs: it reaches the kubelet's plugin directories, the CDI
    directory and the driver root through the pod's hostPath mounts, reads FEATURE_GATES and
    KUBELET_*_DIRECTORY_PATH as NVIDIA's plugin does, and is ready once the kubelet registered
    it (its slices are published before it serves)."""
    from gpu_operator.agents.dra_kubelet_plugin import gpuconfig
    from gpu_operator.agents.dra_kubelet_plugin import plugin as dra_plugin
    from gpu_operator.kube.resource_slices import SliceApi

    env = ctx.env
    if machine is None:
        log.error("gpu-kubelet-plugin: no NVIDIA GPUs on %s", ctx.node_name)
        ctx.write_termination_message("gpu-kubelet-plugin: no NVIDIA GPUs on this node\n")
        return dp_command.EXIT_FAILED
    try:
        gates = gpuconfig.parse_gates(env.get("FEATURE_GATES", ""))
    except gpuconfig.ConfigError as err:
        dra_plugin.log.error("gpu-kubelet-plugin: %s", err)
        ctx.write_termination_message(f"gpu-kubelet-plugin: {err}\n")
        return dp_command.EXIT_USAGE
    plugins = env.get("KUBELET_PLUGINS_DIRECTORY_PATH") or f"{dra_plugin.KUBELET_ROOT}/plugins"
    kubelet_root = posixpath.dirname(plugins.rstrip("/"))
    node_root = ctx.node_root
    settings = dra_plugin.Settings(
        node_name=ctx.node_name,
        kubelet_root_view=ctx.path(plugins).parent,
        kubelet_root=kubelet_root,
        cdi_root=ctx.path(env.get("CDI_ROOT") or "/var/run/cdi"),
        driver_root_view=ctx.path("/driver-root"),
        dev_root_view=node_root,
        sys_root=node_root,
        proc_root=node_root,
        gates=gates,
        health_policy=health.parse_policy(env.get(health.DISABLE_ENV), env.get(health.ENABLE_ENV)),
        rescan_interval=1.0,
    )
    api = node_features.client(ctx.kubeconfig_path)
    plugin = dra_plugin.Plugin(
        settings, machine.nvml, SliceApi(api, ctx.node_name, "gpu.nvidia.com"), simulated=True
    )

    async def report_registered() -> None:
        await plugin.registered.wait()
        ctx.set_ready(True)

    helper = asyncio.ensure_future(report_registered())
    try:
        await plugin.run(ctx.stopping)
    except dra_plugin.StartError as err:
        dra_plugin.log.error("gpu-kubelet-plugin: %s", err)
        ctx.write_termination_message(f"gpu-kubelet-plugin: {err}\n")
        return dp_command.EXIT_FAILED
    finally:
        helper.cancel()
        await api.close()
    return 0
