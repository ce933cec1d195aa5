"""The plugin's main loop: discover devices, start one server per resource, restart when needed.

Restarts all plugins when the kubelet re-creates `kubelet.sock` (a kubelet restart forgets every
registration), on SIGHUP (config reload; a bad file keeps the running plugins) and 30 s after a
failed start. SIGTERM/SIGINT stop the servers and remove their sockets. With `failOnInitError`
false a node without working NVML idles instead of exiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpu_operator import nvml
from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.device_plugin import allocate as alloc
from gpu_operator.agents.device_plugin import cdi, devices, facts, mps
from gpu_operator.agents.device_plugin.monitor import HealthChange, HealthMonitor
from gpu_operator.agents.device_plugin.server import PluginServer, StartError
from gpu_operator.agents.device_plugin.settings import Settings

log = logging.getLogger("gpu_operator.agents.device_plugin")

COMPONENT = "nvidia-device-plugin"


class InitFailed(RuntimeError):
    """NVML could not be initialised and failOnInitError is set."""


class FatalError(RuntimeError):
    """Devices do not fit the configuration (upstream exits; so do we)."""


class EventSink(Protocol):
    async def event(self, type_: str, reason: str, message: str) -> None: ...


@dataclass
class State:
    """What the running plugin looks like (for tests, the health endpoint and the bench)."""

    servers: list[PluginServer] = field(default_factory=list)
    monitor: HealthMonitor | None = None
    resources: tuple[devices.Resource, ...] = ()
    idle_reason: str | None = None
    # Why the last start failed (the manager retries), None after a clean start.
    last_error: str | None = None
    starts: int = 0
    serving: asyncio.Event = field(default_factory=asyncio.Event)


def _socket_identity(path: Path | None) -> tuple[int, int, int] | None:
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def _present(root: Path, paths: tuple[str, ...]) -> list[str]:
    return [p for p in paths if (root / p.lstrip("/")).exists()]


class Manager:
    """Runs the plugins of one node until stopped."""

    def __init__(
        self,
        settings: Settings,
        open_nvml: Callable[[], nvml.Nvml],
        *,
        events: EventSink | None = None,
    ) -> None:
        self.settings = settings
        self.open_nvml = open_nvml
        self.events = events
        self.state = State()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Physical devices the monitor reported unhealthy (new servers start with this).
        self._unhealthy: set[str] = set()
        self._generation = 0

    # -- discovery -------------------------------------------------------------------------

    def discover(self) -> facts.NodeFacts:
        """NVML facts of the node (InitFailed when NVML does not come up)."""
        s = self.settings
        try:
            lib = self.open_nvml()
            lib.init()
        except nvml.NvmlError as err:
            raise InitFailed(f"failed to initialize NVML: {err}") from err
        try:
            return facts.collect(
                lib, driver_root=s.driver_root_view, sys_root=s.sys_root, proc_root=s.proc_root
            )
        except nvml.NvmlError as err:
            # A GPU NVML cannot describe fails the start like an NVML that does not come up
            # (failOnInitError decides), instead of escaping as an unexplained crash.
            raise InitFailed(f"failed to read the GPUs from NVML: {err}") from err
        finally:
            with contextlib.suppress(nvml.NvmlError):
                lib.shutdown()

    def _imex_channels(self) -> list[str]:
        config = self.settings.config
        wanted = [str(c) for c in config.imex.channel_ids]
        channels = self.settings.dev_root_view / cdi.IMEX_CHANNEL_DIR.lstrip("/")
        present = [c for c in wanted if (channels / f"channel{c}").exists()]
        missing = sorted(set(wanted) - set(present))
        if missing and config.imex.required:
            raise StartError(f"IMEX channels {missing} are required but not present")
        return present

    def _write_cdi(self, node: facts.NodeFacts, control: list[str]) -> set[str]:
        s = self.settings
        flags = s.config.flags
        extra: set[str] = set()
        dev_root = flags.nvidia_dev_root or flags.nvidia_driver_root
        spec = cdi.gpu_spec(
            node,
            id_strategy=flags.plugin.device_id_strategy,
            dev_root=dev_root,
            driver_root=flags.nvidia_driver_root,
            present_control_nodes=control,
            driver_files=cdi.find_driver_files(s.driver_root_view),
            hook_path=flags.plugin.nvidia_ctk_path,
            hooks=not s.cdi_disable_hooks,
        )
        cdi.write_spec(s.cdi_root, "gpu", spec)
        for cdi_class, enabled in (
            ("gds", flags.gds_enabled),
            ("mofed", flags.mofed_enabled),
            ("gdrcopy", flags.gdrcopy_enabled),
        ):
            if not enabled:
                continue
            nodes = cdi.find_nodes(s.dev_root_view, cdi.EXTRA_CLASS_NODES[cdi_class])
            if nodes:
                cdi.write_spec(s.cdi_root, cdi_class, cdi.extra_spec(cdi_class, nodes, dev_root))
                extra.add(cdi_class)
        channels = [str(c) for c in s.config.imex.channel_ids]
        if channels:
            cdi.write_spec(s.cdi_root, "imex-channel", cdi.imex_spec(channels, dev_root))
        log.info("wrote CDI specs to %s", s.cdi_root)
        return extra

    # -- starting and stopping -------------------------------------------------------------

    async def start_plugins(self) -> bool:
        """Start everything; True when a plugin failed to start (retry later)."""
        s = self.settings
        config = s.config
        self.state.starts += 1
        discovery = config.flags.device_discovery_strategy
        if discovery not in ("auto", "nvml"):
            raise FatalError(
                f"deviceDiscoveryStrategy {discovery!r} is not supported here (auto or nvml)"
            )
        node = await asyncio.to_thread(self.discover)
        try:
            resources = devices.build_resources(node, config)
        except devices.DeviceError as err:
            raise FatalError(f"error building the device list: {err}") from err
        self.state.resources = resources
        if not resources:
            self.state.idle_reason = "no devices found"
            log.info("No devices found. Waiting indefinitely.")
            self.state.serving.set()
            return False
        control = _present(s.dev_root_view, alloc.CONTROL_DEVICE_NODES)
        extra: set[str] = set()
        if any(x in alloc.CDI_STRATEGIES for x in config.flags.plugin.device_list_strategy):
            extra = await asyncio.to_thread(self._write_cdi, node, control)
        failed = False
        try:
            channels = self._imex_channels()
        except StartError as err:
            log.error("%s", err)
            self.state.last_error = str(err)
            return True
        # Health first, so a fault while the servers start is not lost.
        self._unhealthy.clear()
        self._generation += 1
        monitor = HealthMonitor(
            self.open_nvml,
            [d for r in resources for d in r.devices],
            s.health_policy,
            functools.partial(self._on_health_thread, self._generation),
            recheck_interval=s.recheck_interval,
            recovery=s.health_recovery,
        )
        self.state.monitor = monitor
        monitor.start()
        for resource in resources:
            if resource.sharing is pc.SharingStrategy.MPS:
                if not config.flags.mps_root:
                    raise FatalError("flags.mpsRoot (MPS_ROOT) must be set to share GPUs with MPS")
                try:
                    await mps.wait_ready(
                        s.mps_root_view,
                        resource.name,
                        config,
                        timeout=s.mps_wait_timeout,
                        interval=s.mps_poll_interval,
                    )
                except mps.ControlError as err:
                    log.error("could not start %s: %s", resource.name, err)
                    self.state.last_error = str(err)
                    failed = True
                    continue
            options = alloc.AllocateOptions.from_config(
                config,
                resource,
                present_control_nodes=control,
                cdi_extra_classes=extra,
                imex_channels=channels,
            )
            server = PluginServer(
                resource,
                options,
                plugin_dir=s.plugin_dir,
                kubelet_socket=s.kubelet_socket,
                links=node.links,
                allocation_policy=config.flags.plugin.shared_devices_allocation_policy,
            )
            await server.set_health(self._unhealthy, False)
            try:
                await server.start()
            except StartError as err:
                log.error("could not start the plugin for %s: %s", resource.name, err)
                self.state.last_error = str(err)
                failed = True
                continue
            self.state.servers.append(server)
        self.state.idle_reason = None
        if not failed:
            self.state.last_error = None
        if not failed:
            self.state.serving.set()
        return failed

    async def stop_plugins(self) -> None:
        self.state.serving.clear()
        if self.state.monitor is not None:
            self.state.monitor.stop()
            self.state.monitor = None
        servers, self.state.servers = self.state.servers, []
        for server in servers:
            await server.stop()
        if servers:
            log.info("stopped %d plugin(s)", len(servers))

    # -- health ----------------------------------------------------------------------------

    def _on_health_thread(self, generation: int, changes: list[HealthChange]) -> None:
        # Called on the monitor thread: hop onto the event loop at once.
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._schedule, generation, changes)

    def _schedule(self, generation: int, changes: list[HealthChange]) -> None:
        if generation != self._generation:
            return  # a monitor of plugins that have been restarted since
        task = asyncio.ensure_future(self.apply_health(changes))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def apply_health(self, changes: list[HealthChange]) -> None:
        """Forward health changes to every plugin serving the devices, and to the node's Events."""
        for change in changes:
            if change.healthy:
                self._unhealthy.discard(change.uuid)
            else:
                self._unhealthy.add(change.uuid)
            for server in self.state.servers:
                if await server.set_health([change.uuid], change.healthy):
                    log.info(
                        "health changed resource=%s device=%s healthy=%s reason=%r",
                        server.resource.name,
                        change.uuid,
                        change.healthy,
                        change.reason,
                    )
        if self.events is None:
            return
        for change in changes:
            # From the resources being served, not the servers: a fault can arrive while a
            # server registers and before it joins `state.servers`.
            names = sorted(
                {
                    r.name
                    for r in self.state.resources
                    if any(d.uuid == change.uuid for d in r.devices)
                }
            ) or ["(no resource)"]
            if change.healthy:
                await self.events.event(
                    "Normal",
                    "GPUHealthy",
                    f"{', '.join(names)} device {change.uuid} is healthy again: {change.reason}",
                )
            else:
                await self.events.event(
                    "Warning",
                    "GPUUnhealthy",
                    f"{', '.join(names)} device {change.uuid} is unhealthy: {change.reason}",
                )

    # -- the loop --------------------------------------------------------------------------

    async def _event(self, type_: str, reason: str, message: str) -> None:
        if self.events is not None:
            await self.events.event(type_, reason, message)

    async def run(
        self,
        *,
        stop: asyncio.Event | None = None,
        reload: asyncio.Event | None = None,
        install_signals: bool = True,
    ) -> None:
        """Serve until `stop` (or SIGTERM/SIGINT). Raises InitFailed or FatalError."""
        self._loop = asyncio.get_running_loop()
        stop = stop or asyncio.Event()
        reload = reload or asyncio.Event()
        handled: list[signal.Signals] = []
        if install_signals:
            for sig, ev in (
                (signal.SIGTERM, stop),
                (signal.SIGINT, stop),
                (signal.SIGQUIT, stop),
                (signal.SIGHUP, reload),
            ):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    self._loop.add_signal_handler(sig, ev.set)
                    handled.append(sig)
        # Starting can block (waiting for an MPS daemon, dialling the kubelet): a stop request
        # cancels it rather than waiting for it.
        serve = asyncio.ensure_future(self._serve(stop, reload))
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({serve, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not serve.done():
                serve.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await serve
            else:
                serve.result()
        finally:
            stopping.cancel()
            await self.stop_plugins()
            for task in list(self._tasks):
                task.cancel()
            for sig in handled:
                self._loop.remove_signal_handler(sig)

    async def _serve(self, stop: asyncio.Event, reload: asyncio.Event) -> None:
        s = self.settings
        loop = asyncio.get_running_loop()
        restart = True
        retry_at: float | None = None
        kubelet: tuple[int, int, int] | None = None
        while not stop.is_set():
            if restart:
                kubelet = _socket_identity(s.kubelet_socket)
                retry_at = None
                try:
                    if await self.start_plugins():
                        log.info("Failed to start one or more plugins. Retrying in %.0fs...",
                                 s.retry_interval)  # fmt: skip
                        retry_at = loop.time() + s.retry_interval
                except InitFailed as err:
                    if s.config.flags.fail_on_init_error:
                        raise
                    self.state.idle_reason = str(err)
                    log.warning("%s; failOnInitError is false: waiting indefinitely", err)
                    self.state.serving.set()
            why = await self._wait(stop, reload, kubelet, retry_at)
            if why is None:
                return
            restart = True
            if why == "reload":
                reload.clear()
                log.info("Received SIGHUP: reloading the configuration")
                try:
                    s.reload()
                except pc.ConfigError as err:
                    log.error("keeping the running configuration: %s", err)
                    await self._event("Warning", "DevicePluginConfigInvalid",
                                      f"keeping the running configuration: {err}")  # fmt: skip
                    restart = False
                    continue
            log.info("restarting plugins: %s", why)
            await self.stop_plugins()

    async def _wait(
        self,
        stop: asyncio.Event,
        reload: asyncio.Event,
        kubelet: tuple[int, int, int] | None,
        deadline: float | None,
    ) -> str | None:
        """Block until a reason to restart ('reload', 'kubelet', 'retry'); None when stopping."""
        loop = asyncio.get_running_loop()
        poll = self.settings.kubelet_poll_interval
        while True:
            if stop.is_set():
                return None
            if reload.is_set():
                return "reload"
            current = _socket_identity(self.settings.kubelet_socket)
            if current is not None and current != kubelet:
                log.info("%s created, restarting", self.settings.kubelet_socket)
                return "kubelet"
            kubelet = current if current is None else kubelet
            if deadline is not None and loop.time() >= deadline:
                return "retry"
            timeout = poll if deadline is None else max(0.0, min(poll, deadline - loop.time()))
            waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(reload.wait())]
            _, pending = await asyncio.wait(
                waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            for w in pending:
                w.cancel()
