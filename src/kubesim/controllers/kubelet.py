"""Kubelet simulator: runs bound pods through their lifecycle, keeps node status and Leases.

Pod runners registered by image or label run as the containers' programs; everything else
"runs" until stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fnmatch
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from kubesim import errors, selectors
from kubesim.controllers.base import Controller
from kubesim.store import Event, Store, dumps, now

log = logging.getLogger("kubesim.kubelet")
POD_KEY = ("", "pods")
NODE_KEY = ("", "nodes")
LEASE_NAMESPACE = "kube-node-lease"


@dataclass
class KubeletConfig:
    """Delays (seconds) of the simulated kubelet; `instant=True` zeroes them for scale tests."""

    instant: bool = False
    pending_delay: float = 0.0
    init_container_duration: float = 0.05
    start_delay: float = 0.05
    ready_delay: float = 0.05
    restart_delay: float = 0.1
    termination_delay: float = 0.0
    lease_interval: float | None = 10.0
    kubelet_version: str = "v1.35.0"
    container_runtime_version: str = "containerd://2.0.5"
    kernel_version: str = "6.8.0-52-generic"
    os_image: str = "Ubuntu 24.04.1 LTS"
    operating_system: str = "linux"
    architecture: str = "amd64"
    capacity: dict[str, str] = field(
        default_factory=lambda: {
            "cpu": "16",
            "memory": "65536Mi",
            "pods": "110",
            "ephemeral-storage": "200Gi",
            "hugepages-1Gi": "0",
            "hugepages-2Mi": "0",
        }
    )

    def delay(self, value: float) -> float:
        """A configured delay, or zero in instant mode."""
        return 0.0 if self.instant else value


class PodContext:
    """What a pod runner sees: its pod, node and container, and levers on the container's state."""

    def __init__(
        self,
        kubelet: Kubelet,
        pod: dict[str, Any],
        container: dict[str, Any],
        init: bool,
    ) -> None:
        self._kubelet = kubelet
        self.pod = pod
        self.container = container
        self.container_name: str = container.get("name", "")
        self.image: str = container.get("image", "")
        self.init = init
        self.node_name: str = (pod.get("spec") or {}).get("nodeName", "")
        self.namespace: str = pod["metadata"].get("namespace", "")
        self.name: str = pod["metadata"]["name"]
        self.url = kubelet.url
        self.kubeconfig_path = kubelet.kubeconfig_path
        self.env = resolve_env(pod, container)
        self.stopping = asyncio.Event()
        self.exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.ready_set: bool | None = None

    @property
    def labels(self) -> dict[str, str]:
        """The pod's labels."""
        return dict(self.pod["metadata"].get("labels") or {})

    def set_ready(self, ready: bool = True) -> None:
        """Set this container's readiness (as a readiness probe would)."""
        self.ready_set = ready
        self._kubelet.set_container_ready(self, ready)

    def exit(self, code: int = 0) -> None:
        """End the container with an exit code; the restartPolicy decides what happens next."""
        if not self.exited.done():
            self.exited.set_result(code)

    def node(self) -> dict[str, Any] | None:
        """A copy of this pod's Node object (convenience; real node programs use the API)."""
        return self._kubelet.store.get("nodes", self.node_name)


@runtime_checkable
class PodRunnerObject(Protocol):
    """A runner with explicit start/stop hooks; the container runs until `ctx.exit()`."""

    async def start(self, ctx: PodContext) -> None:
        """Called when the container starts."""

    async def stop(self, ctx: PodContext) -> None:
        """Called when the container stops (within the pod's grace period)."""


# A callable runner runs for the container's lifetime; its return value is the exit code
# (None means 0), an exception means exit code 1, and it is cancelled when the pod stops.
PodRunnerFunction = Callable[[PodContext], Awaitable[int | None]]
PodRunner = PodRunnerObject | PodRunnerFunction


