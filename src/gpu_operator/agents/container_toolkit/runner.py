"""The toolkit agent's life: lock, install, CDI spec, configure the runtime, watch for drift,
and on SIGTERM put the node's runtime config back.

Every step is logged as a sentence (what `kubectl logs` of the toolkit pod shows) and the ones a
node administrator must see are Events on the Node: `RuntimeConfigured`, `RuntimeConfigDrift`
(Warning: our settings were removed or changed behind our back and are re-applied),
`RuntimeConfigRestored`, `RuntimeConfigPartiallyRestored` (Warning), `RuntimeConfigFailed`
(Warning).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
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
    """The runtime's files by role, as this process sees them."""
    files = {edits.CONFIG: configure.FileSpec(view(s.config), s.config_host)}
    if s.drop_in and s.runtime != "docker":
        files[edits.DROP_IN] = configure.FileSpec(view(s.drop_in), s.drop_in_host or s.drop_in)
    if s.runtime == "crio":
        files[edits.HOOK] = configure.FileSpec(view(s.crio_hook), s.crio_hook)
    if s.source:
        files[edits.SOURCE] = configure.FileSpec(view(s.source), s.source)
    return configure.RuntimeFiles(files)


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
        """Apply our settings; restart the runtime when a file changed. False on failure."""
        try:
            applied = await asyncio.to_thread(
                configure.apply, self.editor, self.files, self.store, self.s.runtime
            )
        except (edits.EditError, backup.BackupError) as err:
            log.error("configuring %s failed: %s", self.s.runtime, err)
            self.failure = f"configuring {self.s.runtime} failed: {err}"
            await self._event("Warning", "RuntimeConfigFailed", f"{self.s.runtime}: {err}")
            return False
        edit = applied.edit
        if not drift:
            log.info("%s: %s", self.s.runtime, edit.summary)
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

    async def restart(self) -> None:
        log.info("restarting %s: %s", self.s.runtime, self.restarter.description)
        try:
            await self.restarter.restart()
        except restart.RestartError as err:
            log.error("%s", err)
            await self._event("Warning", "RuntimeRestartFailed", str(err))

    async def restore(self) -> None:
        """Put the node's runtime config back (see `configure.restore`) and tell."""
        try:
            restored = await asyncio.to_thread(
                configure.restore, self.editor, self.files, self.store
            )
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
            self.install()
        except install.InstallError as err:
            log.error("%s", err)
            self.failure = str(err)
            return EXIT_FAILED
        try:
            self.generate_cdi()
            if s.nri:
                log.info(
                    "ENABLE_NRI_PLUGIN: devices are injected through NRI; the %s config is "
                    "left untouched",
                    s.runtime,
                )
                self.configured = True
            elif not await self.configure():
                return EXIT_FAILED
            if s.no_daemon:
                log.info("NO_DAEMON: configured, exiting without waiting (no restore on exit)")
                return EXIT_OK
            try:
                await self._serve(stop, on_ready)
                if self.failure is not None:
                    # Giving up on the CDI spec is not an uninstall: the runtime keeps our
                    # handlers, so the next pod finds them in place and restarts nothing.
                    return EXIT_FAILED
            except asyncio.CancelledError:
                # Cancelled instead of signalled (an event loop shutting down, an in-process pod
                # runner): the node's config must still be put back before we go.
                log.info("Cancelled: restoring the node's runtime config before exiting")
                await self.shutdown()
                raise
            await self.shutdown()
            return EXIT_OK
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
        while not stop.is_set():
            interval = s.drift_interval or 3600.0
            if not self.ready:
                interval = min(interval, 1.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
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
            if s.drift_interval and not s.nri:
                await self.configure(drift=True)
            if self.ready and not told and on_ready is not None:
                on_ready()
                told = True
        log.info("Signal received: restoring the node's runtime config")

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
