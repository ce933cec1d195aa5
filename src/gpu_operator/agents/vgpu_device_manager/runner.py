"""The vGPU device manager's node protocol (upstream `nvidia-k8s-vgpu-dm`).

For the config the node label `nvidia.com/vgpu.config` names (or the default), at start and on
every change of the label: validate it; if the GPUs already have it, make sure the sandbox
operands are not left paused and report `success`; otherwise set
`nvidia.com/vgpu.config.state=pending`, pause the sandbox device plugin and validator (their
deploy labels `true` -> `paused-for-vgpu-change`) and wait for their pods to leave the node, apply
the plan, check it took, restore the labels, and report `success` or `failed` (with a Normal
`VgpuConfigApplied` or Warning `VgpuConfigFailed` Event on the node saying why).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpu_operator.agents.pci import kernel as kernel_mod
from gpu_operator.agents.vgpu_device_manager import apply as apply_mod
from gpu_operator.agents.vgpu_device_manager import config as cfg
from gpu_operator.agents.vgpu_device_manager import planner, state

log = logging.getLogger("gpu_operator.agents.vgpu_device_manager")

CONFIG_LABEL = "nvidia.com/vgpu.config"
STATE_LABEL = "nvidia.com/vgpu.config.state"
PLUGIN_LABEL = "nvidia.com/gpu.deploy.sandbox-device-plugin"
VALIDATOR_LABEL = "nvidia.com/gpu.deploy.sandbox-validator"
PAUSED = "paused-for-vgpu-change"
PAUSED_APPS = ("nvidia-sandbox-device-plugin-daemonset", "nvidia-sandbox-validator")
PENDING, SUCCESS, FAILED = "pending", "success", "failed"


class NodeApi(Protocol):
    """The API calls about its own node the manager needs (`gpu_operator.kube.mig_node`)."""

    def label_values(self, label: str) -> AsyncIterator[str | None]: ...

    async def metadata(self) -> tuple[dict[str, str], dict[str, str]]: ...

    async def patch(self, patch: Mapping[str, Any]) -> None: ...

    async def pods(self) -> list[dict[str, Any]]: ...

    async def event(self, type_: str, reason: str, message: str) -> None: ...


class UpdateError(RuntimeError):
    """The selected config could not be applied; the message says why."""


@dataclass
class Settings:
    config_file: Path
    default_config: str
    shutdown_timeout: float = 120.0
    poll_interval: float = 1.0


def pause_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The label changes that pause the sandbox operands (UpdateError if another operation
    already holds one of the labels with its own value)."""
    patch = {}
    for key in (PLUGIN_LABEL, VALIDATOR_LABEL):
        value = labels.get(key)
        if value in (None, "", "false", PAUSED):
            continue
        if value != "true":
            raise UpdateError(f"cannot pause {key}: another operation holds it ({value!r})")
        patch[key] = PAUSED
    return patch


def restore_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The label changes that undo our pause (values others set are left alone)."""
    return {k: "true" for k in (PLUGIN_LABEL, VALIDATOR_LABEL) if labels.get(k) == PAUSED}


class Manager:
    """Applies vGPU configs on one node."""

    def __init__(
        self,
        settings: Settings,
        node: NodeApi,
        kernel: kernel_mod.Kernel,
        read_state: Callable[[Path], list[state.Gpu]] = state.read,
    ) -> None:
        self.settings = settings
        self.node = node
        self.kernel = kernel
        self.read_state = read_state

    async def _labels(self) -> dict[str, str]:
        return (await self.node.metadata())[0]

    async def _patch_labels(self, changes: Mapping[str, str | None]) -> None:
        if changes:
            await self.node.patch({"metadata": {"labels": dict(changes)}})

    def _plan(self, entries: tuple[cfg.Entry, ...]) -> planner.Plan:
        try:
            return planner.plan(self.read_state(self.kernel.root), entries)
        except planner.PlanError as err:
            raise UpdateError(str(err)) from None

    async def _wait_for_operands_gone(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.shutdown_timeout
        while True:
            left = [
                f"{(p.get('metadata') or {}).get('namespace')}/{p['metadata']['name']}"
                for p in await self.node.pods()
                if ((p.get("metadata") or {}).get("labels") or {}).get("app") in PAUSED_APPS
            ]
            if not left:
                return
            if loop.time() >= deadline:
                raise UpdateError(
                    f"sandbox operands did not shut down within "
                    f"{self.settings.shutdown_timeout:.0f}s: {', '.join(sorted(left))}"
                )
            await asyncio.sleep(self.settings.poll_interval)

    async def update(self, selected: str) -> str:
        """Bring the node to `selected`; returns what was done (UpdateError on failure)."""
        try:
            entries = cfg.load(self.settings.config_file).select(selected)
        except cfg.ConfigError as err:
            raise UpdateError(f"unable to validate the selected vGPU config: {err}") from None
        plan = self._plan(entries)
        if plan.applied:
            await self._patch_labels(restore_labels(await self._labels()))
            return f"vGPU config {selected!r} is applied"
        await self._patch_labels({STATE_LABEL: PENDING})
        log.info("pausing the sandbox device plugin and validator")
        await self._patch_labels(pause_labels(await self._labels()))
        try:
            await self._wait_for_operands_gone()
            plan = self._plan(entries)  # the GPUs may have changed while we waited
            for line in planner.describe(plan):
                log.info("applying %s: %s", selected, line)
            try:
                done = apply_mod.apply(self.kernel, plan)
            except apply_mod.ApplyError as err:
                raise UpdateError(str(err)) from None
            if not self._plan(entries).applied:
                raise UpdateError(f"applied vGPU config {selected!r} does not match the GPUs")
        finally:
            log.info("restoring the sandbox device plugin and validator")
            await self._patch_labels(restore_labels(await self._labels()))
        return f"vGPU config {selected!r} applied: " + ("; ".join(done) or "no change")

    async def report(self, selected: str) -> bool:
        """Update and set the state label and an Event; True on success."""
        try:
            message = await self.update(selected)
        except UpdateError as err:
            log.error("failed to apply vGPU config %r: %s", selected, err)
            await self._patch_labels({STATE_LABEL: FAILED})
            await self.node.event("Warning", "VgpuConfigFailed", f"{selected}: {err}")
            return False
        log.info("%s", message)
        await self._patch_labels({STATE_LABEL: SUCCESS})
        await self.node.event("Normal", "VgpuConfigApplied", message)
        return True

    async def run(self, stop: asyncio.Event, on_first: Callable[[], None] | None = None) -> None:
        """Follow the label until `stop`: apply at start and on every change."""
        values = self.node.label_values(CONFIG_LABEL).__aiter__()
        first = True
        while not stop.is_set():
            following = asyncio.ensure_future(values.__anext__())
            stopping = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({following, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (stopping, following):
                    if not task.done():
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                            await task
            if following.cancelled():
                return
            value = following.result()
            selected = value or self.settings.default_config
            if not value:
                log.info("no %s label: using the default config %r", CONFIG_LABEL, selected)
            await self.report(selected)
            if first and on_first is not None:
                on_first()
            first = False