@dataclass
class RunnerRegistration:
    """A runner and what it matches: an image (exact, repository without tag, or glob) or labels."""

    runner: PodRunner
    image: str | None = None
    label_selector: str | None = None
    container: str | None = None

    def matches(self, pod: dict[str, Any], container: dict[str, Any]) -> bool:
        """Whether this registration runs a container of a pod."""
        if self.container is not None and container.get("name") != self.container:
            return False
        if self.image is not None and not image_matches(self.image, container.get("image", "")):
            return False
        if self.label_selector is not None:
            selector = selectors.parse_label_selector(self.label_selector)
            if not selector.matches(pod["metadata"].get("labels")):
                return False
        return True


def image_matches(pattern: str, image: str) -> bool:
    """Exact match, same repository ignoring tag/digest, or a shell-style glob."""
    if pattern == image or fnmatch.fnmatchcase(image, pattern):
        return True
    repository = image.split("@", 1)[0]
    last = repository.rsplit("/", 1)
    if ":" in last[-1]:
        repository = repository.rsplit(":", 1)[0]
    return repository == pattern


def resolve_env(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """Container environment with literal values and the common downward-API fieldRefs."""
    fields = {
        "spec.nodeName": (pod.get("spec") or {}).get("nodeName", ""),
        "metadata.name": pod["metadata"].get("name", ""),
        "metadata.namespace": pod["metadata"].get("namespace", ""),
        "metadata.uid": pod["metadata"].get("uid", ""),
        "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName", ""),
        "status.hostIP": (pod.get("status") or {}).get("hostIP", ""),
        "status.podIP": (pod.get("status") or {}).get("podIP", ""),
    }
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        name = item.get("name", "")
        if "value" in item:
            env[name] = str(item["value"])
            continue
        ref = (item.get("valueFrom") or {}).get("fieldRef") or {}
        path = ref.get("fieldPath", "")
        if path in fields:
            env[name] = str(fields[path])
        elif path.startswith("metadata.labels['"):
            env[name] = (pod["metadata"].get("labels") or {}).get(path[17:-2], "")
    return env


