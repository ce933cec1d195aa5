"""The GFD loop: collect facts, compute labels, hand them to a sink; oneshot or every interval.

SIGTERM/SIGINT stop the loop (and remove the output where upstream does: file-like sinks in
finite-interval mode); SIGHUP reloads the config file and restamps the timestamp.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpu_operator import nvml
from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.gfd import facts as gfd_facts
from gpu_operator.agents.gfd import labels as gfd_labels
from gpu_operator.agents.gfd.output import Sink

log = logging.getLogger("gpu_operator.agents.gfd")


class InitFailed(RuntimeError):
    """NVML could not be initialised and failOnInitError is set."""


class CollectFailed(RuntimeError):
    """NVML came up but reading the GPUs failed (the message says which call and why)."""


@dataclass
class Settings:
    """Everything the loop needs besides the GPUs and the sink."""

    config: pc.PluginConfig
    config_path: Path | None = None
    machine_type: str | None = None  # fixed machine type (mock machines); else read the file
    vgpu: gfd_facts.VgpuFacts | None = None
    overrides: dict[str, object] = field(default_factory=dict)


def gather(open_nvml: Callable[[], nvml.Nvml], settings: Settings) -> gfd_facts.NodeFacts | None:
    """Facts from a freshly initialised NVML; None when init fails and failures are tolerated."""
    config = settings.config
    machine_type = settings.machine_type or gfd_facts.read_machine_type(
        config.flags.gfd.machine_type_file
    )
    try:
        lib = open_nvml()
        lib.init()
    except nvml.NvmlError as err:
        if config.flags.fail_on_init_error:
            raise InitFailed(str(err)) from err
        log.warning("NVML init failed (%s); labelling without GPUs", err)
        return None
    try:
        return gfd_facts.collect(lib, machine_type=machine_type, vgpu=settings.vgpu)
    except nvml.NvmlError as err:
        raise CollectFailed(f"reading the GPUs from NVML failed: {err}") from err
    finally:
        with contextlib.suppress(nvml.NvmlError):
            lib.shutdown()


def labels_once(
    open_nvml: Callable[[], nvml.Nvml], settings: Settings, timestamp: int
) -> gfd_labels.Labels:
    facts = gather(open_nvml, settings)
    if facts is None:
        facts = gfd_facts.NodeFacts("", 0, "unknown", ())
    return gfd_labels.compute_labels(
        facts, settings.config, gfd_labels.LabelOptions(timestamp=timestamp)
    )


def reload_config(settings: Settings) -> None:
    """Re-read the config file and re-apply the command-line/env overrides (SIGHUP)."""
    if settings.config_path is None:
        return
    fresh = pc.load(settings.config_path)
    settings.config = apply_overrides(fresh, settings.overrides)


def apply_overrides(config: pc.PluginConfig, overrides: dict[str, object]) -> pc.PluginConfig:
    """Overlay explicitly set flags (dotted paths such as `flags.gfd.oneshot`) on a config."""
    data = config.model_dump(by_alias=True)
    for path, value in overrides.items():
        node = data
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return pc.parse(data, "command line")


async def run(
    open_nvml: Callable[[], nvml.Nvml],
    sink: Sink,
    settings: Settings,
    *,
    clock: Callable[[], float] = time.time,
    stop: asyncio.Event | None = None,
    reload: asyncio.Event | None = None,
    install_signals: bool = True,
) -> None:
    """Label until stopped (or once with `oneshot`)."""
    stop = stop or asyncio.Event()
    reload = reload or asyncio.Event()
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    if install_signals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
                handled.append(sig)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, reload.set)
            handled.append(signal.SIGHUP)
    timestamp = int(clock())
    wrote = False
    try:
        while not stop.is_set():
            gfd = settings.config.flags.gfd
            try:
                labels = await asyncio.to_thread(labels_once, open_nvml, settings, timestamp)
            except CollectFailed as err:
                if gfd.oneshot:
                    raise
                # Keep the labels last written and try again next interval (a GPU that answers
                # again, a fixed permission), rather than ending the loop.
                log.error("%s; keeping the previous labels", err)
            else:
                await sink.write(labels)
                wrote = True
            if gfd.oneshot:
                return
            interval = gfd.sleep_seconds
            log.info("labels written; sleeping %s", gfd.sleep_interval)
            waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(reload.wait())]
            _, pending = await asyncio.wait(
                waiters, timeout=interval, return_when=asyncio.FIRST_COMPLETED
            )
            for w in pending:
                w.cancel()
            if reload.is_set() and not stop.is_set():
                reload.clear()
                log.info("SIGHUP: reloading configuration")
                reload_config(settings)
                timestamp = int(clock())
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        gfd = settings.config.flags.gfd
        if wrote and not gfd.oneshot and gfd.sleep_seconds is not None:
            await sink.remove()
