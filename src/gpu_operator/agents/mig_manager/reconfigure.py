"""One reconfiguration of the node to the config its `nvidia.com/mig.config` label names: the
node protocol around the plan (state label, pausing GPU clients, waiting for their pods, apply,
re-validate, restore), with a rollback to the previous layout when applying fails.

Nothing is touched while the driver is being restarted; a reconfiguration that did not finish
for a transient cause (the driver missing, a GPU busy) says when it is tried again
(`Outcome.retry_in`, see `retry`), and the loop (`runner`) tries it again then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpu_operator import nvml
from gpu_operator.agents.mig_manager import config as cfg
from gpu_operator.agents.mig_manager import gpus as gpus_mod
from gpu_operator.agents.mig_manager import host as host_mod
from gpu_operator.agents.mig_manager import planner, retry
from gpu_operator.agents.mig_manager import protocol as proto
from gpu_operator.api import keys

log = logging.getLogger("gpu_operator.agents.mig_manager")

REASON_APPLIED = "MigConfigApplied"


class NodeApi(Protocol):
    """The API calls the protocol needs (gpu_operator.kube.mig_node.NodeApi implements them)."""

    async def metadata(self) -> tuple[dict[str, str], dict[str, str]]: ...
    async def patch(self, patch: Mapping[str, Any]) -> None: ...
    async def pods(self) -> list[dict[str, Any]]: ...
    async def delete_pod(self, namespace: str, name: str) -> None: ...
    async def event(self, type_: str, reason: str, message: str) -> None: ...


@dataclass
class Settings:
    """Env/flags of upstream's manager that the protocol uses."""

    clients_namespace: str = "default"
    with_reboot: bool = False
    with_shutdown_host_gpu_clients: bool = False
    host_gpu_client_services: Sequence[str] = ()
    host_kubelet_service: str = "kubelet.service"
    clients_timeout: float = 300.0
    poll_interval: float = 1.0
    progress_interval: float = 10.0
    # How transient failures (driver missing, GPU busy) are retried.
    backoff: retry.Backoff = field(default_factory=retry.Backoff)


@dataclass
class Outcome:
    """How a reconfiguration ended: the state written and why, whether the cause was transient,
    and when to try again (None: only when the label or the driver changes)."""

    state: str
    message: str = ""
    plan: planner.NodePlan | None = None
    events: list[str] = field(default_factory=list)
    transient: bool = False
    retry_in: float | None = None


