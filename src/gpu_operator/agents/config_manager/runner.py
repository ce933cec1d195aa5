"""The config-manager loop: on every value of the node label, choose a config, check it, point
the destination symlink at it and signal the operand.

Better than upstream: a label naming no config, or a config that does not parse, is reported
(error log line and a Warning Event on the node) and changes nothing, so the operand keeps its
last good config; the sidecar keeps running instead of exiting. The init container (`oneshot`)
keeps a valid config already in place, else falls back to what the node would get without the
label. The sidecar also re-checks the mounted configs every `recheck_interval`, so an edited
ConfigMap reaches the operand without a label change.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import posixpath
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.config_manager import files as cm_files
from gpu_operator.agents.config_manager import selection
from gpu_operator.agents.config_manager.signals import Signaller

log = logging.getLogger("gpu_operator.agents.config_manager")

REJECTED = "DevicePluginConfigRejected"
APPLIED = "DevicePluginConfigApplied"
EXIT_OK = 0
EXIT_FAILED = 1


class Reporter(Protocol):
    """Records an Event about the node (best effort)."""

    async def event(self, type_: str, reason: str, message: str) -> None: ...


class NullReporter:
    """Reports nothing (no API access, tests)."""

    async def event(self, type_: str, reason: str, message: str) -> None:
        return None


@dataclass
class Settings:
    """The agent's settings (upstream's flags and env; `recheck_interval` is ours)."""

    node_name: str
    srcdir: str
    dst: str
    node_label: str = "nvidia.com/device-plugin.config"
    default_config: str = ""
    fallbacks: list[str] = field(default_factory=list)
    oneshot: bool = False
    send_signal: bool = True
    signal: int = int(signal.SIGHUP)
    process_to_signal: str = "nvidia-device-plugin"
    recheck_interval: float | None = 5.0


def signal_name(signum: int) -> str:
    with contextlib.suppress(ValueError):
        return signal.Signals(signum).name
    return str(signum)


@dataclass
class _Applied:
    """What the destination points at and a digest of that config's content when it was applied."""

    target: str | None = None
    digest: str | None = None


