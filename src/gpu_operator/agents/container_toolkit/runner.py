"""The toolkit agent's life: lock, install, CDI spec, configure the runtime, watch for drift,
and on SIGTERM put the node's runtime config back.

Every step is logged as a sentence (what `kubectl logs` of the toolkit pod shows) and the ones a
node administrator must see are Events on the Node: `RuntimeConfigured`, `RuntimeConfigDrift`
(Warning: our settings were removed or changed behind our back and are re-applied),
`RuntimeConfigRestored`, `RuntimeConfigPartiallyRestored` (Warning), `RuntimeConfigFailed`
(Warning, once per distinct failure).

A file of the node that cannot be read or written (a full or read-only disk, a permission or I/O
error: `hostfile.IoFailure`) is one log line, a `RuntimeConfigFailed` Event and the termination
message (`failure`), and is retried with exponential backoff (`Backoff`), first configuring and
in the drift loop alike; the files stay intact (every write is atomic). After
RUNTIME_CONFIG_IO_TIMEOUT seconds of failures the agent exits 1 with the reason, without an
uninstall (the next pod retries). On SIGTERM the restore is retried the same way within
`restore_budget` seconds; a failed restore keeps the backup for the next pod and exits 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpu_operator import nvml
from gpu_operator.agents import cdi
from gpu_operator.agents.container_toolkit import (
    backup,
    cdi_spec,
    configure,
    containerd,
    crio,
    docker,
    edits,
    hostfile,
    install,
    restart,
)
from gpu_operator.agents.container_toolkit.settings import Settings

log = logging.getLogger("gpu_operator.agents.container_toolkit")

EXIT_OK = 0
EXIT_FAILED = 1
COMPONENT = "nvidia-container-toolkit"
SERVICES = {"containerd": "containerd", "crio": "crio", "docker": "docker"}


class EventSink(Protocol):
    async def event(self, type_: str, reason: str, message: str) -> None: ...


View = Callable[[str], Path]


@dataclass(frozen=True)
class Backoff:
    """Retry delays after an I/O failure: `first`, doubling up to `limit` (seconds)."""

    first: float = 1.0
    limit: float = 30.0

    def after(self, delay: float | None) -> float:
        return self.first if delay is None else min(self.limit, delay * 2)


# How long a restore on SIGTERM keeps retrying I/O failures (within the default 30 s grace).
RESTORE_BUDGET = 20.0


def editor_for(s: Settings) -> edits.Editor:
    """The editor for the configured runtime."""
    handlers = s.handlers()
    if s.runtime == "containerd":
        return containerd.Containerd(
            containerd.Options(
                handlers,
                enable_cdi=s.enable_cdi_in_runtime,
                runtime_type=s.runtime_type,
                annotation_prefixes=s.annotation_prefixes,
                drop_in=s.drop_in_host,
                config=s.config_host,
                source=s.source,
            )
        )
    if s.runtime == "crio":
        return crio.Crio(
            crio.Options(
                handlers,
                mode=s.crio_mode,
                config=s.config_host,
                drop_in=s.drop_in_host or "/etc/crio/crio.conf.d/99-nvidia.conf",
                hook=s.crio_hook,
                runtime_dir=s.runtime_dir,
            )
        )
    return docker.Docker(docker.Options(handlers, s.enable_cdi_in_runtime, s.config_host))


def runtime_files(s: Settings, view: View) -> configure.RuntimeFiles:
    """The runtime's files by role, as this process sees them, and the node's directories the pod
    mounts for them (links are followed and temporary files placed through those)."""
    files = {edits.CONFIG: configure.FileSpec(view(s.config), s.config_host)}
    mounts = [hostfile.Mount(_dir(s.config_host), view(_dir(s.config)))]
    if s.drop_in and s.runtime != "docker":
        host = s.drop_in_host or s.drop_in
        files[edits.DROP_IN] = configure.FileSpec(view(s.drop_in), host)
        mounts.append(hostfile.Mount(_dir(host), view(_dir(s.drop_in))))
    if s.runtime == "crio":
        files[edits.HOOK] = configure.FileSpec(view(s.crio_hook), s.crio_hook)
        mounts.append(hostfile.Mount(_dir(s.crio_hook), view(_dir(s.crio_hook))))
    if s.source:
        files[edits.SOURCE] = configure.FileSpec(view(s.source), s.source)
    return configure.RuntimeFiles(files, mounts)


def _dir(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def restarter_for(s: Settings, view: View) -> restart.Restarter:
    """The restart mode's real implementation (the demo passes its own)."""
    service = SERVICES[s.runtime]
    if s.restart_mode == "none":
        return restart.NoRestart(service)
    if s.restart_mode == "systemd":
        return restart.SystemdRestarter(service, s.host_root)
    return restart.SignalRestarter(service, view(s.socket))


