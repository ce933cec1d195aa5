"""Wire the driver manager from its environment: settings, host, API, then one run.

A bad environment value exits 2 with one line naming the variable; a failed run exits 1 (the
kubelet restarts the init container, as upstream's does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

from gpu_operator.agents.driver_manager import host as host_mod
from gpu_operator.agents.driver_manager import runner as runner_mod
from gpu_operator.agents.driver_manager import settings as settings_mod
from gpu_operator.kube import client as kube_client
from gpu_operator.kube import driver_node

log = logging.getLogger("gpu_operator.agents.driver_manager")

COMMANDS = ("uninstall_driver", "preflight_check")


async def uninstall_driver(
    settings: settings_mod.Settings,
    host: host_mod.Host,
    api: driver_node.DriverNodeApi,
    stop: asyncio.Event | None = None,
) -> runner_mod.Outcome:
    """One run of the flow on this node."""
    return await runner_mod.Runner(settings, host, api, stop).run()


async def _main(settings: settings_mod.Settings, host_root: Path) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        api = driver_node.DriverNodeApi(
            driver_node.connect(settings.kubeconfig or None),
            settings.node_name,
            settings.operator_namespace,
        )
    except kube_client.ConnectError as err:
        log.error("%s", err)
        return runner_mod.EXIT_FAILED
    try:
        outcome = await uninstall_driver(settings, host_mod.LinuxHost(host_root), api, stop)
    finally:
        await api.close()
    return outcome.code


def _usage(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)


def execute(command: str, env: Mapping[str, str], host_root: Path = Path("/host")) -> int:
    """Run `command` with settings from `env`; the exit status."""
    if command not in COMMANDS:
        _usage(f"unknown command {command!r}: expected one of {', '.join(COMMANDS)}")
        return runner_mod.EXIT_USAGE
    try:
        settings = settings_mod.parse(env)
    except settings_mod.SettingsError as err:
        _usage(str(err))
        return runner_mod.EXIT_USAGE
    if command == "preflight_check":
        # Upstream's preflight check has no checks yet either: it only reports.
        log.info("preflight checks: none to run")
        return runner_mod.EXIT_OK
    return asyncio.run(_main(settings, host_root))