class ConfigManager:
    """One node's selection state; `sync(label)` does one pass and returns an exit status."""

    def __init__(
        self,
        settings: Settings,
        files: cm_files.Files,
        signaller: Signaller,
        reporter: Reporter | None = None,
    ) -> None:
        self.settings = settings
        self.files = files
        self.signaller = signaller
        self.reporter = reporter or NullReporter()
        self.applied = _Applied()
        self.last_error: str | None = None

    # ----- one pass ---------------------------------------------------------------------------

    def _choose(self, label_value: str | None) -> tuple[selection.Selection, str | None]:
        """The selection and the digest of its content; raises SelectionError or ConfigError."""
        s = self.settings
        names = cm_files.list_configs(self.files, s.srcdir)
        choice = selection.select(
            label_value,
            names,
            label=s.node_label,
            default=s.default_config,
            fallbacks=s.fallbacks,
            source=s.srcdir,
        )
        if choice.name is None:
            return choice, None
        target = cm_files.target_of(choice, s.srcdir)
        digest = self._digest(target)
        if digest is None or (target, digest) != (self.applied.target, self.applied.digest):
            # Parsed only when new: re-checks of an unchanged file stay quiet and cheap.
            cm_files.load_config(self.files, s.srcdir, choice.name)
        return choice, digest

    def _digest(self, target: str) -> str | None:
        if target == cm_files.EMPTY_TARGET:
            return None
        try:
            return hashlib.sha256(self.files.path(target).read_bytes()).hexdigest()
        except OSError:
            return None

    def _describe_current(self) -> str:
        target = cm_files.current_target(self.files, self.settings.dst)
        if target is None:
            return "no config yet"
        if target == cm_files.EMPTY_TARGET:
            return "the empty config"
        return f"config {posixpath.basename(target)!r}"

    async def _reject(self, problem: str, *, consequence: str) -> None:
        s = self.settings
        message = f"{problem}; {consequence}"
        if message == self.last_error:
            log.debug("%s", message)  # said already; re-checks do not repeat it
            return
        log.error("%s", message)
        self.last_error = message
        await self.reporter.event(
            "Warning", REJECTED, f"config-manager for {s.process_to_signal}: {message}"
        )

    def _signal(self) -> None:
        s = self.settings
        if not s.send_signal:
            return
        name = signal_name(s.signal)
        log.info("sending %s to %s", name, s.process_to_signal)
        if self.signaller.signal(s.process_to_signal, s.signal):
            log.info("sent %s to %s", name, s.process_to_signal)
        else:
            # Upstream exits here; the process is likely starting and will read the new file.
            log.warning(
                "no process named %s found; it reads the new config when it starts",
                s.process_to_signal,
            )

    async def _apply(self, choice: selection.Selection, digest: str | None, why: str) -> bool:
        """Point the link at the choice; signal when the link or the content changed."""
        s = self.settings
        target = cm_files.target_of(choice, s.srcdir)
        swapped = cm_files.swap_symlink(self.files, s.dst, target)
        content_changed = (
            not swapped and self.applied.target == target and self.applied.digest != digest
        )
        self.applied = _Applied(target, digest)
        self.last_error = None
        if not swapped and not content_changed:
            log.log(
                logging.DEBUG if why == "re-check" else logging.INFO,
                "%s is already in place",
                choice.display,
            )
            return False
        what = "content of " if content_changed else ""
        log.info("now using %s%s (%s)", what, choice.display, choice.reason)
        if not s.oneshot:
            await self.reporter.event(
                "Normal",
                APPLIED,
                f"config-manager for {s.process_to_signal}: now using {what}{choice.display} "
                f"({choice.reason})",
            )
        self._signal()
        return True

    async def sync(self, label_value: str | None, *, why: str = "label") -> int:
        """One pass for a label value: EXIT_OK when a config is in place, else EXIT_FAILED."""
        try:
            choice, digest = self._choose(label_value)
        except (selection.SelectionError, pc.ConfigError, OSError) as err:
            return await self._refuse(label_value, str(err))
        await self._apply(choice, digest, why)
        return EXIT_OK

    async def _refuse(self, label_value: str | None, problem: str) -> int:
        s = self.settings
        if not s.oneshot:
            await self._reject(problem, consequence=f"keeping {self._describe_current()}")
            return EXIT_OK
        current = cm_files.current_target(self.files, s.dst)
        if current is not None and self._valid_target(current):
            await self._reject(problem, consequence=f"keeping {self._describe_current()}")
            return EXIT_OK
        if label_value:
            # Without a config in place the operand cannot start: use what the node would get
            # without the label rather than leave it with no device plugin at all.
            try:
                choice, digest = self._choose(None)
            except (selection.SelectionError, pc.ConfigError, OSError) as err:
                await self._reject(problem, consequence=f"and without the label: {err}")
                return EXIT_FAILED
            await self._reject(problem, consequence=f"using {choice.display} ({choice.reason})")
            await self._apply(choice, digest, "fallback")
            return EXIT_OK
        await self._reject(problem, consequence="no config is in place")
        return EXIT_FAILED

    def _valid_target(self, target: str) -> bool:
        if target == cm_files.EMPTY_TARGET:
            return True
        try:
            pc.load(self.files.path(target))
        except (pc.ConfigError, OSError):
            return False
        return True

    # ----- the loop ---------------------------------------------------------------------------

    async def run(self, labels: AsyncIterator[str | None], stop: asyncio.Event) -> int:
        """Sync on every label value (once with `oneshot`) until `stop`; re-check the mounted
        configs every `recheck_interval` seconds in between."""
        s = self.settings
        log.info("waiting for the %s label of node %s", s.node_label, s.node_name)
        latest: asyncio.Queue[str | None] = asyncio.Queue()

        async def follow() -> None:
            async for value in labels:
                await latest.put(value)

        follower = asyncio.ensure_future(follow())
        stopping = asyncio.ensure_future(stop.wait())
        label: str | None = None
        seen = False
        try:
            while not stop.is_set():
                getter = asyncio.ensure_future(latest.get())
                timeout = s.recheck_interval if seen and not s.oneshot else None
                done, _ = await asyncio.wait(
                    {getter, stopping, follower},
                    timeout=timeout,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if getter in done:
                    label = getter.result() or None
                    while not latest.empty():  # only the newest value matters
                        label = latest.get_nowait() or None
                    log.info("label %s=%s", s.node_label, label or "(not set)")
                    code = await self.sync(label)
                    seen = True
                    if s.oneshot:
                        return code
                    continue
                getter.cancel()
                if follower in done:
                    follower.result()  # re-raise what ended the watch
                    return EXIT_FAILED
                if stopping in done:
                    break
                await self.sync(label, why="re-check")
        finally:
            follower.cancel()
            stopping.cancel()
            with contextlib.suppress(BaseException):
                await follower
        return EXIT_OK