class _PodWorker:
    """Drives one pod: init containers in order, then each container with restarts."""

    def __init__(self, kubelet: Kubelet, pod: dict[str, Any]) -> None:
        self.kubelet = kubelet
        self.key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        self.uid = pod["metadata"]["uid"]
        self.pod = pod
        self.contexts: dict[str, PodContext] = {}
        self.runner_tasks: dict[str, asyncio.Task[int]] = {}
        self.init_statuses: list[dict[str, Any]] = []
        self.statuses: list[dict[str, Any]] = []
        self.phase = "Pending"
        self.conditions: dict[str, dict[str, Any]] = {}
        self.task: asyncio.Task[None] | None = None
        self.terminating = False
        self.started = now()

    # ----- status model ---------------------------------------------------------------------

    def _condition(self, ctype: str, value: bool) -> None:
        status = "True" if value else "False"
        current = self.conditions.get(ctype)
        if current is None or current["status"] != status:
            self.conditions[ctype] = {
                "type": ctype,
                "status": status,
                "lastProbeTime": None,
                "lastTransitionTime": now(),
            }

    def refresh_conditions(self) -> None:
        spec = self.pod.get("spec") or {}
        inits_done = all(
            ((s.get("state") or {}).get("terminated") or {}).get("exitCode") == 0
            for s in self.init_statuses
        ) and len(self.init_statuses) == len(spec.get("initContainers") or [])
        all_ready = bool(self.statuses) and all(s.get("ready") for s in self.statuses)
        self._condition("PodReadyToStartContainers", True)
        self._condition("Initialized", inits_done)
        self._condition("Ready", all_ready and not self.terminating)
        self._condition("ContainersReady", all_ready)
        self._condition("PodScheduled", True)

    def status(self) -> dict[str, Any]:
        self.refresh_conditions()
        node_ip = self.kubelet.node_ip(self.pod["spec"]["nodeName"])
        status: dict[str, Any] = {
            "phase": self.phase,
            "conditions": [
                self.conditions[c]
                for c in (
                    "PodReadyToStartContainers",
                    "Initialized",
                    "Ready",
                    "ContainersReady",
                    "PodScheduled",
                )
            ],
            "hostIP": node_ip,
            "hostIPs": [{"ip": node_ip}],
            "podIP": self.kubelet.pod_ip(self.uid, self.pod),
            "startTime": self.started,
            "qosClass": (self.pod.get("status") or {}).get("qosClass", "BestEffort"),
            "containerStatuses": self.statuses,
        }
        status["podIPs"] = [{"ip": status["podIP"]}]
        if self.init_statuses:
            status["initContainerStatuses"] = self.init_statuses
        return status

    def _container_status(self, container: dict[str, Any]) -> dict[str, Any]:
        image = container.get("image", "")
        return {
            "name": container.get("name", ""),
            "image": image,
            "imageID": f"{image.split(':')[0]}@sha256:{'0' * 64}",
            "containerID": "",
            "ready": False,
            "started": False,
            "restartCount": 0,
            "state": {"waiting": {"reason": "ContainerCreating"}},
        }

    def mark(self) -> None:
        self.kubelet.mark_dirty(self.key)

    # ----- lifecycle --------------------------------------------------------------------------

    async def run(self) -> None:
        cfg = self.kubelet.config
        spec = self.pod.get("spec") or {}
        inits = spec.get("initContainers") or []
        containers = spec.get("containers") or []
        self.init_statuses = [self._container_status(c) for c in inits]
        for status in self.init_statuses:
            status["state"] = {"waiting": {"reason": "PodInitializing"}}
        self.statuses = [self._container_status(c) for c in containers]
        if inits:
            for status in self.statuses:
                status["state"] = {"waiting": {"reason": "PodInitializing"}}
        if cfg.delay(cfg.pending_delay):
            await asyncio.sleep(cfg.delay(cfg.pending_delay))
        self.mark()
        restart_policy = spec.get("restartPolicy", "Always")
        for index, container in enumerate(inits):
            status = self.init_statuses[index]
            while True:
                status["state"] = {"running": {"startedAt": now()}}
                status["started"] = True
                status["containerID"] = f"containerd://{self.uid[:8]}{index:04d}i"
                self.mark()
                code = await self._run_container(container, init=True)
                status["started"] = False
                status["state"] = {
                    "terminated": {
                        "exitCode": code,
                        "reason": "Completed" if code == 0 else "Error",
                        "startedAt": status.get("state", {})
                        .get("running", {})
                        .get("startedAt", now()),
                        "finishedAt": now(),
                    }
                }
                self.mark()
                if code == 0:
                    break
                if restart_policy == "Never":
                    self.phase = "Failed"
                    self.mark()
                    return
                status["restartCount"] += 1
                status["lastState"] = status["state"]
                status["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
                self.mark()
                await asyncio.sleep(cfg.delay(cfg.restart_delay))
        loops = [self._container_loop(i, c, restart_policy) for i, c in enumerate(containers)]
        codes = await asyncio.gather(*loops)
        self.phase = "Succeeded" if all(c == 0 for c in codes) else "Failed"
        self.mark()

    async def _container_loop(
        self, index: int, container: dict[str, Any], restart_policy: str
    ) -> int:
        cfg = self.kubelet.config
        status = self.statuses[index]
        while True:
            if cfg.delay(cfg.start_delay):
                await asyncio.sleep(cfg.delay(cfg.start_delay))
            started_at = now()
            status["state"] = {"running": {"startedAt": started_at}}
            status["started"] = True
            status["containerID"] = (
                f"containerd://{self.uid[:8]}{index:04d}{status['restartCount']:04d}"
            )
            self.phase = "Running"
            self.mark()
            code_task = asyncio.ensure_future(self._run_container(container, init=False))
            ready_task: asyncio.Future[None] | None = None
            registration = self.kubelet.runner_for(self.pod, container)
            probe_driven = registration is not None and bool(container.get("readinessProbe"))
            if not probe_driven:
                ready_task = asyncio.ensure_future(self._become_ready(status))
            code = await code_task
            if ready_task is not None:
                ready_task.cancel()
            status["ready"] = False
            status["started"] = False
            terminated = {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": started_at,
                "finishedAt": now(),
                "containerID": status["containerID"],
            }
            restart = restart_policy == "Always" or (restart_policy == "OnFailure" and code != 0)
            if not restart:
                status["state"] = {"terminated": terminated}
                self.mark()
                return code
            status["restartCount"] += 1
            status["lastState"] = {"terminated": terminated}
            status["state"] = {
                "waiting": {"reason": "CrashLoopBackOff" if code else "ContainerCreating"}
            }
            self.mark()
            await asyncio.sleep(max(cfg.delay(cfg.restart_delay), 0.001))

    async def _become_ready(self, status: dict[str, Any]) -> None:
        cfg = self.kubelet.config
        if cfg.delay(cfg.ready_delay):
            await asyncio.sleep(cfg.delay(cfg.ready_delay))
        status["ready"] = True
        self.mark()

    async def _run_container(self, container: dict[str, Any], init: bool) -> int:
        cfg = self.kubelet.config
        registration = self.kubelet.runner_for(self.pod, container)
        if registration is None:
            if init:
                await asyncio.sleep(cfg.delay(cfg.init_container_duration))
                return 0
            await asyncio.Event().wait()  # runs until the pod stops
            return 0
        ctx = PodContext(self.kubelet, self.pod, container, init)
        self.contexts[ctx.container_name] = ctx
        runner = registration.runner
        try:
            if isinstance(runner, PodRunnerObject):
                await runner.start(ctx)
                return await ctx.exited
            task = asyncio.ensure_future(_call(runner, ctx))
            waiters: set[asyncio.Future[Any]] = {task, ctx.exited}
            done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if ctx.exited in done:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                return ctx.exited.result()
            result = task.result()
            return int(result or 0)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("pod runner for %s/%s container %s failed", *self.key, ctx.container_name)
            return 1
        finally:
            self.contexts.pop(ctx.container_name, None)

    async def stop(self, grace: float) -> None:
        """Stop runners (object runners get `stop` within the grace period) and the worker."""
        self.terminating = True
        for ctx in list(self.contexts.values()):
            ctx.stopping.set()
            registration = self.kubelet.runner_for(self.pod, ctx.container)
            if registration is not None and isinstance(registration.runner, PodRunnerObject):
                try:
                    await asyncio.wait_for(registration.runner.stop(ctx), timeout=max(grace, 0.001))
                except (TimeoutError, Exception):
                    log.warning("pod runner stop for %s/%s did not finish cleanly", *self.key)
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task


async def _call(runner: PodRunnerFunction, ctx: PodContext) -> int | None:
    result = runner(ctx)
    if inspect.isawaitable(result):
        return await result
    return result


class Kubelet(Controller):
    """All simulated kubelets: one worker per bound pod, node status and node Lease heartbeats."""

    name = "kubelet"

    def __init__(
        self,
        store: Store,
        config: KubeletConfig | None = None,
        *,
        url: str = "",
        kubeconfig_path: Path | None = None,
    ) -> None:
        super().__init__(store)
        self.config = config or KubeletConfig()
        self.url = url
        self.kubeconfig_path = kubeconfig_path
        self.runners: list[RunnerRegistration] = []
        self.workers: dict[tuple[str, str], _PodWorker] = {}
        self.down_nodes: set[str] = set()
        self._dirty: set[tuple[str, str]] = set()
        self._flush_scheduled = False
        self._node_ips: dict[str, str] = {}
        self._pod_ips: dict[str, str] = {}
        self._lease_task: asyncio.Task[None] | None = None
        self._stopping: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        super().start()
        if self.config.lease_interval:
            self._lease_task = asyncio.get_running_loop().create_task(self._heartbeat())

    async def stop(self) -> None:
        if self._lease_task:
            self._lease_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lease_task
        await super().stop()
        for worker in list(self.workers.values()):
            await worker.stop(0)
        self.workers.clear()
        for task in list(self._stopping):
            task.cancel()

    # ----- registration -------------------------------------------------------------------------

    def register(self, registration: RunnerRegistration) -> None:
        """Add a pod runner and requeue pods so already-running matches pick it up on restart."""
        self.runners.append(registration)

    def runner_for(
        self, pod: dict[str, Any], container: dict[str, Any]
    ) -> RunnerRegistration | None:
        """The first registration matching a container."""
        for registration in self.runners:
            if registration.matches(pod, container):
                return registration
        return None

    # ----- addressing ---------------------------------------------------------------------------

    def node_ip(self, node: str) -> str:
        """A stable InternalIP per node."""
        ip = self._node_ips.get(node)
        if ip is None:
            index = len(self._node_ips) + 1
            ip = self._node_ips[node] = f"10.0.{index // 250}.{index % 250 + 1}"
        return ip

    def pod_ip(self, uid: str, pod: dict[str, Any]) -> str:
        """A stable pod IP (the node IP for hostNetwork pods)."""
        if (pod.get("spec") or {}).get("hostNetwork"):
            return self.node_ip(pod["spec"]["nodeName"])
        ip = self._pod_ips.get(uid)
        if ip is None:
            index = len(self._pod_ips) + 1
            ip = self._pod_ips[uid] = (
                f"10.{128 + index // 65000}.{index // 250 % 256}.{index % 250 + 1}"
            )
        return ip

    # ----- events -------------------------------------------------------------------------------

    def initial_keys(self) -> list[Any]:
        return [
            ("pod", s.obj["metadata"]["namespace"], s.obj["metadata"]["name"])
            for s in self.store.scan(POD_KEY)
            if (s.obj.get("spec") or {}).get("nodeName")
        ]

    def on_event(self, event: Event) -> None:
        if event.key == POD_KEY:
            meta = event.new.obj["metadata"]
            if (event.new.obj.get("spec") or {}).get("nodeName") or (
                meta["namespace"],
                meta["name"],
            ) in self.workers:
                self.enqueue(("pod", meta["namespace"], meta["name"]))
        elif event.key == NODE_KEY and event.type == "DELETED":
            self.enqueue(("node-gone", event.new.obj["metadata"]["name"]))

    def reconcile(self, key: Any) -> None:
        if key[0] == "node-gone":
            for bound_key, bound in list(self.workers.items()):
                if bound.pod["spec"].get("nodeName") == key[1]:
                    self._discard(bound_key)
            return
        _, namespace, name = key
        pod_key = (namespace, name)
        stored = self.store.peek(POD_KEY, namespace, name)
        worker: _PodWorker | None = self.workers.get(pod_key)
        if stored is None:
            if worker is not None:
                self._discard(pod_key)
            return
        pod = stored.obj
        if worker is not None and worker.uid != pod["metadata"]["uid"]:
            self._discard(pod_key)
            worker = None
        node = pod["spec"].get("nodeName", "")
        if pod["metadata"].get("deletionTimestamp"):
            if worker is None or not worker.terminating:
                self._terminate(pod_key, pod, worker)
            return
        if worker is not None or node in self.down_nodes:
            return
        if self.store.peek(NODE_KEY, "", node) is None:
            return
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        worker = _PodWorker(self, pod)
        self.workers[pod_key] = worker
        worker.task = asyncio.get_running_loop().create_task(worker.run())

    def _discard(self, pod_key: tuple[str, str]) -> None:
        worker = self.workers.pop(pod_key, None)
        self._dirty.discard(pod_key)
        if worker is not None:
            self._spawn(worker.stop(0))

    def _spawn(self, coro: Awaitable[None]) -> None:
        async def wrapper() -> None:
            await coro

        task = asyncio.get_running_loop().create_task(wrapper())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def _terminate(
        self, pod_key: tuple[str, str], pod: dict[str, Any], worker: _PodWorker | None
    ) -> None:
        grace = float(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
        cfg = self.config

        async def terminate() -> None:
            if worker is not None:
                await worker.stop(grace)
            delay = min(cfg.delay(cfg.termination_delay), grace)
            if delay > 0:
                await asyncio.sleep(delay)
            self.workers.pop(pod_key, None)
            self._dirty.discard(pod_key)
            current = self.store.peek(POD_KEY, *pod_key)
            if current is None or current.obj["metadata"]["uid"] != pod["metadata"]["uid"]:
                return
            rt = self.rt("pods")
            with contextlib.suppress(errors.ApiError):
                if current.obj["metadata"].get("finalizers"):
                    obj = current.copy()
                    obj.setdefault("status", {})["phase"] = (
                        "Failed" if worker else obj["status"].get("phase", "Failed")
                    )
                    for status in obj["status"].get("containerStatuses") or []:
                        status["ready"] = False
                    self.store.replace(
                        rt, obj, namespace=pod_key[0], name=pod_key[1], subresource="status"
                    )
                self.store.remove(rt, pod_key[0], pod_key[1], grace=0)

        if worker is None:
            self.workers.pop(pod_key, None)
        self._spawn(terminate())

    # ----- status writes ----------------------------------------------------------------------

    def mark_dirty(self, pod_key: tuple[str, str]) -> None:
        """Queue a status write for a pod, coalesced with other changes in this loop turn."""
        self._dirty.add(pod_key)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, set()
        rt = self.rt("pods")
        for pod_key in dirty:
            worker = self.workers.get(pod_key)
            stored = self.store.peek(POD_KEY, *pod_key)
            if worker is None or stored is None or stored.obj["metadata"]["uid"] != worker.uid:
                continue
            if stored.obj["metadata"].get("deletionTimestamp"):
                continue
            status = worker.status()
            if stored.obj.get("status") == status:
                continue
            obj = stored.copy()
            obj["status"] = json_copy(status)
            try:
                self.store.replace(
                    rt, obj, namespace=pod_key[0], name=pod_key[1], subresource="status"
                )
            except errors.ApiError as exc:
                log.debug("kubelet status write for %s/%s failed: %s", *pod_key, exc.message)

    def set_container_ready(self, ctx: PodContext, ready: bool) -> None:
        """Apply a runner's readiness verdict to the container status."""
        worker = self.workers.get((ctx.namespace, ctx.name))
        if worker is None:
            return
        for status in worker.statuses:
            if status["name"] == ctx.container_name:
                status["ready"] = ready and "running" in (status.get("state") or {})
        worker.mark()

    # ----- nodes --------------------------------------------------------------------------------

    def node_object(
        self,
        name: str,
        labels: dict[str, str] | None = None,
        capacity: dict[str, str] | None = None,
        node_info: dict[str, str] | None = None,
        taints: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """A Node as a freshly registered kubelet would create it."""
        cfg = self.config
        stamp = now()
        merged_capacity = {**cfg.capacity, **(capacity or {})}
        info = {
            "architecture": cfg.architecture,
            "bootID": f"boot-{name}",
            "containerRuntimeVersion": cfg.container_runtime_version,
            "kernelVersion": cfg.kernel_version,
            "kubeProxyVersion": "",
            "kubeletVersion": cfg.kubelet_version,
            "machineID": f"machine-{name}",
            "operatingSystem": cfg.operating_system,
            "osImage": cfg.os_image,
            "systemUUID": f"uuid-{name}",
            **(node_info or {}),
        }
        all_labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": cfg.operating_system,
            "kubernetes.io/arch": cfg.architecture,
            "beta.kubernetes.io/os": cfg.operating_system,
            "beta.kubernetes.io/arch": cfg.architecture,
            **(labels or {}),
        }
        spec: dict[str, Any] = {}
        if taints:
            spec["taints"] = taints
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": all_labels},
            "spec": spec,
            "status": {
                "capacity": merged_capacity,
                "allocatable": dict(merged_capacity),
                "conditions": _node_conditions(True, stamp),
                "addresses": [
                    {"type": "InternalIP", "address": self.node_ip(name)},
                    {"type": "Hostname", "address": name},
                ],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": info,
            },
        }

    def ensure_lease(self, name: str) -> None:
        """Create or renew a node's Lease in kube-node-lease."""
        rt = self.rt("leases.coordination.k8s.io")
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        current = self.store.peek(rt.key, LEASE_NAMESPACE, name)
        if current is None:
            node = self.store.peek(NODE_KEY, "", name)
            lease: dict[str, Any] = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "namespace": LEASE_NAMESPACE},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": stamp},
            }
            if node is not None:
                lease["metadata"]["ownerReferences"] = [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": name,
                        "uid": node.obj["metadata"]["uid"],
                    }
                ]
            self.store.insert(rt, lease)
            return
        obj = current.copy()
        obj["spec"]["renewTime"] = stamp
        self.store.replace(rt, obj, namespace=LEASE_NAMESPACE, name=name)

    async def _heartbeat(self) -> None:
        interval = self.config.lease_interval or 10.0
        while True:
            await asyncio.sleep(interval)
            for index, stored in enumerate(list(self.store.scan(NODE_KEY))):
                name = stored.obj["metadata"]["name"]
                if name in self.down_nodes:
                    continue
                with contextlib.suppress(errors.ApiError):
                    self.ensure_lease(name)
                if index % 200 == 199:
                    await asyncio.sleep(0)

    def set_node_ready(self, name: str, ready: bool, *, unreachable: bool = False) -> None:
        """Flip a node's Ready condition and the matching taints; a down node stops its pods."""
        stored = self.store.peek(NODE_KEY, "", name)
        if stored is None:
            raise errors.not_found("nodes", "", name)
        obj = stored.copy()
        stamp = now()
        status = obj.setdefault("status", {})
        status["conditions"] = _node_conditions(
            ready, stamp, unreachable=unreachable, previous=status.get("conditions")
        )
        taint_key = (
            "node.kubernetes.io/unreachable" if unreachable else "node.kubernetes.io/not-ready"
        )
        taints = [
            t
            for t in (obj.get("spec") or {}).get("taints") or []
            if t.get("key")
            not in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
        ]
        if not ready:
            taints.append({"key": taint_key, "effect": "NoSchedule"})
            taints.append({"key": taint_key, "effect": "NoExecute", "timeAdded": stamp})
        spec = obj.setdefault("spec", {})
        if taints:
            spec["taints"] = taints
        else:
            spec.pop("taints", None)
        rt = self.rt("nodes")
        # The store owns what it is given, so each write gets its own copy.
        self.store.replace(rt, json_copy(obj), namespace="", name=name, subresource="status")
        del obj["metadata"]["resourceVersion"]
        self.store.replace(rt, obj, namespace="", name=name)
        if ready:
            self.down_nodes.discard(name)
            for pod in self.store.select(
                self.rt("pods"),
                None,
                selectors.EVERYTHING,
                selectors.parse_field_selector(f"spec.nodeName={name}"),
            ):
                meta = pod.obj["metadata"]
                self.enqueue(("pod", meta["namespace"], meta["name"]))
            return
        self.down_nodes.add(name)
        pods_rt = self.rt("pods")
        for pod_key, worker in list(self.workers.items()):
            if worker.pod["spec"].get("nodeName") != name:
                continue
            self.workers.pop(pod_key)
            self._spawn(worker.stop(0))
            current = self.store.peek(POD_KEY, *pod_key)
            if current is None:
                continue
            pod_obj = current.copy()
            for condition in (pod_obj.get("status") or {}).get("conditions") or []:
                if (
                    condition.get("type") in ("Ready", "ContainersReady")
                    and condition.get("status") != "False"
                ):
                    condition["status"] = "False"
                    condition["lastTransitionTime"] = stamp
            for container in (pod_obj.get("status") or {}).get("containerStatuses") or []:
                container["ready"] = False
            with contextlib.suppress(errors.ApiError):
                self.store.replace(
                    pods_rt, pod_obj, namespace=pod_key[0], name=pod_key[1], subresource="status"
                )


def _node_conditions(
    ready: bool,
    stamp: str,
    *,
    unreachable: bool = False,
    previous: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    old = {c.get("type"): c for c in previous or []}
    result = []
    for ctype, ok_status, reason in (
        ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID"),
        ("Ready", "True", "KubeletReady"),
    ):
        if ready:
            value, why, message = ok_status, reason, "kubelet is posting ready status"
        elif unreachable:
            value, why, message = (
                "Unknown",
                "NodeStatusUnknown",
                "Kubelet stopped posting node status.",
            )
        elif ctype == "Ready":
            value, why, message = "False", "KubeletNotReady", "container runtime is down"
        else:
            value, why, message = ok_status, reason, "kubelet has sufficient resources"
        before = old.get(ctype)
        transition = (
            before.get("lastTransitionTime", stamp)
            if before and before.get("status") == value
            else stamp
        )
        result.append(
            {
                "type": ctype,
                "status": value,
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": transition,
                "reason": why,
                "message": message,
            }
        )
    return result


def json_copy(value: Any) -> Any:
    """A deep copy via JSON (fast for plain data)."""
    import json

    return json.loads(dumps(value))
