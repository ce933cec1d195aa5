"""Carry out a driver-manager plan on the node: label patches, bounded waits for pods, cordon,
evictions through the Eviction API, module unloads on the host, and the undo steps on failure.

Every step is one readable log line or a few (`kubectl logs -c k8s-driver-manager` tells the
story) and every decision an Event on the Node. A stop request (SIGTERM) interrupts any wait; the
labels are then restored (and our cordon undone) before exiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from gpu_operator.agents.driver_manager import host as host_mod
from gpu_operator.agents.driver_manager import plan as plan_mod
from gpu_operator.agents.driver_manager.settings import Settings, format_duration
from gpu_operator.agents.vfio_manager import command as vfio
from gpu_operator.agents.vfio_manager import holders as holders_mod
from gpu_operator.agents.vgpu_device_manager import apply as vgpu_apply
from gpu_operator.agents.vgpu_device_manager import state as vgpu_state
from gpu_operator.api import keys
from gpu_operator.kube import driver_node

log = logging.getLogger("gpu_operator.agents.driver_manager")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_STOPPED = 143  # 128 + SIGTERM, what a shell reports for a process ended by it
CONFLICT_RETRIES = 10
EMPTY = '""'
GPU_PODS = "GPU pods"
T = TypeVar("T")
PodLister = Callable[[], Awaitable[list[dict[str, Any]]]]


class StepFailed(Exception):
    """A step could not be done; str() is the reason shown in the log and the Event."""


class Stopped(Exception):
    """The pod is stopping (SIGTERM) while a step waited."""


@dataclass
class Outcome:
    """How the run ended (for tests and the demo)."""

    code: int
    route: str = ""
    reason: str = ""


def node_facts(node: Mapping[str, Any]) -> plan_mod.NodeFacts:
    meta = node.get("metadata") or {}
    return plan_mod.NodeFacts(
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
    )


def _names(refs: Any) -> str:
    return ", ".join(str(r) for r in refs)


class Runner:
    """One run of `uninstall_driver` on one node."""

    def __init__(
        self,
        settings: Settings,
        host: host_mod.Host,
        api: driver_node.DriverNodeApi,
        stop: asyncio.Event | None = None,
    ) -> None:
        self.settings = settings
        self.host = host
        self.api = api
        self.stop = stop or asyncio.Event()
        self.plan: plan_mod.Plan | None = None
        # Labels re-paused after a concurrent change (their paused value now).
        self._repaused: dict[str, str] = {}
        self._paused_any = False
        self._started = 0.0

    # -- helpers -------------------------------------------------------------------------

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    async def _sleep(self, seconds: float) -> None:
        """Wait, or raise Stopped as soon as a stop is requested."""
        if self.stop.is_set():
            raise Stopped()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)
        if self.stop.is_set():
            raise Stopped()

    async def _race(self, work: Awaitable[T]) -> T:
        """Run `work` until it finishes or a stop is requested (Stopped)."""
        task = asyncio.ensure_future(work)
        stopping = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise Stopped()
        return task.result()

    async def _event(self, type_: str, reason: str, message: str) -> None:
        await self.api.event(type_, reason, message)

    def _deadline(self, timeout: float) -> float | None:
        return self._now() + timeout if timeout > 0 else None

    async def _patch_labels(
        self, compute: Callable[[dict[str, str]], dict[str, str]], what: str
    ) -> tuple[dict[str, str], dict[str, str]]:
        """Apply `compute(labels) -> patch` guarded by the node's resourceVersion, recomputing
        on a conflict; returns (labels before, patch applied)."""
        for _ in range(CONFLICT_RETRIES):
            node = await self.api.node()
            meta = node.get("metadata") or {}
            labels = dict(meta.get("labels") or {})
            patch = compute(labels)
            if not patch:
                return labels, {}
            try:
                await self.api.patch(
                    {"metadata": {"labels": patch}}, resource_version=meta.get("resourceVersion")
                )
            except driver_node.Conflict:
                continue
            return labels, patch
        raise StepFailed(f"{what}: the node kept changing ({CONFLICT_RETRIES} conflicts)")

    # -- the run -------------------------------------------------------------------------

    async def run(self) -> Outcome:
        """Observe, plan, execute; on failure or stop, undo. Never raises."""
        self._started = self._now()
        s = self.settings
        log.info(
            "driver manager on node %s: GPU pod eviction %s, auto drain %s, drain timeout %s, "
            "operand wait %s, operator namespace %s",
            s.node_name,
            "on" if s.enable_gpu_pod_eviction else "off",
            "on" if s.enable_auto_drain else "off",
            format_duration(s.drain_timeout),
            format_duration(s.operand_wait_timeout),
            s.operator_namespace,
        )  # fmt: skip
        try:
            node = node_facts(await self.api.node())
            facts = host_mod.observe(self.host)
        except Exception as err:  # the API or the host cannot be read: nothing was changed
            log.error("cannot start: %s", err)
            return Outcome(EXIT_FAILED, reason=str(err))
        self._log_facts(node, facts)
        plan = plan_mod.make_plan(node, facts, s)
        self.plan = plan
        for note in plan.notes:
            log.info("%s", note)
        log.info(
            "plan (%s): %s", plan.route, "; ".join(plan_mod.title(step) for step in plan.steps)
        )
        try:
            for step in plan.steps:
                await self._do(step)
        except Stopped:
            log.warning("stop requested (SIGTERM): undoing what was done so far")
            await self._undo(plan)
            return Outcome(EXIT_STOPPED, plan.route, "stopped")
        except Exception as err:
            reason = str(err) or type(err).__name__
            log.error("failed: %s", reason)
            if plan.route != "preinstalled":  # HostDriverDetected said it already
                await self._event("Warning", "DriverManagerFailed", reason)
            await self._undo(plan)
            return Outcome(EXIT_FAILED, plan.route, reason)
        elapsed = self._now() - self._started
        log.info("done in %.1fs: the driver container can start", elapsed)
        return Outcome(EXIT_OK, plan.route)

    def _log_facts(self, node: plan_mod.NodeFacts, facts: plan_mod.HostFacts) -> None:
        managed = plan_mod.managed_labels(self.settings)
        present = [
            f"{k.removeprefix(keys.DEPLOY_PREFIX)}={node.labels[k] or EMPTY}"
            for k in managed
            if k in node.labels
        ]
        log.info("operand labels now: %s", ", ".join(present) or "(none)")
        upgrade = node.annotations.get(keys.UPGRADE_ENABLED)
        log.info("%s=%s", keys.UPGRADE_ENABLED, upgrade if upgrade else "(not set)")
        if facts.host_driver_version is None:
            log.info("no NVIDIA driver on the host itself (nvidia-smi of the host does not answer)")
        loaded = sorted(facts.loaded_modules)
        if plan_mod.NVIDIA in facts.loaded_modules:
            users = self.host.refcnt(plan_mod.NVIDIA)
            log.info(
                "NVIDIA driver loaded (modules %s; nvidia refcnt %s)",
                " ".join(loaded),
                users if users is not None else "?",
            )  # fmt: skip
        else:
            log.info("no NVIDIA driver loaded (/sys/module/nvidia absent)")
        if facts.stored_digest is not None:
            log.info(
                "last install's config digest %s (this pod's: %s)",
                facts.stored_digest,
                self.settings.driver_config_digest or "(not set)",
            )  # fmt: skip

    async def _undo(self, plan: plan_mod.Plan) -> None:
        for step in plan.on_failure:
            try:
                await self._do(step)
            except Exception as err:
                log.warning("could not %s: %s", plan_mod.title(step), err)

    async def _do(self, step: plan_mod.Step) -> None:
        match step:
            case plan_mod.MarkPreinstalled(version=version):
                await self._mark_preinstalled(version)
            case plan_mod.ExitAfter(seconds=seconds, reason=reason):
                log.info(
                    "exiting with an error in %s; the driver DaemonSet no longer selects this "
                    "node and removes this pod meanwhile", format_duration(seconds),
                )  # fmt: skip
                with contextlib.suppress(Stopped):
                    await self._sleep(seconds)
                raise StepFailed(reason)
            case plan_mod.PauseOperands(patch=patch):
                await self._pause(patch)
            case plan_mod.WaitForPods(apps=apps, timeout=timeout):
                await self._wait_for_apps(apps, timeout)
            case plan_mod.WaitForSelectorPods(key=key, timeout=timeout):
                await self._wait_for_selector_pods(key, timeout)
            case plan_mod.KeepDriver(digest=digest):
                message = (
                    f"the loaded driver was installed with this config (DRIVER_CONFIG_DIGEST "
                    f"{digest}): keeping it, GPU pods keep running"
                )
                log.info("%s", message)
                await self._event("Normal", "DriverKept", message)
            case plan_mod.Cordon():
                await self._cordon()
            case plan_mod.EvictGpuPods(fallback_drain=fallback):
                await self._evict_gpu_pods(fallback)
            case plan_mod.ReleaseVgpus():
                await self._release_vgpus()
            case plan_mod.UnloadDriver(modules=modules, drain_and_retry=retry):
                await self._unload_driver(modules, retry)
            case plan_mod.CleanupDriverRoot():
                self._cleanup_driver_root()
            case plan_mod.UnloadNouveau():
                log.info("unloading nouveau (it keeps the NVIDIA driver from loading)")
                self.host.unload(plan_mod.NOUVEAU)
            case plan_mod.UnbindVfio():
                await self._unbind_vfio()
            case plan_mod.WaitForMofed(use_host_mofed=host_mofed, timeout=timeout):
                await self._wait_for_mofed(host_mofed, timeout)
            case plan_mod.Uncordon():
                await self._uncordon()
            case plan_mod.RestoreLabels(paused=paused):
                await self._restore({**paused, **self._repaused})

    # -- steps ---------------------------------------------------------------------------

    async def _mark_preinstalled(self, version: str) -> None:
        node = self.settings.node_name
        message = (
            f"NVIDIA driver {version} is pre-installed on the host: labelled "
            f"{plan_mod.DRIVER_DEPLOY_LABEL}={plan_mod.PREINSTALLED}, so the operator's driver "
            f"leaves node {node}. Use the host's driver (driver.enabled=false), or create the "
            "node without a driver (on AKS: --gpu-driver none)"
        )
        log.warning("%s", message)
        await self.api.patch(
            {"metadata": {"labels": {plan_mod.DRIVER_DEPLOY_LABEL: plan_mod.PREINSTALLED}}}
        )
        await self._event("Warning", "HostDriverDetected", message)

    async def _pause(self, planned: Mapping[str, str]) -> None:
        if not planned:
            log.info("no GPU operand to pause (none is deployed, or all are paused already)")
            return
        keys_ = tuple(planned)

        def compute(labels: dict[str, str]) -> dict[str, str]:
            return plan_mod.pause_patch(labels, keys_)

        before, patch = await self._patch_labels(compute, "pause the GPU operands")
        if patch != dict(planned):
            # The labels changed since the plan was made: restore to what was paused now.
            self._repaused.update(plan_mod.paused_values(before, keys_))
        if not patch:
            log.info("no GPU operand to pause any more")
            return
        self._paused_any = True
        change = plan_mod.describe_changes(before, patch)
        log.info("pausing GPU operands: %s", change)
        await self._event("Normal", "OperandsPaused", f"paused for the driver change: {change}")

    async def _wait_for_pods(self, what: str, timeout: float, list_pods: PodLister) -> None:
        """Wait until `list_pods()` is empty, at most `timeout` seconds (0: no limit)."""
        deadline = self._deadline(timeout)
        start = self._now()
        shown: list[str] = []
        while True:
            pods = await list_pods()
            names = sorted(str((p.get("metadata") or {}).get("name")) for p in pods)
            if not names:
                if shown:
                    log.info("%s: gone after %.1fs", what, self._now() - start)
                return
            if names != shown:
                log.info(
                    "%s: waiting for %d pod(s) to leave the node (at most %s): %s",
                    what, len(names), format_duration(timeout), ", ".join(names),
                )  # fmt: skip
                shown = names
            if deadline is not None and self._now() >= deadline:
                message = (
                    f"{what}: {len(names)} pod(s) still on the node after "
                    f"{format_duration(timeout)}: {', '.join(names)}"
                )
                await self._event("Warning", "OperandsStillRunning", message)
                raise StepFailed(message)
            await self._sleep(self.settings.poll_interval)

    async def _wait_for_apps(self, apps: tuple[str, ...], timeout: float) -> None:
        namespace = self.settings.operator_namespace
        log.info("checking that the paused operands' pods leave: app=%s", ",".join(apps))
        for app in apps:

            async def listed(app: str = app) -> list[dict[str, Any]]:
                return await self.api.pods(namespace=namespace, labels={"app": app})

            await self._wait_for_pods(app, timeout, listed)
        log.info("the paused operands' pods are gone")

    async def _wait_for_selector_pods(self, key: str, timeout: float) -> None:
        async def listed() -> list[dict[str, Any]]:
            return [
                p
                for p in await self.api.pods()
                if (plan_mod.controller_of(p) or {}).get("kind") == "DaemonSet"
                and key in ((p.get("spec") or {}).get("nodeSelector") or {})
            ]

        await self._wait_for_pods(f"DaemonSet pods selecting {key}", timeout, listed)

    async def _cordon(self) -> None:
        node = await self.api.node()
        meta = node.get("metadata") or {}
        unschedulable = bool((node.get("spec") or {}).get("unschedulable"))
        recorded = (meta.get("annotations") or {}).get(plan_mod.INITIAL_STATE_ANNOTATION)
        annotations: dict[str, str] = {}
        # A record is kept while the node is cordoned (a restarted run must not mistake our own
        # cordon for a person's); on a schedulable node any record is stale.
        initial = "true" if unschedulable else "false"
        if recorded is None or (not unschedulable and recorded != initial):
            annotations[plan_mod.INITIAL_STATE_ANNOTATION] = initial
        patch: dict[str, Any] = {}
        if annotations:
            patch["metadata"] = {"annotations": annotations}
        if not unschedulable:
            patch["spec"] = {"unschedulable": True}
        if patch:
            await self.api.patch(patch)
        if unschedulable and (recorded or initial) == "true":
            log.info(
                "node %s was already cordoned (not by the driver manager): it stays cordoned "
                "afterwards", self.settings.node_name,
            )  # fmt: skip
            return
        if unschedulable:
            log.info("node %s is cordoned by the driver manager already", self.settings.node_name)
            return
        log.info(
            "cordoned node %s (recorded %s=false, so only our cordon is undone)",
            self.settings.node_name, plan_mod.INITIAL_STATE_ANNOTATION,
        )  # fmt: skip
        await self._event("Normal", "Cordoned", "cordoned for the driver change")

    async def _uncordon(self) -> None:
        node = await self.api.node()
        meta = node.get("metadata") or {}
        unschedulable = bool((node.get("spec") or {}).get("unschedulable"))
        recorded = (meta.get("annotations") or {}).get(plan_mod.INITIAL_STATE_ANNOTATION)
        if recorded is None:
            if unschedulable:
                log.info("node cordoned, but not by the driver manager: it stays cordoned")
            return
        patch: dict[str, Any] = {
            "metadata": {"annotations": {plan_mod.INITIAL_STATE_ANNOTATION: None}}
        }
        if recorded == "true":
            log.info("node was cordoned before the driver manager started: it stays cordoned")
        elif unschedulable:
            patch["spec"] = {"unschedulable": None}
        await self.api.patch(patch)
        if "spec" in patch:
            log.info("uncordoned node %s", self.settings.node_name)
            await self._event("Normal", "Uncordoned", "uncordoned after the driver change")

    async def _evict_gpu_pods(self, fallback_drain: bool) -> None:
        s = self.settings
        selection = plan_mod.select_gpu_pods(
            await self.api.pods(),
            force=s.drain_use_force,
            delete_emptydir=s.drain_delete_emptydir_data,
        )
        if not selection.pods and not selection.blocked:
            log.info("no GPU pods on the node")
            return
        if selection.pods:
            log.info("GPU pods on the node: %s", _names(selection.pods))
        try:
            if selection.blocked:
                problems = "; ".join(f"{ref}: {why}" for ref, why in selection.blocked)
                raise StepFailed(f"cannot evict every GPU pod: {problems}")
            await self._evict(selection, GPU_PODS)
        except StepFailed as err:
            if not fallback_drain:
                raise
            log.warning("%s; draining the node instead (ENABLE_AUTO_DRAIN=true)", err)
            await self._event("Warning", "DrainFallback", f"{err}; draining the node")
            await self._drain()

    async def _drain(self) -> None:
        s = self.settings
        await self._cordon()
        selection = plan_mod.select_drain_pods(
            await self.api.pods(),
            selector=s.drain_pod_selector,
            force=s.drain_use_force,
            delete_emptydir=s.drain_delete_emptydir_data,
        )
        if selection.ignored:
            log.info(
                "draining node %s; left in place: %d DaemonSet/static pod(s)",
                s.node_name, len(selection.ignored),
            )  # fmt: skip
        if selection.blocked:
            problems = "; ".join(f"{ref}: {why}" for ref, why in selection.blocked)
            raise StepFailed(f"cannot drain the node: {problems}")
        await self._evict(selection, "pods")

    async def _evict(self, selection: plan_mod.Selection, what: str) -> None:
        """Evict the pods (retrying refusals until the drain timeout) and wait until they are
        gone."""
        reason_evicted = "GPUPodEvicted" if what == GPU_PODS else "PodEvicted"
        timeout = self.settings.drain_timeout
        deadline = self._deadline(timeout)
        pending = list(selection.evict)
        refused: dict[plan_mod.PodRef, str] = {}
        tries: dict[plan_mod.PodRef, int] = {}
        while pending:
            still: list[plan_mod.PodRef] = []
            for ref in pending:
                reason = await self.api.evict(ref.namespace, ref.name)
                tries[ref] = tries.get(ref, 0) + 1
                if reason is None:
                    after = f" after {tries[ref] - 1} refusal(s)" if ref in refused else ""
                    log.info("evicted %s%s", ref, after)
                    await self._event("Normal", reason_evicted, f"evicted {ref}{after}")
                    continue
                if refused.get(ref) != reason:
                    message = (
                        f"eviction of {ref} refused: {reason}; retrying every "
                        f"{self.settings.poll_interval:g}s (drain timeout: "
                        f"{format_duration(timeout)})"
                    )
                    log.warning("%s", message)
                    await self._event("Warning", "EvictionRefused", message)
                refused[ref] = reason
                still.append(ref)
            pending = still
            if not pending:
                break
            if deadline is not None and self._now() >= deadline:
                reasons = "; ".join(f"{ref}: {refused[ref]}" for ref in pending)
                raise StepFailed(
                    f"eviction of {what} still refused after {format_duration(timeout)}: {reasons}"
                )
            await self._sleep(self.settings.poll_interval)
        await self._wait_gone(list(selection.pods), deadline, what)

    async def _wait_gone(
        self, refs: list[plan_mod.PodRef], deadline: float | None, what: str
    ) -> None:
        remaining = list(refs)
        if remaining:
            log.info("waiting for %d evicted pod(s) to terminate", len(remaining))
        while remaining:
            still = []
            for ref in remaining:
                pod = await self.api.pod(ref.namespace, ref.name)
                uid = ((pod or {}).get("metadata") or {}).get("uid")
                if pod is not None and (not ref.uid or uid == ref.uid):
                    still.append(ref)
            remaining = still
            if not remaining:
                log.info("%s gone from the node", what)
                return
            if deadline is not None and self._now() >= deadline:
                raise StepFailed(
                    f"{what} still terminating after the drain timeout: {_names(remaining)}"
                )
            await self._sleep(self.settings.poll_interval)

    def _holders(self) -> holders_mod.Holders:
        return holders_mod.Holders(self.host.pod_resources_socket)

    async def _notify_in_use(self, message: str) -> None:
        await self._event("Warning", "GPUsInUse", message)

    async def _release_vgpus(self) -> None:
        kernel = self.host.kernel
        gpus = vgpu_state.read(kernel.root)
        ids = [v.id for gpu in gpus for v in gpu.vgpus]
        if not ids:
            log.info("no vGPUs to delete")
            return
        holders = self._holders()
        try:
            free = await vfio.wait_until_free(
                holders, holders_mod.vm_devices(ids), "vGPUs",
                interval=self.settings.poll_interval, stop=self.stop, notify=self._notify_in_use,
            )  # fmt: skip
        finally:
            await holders.close()
        if not free:
            raise Stopped()
        for gpu in gpus:
            for vgpu in gpu.vgpus:
                try:
                    vgpu_apply.delete(kernel, gpu, vgpu)
                except OSError as err:
                    raise StepFailed(f"cannot delete vGPU {vgpu.id}: {err}") from None
        log.info("deleted %d vGPU(s)", len(ids))

    def _cleanup_driver_root(self) -> None:
        points = self.host.unmount_driver_root()
        if points:
            log.info("unmounted the old driver root: %s", " ".join(points))
        else:
            log.info("nothing mounted at %s", host_mod.DRIVER_ROOT)
        if self.host.remove_pid_file():
            log.info("removed %s", host_mod.PID_FILE)

    def _unload(self, modules: tuple[str, ...]) -> None:
        for module in modules:
            if self.host.loaded(module):
                self.host.unload(module)
                log.info("rmmod %s: done", module)

    async def _in_use_detail(self) -> str:
        holders = self._holders()
        try:
            pods = await holders.pods(holders_mod.container_stack)
        finally:
            await holders.close()
        users = self.host.refcnt(plan_mod.NVIDIA)
        parts = []
        if users:
            parts.append(f"nvidia refcnt {users}")
        if pods:
            parts.append(f"pods holding GPUs: {', '.join(pods)}")
        return "; ".join(parts)

    async def _unload_driver(self, modules: tuple[str, ...], drain_and_retry: bool) -> None:
        loaded = tuple(m for m in modules if self.host.loaded(m))
        if not loaded:
            log.info("no NVIDIA kernel module is loaded any more")
            self._cleanup_driver_root()
            return
        log.info("unloading the NVIDIA driver: %s", " ".join(loaded))
        try:
            self._unload(loaded)
        except host_mod.HostError as err:
            detail = await self._in_use_detail()
            shown = f"{err}" + (f" ({detail})" if detail else "")
            log.warning("could not unload the NVIDIA driver: %s", shown)
            await self._event("Warning", "DriverInUse", f"cannot unload the driver: {shown}")
            if not drain_and_retry:
                hint = self.plan.in_use_hint if self.plan else ""
                raise StepFailed(
                    f"the NVIDIA driver is in use: {shown}" + (f"; {hint}" if hint else "")
                ) from None
            log.info("draining the node and trying again (ENABLE_AUTO_DRAIN=true)")
            await self._drain()
            try:
                self._unload(loaded)
            except host_mod.HostError as again:
                raise StepFailed(
                    f"the NVIDIA driver is still in use after a drain: {again}"
                ) from None
        self._cleanup_driver_root()
        log.info("NVIDIA driver unloaded")
        await self._event("Normal", "DriverUnloaded", f"unloaded {' '.join(loaded)}")

    async def _unbind_vfio(self) -> None:
        log.info("releasing the GPUs from vfio (vfio-manage unbind --all)")
        holders = self._holders()
        try:
            code = await self._race(
                vfio.unbind(
                    self.host.kernel,
                    vfio.Options(poll_interval=self.settings.poll_interval),
                    holders,
                    notify=self._notify_in_use,
                )
            )
        finally:
            await holders.close()
        if code != vfio.EXIT_OK:
            raise StepFailed("could not release the GPUs from vfio (see the lines above)")

    async def _wait_for_mofed(self, use_host_mofed: bool, timeout: float) -> None:
        what = (
            f"{host_mod.MOFED_MODULE} loaded (USE_HOST_MOFED=true)"
            if use_host_mofed
            else host_mod.MOFED_READY
        )
        deadline = self._deadline(timeout)
        if self.host.mofed_ready(use_host_mofed):
            log.info("GPUDirect RDMA: MOFED is ready (%s)", what)
            return
        log.info(
            "GPUDirect RDMA: waiting for MOFED (%s, at most %s)", what, format_duration(timeout)
        )
        while not self.host.mofed_ready(use_host_mofed):
            if deadline is not None and self._now() >= deadline:
                raise StepFailed(f"MOFED not ready after {format_duration(timeout)}: no {what}")
            await self._sleep(self.settings.poll_interval)
        log.info("MOFED is ready")

    async def _restore(self, paused: Mapping[str, str]) -> None:
        changed: dict[str, str | None] = {}

        def compute(labels: dict[str, str]) -> dict[str, str]:
            restore = plan_mod.restore_patch(paused, labels)
            changed.clear()
            changed.update(restore.changed_meanwhile)
            return restore.patch

        before, patch = await self._patch_labels(compute, "restore the GPU operands")
        for key, value in sorted(changed.items()):
            log.warning(
                "left %s=%s as it is: it changed while paused", key,
                value if value is not None else "(removed)",
            )  # fmt: skip
        if not patch:
            if self._paused_any:
                log.info("no paused operand to restore")
            return
        change = plan_mod.describe_changes(before, patch)
        log.info("restoring GPU operands: %s", change)
        await self._event("Normal", "OperandsRestored", f"restored: {change}")
