"""The MPS control daemon agent (`gpu-operator agent mps-control-daemon`).

For every resource the config shares with MPS it starts a control daemon (real GPUs: exclusive
compute mode, `nvidia-cuda-mps-control -d`, then the per-GPU pinned-memory and active-thread
defaults; mock GPUs: `mps.SimulatedControl`), marks the resource `.started`, and when all are up
writes `.ready` holding the `sharing.mps` config they run: the plugin serves MPS resources only
after that. SIGHUP restarts the daemons with the reloaded config; SIGTERM quits them and removes
`.ready`. Without MPS sharing it idles, as upstream does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpu_operator import nvml
from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.device_plugin import devices, facts, mps
from gpu_operator.agents.device_plugin.settings import Settings

log = logging.getLogger("gpu_operator.agents.mps")


class DaemonError(RuntimeError):
    """A control daemon could not be started or configured."""


async def _run(*argv: str, env: dict[str, str] | None = None) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise DaemonError(f"{' '.join(argv)} exited {proc.returncode}: {out.decode().strip()}")


@dataclass
class Daemon:
    """One MPS control daemon: its pipe/log directories are `<root>/<name>/{pipe,log}`, it runs
    on `uuids` (exclusive compute mode while it runs) and gets `commands` once started. The
    device plugin runs one per MPS-shared resource (`for_resource`); the DRA kubelet plugin one
    per MPS-shared claim."""

    name: str
    uuids: list[str]
    commands: list[str]
    root: Path
    simulated: bool
    control: mps.SimulatedControl | None = None

    @classmethod
    def for_resource(cls, resource: devices.Resource, root: Path, simulated: bool) -> Daemon:
        return cls(
            name=resource.name,
            uuids=list(dict.fromkeys(d.uuid for d in resource.devices)),
            commands=mps.configure_commands(resource),
            root=root,
            simulated=simulated,
        )

    async def start(self) -> None:
        name = self.name
        mps.pipe_dir(self.root, name).mkdir(parents=True, exist_ok=True)
        mps.log_dir(self.root, name).mkdir(parents=True, exist_ok=True)
        if self.simulated:
            log.info("starting simulated MPS control daemon resource=%s", name)
            self.control = mps.SimulatedControl(self.root, name)
            await self.control.start()
        else:
            await self._compute_mode("EXCLUSIVE_PROCESS")
            log.info("starting MPS control daemon resource=%s", name)
            await _run(mps.CONTROL_BINARY, "-d", env=mps._env(self.root, name))
        for command in self.commands:
            if self.control is not None:
                self.control.answer(command)
            else:
                try:
                    await mps.ask(self.root, name, command)
                except mps.ControlError as err:
                    raise DaemonError(f"{command}: {err}") from None
        mps.started_file(self.root, name).touch()

    async def stop(self) -> None:
        name = self.name
        with contextlib.suppress(FileNotFoundError):
            mps.started_file(self.root, name).unlink()
        if self.control is not None:
            self.control.answer("quit")
            await self.control.stop()
            self.control = None
        elif not self.simulated:
            with contextlib.suppress(mps.ControlError):
                await mps.ask(self.root, name, "quit")
            with contextlib.suppress(DaemonError, OSError):
                await self._compute_mode("DEFAULT")
        log.info("stopped MPS control daemon resource=%s", name)

    async def _compute_mode(self, mode: str) -> None:
        for uuid in self.uuids:
            await _run("nvidia-smi", "-i", uuid, "-c", mode)


def mps_resources(node: facts.NodeFacts, config: pc.PluginConfig) -> list[devices.Resource]:
    """The resources the config shares with MPS (DeviceError for MIG devices)."""
    return [r for r in devices.build_resources(node, config) if r.sharing is pc.SharingStrategy.MPS]


async def mount_shm(root: Path, *, simulated: bool) -> None:
    """The init step: a fresh 64 MiB tmpfs at `<root>/shm` (simulated: just the directory)."""
    shm = mps.shm_dir(root)
    shm.mkdir(parents=True, exist_ok=True)
    if simulated:
        log.info("simulated: %s is a plain directory, not a tmpfs", shm)
        return
    with contextlib.suppress(DaemonError):
        await _run("umount", str(shm))
    options = "rw,nosuid,nodev,noexec,relatime,size=65536k"
    await _run("mount", "-t", "tmpfs", "-o", options, "shm", str(shm))


async def unmount_shm(shm: Path, *, simulated: bool) -> None:
    """Undo `mount_shm` (a DRA claim's shm directory when the claim is unprepared)."""
    if not simulated:
        with contextlib.suppress(DaemonError, OSError):
            await _run("umount", str(shm))


async def run(
    settings: Settings,
    open_nvml: Callable[[], nvml.Nvml],
    *,
    simulated: bool,
    stop: asyncio.Event | None = None,
    reload: asyncio.Event | None = None,
    install_signals: bool = True,
    started: Callable[[list[Daemon]], None] | None = None,
) -> None:
    """Run the daemons until stopped; DaemonError/DeviceError/ConfigError end it."""
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    reload = reload or asyncio.Event()
    handled: list[signal.Signals] = []
    if install_signals:
        for sig, ev in ((signal.SIGTERM, stop), (signal.SIGINT, stop), (signal.SIGHUP, reload)):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, ev.set)
                handled.append(sig)
    root = settings.mps_root_view
    daemons: list[Daemon] = []
    try:
        while not stop.is_set():
            node = await _discover(settings, open_nvml)
            resources = mps_resources(node, settings.config) if node is not None else []
            if not resources:
                log.info("No devices are configured for MPS sharing; waiting indefinitely.")
            for resource in resources:
                daemon = Daemon.for_resource(resource, root, simulated)
                daemons.append(daemon)
                await daemon.start()
            if resources:
                mps.write_ready(root, settings.config)
                log.info("MPS daemons ready resources=%s", [r.name for r in resources])
            if started is not None:
                started(daemons)
            waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(reload.wait())]
            _, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for w in pending:
                w.cancel()
            mps.remove_ready(root)
            for daemon in daemons:
                await daemon.stop()
            daemons = []
            if reload.is_set() and not stop.is_set():
                reload.clear()
                log.info("Received SIGHUP, restarting.")
                settings.reload()
    finally:
        mps.remove_ready(root)
        for daemon in daemons:
            await daemon.stop()
        for sig in handled:
            loop.remove_signal_handler(sig)


async def _discover(
    settings: Settings, open_nvml: Callable[[], nvml.Nvml]
) -> facts.NodeFacts | None:
    def read() -> facts.NodeFacts | None:
        try:
            lib = open_nvml()
            lib.init()
        except nvml.NvmlError as err:
            if settings.config.flags.fail_on_init_error:
                raise
            log.warning("NVML init failed (%s); no MPS daemons", err)
            return None
        try:
            return facts.collect(
                lib,
                driver_root=settings.driver_root_view,
                sys_root=settings.sys_root,
                proc_root=settings.proc_root,
            )
        finally:
            with contextlib.suppress(nvml.NvmlError):
                lib.shutdown()

    return await asyncio.to_thread(read)
