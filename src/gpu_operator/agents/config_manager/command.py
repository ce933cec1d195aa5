"""Wire the config manager from its command line and environment (upstream's names), then run.

Errors the user can fix (missing NODE_NAME, an unknown fallback strategy) exit 2 with one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from gpu_operator.agents.config_manager import files as cm_files
from gpu_operator.agents.config_manager import runner, selection
from gpu_operator.agents.config_manager.signals import ProcSignaller

log = logging.getLogger("gpu_operator.agents.config_manager")

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit status 2."""


@dataclass
class Options:
    """The command line as given (env already folded in by the CLI)."""

    node_name: str = ""
    node_label: str = "nvidia.com/device-plugin.config"
    config_file_srcdir: str = ""
    config_file_dst: str = ""
    default_config: str = ""
    fallback_strategies: str = ""
    oneshot: bool = False
    send_signal: bool = True
    signal: int = int(signal.SIGHUP)
    process_to_signal: str = "nvidia-device-plugin"
    recheck_interval: float = 5.0
    kubeconfig: Path | None = None


def build_settings(o: Options) -> runner.Settings:
    """Validated settings; UsageError names the flag (upstream's checks, same wording)."""
    for value, flag in (
        (o.node_name, "node-name"),
        (o.node_label, "node-label"),
        (o.config_file_srcdir, "config-file-srcdir"),
        (o.config_file_dst, "config-file-dst"),
    ):
        if not value:
            raise UsageError(f"invalid <{flag}>: must not be empty string")
    if o.signal <= 0 or o.signal >= signal.NSIG:
        raise UsageError(f"invalid <signal>: {o.signal} is not a signal number")
    if o.recheck_interval < 0:
        raise UsageError("invalid <recheck-interval>: must not be negative")
    try:
        fallbacks = selection.parse_fallbacks(o.fallback_strategies)
    except selection.SelectionError as err:
        raise UsageError(str(err)) from None
    return runner.Settings(
        node_name=o.node_name,
        srcdir=o.config_file_srcdir,
        dst=o.config_file_dst,
        node_label=o.node_label,
        default_config=o.default_config,
        fallbacks=fallbacks,
        oneshot=o.oneshot,
        send_signal=o.send_signal,
        signal=o.signal,
        process_to_signal=o.process_to_signal,
        recheck_interval=o.recheck_interval or None,
    )


async def _run(settings: runner.Settings, kubeconfig: Path | None) -> int:
    from gpu_operator.kube import node_features, node_watch

    api = node_features.client(kubeconfig)
    events = node_watch.NodeEvents(
        api, settings.node_name, node_watch.own_namespace(), "config-manager"
    )
    manager = runner.ConfigManager(settings, cm_files.LocalFiles(), ProcSignaller(), events)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        labels = node_watch.label_values(api, settings.node_name, settings.node_label)
        return await manager.run(labels, stop)
    finally:
        await api.close()


def execute(o: Options) -> int:
    """Run the config manager for `o`; returns the process exit status."""
    try:
        settings = build_settings(o)
    except UsageError as err:
        print(f"config-manager: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return asyncio.run(_run(settings, o.kubeconfig))
    except Exception as err:
        log.debug("config manager failed", exc_info=True)
        print(f"config-manager: {type(err).__name__}: {err}", file=sys.stderr)
        return runner.EXIT_FAILED