class Failed(Exception):
    """Ends a reconfiguration with this message; `transient` when the cause may go away by
    itself (then it is retried)."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


def _nvml_failure(err: nvml.NvmlError) -> Failed:
    return Failed(f"reading the GPUs failed: {err}", transient=retry.transient_code(err.code))


def pod_ref(pod: Mapping[str, Any]) -> proto.PodRef:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    owners = meta.get("ownerReferences") or []
    return proto.PodRef(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        labels=meta.get("labels") or {},
        node_selector=spec.get("nodeSelector") or {},
        daemonset=any(o.get("kind") == "DaemonSet" for o in owners),
    )


class Reconfigurer:
    """Applies a named config to this node's GPUs with the label protocol."""

    def __init__(
        self,
        api: NodeApi,
        gpus: gpus_mod.Gpus,
        load_config: Callable[[], cfg.MigConfigFile],
        settings: Settings,
        *,
        clock: Callable[[], float] = time.monotonic,
        driver_marker: Callable[[], bool | None] = lambda: None,
    ) -> None:
        self.api = api
        self.gpus = gpus
        self.load_config = load_config
        self.settings = settings
        self.clock = clock
        # Whether the driver container's ready marker is there (None: not visible here).
        self.driver_marker = driver_marker

    async def run(self, name: str, *, attempt: int = 1) -> Outcome:
        """Bring the node to config `name` (`attempt`: 1, or the number of this retry); never
        raises for a failed apply (state `failed`, or `pending` while a transient cause is
        retried)."""
        labels, _ = await self.api.metadata()
        state = labels.get(keys.MIG_CONFIG_STATE, "")
        log.info(
            "MIG config %r requested (state %r%s)",
            name,
            state or "unset",
            f", try {attempt}" if attempt > 1 else "",
        )
        hold = retry.driver_hold(labels, self.driver_marker())
        if hold is not None:
            log.info("not touching the GPUs: %s", hold)
            return await self._finish(
                proto.STATE_FAILED,
                f"waiting for the NVIDIA driver: {hold}",
                labels,
                transient=True,
                attempt=attempt,
            )
        try:
            plan, entries = await self._plan(name)
        except Failed as err:
            return await self._finish(
                proto.STATE_FAILED, str(err), labels, transient=err.transient, attempt=attempt
            )
        if plan.gpus:
            log.info("plan: %s", planner.summarize(plan.gpus))
        if plan.applied:
            log.info("MIG config %r is already applied", name)
            return await self._finish(proto.STATE_SUCCESS, "", labels, plan)
        persisted = await asyncio.to_thread(self.gpus.host.persist_selected_config, name)
        if persisted:
            log.info("persisted %r for the host's mig-manager service", name)
        if state == proto.STATE_REBOOTING and plan.mode_change:
            return await self._finish(
                proto.STATE_FAILED,
                f"MIG mode change for {name!r} did not take effect after rebooting",
                labels,
                plan,
            )
        await self.api.patch(proto.state_patch(proto.STATE_PENDING))
        paused = proto.pause_patch(labels)
        stopped: list[str] = []
        try:
            if paused:
                log.info("pausing GPU clients: %s", ", ".join(sorted(paused)))
                await self.api.patch({"metadata": {"labels": paused}})
            await self._wait_for_clients()
            await self._delete_validators(proto.VALIDATOR_APPS_BEFORE)
            if self.settings.with_shutdown_host_gpu_clients:
                services = list(self.settings.host_gpu_client_services)
                if plan.mode_change and self.settings.host_kubelet_service:
                    services.append(self.settings.host_kubelet_service)
                stopped = await asyncio.to_thread(self.gpus.host.stop_services, services)
                log.info("stopped host GPU clients: %s", ", ".join(stopped) or "none running")
            outcome = await self._apply(name, plan, entries)
        except Failed as err:
            outcome = Outcome(proto.STATE_FAILED, str(err), plan, transient=err.transient)
        except nvml.NvmlError as err:
            failed = _nvml_failure(err)
            outcome = Outcome(proto.STATE_FAILED, str(failed), plan, transient=failed.transient)
        except Exception as err:  # whatever broke, the clients must come back
            log.exception("reconfiguring to %r failed unexpectedly", name)
            outcome = Outcome(proto.STATE_FAILED, f"unexpected error: {err}", plan)
        finally:
            if stopped:
                try:
                    await asyncio.to_thread(self.gpus.host.start_services, stopped)
                except host_mod.HostError as err:
                    log.error("restarting host GPU clients: %s", err)
        if outcome.state == proto.STATE_REBOOTING:
            return outcome
        if outcome.state == proto.STATE_SUCCESS:
            await self._delete_validators(proto.VALIDATOR_APPS_AFTER)
        labels, _ = await self.api.metadata()
        return await self._finish(
            outcome.state,
            outcome.message,
            labels,
            plan,
            transient=outcome.transient,
            attempt=attempt,
        )

    async def _plan(self, name: str) -> tuple[planner.NodePlan, tuple[cfg.Entry, ...]]:
        try:
            entries = self.load_config().select(name)
            states = await asyncio.to_thread(self.gpus.read)
            return planner.plan_node(name, entries, states), entries
        except (cfg.ConfigError, planner.PlanError) as err:
            raise Failed(str(err)) from None
        except nvml.NvmlError as err:  # the driver missing is transient, a lost GPU is not
            raise _nvml_failure(err) from None
        except Exception as err:  # anything else: fail with the reason
            raise Failed(f"reading the GPUs failed: {err}") from None

    async def _apply(
        self, name: str, plan: planner.NodePlan, entries: Sequence[cfg.Entry]
    ) -> Outcome:
        previous = await asyncio.to_thread(self.gpus.read)

        def replan(states: list[planner.GpuState]) -> planner.NodePlan:
            return planner.plan_node(name, entries, states)

        try:
            await asyncio.to_thread(self.gpus.apply, plan, replan)
            problems = planner.verify(plan, await asyncio.to_thread(self.gpus.read))
            if problems:
                raise gpus_mod.ApplyError("; ".join(problems))
        except gpus_mod.ModeChangeFailed as err:
            # A reboot helps a GPU held by a process, not a driver that is missing.
            if self.settings.with_reboot and not retry.driver_code(err.code):
                return await self._reboot(str(err), plan)
            return await self._rollback(name, previous, str(err), plan, err.code)
        except gpus_mod.ApplyError as err:
            return await self._rollback(name, previous, str(err), plan, err.code)
        except planner.PlanError as err:
            return await self._rollback(name, previous, str(err), plan)
        except nvml.NvmlError as err:  # re-reading the GPUs between the phases
            reason = f"reading the GPUs failed: {err}"
            return await self._rollback(name, previous, reason, plan, err.code)
        log.info("MIG config %r applied: %d GPU(s) changed", name, len(plan.changed))
        return Outcome(proto.STATE_SUCCESS, "", plan)

    async def _rollback(
        self,
        name: str,
        previous: list[planner.GpuState],
        reason: str,
        plan: planner.NodePlan,
        code: int | None = None,
    ) -> Outcome:
        """Put every GPU back as it was; the outcome is transient when the apply's cause was."""
        log.error("applying %r failed: %s; restoring the previous layout", name, reason)

        def replan(states: list[planner.GpuState]) -> planner.NodePlan:
            return planner.plan_restore(previous, states)

        try:
            now = await asyncio.to_thread(self.gpus.read)
            await asyncio.to_thread(self.gpus.apply, planner.plan_restore(previous, now), replan)
            left = planner.verify(
                planner.plan_restore(previous, previous), await asyncio.to_thread(self.gpus.read)
            )
            if left:
                raise gpus_mod.ApplyError("; ".join(left))
        except Exception as err:
            cause = getattr(err, "code", None)
            return Outcome(
                proto.STATE_FAILED,
                f"applying {name!r} failed: {reason}; restoring the previous layout also "
                f"failed: {err}",
                plan,
                transient=retry.transient_code(code) or retry.transient_code(cause),
            )
        return Outcome(
            proto.STATE_FAILED,
            f"applying {name!r} failed: {reason}; the previous layout was restored",
            plan,
            transient=retry.transient_code(code),
        )

    async def _reboot(self, reason: str, plan: planner.NodePlan) -> Outcome:
        log.warning("MIG mode change failed (%s); rebooting the node (WITH_REBOOT)", reason)
        await self.api.patch(proto.state_patch(proto.STATE_REBOOTING))
        try:
            # A real node does not come back from this; a simulated one returns rebooted.
            await asyncio.to_thread(self.gpus.host.reboot)
        except host_mod.HostError as err:
            return Outcome(proto.STATE_FAILED, f"{reason}; rebooting failed: {err}", plan)
        return Outcome(proto.STATE_REBOOTING, reason, plan)

    async def _wait_for_clients(self) -> None:
        """Until the GPU-client pods have left the node (bounded, with progress in the log)."""
        deadline = self.clock() + self.settings.clients_timeout
        next_report = self.clock()
        while True:
            pods = [pod_ref(p) for p in await self.api.pods()]
            left = proto.waiting_for(pods, self.settings.clients_namespace)
            if not left:
                return
            now = self.clock()
            names = ", ".join(f"{p.namespace}/{p.name}" for p in left)
            if now >= deadline:
                raise Failed(
                    f"GPU client pods did not leave the node within "
                    f"{self.settings.clients_timeout:.0f}s: {names}"
                )
            if now >= next_report:
                log.info("waiting for %d GPU client pod(s) to leave: %s", len(left), names)
                next_report = now + self.settings.progress_interval
            await asyncio.sleep(self.settings.poll_interval)

    async def _delete_validators(self, apps: Sequence[str]) -> None:
        pods = [pod_ref(p) for p in await self.api.pods()]
        for pod in proto.validators(pods, self.settings.clients_namespace, apps):
            log.info("deleting validator pod %s/%s", pod.namespace, pod.name)
            await self.api.delete_pod(pod.namespace, pod.name)

    async def _finish(
        self,
        state: str,
        message: str,
        labels: Mapping[str, str],
        plan: planner.NodePlan | None = None,
        *,
        transient: bool = False,
        attempt: int = 1,
    ) -> Outcome:
        """Restore the paused GPU clients, write the state (and why), record an Event. A failure
        is `pending` or `failed` as `retry.decide` says, and comes back with when to retry."""
        retry_in = None
        event = None
        if state == proto.STATE_FAILED:
            if not transient and retry.driver_hold(labels, self.driver_marker()) is not None:
                transient = True  # the driver went away under the change: that was the cause
            decision = retry.decide(
                message, transient=transient, attempt=attempt, backoff=self.settings.backoff
            )
            state, message, retry_in, event = (
                decision.state,
                decision.message,
                decision.retry_in,
                decision.event,
            )
        restore = proto.restore_patch(labels)
        if restore:
            log.info("restoring GPU clients: %s", ", ".join(sorted(restore)))
        patch = proto.state_patch(state, message or None)
        patch["metadata"]["labels"].update(restore)  # type: ignore[index]
        await self.api.patch(patch)
        outcome = Outcome(state, message, plan, transient=transient, retry_in=retry_in)
        if retry_in is not None:
            log.warning("MIG config not applied yet: %s", message)
        elif state == proto.STATE_FAILED:
            log.error("MIG config failed: %s", message)
        if event is not None:
            await self.api.event("Warning", event, message)
            outcome.events.append(event)
        elif state == proto.STATE_SUCCESS and plan is not None and plan.changed:
            summary = planner.summarize(plan.changed)
            await self.api.event("Normal", REASON_APPLIED, f"MIG config {plan.config!r}: {summary}")
            outcome.events.append(REASON_APPLIED)
        return outcome
