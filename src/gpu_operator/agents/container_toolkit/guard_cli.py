"""`gpu-operator agent runtime-config-guard save|watch`: the runtime-config guard next to a toolkit
that is not ours (see `guard`); it reads the toolkit container's environment (`settings`)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import typer

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
ACTIONS = ("save", "watch", "restore")


def register(app: typer.Typer) -> None:
    """Add the `runtime-config-guard` command to the `agent` app."""
    app.command("runtime-config-guard")(runtime_config_guard)


def runtime_config_guard(
    action: str = typer.Argument(
        ...,
        help="save (copy the runtime config; an init container), watch (restore it when the pod "
        "stops; a native sidecar) or restore (now).",
    ),
) -> None:
    """Keep the node's original runtime config and put it back byte for byte when the toolkit's
    pod goes (upstream's toolkit environment: RUNTIME, RUNTIME_CONFIG, ...;
    RUNTIME_CONFIG_BACKUP_DIR)."""
    from gpu_operator.agents.container_toolkit import cli as toolkit_cli
    from gpu_operator.agents.container_toolkit import guard, runner, settings

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    log = guard.log
    if action not in ACTIONS:
        typer.echo(
            f"runtime-config-guard: unknown action {action!r} ({', '.join(ACTIONS)})", err=True
        )
        raise typer.Exit(2)
    try:
        s = settings.from_env(dict(os.environ))
    except settings.SettingsError as err:
        typer.echo(f"runtime-config-guard: {err}", err=True)
        raise typer.Exit(2) from None
    if action == "save":
        for line in guard.save(s, Path):
            log.info("%s", line)
        raise typer.Exit(0)

    async def restore() -> None:
        restored = guard.restore(s, Path)
        for line in restored.exact:
            log.info("%s", line)
        for line in restored.kept:
            log.warning("%s", line)
        events = toolkit_cli._node_events(s.node_name, None)
        if events is not None:
            if restored.kept:
                await events.event(
                    "Warning", "RuntimeConfigPartiallyRestored", "; ".join(restored.kept)
                )
            elif restored.exact:
                await events.event("Normal", "RuntimeConfigRestored", "; ".join(restored.exact))
        if restored.changed:
            restarter = runner.restarter_for(s, Path)
            log.info("restarting %s: %s", s.runtime, restarter.description)
            try:
                await restarter.restart()
            except Exception as err:  # the restore stands; the runtime reads it on its next start
                log.error("%s", err)
        elif not restored.kept:
            log.info("the runtime config is as it was: nothing to restore")

    async def watch() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info("guarding the %s config until this pod stops", s.runtime)
        await stop.wait()
        log.info("the pod stops: restoring the node's runtime config")
        await restore()

    asyncio.run(watch() if action == "watch" else restore())
