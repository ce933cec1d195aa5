"""The validator in the demo: `gpu-operator agent validator` in every validation init container
(the validator DaemonSet's driver, toolkit, cuda and plugin steps, the toolkit DaemonSet's
`driver-validation`), the operands' shell loops that wait for `toolkit-ready`, and the validator's
main container (ready once every step passed; on stop it removes the markers, as its preStop).

The agent is the real one; it sees its container through `PodContainer`: files through the
pod's volume mounts (and the kernel's `/proc/modules` and `/sys`, which every container sees),
programs through `PodContext.run_program` (kubesim has no `chroot`: the program is run by its
path under the new root), and its termination message through the pod context. Its waits keep
their counts of retries on a faster clock (`settings_for`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import posixpath
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpu_operator.agents.validator import command, components, runner
from gpu_operator.agents.validator.protocols import ProgramResult
from gpu_operator.kube import client as kube_client
from gpu_operator.kube import validator_api
from kubesim import PodContext

VALIDATOR_APP = "nvidia-operator-validator"
PROGRAM = "nvidia-validator"
POLL = 0.1
# The demo's clock: retries every 0.1 s instead of 5 s, five times as many (a tenth of upstream's
# bounds: the driver gets 30 s instead of 5 min, a workload pod 30 s), unless the env sets them.
DEMO_INTERVAL = 0.1
DEMO_RETRIES = 5
# Paths every container sees from the host kernel (privileged validators read them there).
KERNEL_PATHS = ("/proc/modules", "/sys/")
# How often a shell wait loop says it is still waiting (its `sleep 5`).
WAIT_MESSAGE_EVERY = 5.0
_WAIT_FILE = re.compile(r"\[\s+-f\s+(\S+)\s+\]")
# What a wait loop waits for, in its own words (upstream's say "... to be setup").
_WAIT_WHAT = re.compile(r"echo\s+waiting\s+for\s+([^;]+?)(?:\s+to\s+be\s+set\s?up)?\s*;")


def _argv(container: Mapping[str, Any]) -> list[str]:
    return [str(w) for w in container.get("command") or []] + [
        str(a) for a in container.get("args") or []
    ]


def runs_validator(container: Mapping[str, Any]) -> bool:
    """Whether a container runs `nvidia-validator` (directly or as `sh -c nvidia-validator`)."""
    return any(
        posixpath.basename(word) == PROGRAM for arg in _argv(container) for word in arg.split()[:1]
    )


def wait_script(container: Mapping[str, Any]) -> tuple[list[str], str] | None:
    """The files a shell wait loop (`until [ -f X ] || ...; do echo waiting for W; ...`) waits
    for and what it calls them; None for anything else."""
    script = next((a for a in _argv(container) if a.lstrip().startswith("until ")), None)
    if script is None:
        return None
    files = _WAIT_FILE.findall(script)
    if not files:
        return None
    what = _WAIT_WHAT.search(script)
    return files, what.group(1) if what else ", ".join(files)


def handles(ctx: PodContext) -> bool:
    """Whether this module runs the container."""
    if ctx.init:
        return runs_validator(ctx.container) or wait_script(ctx.container) is not None
    return ctx.labels.get("app") == VALIDATOR_APP


class PodContainer:
    """The validator's `Container` protocol on a kubesim pod context."""

    def __init__(self, ctx: PodContext) -> None:
        self.ctx = ctx

    def path(self, container_path: str) -> Path:
        if container_path.startswith(KERNEL_PATHS):
            return self.ctx.host_path(container_path)
        return self.ctx.path(container_path)

    async def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> ProgramResult:
        args = list(argv)
        if args[0] == "chroot" and len(args) >= 3:
            args = [posixpath.join(args[1], args[2].lstrip("/")), *args[3:]]
        result = await self.ctx.run_program(args, env=env)
        return ProgramResult(result.code, result.stdout, result.stderr)

    def write_termination_message(self, text: str) -> None:
        self.ctx.write_termination_message(text)


def settings_for(ctx: PodContext) -> runner.Settings:
    """The agent's settings from the container's env, on the demo's clock: retries every
    `DEMO_INTERVAL` seconds, `DEMO_RETRIES` times as many, unless the env sets them."""
    s = command.settings_from(ctx.env)

    def interval(env: str, current: float) -> float:
        return current if env in ctx.env else DEMO_INTERVAL

    def retries(env: str, current: int) -> int:
        return current if env in ctx.env else current * DEMO_RETRIES

    return dataclasses.replace(
        s,
        sleep_interval=interval("SLEEP_INTERVAL_SECONDS", s.sleep_interval),
        wait_retries=retries("WITH_WAIT_RETRIES", s.wait_retries),
        pod_interval=interval("POD_CREATION_SLEEP_INTERVAL_SECONDS", s.pod_interval),
        pod_retries=retries("POD_CREATION_WAIT_RETRIES", s.pod_retries),
        resource_interval=interval("GPU_RESOURCE_DISCOVERY_INTERVAL_SECONDS", s.resource_interval),
        resource_retries=retries("GPU_RESOURCE_DISCOVERY_WAIT_RETRIES", s.resource_retries),
    )


async def run(ctx: PodContext) -> int:
    """One validation container (init), or the validator's main container."""
    if not ctx.init:
        return await _main(ctx)
    waits = wait_script(ctx.container)
    if waits is not None and not runs_validator(ctx.container):
        return await _wait_for_files(ctx, *waits)
    return await _validate(ctx)


async def _validate(ctx: PodContext) -> int:
    try:
        settings = settings_for(ctx)
    except command.SettingsError as err:
        text = f"validator: {err}"
        ctx.write_termination_message(text + "\n")
        ctx.log(text, "stderr")
        return runner.EXIT_USAGE
    api = validator_api.ValidatorApi(kube_client.connect(str(ctx.kubeconfig_path)))
    try:
        validator = runner.Validator(settings, PodContainer(ctx), api, ctx.stopping)
        return await validator.run()
    finally:
        await api.close()


async def _wait_for_files(ctx: PodContext, files: list[str], what: str) -> int:
    """The operands' `until [ -f ... ]` loop: waits (saying so every 5 s) until a file is there."""
    loop = asyncio.get_running_loop()
    said = -WAIT_MESSAGE_EVERY
    while not any(_exists(ctx, f) for f in files):
        if loop.time() - said >= WAIT_MESSAGE_EVERY:
            ctx.log(f"waiting for {what}")
            said = loop.time()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ctx.stopping.wait(), POLL)
        if ctx.stopping.is_set():
            return 143  # the shell killed by SIGTERM
    ctx.log(f"{what} is ready")
    return 0


def _exists(ctx: PodContext, container_path: str) -> bool:
    try:
        return ctx.path(container_path).exists()
    except OSError:
        return False


async def _main(ctx: PodContext) -> int:
    """`echo all validations are successful; sleep infinity`; the preStop removes the markers."""
    ctx.log("all validations are successful")
    ctx.set_ready(True)
    try:
        await ctx.stopping.wait()
    finally:
        with contextlib.suppress(OSError):
            markers = ctx.path(components.VALIDATIONS_DIR)
            for marker in markers.glob("*" + components.MARKER_SUFFIX):
                if not marker.name.startswith("."):  # the shell's `*` leaves .driver-ctr-ready
                    marker.unlink(missing_ok=True)
    return 0