class Agent:
    """One toolkit agent on one node (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        *,
        restarter: restart.Restarter,
        view: View = Path,
        open_nvml: Callable[[], nvml.Nvml] | None = None,
        events: EventSink | None = None,
        stand_ins: bool = False,
        sys_root: Path = Path("/"),
        backoff: Backoff = Backoff(),
        restore_budget: float = RESTORE_BUDGET,
    ) -> None:
        self.s = settings
        self.view = view
        self.restarter = restarter
        self.open_nvml = open_nvml
        self.events = events
        self.stand_ins = stand_ins
        self.sys_root = sys_root
        self.editor = editor_for(settings)
        self.files = runtime_files(settings, view)
        self.store = backup.Store(view(settings.backup_dir), settings.backup_dir)
        self.cdi_path: Path | None = None
        self.cdi_error: str | None = None
        self.configured = False
        self._shut_down = False
        # Why the agent gave up (its exit is non-zero): the container's termination message.
        self.failure: str | None = None
        self.gave_up = False  # exited without an uninstall (CDI spec or I/O failures)
        self.backoff = backoff
        self.restore_budget = restore_budget
        self._io_since: float | None = None  # when the current run of I/O failures began
        self._io_delay: float | None = None
        self._retry_at = 0.0
        self._reported: str | None = None  # the failure last recorded as an Event

    async def _event(self, type_: str, reason: str, message: str) -> None:
        if self.events is None:
            return
        try:
            await self.events.event(type_, reason, message)
        except Exception as err:  # Events are best effort
            log.warning("could not record event %s: %s", reason, err)

    @property
    def ready(self) -> bool:
        return self.configured and (not self.s.cdi_enabled or self.cdi_path is not None)

    # -- steps ----------------------------------------------------------------------------------

    def install(self) -> None:
        s = self.s
        log.info("Installing the NVIDIA container toolkit to %s", s.runtime_dir)
        config = install.RuntimeConfig(
            runtime_dir=s.runtime_dir,
            driver_root=s.driver_root,
            mode=s.runtime_mode,
            cdi_default_kind=s.cdi_default_kind,
            annotation_prefixes=s.annotation_prefixes,
            low_level_runtimes=install.low_level_runtime_paths(s.low_level_runtimes),
            accept_envvar_unprivileged=s.accept_envvar_unprivileged,
            accept_volume_mounts=s.accept_volume_mounts,
            hook_skip_mode_detection=s.hook_skip_mode_detection,
            debug=s.runtime_debug,
            log_level=s.runtime_log_level,
        )
        for line in install.install(self.view(s.root), config, stand_ins=self.stand_ins):
            log.info("%s", line)

    async def _install(self, stop: asyncio.Event) -> bool:
        """Install; an I/O failure (a full or read-only disk under ROOT) is one line, an Event
        `ToolkitInstallFailed` and the termination message, retried with backoff up to
        RUNTIME_CONFIG_IO_TIMEOUT (or until stopped). False when the agent must exit."""
        loop = asyncio.get_running_loop()
        since = loop.time()
        delay: float | None = None
        while True:
            try:
                await asyncio.to_thread(self.install)
            except install.InstallError as err:
                line = str(err)
                self.failure = line
                if err.errno not in hostfile.TRANSIENT:
                    log.error("%s", line)
                    await self._event("Warning", "ToolkitInstallFailed", line)
                    return False
                timeout = self.s.io_timeout
                if timeout > 0 and loop.time() - since >= timeout:
                    self.failure = (
                        f"{line} (failing for {timeout:g} s: exiting; the next pod retries)"
                    )
                    log.error("%s", self.failure)
                    return False
                delay = self.backoff.after(delay)
                log.error("%s; retrying in %gs", line, delay)
                if line != self._reported:
                    self._reported = line
                    await self._event("Warning", "ToolkitInstallFailed", line)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    return False
                continue
            if delay is not None:
                log.info("the toolkit is installed: %s can be written again", self.s.runtime_dir)
                self.failure = self._reported = None
            return True

    def generate_cdi(self) -> bool:
        """Write the management CDI spec; False (with the reason logged once) when it fails."""
        s = self.s
        if not s.cdi_enabled:
            return True
        if self.open_nvml is None:
            self._cdi_failed("no NVML backend")
            return False
        try:
            path, spec = cdi_spec.generate(
                self.open_nvml,
                self.view(s.cdi_output_dir),
                kind=s.cdi_kind,
                driver_root=s.driver_root,
                driver_root_view=self.view(s.driver_root_ctr),
                dev_root=s.dev_root,
                dev_root_view=self.view(s.dev_root_ctr),
                hook_path=f"{s.runtime_dir}/nvidia-cdi-hook",
                sys_root=self.sys_root,
            )
        except (cdi_spec.CdiError, OSError) as err:
            self._cdi_failed(str(err))
            return False
        names = [d["name"] for d in spec["devices"]]
        log.info(
            "wrote the management CDI spec %s/%s: kind %s, devices %s",
            s.cdi_output_dir,
            path.name,
            spec["kind"],
            ", ".join(names) or "none",
        )
        self.cdi_path, self.cdi_error = path, None
        return True

    def _cdi_failed(self, reason: str) -> None:
        if reason != self.cdi_error:
            log.error("cannot generate the management CDI spec: %s (retrying)", reason)
        self.cdi_error = reason
        self.cdi_path = None

    async def configure(self, *, drift: bool = False) -> bool:
        """Apply our settings; restart the runtime when a file changed. False on failure (an
        I/O failure is retried: see `_io_failed`)."""
        try:
            applied = await asyncio.to_thread(
                configure.apply, self.editor, self.files, self.store, self.s.runtime, quick=drift
            )
        except hostfile.IoFailure as err:
            if err.transient:
                await self._io_failed(f"configuring {self.s.runtime} failed: {err}")
                return False
            await self._failed(
                f"configuring {self.s.runtime} failed: {err}", f"{self.s.runtime}: {err}"
            )
            return False
        except (edits.EditError, backup.BackupError) as err:
            await self._failed(
                f"configuring {self.s.runtime} failed: {err}", f"{self.s.runtime}: {err}"
            )
            return False
        self._recovered()
        if applied.unchanged:
            self.configured = True
            return True
        edit = applied.edit
        if not drift:
            log.info("%s: %s", self.s.runtime, edit.summary)
            for line in applied.links:
                log.info("%s", line)
        for note in edit.notes:
            log.warning("%s", note)
        for name in applied.rebased:
            log.warning(
                "%s was changed by somebody else since the toolkit wrote it: its new "
                "content (without the toolkit's settings) is now what uninstall restores",
                name,
            )
        if applied.written:
            for change in edit.changes:
                log.info("%s%s", "drift: " if drift else "", change)
            files = ", ".join(applied.written)
            what = "; ".join(edit.changes) or "rewrote our settings"
            if drift:
                message = f"{files}: {what}; re-applied the toolkit's settings"
                log.warning("runtime config drift in %s: %s", files, what)
                await self._event("Warning", "RuntimeConfigDrift", message)
            else:
                await self._event("Normal", "RuntimeConfigured", f"{files}: {what}")
            await self.restart()
        elif not drift:
            log.info("%s already has the toolkit's settings: nothing to change", self.s.config_host)
        self.configured = True
        return True

    async def _failed(self, line: str, event: str) -> None:
        """A failure: the termination message; logged and an Event once while it stays the same
        (the drift loop meets it at every check)."""
        self.failure = line
        if line != self._reported:
            self._reported = line
            log.error("%s", line)
            await self._event("Warning", "RuntimeConfigFailed", event)

    async def _io_failed(self, line: str) -> None:
        """An I/O failure: one line per attempt (with the next delay), an Event when it is new,
        the termination message, and the next attempt after the backoff delay."""
        now = asyncio.get_running_loop().time()
        if self._io_since is None:
            self._io_since = now
        self._io_delay = self.backoff.after(self._io_delay)
        self._retry_at = now + self._io_delay
        self.failure = line
        log.error("%s; retrying in %gs", line, self._io_delay)
        if line != self._reported:
            self._reported = line
            await self._event("Warning", "RuntimeConfigFailed", line)

    def _recovered(self) -> None:
        if self._io_since is not None:
            log.info("the runtime config can be read and written again")
        self._io_since = self._io_delay = None
        self._reported = None
        self.failure = None

    @property
    def io_failing(self) -> bool:
        return self._io_since is not None

    def _io_given_up(self) -> bool:
        """Whether I/O failures have lasted RUNTIME_CONFIG_IO_TIMEOUT; then the reason is the
        termination message and the agent exits without an uninstall (the next pod retries)."""
        timeout = self.s.io_timeout
        if self._io_since is None or timeout <= 0 or self.failure is None:
            return False
        if asyncio.get_running_loop().time() - self._io_since < timeout:
            return False
        self.failure += f" (failing for {timeout:g} s: exiting; the next pod retries)"
        log.error("%s", self.failure)
        self.gave_up = True
        return True

    async def restart(self) -> None:
        log.info("restarting %s: %s", self.s.runtime, self.restarter.description)
        try:
            await self.restarter.restart()
        except restart.RestartError as err:
            log.error("%s", err)
            await self._event("Warning", "RuntimeRestartFailed", str(err))

    async def restore(self) -> None:
        """Put the node's runtime config back (see `configure.restore`) and tell; I/O failures
        are retried with backoff within `restore_budget` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.restore_budget
        delay: float | None = None
        while True:
            try:
                restored = await asyncio.to_thread(
                    configure.restore, self.editor, self.files, self.store
                )
                break
            except hostfile.IoFailure as err:
                line = f"restoring the runtime config failed: {err}"
                delay = self.backoff.after(delay)
                left = deadline - loop.time()
                if left <= 0 or not err.transient:
                    self.failure = (
                        f"{line}; the backup in {self.store.name} is kept: the next toolkit pod "
                        "restores from it (or copy its .orig files back by hand)"
                    )
                    log.error("%s", self.failure)
                    await self._event("Warning", "RuntimeConfigFailed", self.failure)
                    return
                delay = min(delay, left)
                log.error("%s; retrying in %gs", line, delay)
                if line != self._reported:
                    self._reported = line
                    await self._event("Warning", "RuntimeConfigFailed", line)
                await asyncio.sleep(delay)
            except (edits.EditError, backup.BackupError) as err:
                log.error("restoring the runtime config failed: %s", err)
                await self._event("Warning", "RuntimeConfigFailed", f"restore: {err}")
                return
        for line in restored.exact:
            log.info("%s", line)
        for line in restored.partial:
            log.warning("%s", line)
        if restored.partial:
            await self._event(
                "Warning",
                "RuntimeConfigPartiallyRestored",
                "; ".join(restored.partial + restored.exact),
            )
        elif restored.exact:
            await self._event("Normal", "RuntimeConfigRestored", "; ".join(restored.exact))
        if restored.changed:
            await self.restart()
        else:
            log.info("nothing of the toolkit's was left in the runtime config")

    def remove_cdi(self) -> None:
        if self.cdi_path is not None:
            self.cdi_path.unlink(missing_ok=True)
            log.info("removed the management CDI spec %s", self.cdi_path.name)

    # -- main -----------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, on_ready: Callable[[], None] | None = None) -> int:
        s = self.s
        log.info(
            "Starting the NVIDIA container toolkit agent: runtime %s, root %s", s.runtime, s.root
        )
        for warning in s.warnings:
            log.warning("%s", warning)
        lock = install.PidLock(self.view(s.pid_file))
        try:
            lock.acquire()
        except install.InstallError as err:
            log.error("%s", err)
            self.failure = str(err)
            return EXIT_FAILED
        try:
            if not await self._install(stop):
                return EXIT_FAILED
            self.generate_cdi()
            if s.nri:
                log.info(
                    "ENABLE_NRI_PLUGIN: devices are injected through NRI; the %s config is "
                    "left untouched",
                    s.runtime,
                )
                self.configured = True
            elif not await self.configure() and (not self.io_failing or s.no_daemon):
                return EXIT_FAILED  # a config the toolkit cannot edit: said, nothing written
            if s.no_daemon:
                log.info("NO_DAEMON: configured, exiting without waiting (no restore on exit)")
                return EXIT_OK
            try:
                await self._serve(stop, on_ready)
                if self.gave_up:
                    # Giving up (on the CDI spec, on a disk that stays unwritable) is not an
                    # uninstall: the runtime keeps our handlers, so the next pod finds them in
                    # place and restarts nothing.
                    return EXIT_FAILED
            except asyncio.CancelledError:
                # Cancelled instead of signalled (an event loop shutting down, an in-process pod
                # runner): the node's config must still be put back before we go.
                log.info("Cancelled: restoring the node's runtime config before exiting")
                await self.shutdown()
                raise
            await self.shutdown()
            return EXIT_OK if self.failure is None else EXIT_FAILED
        finally:
            lock.release()

    async def _cdi_given_up(self, missing_since: float | None) -> bool:
        """Whether the CDI spec has been missing for longer than CDI_SPEC_TIMEOUT; sets the
        failure (the termination message) and records a Warning Event when it has.

        Why exit rather than stay unready: an unready container says nothing in the pod's
        status, while an exit puts the reason in its termination message, which `kubectl
        describe` and the ClusterPolicy status quote (upstream's installer exits at once).
        """
        s = self.s
        timeout = s.cdi_spec_timeout
        if not s.cdi_enabled or missing_since is None or timeout <= 0:
            return False
        if asyncio.get_running_loop().time() - missing_since < timeout:
            return False
        self.failure = (
            f"the management CDI spec {spec_file(s)} could not be generated for {timeout:g} s: "
            f"{self.cdi_error or 'unknown error'}; containers of the NVIDIA runtime in CDI mode "
            "fail with unresolvable CDI devices until it is"
        )
        log.error("%s", self.failure)
        await self._event("Warning", "CDISpecGenerationFailed", self.failure)
        self.gave_up = True
        return True

    async def _serve(self, stop: asyncio.Event, on_ready: Callable[[], None] | None) -> None:
        s = self.s
        loop = asyncio.get_running_loop()
        missing_since = None if self.cdi_path is not None else loop.time()
        told = False
        if self.ready and on_ready is not None:
            on_ready()
            told = True
        log.info("Waiting for SIGTERM (checking the runtime config every %gs)", s.drift_interval)
        next_check = self._next_check(loop.time())
        while not stop.is_set():
            wait = next_check - loop.time()
            if s.cdi_enabled and (self.cdi_path is None or not self.ready):
                wait = min(wait, 1.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, wait))
            if stop.is_set():
                break
            if s.cdi_enabled and (self.cdi_path is None or not self.cdi_path.exists()):
                if self.cdi_path is not None:
                    log.warning(
                        "the management CDI spec %s disappeared: writing it again", self.cdi_path
                    )
                if not await asyncio.to_thread(self.generate_cdi):
                    missing_since = loop.time() if missing_since is None else missing_since
                    if await self._cdi_given_up(missing_since):
                        return
            if self.cdi_path is not None:
                missing_since = None
            if not s.nri and loop.time() >= next_check:
                await self.configure(drift=self.configured)
                if self._io_given_up():
                    return
                next_check = self._next_check(loop.time())
            if self.ready and not told and on_ready is not None:
                on_ready()
                told = True
        log.info("Signal received: restoring the node's runtime config")

    def _next_check(self, now: float) -> float:
        """When to look at the runtime config next: after the backoff delay while I/O fails,
        else after the drift interval (none: an hour, to wake up anyway)."""
        if self.io_failing:
            return self._retry_at
        if self.s.nri or not self.s.drift_interval:
            return now + 3600.0
        return now + self.s.drift_interval

    async def shutdown(self) -> None:
        """Restore the runtime config and remove the CDI spec (once)."""
        if self._shut_down:
            return
        self._shut_down = True
        if not self.s.nri:
            await self.restore()
        self.remove_cdi()
        log.info("Shutting down")


def spec_file(s: Settings) -> str:
    return f"{s.cdi_output_dir}/{cdi.spec_file_name(s.cdi_kind, '.yaml')}"
