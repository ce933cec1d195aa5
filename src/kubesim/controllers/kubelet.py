"""Kubelet simulator: runs bound pods through their lifecycle, keeps node status and Leases.

Pod runners registered by image or label run as the containers' programs; everything else
"runs" until stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fnmatch
import functools
import hashlib
import inspect
import logging
import re
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, overload, runtime_checkable

from kubesim import (
    cri,
    errors,
    images,
    programs,
    runner_logs,
    runtime_class,
    selectors,
    termination,
)
from kubesim.controllers.base import SLICE_SECONDS, Controller
from kubesim.controllers.volumes import (
    CONFIGMAP_KEY,
    SECRET_KEY,
    NodeFilesystems,
    PathNotMounted,
    PodVolumes,
    node_allocatable,
    resolve_within,
)
from kubesim.devicemanager import (
    AdmissionError,
    ContainerAllocation,
    DeviceManagers,
    PreStartError,
)
from kubesim.dramanager import DRAManagers, PrepareError, UnprepareError, uses_claims
from kubesim.store import Event, Store, dumps, loads, now
from kubesim.streaming.runtime import (
    ContainerInstance,
    ContainerIO,
    ContainerRuntime,
    ExecFunction,
    ExecOutput,
    ExecProcess,
)
from kubesim.turns import TURNS

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
    # First back-off before restarting a container that exited (the real kubelet's 10 s), doubling
    # up to `restart_delay_max` (its 5 min); the first restart is immediate, as in the kubelet.
    restart_delay: float = 0.1
    restart_delay_max: float = 3.0
    # A container with no runner but a `command` or `args` in a Never/OnFailure pod exits 0 after
    # this long (None: such containers run until stopped, like everything without a runner).
    command_duration: float | None = 0.05
    # How long an image pull takes, successful or not (`Pulling`, then `Pulled` or `Failed`):
    # short, yet a client looking right after creating a pod finds it in ContainerCreating,
    # as on a cluster. Which images exist is the cluster's image catalog (kubesim.images).
    pull_delay: float = 0.2
    # A failed pull is retried after `image_pull_backoff`, doubling up to
    # `image_pull_backoff_max` (the kubelet's 10 s and 5 min, scaled down); the container shows
    # ErrImagePull until the kubelet next looks at the pod (`image_pull_resync`, its 1 s
    # relist), then ImagePullBackOff. InvalidImageName and ErrImageNeverPull are looked at again
    # every `image_pull_backoff`. Not zeroed by `instant`: intervals, not latencies.
    image_pull_backoff: float = 1.0
    image_pull_backoff_max: float = 30.0
    image_pull_resync: float = 0.1
    # First retry of a volume that failed to mount (FailedMount), doubling up to 30 times this;
    # not zeroed by `instant`, since it is a polling interval rather than a latency.
    mount_retry_delay: float = 0.2
    termination_delay: float = 0.0
    lease_interval: float | None = 10.0
    # Device manager: how long a registering plugin has to answer the kubelet's dial, and how
    # long a resource whose plugin went away keeps its capacity (the kubelet's 10 s and 5 min).
    device_plugin_dial_timeout: float = 10.0
    device_plugin_grace_period: float = 300.0
    # DRA manager (kubesim.dramanager): how often the plugins_registry directory is looked at
    # (the kubelet is told by inotify), the first retry of a failed plugin registration
    # (doubling, as the plugin manager's 500 ms), how long a DRA plugin has to answer a call (the
    # kubelet's 45 s), how long a driver without a plugin keeps its ResourceSlices (30 s) and how
    # often claims of pods gone from the node are unprepared.
    dra_plugin_watch_interval: float = 0.05
    dra_registration_retry: float = 0.5
    dra_call_timeout: float = 45.0
    dra_wiping_delay: float = 30.0
    dra_reconcile_period: float = 60.0
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


class PodContext(ContainerIO):
    """What a pod runner sees: its pod, node and container, and levers on the container's state
    (output, stdin, exec and served ports come from `ContainerIO`)."""

    def __init__(
        self,
        kubelet: Kubelet,
        pod: dict[str, Any],
        container: dict[str, Any],
        init: bool,
        instance: ContainerInstance | None = None,
    ) -> None:
        self._kubelet = kubelet
        uid = pod["metadata"].get("uid", "")
        self._instance = instance or ContainerInstance(uid, container, "")
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
        # The pod's volumes (set by the kubelet when they are written for this pod).
        self.volumes: PodVolumes | None = None
        # What device plugins gave this container (set by the kubelet; None: no devices).
        self.allocation: ContainerAllocation | None = None
        # What the container wrote to its terminationMessagePath (None: nothing).
        self.termination_message: str | None = None

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

    def path(self, container_path: str, *, write: bool = False) -> Path:
        """Where a path of this container lives on this machine, through its volumeMounts
        (hostPath, configMap, secret, emptyDir, downwardAPI, projected, with subPath).

        Raises `PathNotMounted` (a FileNotFoundError) for a path no mount covers, since kubesim
        has no image filesystem, and PermissionError (EROFS) with `write=True` on a read-only
        mount; kubesim cannot stop writes through a Path obtained without `write=True`.
        """
        if self.volumes is None:
            raise PathNotMounted(
                f"pod {self.namespace}/{self.name} has no volumes set up", container_path
            )
        return self.volumes.path(self.container, self.env, container_path, write=write)

    def host_path(self, path: str = "/") -> Path:
        """A path of this pod's node on this machine (for node-level programs), resolved so
        that symlinks cannot lead outside the node's root."""
        return self._kubelet.host_path(self.node_name, path)

    @property
    def node_root(self) -> Path:
        """The node's root directory (its `/`) on this machine."""
        return self._kubelet.node_root(self.node_name)

    def as_on_node(self, text: str) -> str:
        """`text` with this machine's paths into the node's tree written as on the node (a
        runner that logs a path it resolved through `path()` or `host_path()` shows
        `/var/lib/kubelet/...`, as a container on a real node would, not where kubesim keeps
        the node's files). Pod volumes live under the node's tree too, at the kubelet's paths."""
        try:
            root = str(self.node_root)
        except RuntimeError:  # no node filesystems: nothing of the node's is on this machine
            return text
        if root not in text:
            return text
        # The root itself or a path under it, never a sibling such as node `t4-10` of `t4-1`.
        return re.sub(re.escape(root) + r"(?:/|(?![\w.-]))", "/", text)

    def write_termination_message(self, text: str) -> None:
        """Write the container's termination message (its `terminationMessagePath`, replaced,
        not appended): the kubelet reports it as `state.terminated.message` (see
        kubesim.termination)."""
        self.termination_message = text

    async def run_program(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | str = b"",
        env: Mapping[str, str] | None = None,
    ) -> programs.ProgramResult:
        """Run a program inside this container and collect its output: found as `kubectl
        exec` finds it (the runner's exec entries, then registered programs present here);
        a missing one gives exit code 127 and Go's `executable file not found in $PATH`.
        `env` is added to the container's environment for this process."""
        args = [str(a) for a in argv]
        if not args:
            raise ValueError("run_program needs a program name (argv is empty)")
        handler = self._instance.resolve_exec(args)
        if handler is None:
            return programs.ProgramResult(
                programs.NOT_FOUND_EXIT, "", programs.not_found_message(args[0]) + "\n"
            )
        out: list[bytes] = []
        err: list[bytes] = []
        reader = asyncio.StreamReader()
        reader.feed_data(stdin.encode() if isinstance(stdin, str) else bytes(stdin))
        reader.feed_eof()
        proc = ExecProcess(
            argv=args,
            stdin=reader,
            stdout=ExecOutput(out.append),
            stderr=ExecOutput(err.append),
            tty=False,
            container=self.container_name,
            env={**self.env, **(env or {})},
        )
        try:
            code = int(await handler(proc) or 0)
        except asyncio.CancelledError:
            raise
        except Exception:
            # A crashing program leaves its traceback on stderr, as a real one would.
            err.append(traceback.format_exc().encode())
            code = 1
        return programs.ProgramResult(
            code, b"".join(out).decode(errors="replace"), b"".join(err).decode(errors="replace")
        )


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
    # The runner calls `ctx.set_ready()` itself, as if its container had a readiness probe.
    reports_readiness: bool = False

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


def is_sidecar(container: dict[str, Any]) -> bool:
    """A native sidecar: an init container with `restartPolicy: Always` (Kubernetes 1.29+)."""
    return container.get("restartPolicy") == "Always"


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


@dataclass
class _PullBackOff:
    """A pod's back-off for one image: how long, since when, and the pull error it follows."""

    delay: float
    failed_at: float
    error: str


@functools.lru_cache(maxsize=4096)
def _image_id(image: str) -> str:
    """A container status's `imageID` for an image (one string shared by all its containers)."""
    return f"{image.split(':')[0]}@sha256:{'0' * 64}"


@functools.lru_cache(maxsize=4096)
def _container_field_path(name: str, init: bool) -> str:
    """An Event's `involvedObject.fieldPath` for a container: one string for all the pods whose
    containers have that name (the Events keep it)."""
    kind = "initContainers" if init else "containers"
    return f"spec.{kind}{{{name}}}"


class _PodWorker:
    """Drives one pod: volumes, init containers in order, then each container with restarts.

    Slotted: a 20,000-node cluster keeps one per pod, 150,000 of them."""

    __slots__ = (
        "allocations",
        "backoff",
        "claims_pod",
        "conditions",
        "contexts",
        "ephemeral_statuses",
        "ephemeral_tasks",
        "init_statuses",
        "key",
        "kubelet",
        "node_name",
        "parked",
        "phase",
        "pod",
        "pod_ips",
        "pull_backoff",
        "rejected",
        "run_ends",
        "runtime_handler",
        "sandbox_ready",
        "sidecar_tasks",
        "sidecars_stopping",
        "start_errors",
        "started",
        "statuses",
        "task",
        "terminating",
        "termination_messages",
        "uid",
        "volumes",
        "wake",
    )

    def __init__(self, kubelet: Kubelet, pod: dict[str, Any]) -> None:
        self.kubelet = kubelet
        self.key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        self.uid = pod["metadata"]["uid"]
        self.pod = pod
        self.node_name: str = pod["spec"]["nodeName"]
        self.contexts: dict[str, PodContext] = {}
        # Native sidecars (init containers with restartPolicy Always): their restart loops, and
        # an event per container run that is set when that run has ended.
        self.sidecar_tasks: dict[str, asyncio.Task[None]] = {}
        self.run_ends: dict[str, asyncio.Event] = {}
        self.sidecars_stopping = False
        self.init_statuses: list[dict[str, Any]] = []
        self.statuses: list[dict[str, Any]] = []
        self.phase = "Pending"
        self.conditions: dict[str, dict[str, Any]] = {}
        self.task: asyncio.Task[None] | None = None
        self.terminating = False
        self.started = now()
        # Volumes are set up and the sandbox exists (PodReadyToStartContainers).
        self.sandbox_ready = False
        self.volumes: PodVolumes | None = None
        # Set when something a failed mount waits for may have changed (made with the volumes).
        self.wake: asyncio.Event | None = None
        # Instances of the containers that run until the pod stops, without a program of
        # their own: no coroutine waits for each (stop() finishes them).
        self.parked: list[ContainerInstance] = []
        # status.podIPs, made once and shared by every status written (never mutated).
        self.pod_ips: list[dict[str, str]] | None = None
        # Restarts so far per container, for the back-off (reset after a long enough run).
        self.backoff: dict[str, int] = {}
        # Debug containers added through pods/ephemeralcontainers (never restarted).
        self.ephemeral_statuses: list[dict[str, Any]] = []
        self.ephemeral_tasks: dict[str, asyncio.Task[None]] = {}
        # Containers whose command the runtime could not start (name -> runc's message).
        self.start_errors: dict[str, str] = {}
        # What each container's last run wrote to its terminationMessagePath.
        self.termination_messages: dict[str, str] = {}
        # Device-plugin allocations per container name, from admission.
        self.allocations: dict[str, ContainerAllocation] = {}
        # The pod as last read for its ResourceClaims (status.resourceClaimStatuses).
        self.claims_pod = pod
        # (reason, message) when admission refused the pod.
        self.rejected: tuple[str, str] | None = None
        # The CRI runtime handler of the pod's RuntimeClass ("" = the runtime's default).
        self.runtime_handler = ""
        # Image pull back-off per image as the container names it (the kubelet keys it by pod
        # and image): delay, when the last pull failed, and its error.
        self.pull_backoff: dict[str, _PullBackOff] = {}

    # ----- status model ---------------------------------------------------------------------

    def _condition(self, ctype: str, value: bool, reason: str = "", message: str = "") -> None:
        status = "True" if value else "False"
        current = self.conditions.get(ctype)
        if (
            current is not None
            and current["status"] == status
            and current.get("reason", "") == reason
            and current.get("message", "") == message
        ):
            return
        condition: dict[str, Any] = {
            "type": ctype,
            "status": status,
            "lastTransitionTime": current["lastTransitionTime"]
            if current is not None and current["status"] == status
            else now(),
        }
        if reason:
            condition["reason"] = reason
        if message:
            condition["message"] = message
        self.conditions[ctype] = condition

    def refresh_conditions(self) -> None:
        spec = self.pod.get("spec") or {}
        sidecars = {c.get("name", "") for c in spec.get("initContainers") or [] if is_sidecar(c)}
        incomplete = [
            s["name"]
            for s in self.init_statuses
            if (
                not s.get("started")
                if s["name"] in sidecars
                else ((s.get("state") or {}).get("terminated") or {}).get("exitCode") != 0
            )
        ]
        inits_done = not incomplete and len(self.init_statuses) == len(
            spec.get("initContainers") or []
        )
        # A native sidecar's readiness counts towards the pod's, as the kubelet counts it.
        unready = [
            s["name"]
            for s in [*(i for i in self.init_statuses if i["name"] in sidecars), *self.statuses]
            if not s.get("ready")
        ]
        all_ready = bool(self.statuses) and not unready
        finished = self.phase in ("Succeeded", "Failed")
        if finished:
            why, message = "PodCompleted", ""
        else:
            why, message = (
                "ContainersNotReady",
                f"containers with unready status: [{' '.join(unready)}]",
            )
        self._condition("PodReadyToStartContainers", self.sandbox_ready and not finished)
        if inits_done:
            self._condition("Initialized", True)
        else:
            self._condition(
                "Initialized",
                False,
                "ContainersNotInitialized",
                f"containers with incomplete status: [{' '.join(incomplete)}]",
            )
        ready = all_ready and not self.terminating and not finished
        self._condition("Ready", ready, *(() if ready else (why, message)))
        self._condition("ContainersReady", all_ready, *(() if all_ready else (why, message)))
        self._condition("PodScheduled", True)

    def status(self) -> dict[str, Any]:
        if self.rejected is not None:
            return self._rejected_status(*self.rejected)
        self.refresh_conditions()
        node_ip = self.kubelet.node_ip(self.node_name)
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
            "hostIPs": self.kubelet.host_ips(self.node_name),
            "startTime": self.started,
            "qosClass": (self.pod.get("status") or {}).get("qosClass", "BestEffort"),
            "containerStatuses": self.statuses,
        }
        if self.sandbox_ready:
            # The pod network (and so its IP) exists once the sandbox does.
            if self.pod_ips is None:
                self.pod_ips = [{"ip": self.kubelet.pod_ip(self.uid, self.pod)}]
            status["podIP"] = self.pod_ips[0]["ip"]
            status["podIPs"] = self.pod_ips
        if self.init_statuses:
            status["initContainerStatuses"] = self.init_statuses
        if self.ephemeral_statuses:
            status["ephemeralContainerStatuses"] = self.ephemeral_statuses
        return status

    def _rejected_status(self, reason: str, message: str) -> dict[str, Any]:
        """The status of a pod refused at admission: Failed with the kubelet's reason and
        message, and no container statuses (nothing was started)."""
        self._condition("PodScheduled", True)
        return {
            "phase": "Failed",
            "conditions": [self.conditions["PodScheduled"]],
            "message": f"Pod was rejected: {message}",
            "reason": reason,
            "startTime": self.started,
            "qosClass": (self.pod.get("status") or {}).get("qosClass", "BestEffort"),
        }

    def _container_status(self, container: dict[str, Any]) -> dict[str, Any]:
        image = container.get("image", "")
        return {
            "name": container.get("name", ""),
            "image": image,
            "imageID": _image_id(image),
            "containerID": "",
            "ready": False,
            "started": False,
            "restartCount": 0,
            "state": {"waiting": {"reason": "ContainerCreating"}},
        }

    def mark(self) -> None:
        self.kubelet.mark_dirty(self.key)

    def event(self, event_type: str, reason: str, message: str, field_path: str = "") -> None:
        """Record a kubelet Event about this pod (or one of its containers)."""
        self.kubelet.events.record(
            self.pod,
            event_type,
            reason,
            message,
            component="kubelet",
            host=self.node_name,
            field_path=field_path,
        )

    @property
    def pod_ref(self) -> str:
        """The pod as the kubelet names it in messages: `name_namespace(uid)`."""
        return f"{self.key[1]}_{self.key[0]}({self.uid})"

    # ----- lifecycle --------------------------------------------------------------------------

    async def run(self) -> None:
        """The pod's lifecycle (the worker's task)."""
        try:
            await self._run()
        finally:
            self.task = None  # a run that ended keeps nothing alive: neither task nor coroutine

    async def _run(self) -> None:
        if not await self._admit():
            return
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
        if not cfg.instant:
            # Instant mode publishes only the settled state (one status write per pod).
            self.mark()
        await TURNS.pause()  # instant mode has no other pause: let the API server run
        await self._mount_volumes()
        await self._prepare_dynamic_resources()
        await self._run_sandbox()
        self.sandbox_ready = True
        await TURNS.pause()
        restart_policy = spec.get("restartPolicy", "Always")
        for index, container in enumerate(inits):
            status = self.init_statuses[index]
            if is_sidecar(container):
                # A native sidecar: the next container starts once this one has started, and
                # it keeps running (restarted whenever it exits) beside everything after it.
                started = asyncio.Event()
                self.sidecar_tasks[container.get("name", "")] = asyncio.ensure_future(
                    self._sidecar_loop(index, container, started)
                )
                await started.wait()
                continue
            while True:
                started_at = await self._start(container, status, index, init=True)
                self.mark()
                began = asyncio.get_running_loop().time()
                code = await self._run_container(container, init=True)
                terminated = self._terminated(code, started_at, status, container)
                status["started"] = False
                status["state"] = {"terminated": terminated}
                self.mark()
                if code == 0:
                    break
                if restart_policy == "Never":
                    self.phase = "Failed"
                    self.kubelet.devices.release(self.node_name, self.uid)
                    self.kubelet.unprepare_later(self.node_name, self.claims_pod)
                    self.mark()
                    return
                status["restartCount"] += 1
                status["lastState"] = {"terminated": terminated}
                await self._back_off(container, status, began, init=True)
        if len(containers) == 1:
            # Inline, so an instant pod settles within one loop turn (one status write).
            codes = [await self._container_loop(0, containers[0], restart_policy)]
        else:
            loops = [self._container_loop(i, c, restart_policy) for i, c in enumerate(containers)]
            codes = list(await asyncio.gather(*loops))
        if None in codes:
            # A parked container runs until the pod stops: the pod never gets further.
            return
        if self.sidecar_tasks:
            # The main containers are done: the sidecars are stopped, last one first.
            await self._stop_sidecars(self._grace())
        self.phase = "Succeeded" if all(c == 0 for c in codes) else "Failed"
        # A finished pod's devices are free for others (the kubelet frees inactive pods').
        self.kubelet.devices.release(self.node_name, self.uid)
        self.kubelet.unprepare_later(self.node_name, self.claims_pod)
        self.mark()

    async def _admit(self) -> bool:
        """Device-plugin admission, before anything of the pod starts: each container's
        devices are allocated, or the pod is rejected (Failed) as the kubelet rejects it."""
        spec = self.pod.get("spec") or {}
        containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
        # A pod with a runner may be a device plugin: its node's kubelet.sock must be there
        # (and a DRA driver's plugin: its node's plugins_registry must be watched).
        start = any(self.kubelet.runner_for(self.pod, c) is not None for c in containers)
        if start and self.kubelet.filesystems is not None:
            try:
                await self.kubelet.dra.ensure(self.node_name)
            except (OSError, ValueError) as exc:
                log.error("DRA manager of node %s did not start: %s", self.node_name, exc)
        try:
            self.allocations = await self.kubelet.devices.admit(
                self.node_name, self.pod, start=start
            )
        except AdmissionError as exc:
            self.rejected = (exc.reason, exc.message)
            self.phase = "Failed"
            self.event("Warning", exc.reason, exc.message)
            self.mark()
            return False
        return True

    async def _prepare_dynamic_resources(self) -> None:
        """Have the DRA drivers prepare the pod's ResourceClaims before its sandbox exists,
        retrying with back-off (Events `FailedPrepareDynamicResources`) until they are; the
        pod stays Pending with its containers in ContainerCreating meanwhile."""
        if not uses_claims(self.pod):
            return
        attempt = 0
        while True:
            # The claim names come from the pod's status (the resource claim controller writes
            # them): read the pod again on every try.
            stored = self.kubelet.store.peek(POD_KEY, *self.key)
            if stored is not None and stored.obj["metadata"].get("uid") == self.uid:
                self.claims_pod = stored.obj
            try:
                await self.kubelet.dra.prepare(self.node_name, self.claims_pod)
                return
            except PrepareError as exc:
                message = exc.message
            self.event(
                "Warning",
                "FailedPrepareDynamicResources",
                f"Failed to prepare dynamic resources: {message}",
            )
            self.mark()
            attempt += 1
            # Even in instant mode a driver that is not there yet is not polled in a tight
            # loop (each try is an Event and a status write): 0.1 s doubling up to 3 s.
            await asyncio.sleep(max(self._retry_delay(attempt), min(0.1 * 2 ** (attempt - 1), 3.0)))

    async def _mount_volumes(self) -> None:
        """Set up the pod's volumes, retrying (with FailedMount Events) until all are there."""
        kubelet = self.kubelet
        spec = self.pod.get("spec") or {}
        if kubelet.filesystems is None or not spec.get("volumes"):
            return
        containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
        # Files are written only for pods a runner can look into; the checks happen for all.
        materialize = any(kubelet.runner_for(self.pod, c) is not None for c in containers)
        node = kubelet.store.peek(NODE_KEY, "", self.node_name)
        wake = self.wake = asyncio.Event()
        self.volumes = PodVolumes(
            kubelet.filesystems,
            kubelet.store,
            self.pod,
            materialize=materialize,
            node_allocatable=node_allocatable(node.obj if node is not None else None),
        )
        kubelet.track_volumes(self)
        delay = kubelet.config.mount_retry_delay
        while True:
            wake.clear()
            failures = self.volumes.mount_all()
            if not failures:
                return
            for name, message in failures:
                self.event(
                    "Warning",
                    "FailedMount",
                    f'MountVolume.SetUp failed for volume "{name}" : {message}',
                )
            self.mark()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), delay)
            delay = min(delay * 2, kubelet.config.mount_retry_delay * 30)

    async def _run_sandbox(self) -> None:
        """Resolve the pod's runtime handler and have the registered runtime run its sandbox,
        retrying with back-off (Events `FailedCreatePodSandBox`) until both work (kubesim.cri)."""
        kubelet = self.kubelet
        attempt = 0
        while True:
            try:
                self.runtime_handler = runtime_class.lookup_handler(kubelet.store, self.pod)
                if kubelet.cri is not None:
                    sandbox_id = cri.sandbox_id(self.uid, attempt)
                    kubelet.cri.run_sandbox(
                        cri.PodSandbox(
                            sandbox_id, self.node_name, self.pod, self.runtime_handler, attempt
                        )
                    )
                return
            except runtime_class.HandlerNotFound as exc:
                message = str(exc)
            except cri.CriError as exc:
                message = exc.rpc_message
            except Exception as exc:  # a broken runtime hook must not kill the pod worker
                log.exception("run_sandbox for %s/%s failed", *self.key)
                message = cri.CriError(str(exc)).rpc_message
            self.event(
                "Warning", "FailedCreatePodSandBox", f"Failed to create pod sandbox: {message}"
            )
            self.mark()
            attempt += 1
            await asyncio.sleep(self._retry_delay(attempt))

    def _retry_delay(self, attempt: int) -> float:
        """The kubelet's back-off before re-syncing a pod whose sandbox or container could not
        be created: the initial delay doubling up to the cap."""
        cfg = self.kubelet.config
        # A floor even in instant mode, so that a runtime that keeps refusing is not polled
        # in a tight loop.
        cap = max(cfg.delay(cfg.restart_delay_max), 0.01)
        return float(min(max(cfg.delay(cfg.restart_delay), 0.01) * 2 ** (attempt - 1), cap))

    @staticmethod
    def _field_path(container: dict[str, Any], init: bool) -> str:
        return _container_field_path(container.get("name", ""), init)

    async def _pull(
        self, container: dict[str, Any], status: dict[str, Any], field_path: str
    ) -> None:
        """The image step, until the container's image is on the node: the node's copy (the
        pull policy permitting) or a pull, which the cluster's image catalog decides
        (kubesim.images). Failures leave the container waiting as the kubelet leaves it
        (InvalidImageName, ErrImageNeverPull, ErrImagePull then ImagePullBackOff), with its
        Events and its image back-off; a later look succeeds once the image exists."""
        kubelet = self.kubelet
        cfg = kubelet.config
        image = container.get("image", "")
        policy = container.get("imagePullPolicy") or "IfNotPresent"
        loop = asyncio.get_running_loop()
        # A floor, so that a zero configured by a test never spins.
        recheck = max(cfg.image_pull_backoff, 0.01)
        while True:
            node_images = kubelet.images.setdefault(self.node_name, set())
            step = images.image_step(image, policy, node_images)
            if step.action == "present":
                self.event(
                    "Normal",
                    "Pulled",
                    f'Container image "{image}" already present on machine and can be '
                    "accessed by the pod",
                    field_path,
                )
                return
            if step.action == "invalid":
                self.event("Warning", "InspectFailed", step.message, field_path)
                await self._image_waiting(
                    status, "InvalidImageName", step.message, field_path, recheck
                )
                continue
            if step.action == "never":
                self.event("Warning", "ErrImageNeverPull", step.message, field_path)
                await self._image_waiting(
                    status, "ErrImageNeverPull", step.message, field_path, recheck
                )
                continue
            backoff = self.pull_backoff.get(image)
            if backoff is not None and loop.time() - backoff.failed_at < backoff.delay:
                message = f'Back-off pulling image "{image}"'
                self.event("Normal", "BackOff", message, field_path)
                await self._image_waiting(
                    status,
                    "ImagePullBackOff",
                    f"{message}: ErrImagePull: {backoff.error}",
                    field_path,
                    backoff.failed_at + backoff.delay - loop.time(),
                )
                continue
            self.event("Normal", "Pulling", f'Pulling image "{image}"', field_path)
            began = loop.time()
            if cfg.delay(cfg.pull_delay):
                await asyncio.sleep(cfg.delay(cfg.pull_delay))
            failure = kubelet.pull_failure(image)
            if failure is None:
                took = go_duration(loop.time() - began)
                node_images.add(step.key)
                self.pull_backoff.pop(image, None)
                self.event(
                    "Normal",
                    "Pulled",
                    f'Successfully pulled image "{image}" in {took} ({took} including '
                    f"waiting). Image size: {image_size(step.key)} bytes.",
                    field_path,
                )
                return
            reported = f'Failed to pull image "{image}": {failure.message}'
            self.event("Warning", "Failed", reported, field_path)
            failed_at = loop.time()
            delay = images.next_backoff(
                backoff.delay if backoff is not None else None,
                failed_at - backoff.failed_at if backoff is not None else 0.0,
                max(cfg.image_pull_backoff, 0.01),
                max(cfg.image_pull_backoff_max, 0.01),
            )
            self.pull_backoff[image] = _PullBackOff(delay, failed_at, failure.message)
            await self._image_waiting(
                status,
                "ErrImagePull",
                failure.message,
                field_path,
                min(cfg.image_pull_resync, delay),
            )

    async def _image_waiting(
        self, status: dict[str, Any], reason: str, message: str, field_path: str, seconds: float
    ) -> None:
        """A failed image step: the container waits with the reason and message, the kubelet
        records `Failed` (`Error: <reason>`), and looks at the pod again after `seconds`."""
        status["state"] = {"waiting": {"reason": reason, "message": message}}
        self.event("Warning", "Failed", f"Error: {reason}", field_path)
        self.mark()
        await asyncio.sleep(max(seconds, 0.001))

    async def _start(
        self, container: dict[str, Any], status: dict[str, Any], index: int, *, init: bool
    ) -> str:
        """Pull, create and start one container (with their Events); returns its start time."""
        cfg = self.kubelet.config
        field_path = self._field_path(container, init)
        await self._pull(container, status, field_path)
        if not init and cfg.delay(cfg.start_delay):
            await asyncio.sleep(cfg.delay(cfg.start_delay))
        if self.volumes is not None:
            self.volumes.prepare_container(container, resolve_env(self.pod, container))
        await self._pre_start(container, status, field_path)
        start_error = await self._create_container(container, status, field_path, init)
        suffix = "i" if init else ""
        status["containerID"] = (
            f"containerd://{self.uid[:8]}{index:04d}{status['restartCount']:04d}{suffix}"
        )
        self.event("Normal", "Created", "Container created", field_path)
        started_at = now()
        if start_error is not None:
            # The runtime could not start the process: no Started, a StartError instead.
            self.start_errors[container.get("name", "")] = start_error
            self.event("Warning", "Failed", f"Error: {start_error}", field_path)
            return started_at
        status["state"] = {"running": {"startedAt": started_at}}
        status["started"] = True
        self.event("Normal", "Started", "Container started", field_path)
        return started_at

    async def _create_container(
        self, container: dict[str, Any], status: dict[str, Any], field_path: str, init: bool
    ) -> str | None:
        """CreateContainer through the registered runtime: a refusal leaves the container
        waiting in CreateContainerError (Event `Failed`), retried with back-off; a process that
        could not start is returned as the runtime's message (for a StartError)."""
        service = self.kubelet.cri
        if service is None:
            return None
        attempt = 0
        while True:
            try:
                service.create_container(self.container_view(container, init))
                return None
            except cri.StartContainerError as exc:
                return exc.message
            except cri.CriError as exc:
                message = exc.message
            except Exception as exc:  # a broken runtime hook must not kill the pod worker
                log.exception("create_container for %s/%s failed", *self.key)
                message = str(exc)
            status["state"] = {"waiting": {"reason": "CreateContainerError", "message": message}}
            self.event("Warning", "Failed", f"Error: {message}", field_path)
            self.mark()
            attempt += 1
            await asyncio.sleep(self._retry_delay(attempt))

    async def _pre_start(
        self, container: dict[str, Any], status: dict[str, Any], field_path: str
    ) -> None:
        """PreStartContainer for the plugins that asked for it; until it succeeds the container
        waits in CreateContainerConfigError, retried as the kubelet re-syncs a failed pod (every
        `restart_delay`, its 10 s)."""
        while True:
            try:
                await self.kubelet.devices.pre_start(self.node_name, self.uid, container)
                return
            except PreStartError as exc:
                message = str(exc)
            status["state"] = {
                "waiting": {"reason": "CreateContainerConfigError", "message": message}
            }
            self.event("Warning", "Failed", f"Error: {message}", field_path)
            self.mark()
            cfg = self.kubelet.config
            await asyncio.sleep(max(cfg.delay(cfg.restart_delay), 0.001))

    def _terminated(
        self, code: int, started_at: str, status: dict[str, Any], container: dict[str, Any]
    ) -> dict[str, Any]:
        name = status.get("name", "")
        written = self.termination_messages.pop(name, None)
        start_error = self.start_errors.pop(name, None)
        if start_error is not None:
            # The process never started: runc's reason, and no start time (the epoch), as
            # containerd reports it.
            return {
                "exitCode": code,
                "reason": programs.START_ERROR_REASON,
                "message": start_error,
                "startedAt": "1970-01-01T00:00:00Z",
                "finishedAt": now(),
                "containerID": status["containerID"],
            }
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": started_at,
            "finishedAt": now(),
            "containerID": status["containerID"],
        }
        instances = self.kubelet.runtime.instances(self.uid, name)
        log_text = instances[-1].log.text() if instances else ""
        message = termination.message(
            container.get("terminationMessagePolicy"), written, code, log_text
        )
        if message:
            terminated["message"] = message
        return terminated

    async def _back_off(
        self, container: dict[str, Any], status: dict[str, Any], began: float, *, init: bool
    ) -> None:
        """Wait before a restart: none the first time, then the initial back-off doubling to the
        cap; a container that ran for twice the cap starts over, as in the kubelet."""
        cfg = self.kubelet.config
        name = container.get("name", "")
        key = f"{'init/' if init else ''}{name}"
        cap = max(cfg.delay(cfg.restart_delay_max), 0.001)
        if asyncio.get_running_loop().time() - began >= 2 * cap:
            self.backoff.pop(key, None)
        count = self.backoff.get(key, 0)
        self.backoff[key] = count + 1
        if count == 0:
            status["state"] = {"waiting": {"reason": "ContainerCreating"}}
            self.mark()
            return
        delay = min(max(cfg.delay(cfg.restart_delay), 0.001) * 2 ** (count - 1), cap)
        status["state"] = {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {go_duration(delay)} restarting failed "
                f"container={name} pod={self.pod_ref}",
            }
        }
        self.mark()
        self.event(
            "Warning",
            "BackOff",
            f"Back-off restarting failed container {name} in pod {self.pod_ref}",
            self._field_path(container, init),
        )
        await asyncio.sleep(delay)

    async def _container_loop(
        self, index: int, container: dict[str, Any], restart_policy: str
    ) -> int | None:
        """Run a main container, restarted per the pod's restartPolicy, to its last exit code;
        None when it was parked (it runs until the pod stops, see `_run_container`)."""
        cfg = self.kubelet.config
        status = self.statuses[index]
        while True:
            started_at = await self._start(container, status, index, init=False)
            self.phase = "Running"
            self.mark()
            registration = self.kubelet.runner_for(self.pod, container)
            probe_driven = registration is not None and (
                registration.reports_readiness or bool(container.get("readinessProbe"))
            )
            ready_task: asyncio.Future[None] | None = None
            if not probe_driven and container.get("name", "") not in self.start_errors:
                if cfg.delay(cfg.ready_delay):
                    ready_task = asyncio.ensure_future(self._become_ready(status))
                else:
                    status["ready"] = True
            began = asyncio.get_running_loop().time()
            code = await self._run_container(container, init=False, park=True)
            if code is None:
                return None  # parked: a readiness delay still running sets `ready` later
            if ready_task is not None:
                ready_task.cancel()
            status["ready"] = False
            status["started"] = False
            terminated = self._terminated(code, started_at, status, container)
            restart = restart_policy == "Always" or (restart_policy == "OnFailure" and code != 0)
            if not restart or (self.terminating and self.sidecar_tasks):
                status["state"] = {"terminated": terminated}
                self.mark()
                return code
            status["restartCount"] += 1
            status["lastState"] = {"terminated": terminated}
            await self._back_off(container, status, began, init=False)

    async def _sidecar_loop(
        self, index: int, container: dict[str, Any], started: asyncio.Event
    ) -> None:
        """A native sidecar: started (which lets the next container start), restarted whenever
        it exits, until the pod stops it."""
        status = self.init_statuses[index]
        name = container.get("name", "")
        while True:
            started_at = await self._start(container, status, index, init=True)
            if status.get("started"):
                started.set()
            registration = self.kubelet.runner_for(self.pod, container)
            probe_driven = registration is not None and (
                registration.reports_readiness or bool(container.get("readinessProbe"))
            )
            if not probe_driven and name not in self.start_errors:
                status["ready"] = True
            self.mark()
            began = asyncio.get_running_loop().time()
            code = await self._run_container(container, init=True)
            status["ready"] = False
            status["started"] = False
            terminated = self._terminated(code, started_at, status, container)
            if self.terminating or self.sidecars_stopping:
                status["state"] = {"terminated": terminated}
                self.mark()
                return
            status["restartCount"] += 1
            status["lastState"] = {"terminated": terminated}
            await self._back_off(container, status, began, init=True)

    def _grace(self) -> float:
        spec = self.pod.get("spec") or {}
        return float(spec.get("terminationGracePeriodSeconds", 30))

    async def _stop_runs(self, names: list[str], deadline: float) -> None:
        """Tell these containers' runners to stop, and wait (until `deadline`) for their runs
        to end."""
        loop = asyncio.get_running_loop()
        for name in names:
            ctx = self.contexts.get(name)
            if ctx is None:
                continue
            ctx.stopping.set()
            registration = self.kubelet.runner_for(self.pod, ctx.container)
            if registration is not None and isinstance(registration.runner, PodRunnerObject):
                try:
                    await asyncio.wait_for(
                        registration.runner.stop(ctx), timeout=max(deadline - loop.time(), 0.001)
                    )
                except (TimeoutError, Exception):
                    log.warning("pod runner stop for %s/%s did not finish cleanly", *self.key)
        ends = [self.run_ends[n] for n in names if n in self.run_ends and n in self.contexts]
        if ends:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(*(e.wait() for e in ends)),
                    timeout=max(deadline - loop.time(), 0.001),
                )

    async def _stop_sidecars(self, grace: float) -> None:
        """Stop the sidecars in the reverse order of their definition (after the main
        containers), each waited for within the grace period."""
        self.sidecars_stopping = True
        deadline = asyncio.get_running_loop().time() + max(grace, 0.001)
        for name in reversed(list(self.sidecar_tasks)):
            await self._stop_runs([name], deadline)
        for task in self.sidecar_tasks.values():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def _become_ready(self, status: dict[str, Any]) -> None:
        cfg = self.kubelet.config
        if cfg.delay(cfg.ready_delay):
            await asyncio.sleep(cfg.delay(cfg.ready_delay))
        status["ready"] = True
        self.mark()

    def _finishes(self, container: dict[str, Any]) -> bool:
        """Whether a container without a runner is a command that runs to completion: one with
        a command or args in a pod that is not restarted on success. Elsewhere (DaemonSets,
        Deployments) a command is usually a server, so it keeps running."""
        restart_policy = (self.pod.get("spec") or {}).get("restartPolicy", "Always")
        return (
            self.kubelet.config.command_duration is not None
            and restart_policy in ("Never", "OnFailure")
            and bool(container.get("command") or container.get("args"))
        )

    def container_view(self, container: dict[str, Any], init: bool) -> programs.ContainerView:
        """The container as its process sees it (environment with what device plugins added,
        and its allocation), for registered programs and their predicates."""
        env = resolve_env(self.pod, container)
        allocation = self.allocations.get(container.get("name", ""))
        if allocation is not None:
            env = {**allocation.envs, **env}  # as for runners: the container's own win
        # The CRI CDIDevices field: device plugins' devices, then the container's DRA claims'.
        cdi_names = list(allocation.cdi_devices) if allocation is not None else []
        cdi_names += self.kubelet.dra.container_cdi_devices(
            self.node_name, self.claims_pod, container
        )
        return programs.ContainerView(
            pod=self.pod,
            container=container,
            node_name=self.node_name,
            env=env,
            init=init,
            allocation=allocation,
            runtime_handler=self.runtime_handler,
            cdi_devices=cri.cdi_devices(
                cdi_names, allocation.annotations if allocation is not None else {}
            ),
        )

    def _file_in_volumes(self, container: dict[str, Any], program: str) -> bool:
        """Whether `program` is the path of a file one of the container's volumes brings (a
        host binary through a hostPath mount, for example): such a program is there even
        where its predicate does not put it."""
        if not program.startswith("/") or self.volumes is None or not self.volumes.materialize:
            return False
        try:
            env = resolve_env(self.pod, container)
            return self.volumes.path(container, env, program).is_file()
        except OSError:
            return False

    def _present(
        self, registration: programs.Registration, view: programs.ContainerView, program: str
    ) -> bool:
        return registration.present_in(view) or self._file_in_volumes(view.container, program)

    def lookup_program(
        self, container: dict[str, Any], init: bool, argv: list[str]
    ) -> ExecFunction | None:
        """How `kubectl exec` finds a registered program in this container (None: not there)."""
        registration = self.kubelet.programs.lookup(argv[0])
        if registration is None:
            return None
        view = self.container_view(container, init)
        if not self._present(registration, view, argv[0]):
            return None

        async def run(proc: ExecProcess) -> int | None:
            return await registration.program(
                programs.ProgramRun(
                    argv=list(proc.argv),
                    view=view,
                    stdout=proc.stdout,
                    stderr=proc.stderr,
                    stdin=proc.stdin,
                    tty=proc.tty,
                    exec=True,
                )
            )

        return run

    async def _run_installed(
        self, container: dict[str, Any], init: bool, instance: ContainerInstance
    ) -> int | None:
        """Run the container's command when it names a registered program (None otherwise):
        present, it runs with the container log as its output; absent, the container fails to
        start as with a missing executable."""
        if not self.kubelet.programs.programs:
            return None  # nothing registered (scale runs): no command to look at
        argv = programs.container_argv(container)
        registration = self.kubelet.programs.lookup(argv[0]) if argv else None
        if registration is None:
            return None
        view = self.container_view(container, init)
        if not self._present(registration, view, argv[0]):
            message = programs.start_error_message(argv[0])
            self.start_errors[container.get("name", "")] = message
            self.event("Warning", "Failed", f"Error: {message}", self._field_path(container, init))
            return programs.START_ERROR_EXIT
        run = programs.ProgramRun(
            argv=argv,
            view=view,
            stdout=instance.stdout,
            stderr=instance.stderr,
            stdin=instance.stdin,
            tty=bool(container.get("tty")),
        )
        try:
            return int(await registration.program(run) or 0)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("program %s in %s/%s failed", argv[0], *self.key)
            for line in traceback.format_exc().splitlines():
                instance.write_log(line, "stderr")
            return 1

    @overload
    async def _run_container(self, container: dict[str, Any], init: bool) -> int: ...

    @overload
    async def _run_container(
        self, container: dict[str, Any], init: bool, *, park: bool
    ) -> int | None: ...

    async def _run_container(
        self, container: dict[str, Any], init: bool, *, park: bool = False
    ) -> int | None:
        """Run one container to its exit code. With `park`, a container that would only wait
        until the pod stops (no runner, program, stdin or command that ends) is parked
        instead: None comes back at once, its instance stays running and `stop()` finishes it,
        so that no coroutine, task or future is kept per such container."""
        if container.get("name", "") in self.start_errors:
            return programs.START_ERROR_EXIT  # the runtime never started its process
        # Each run is a new instance: its own log (the previous run's is kept), stdin and ports.
        instance = self.kubelet.runtime.start(self.uid, container, "")
        instance.program_lookup = _ProgramLookup(self, container, init)
        parked = False
        try:
            code = await self._run_program(container, init, instance, park=park)
            if code is None:
                parked = True
                self.parked.append(instance)
            return code
        finally:
            if not parked:
                await instance.finish()

    async def _run_program(
        self, container: dict[str, Any], init: bool, instance: ContainerInstance, *, park: bool
    ) -> int | None:
        cfg = self.kubelet.config
        registration = self.kubelet.runner_for(self.pod, container)
        if registration is None:
            installed = await self._run_installed(container, init, instance)
            if installed is not None:
                return installed
            if init and not is_sidecar(container):  # a sidecar serves like a main container
                if cfg.delay(cfg.init_container_duration):
                    await asyncio.sleep(cfg.delay(cfg.init_container_duration))
                return 0
            if container.get("stdin"):
                return await instance.run_idle()  # a shell reading what attached clients type
            if self._finishes(container):
                duration = cfg.delay(cfg.command_duration or 0.0)
                if duration:
                    await asyncio.sleep(duration)
                return 0
            if park:
                return None  # runs until the pod stops, with nothing waiting for it
            await asyncio.Event().wait()  # runs until the pod stops
            return 0
        ctx = PodContext(self.kubelet, self.pod, container, init, instance)
        ctx.volumes = (
            self.volumes if self.volumes is not None and self.volumes.materialize else None
        )
        allocation = self.allocations.get(ctx.container_name)
        if allocation is not None:
            ctx.allocation = allocation
            # The runtime passes the plugins' variables first, so the container's own win.
            ctx.env = {**allocation.envs, **ctx.env}
        self.contexts[ctx.container_name] = ctx
        run_end = self.run_ends[ctx.container_name] = asyncio.Event()
        runner = registration.runner
        # Logging records of the runner (and tasks it starts) belong to this container's log.
        runner_token = runner_logs.CURRENT.set(ctx)
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
            # A crashing program leaves its traceback in its log, as a real one would.
            for line in traceback.format_exc().splitlines():
                ctx.log(line, "stderr")
            return 1
        finally:
            runner_logs.CURRENT.reset(runner_token)
            if self.contexts.get(ctx.container_name) is ctx:
                self.contexts.pop(ctx.container_name, None)
            run_end.set()
            if ctx.termination_message is not None:
                self.termination_messages[ctx.container_name] = ctx.termination_message

    def running_containers(self) -> list[tuple[dict[str, Any], bool]]:
        """(container, init) for each container currently running."""
        spec = self.pod.get("spec") or {}
        result = []
        for init, containers, statuses in (
            (True, spec.get("initContainers") or [], self.init_statuses),
            (False, spec.get("containers") or [], self.statuses),
        ):
            for container, status in zip(containers, statuses, strict=False):
                if "running" in (status.get("state") or {}):
                    result.append((container, init))
        return result

    async def stop(
        self, grace: float, *, announce: bool = False, keep_volumes: bool = False
    ) -> None:
        """Stop runners (object runners get `stop` within the grace period) and the worker;
        `announce` records the kubelet's Killing Events (a deletion, not a lost node), and
        `keep_volumes` leaves the pod's directories for when its node comes back."""
        self.terminating = True
        if announce:
            for container, init in self.running_containers():
                self.event(
                    "Normal",
                    "Killing",
                    f"Stopping container {container.get('name', '')}",
                    self._field_path(container, init),
                )
        if self.sidecar_tasks:
            # As the kubelet terminates a pod with native sidecars: the main containers first
            # (waited for), then the sidecars in reverse order, all within the grace period.
            deadline = asyncio.get_running_loop().time() + max(grace, 0.001)
            mains = [n for n in self.contexts if n not in self.sidecar_tasks]
            await self._stop_runs(mains, deadline)
            await self._stop_sidecars(max(deadline - asyncio.get_running_loop().time(), 0.0))
        for ctx in list(self.contexts.values()):
            ctx.stopping.set()
            registration = self.kubelet.runner_for(self.pod, ctx.container)
            if registration is not None and isinstance(registration.runner, PodRunnerObject):
                try:
                    await asyncio.wait_for(registration.runner.stop(ctx), timeout=max(grace, 0.001))
                except (TimeoutError, Exception):
                    log.warning("pod runner stop for %s/%s did not finish cleanly", *self.key)
        task = self.task
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        elif self.parked:
            # Cancelling a task that waited for them took the loop two turns (the task's, then
            # ours): so long does the pod take to stop, as before (a client that deletes a pod
            # still sees it right after its DELETE).
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        # Parked containers end here, where a waiting coroutine would have been cancelled.
        parked, self.parked = self.parked, []
        for instance in parked:
            await instance.finish()
        for ephemeral_task in self.ephemeral_tasks.values():
            ephemeral_task.cancel()
        self.kubelet.untrack_volumes(self)
        if self.volumes is not None and not keep_volumes:
            self.volumes.teardown()
        if not keep_volumes:
            # The pod is gone (not merely its node down): its devices are free again.
            self.kubelet.devices.release(self.node_name, self.uid)
        await self.kubelet.runtime.forget_pod(self.uid)

    def sync_ephemeral(self, pod: dict[str, Any]) -> None:
        """Start the ephemeral containers added to the pod since they were last looked at."""
        if self.phase in ("Succeeded", "Failed"):
            return  # the kubelet starts nothing in a finished pod
        for container in (pod.get("spec") or {}).get("ephemeralContainers") or []:
            name = container.get("name", "")
            if name in self.ephemeral_tasks:
                continue
            status = self._container_status(container)
            self.ephemeral_statuses.append(status)
            self.ephemeral_tasks[name] = asyncio.ensure_future(
                self._run_ephemeral(container, status, len(self.ephemeral_tasks))
            )
            self.mark()

    async def _run_ephemeral(
        self, container: dict[str, Any], status: dict[str, Any], index: int
    ) -> None:
        status.pop("started", None)  # ephemeral container statuses carry no `started`
        # A debug container's image is pulled like any other (`kubectl debug --image=...`).
        name = container.get("name", "")
        await self._pull(container, status, f"spec.ephemeralContainers{{{name}}}")
        status["containerID"] = f"containerd://{self.uid[:8]}e{index:03d}0000"
        started_at = now()
        status["state"] = {"running": {"startedAt": started_at}}
        self.mark()
        code = await self._run_container(container, init=False)
        status["state"] = {
            "terminated": {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": started_at,
                "finishedAt": now(),
                "containerID": status["containerID"],
            }
        }
        self.mark()


class _ProgramLookup:
    """A container instance's `program_lookup`: `_PodWorker.lookup_program` for one container
    (a slotted object, smaller than a closure; every container instance has one)."""

    __slots__ = ("container", "init", "worker")

    def __init__(self, worker: _PodWorker, container: dict[str, Any], init: bool) -> None:
        self.worker = worker
        self.container = container
        self.init = init

    def __call__(self, argv: list[str]) -> ExecFunction | None:
        return self.worker.lookup_program(self.container, self.init, argv)


def go_duration(seconds: float) -> str:
    """A duration as Go prints it after rounding to milliseconds (`0s`, `523ms`, `1.2s`, `1m5s`)."""
    millis = round(seconds * 1000)
    if millis == 0:
        return "0s"
    if millis < 1000:
        return f"{millis}ms"
    minutes, rest = divmod(millis, 60_000)
    text = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{minutes}m{text}" if minutes else text


@functools.lru_cache(maxsize=4096)
def image_size(image: str) -> int:
    """A stable, plausible size in bytes for an image (kubesim pulls nothing); remembered, as
    every node of a fleet pulls the same images."""
    digest = hashlib.sha256(image.encode()).digest()
    return 20_000_000 + int.from_bytes(digest[:4], "big") % 480_000_000


async def _call(runner: PodRunnerFunction, ctx: PodContext) -> int | None:
    result = runner(ctx)
    if inspect.isawaitable(result):
        return await result
    return result


class Kubelet(Controller):
    """All simulated kubelets: one worker per bound pod, node status and node Lease heartbeats."""

    name = "kubelet"
    resources = (POD_KEY, NODE_KEY, CONFIGMAP_KEY, SECRET_KEY)

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
        self._host_ips: dict[str, list[dict[str, str]]] = {}
        self._pod_ips: dict[str, str] = {}
        self._lease_task: asyncio.Task[None] | None = None
        self._stopping: set[asyncio.Task[None]] = set()
        # Node root directories; the cluster sets this (None: no volumes are set up).
        self.filesystems: NodeFilesystems | None = None
        # Images each node has (normalized references): pulled, or loaded with `load_image`.
        self.images: dict[str, set[str]] = {}
        # The registries and images that exist; the cluster replaces it with its own.
        self.catalog = images.ImageCatalog()
        # (namespace, resource, name) of a ConfigMap or Secret -> pods whose volumes read it.
        self._volume_users: dict[tuple[str, str, str], set[tuple[str, str]]] = {}
        # Container instances (logs, stdin, exec handlers, served ports) for the streaming API.
        self.runtime = ContainerRuntime()
        # The simulated container runtime (kubesim.cri); None: sandboxes and containers are
        # created without one.
        self.cri: cri.RuntimeService | None = None
        # Executables containers can run and exec (kubesim.programs); none by default.
        self.programs = programs.ProgramRegistry()
        # Per-node device managers (device plugins, pod resources), started when first needed.
        self.devices = DeviceManagers(self)
        # Per-node DRA managers (plugin registration, DRA drivers' calls), likewise.
        self.dra = DRAManagers(self)

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
        await self.devices.stop_all()
        await self.dra.stop_all()

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

    # ----- images -------------------------------------------------------------------------------

    def pull_failure(self, image: str) -> images.PullFailure | None:
        """What pulling a (parseable) image gives now: None when the catalog has it."""
        return self.catalog.pull(image)

    def load_image(self, node: str, image: str) -> None:
        """Put an image on a node without a pull (as `kind load` or a pre-pulled image
        would); raises InvalidReference for a name the kubelet could not parse."""
        self.images.setdefault(node, set()).add(str(images.parse(image)))

    # ----- addressing ---------------------------------------------------------------------------

    def node_ip(self, node: str) -> str:
        """A stable InternalIP per node."""
        ip = self._node_ips.get(node)
        if ip is None:
            index = len(self._node_ips) + 1
            ip = self._node_ips[node] = f"10.0.{index // 250}.{index % 250 + 1}"
        return ip

    def host_ips(self, node: str) -> list[dict[str, str]]:
        """`status.hostIPs` of a node's pods: one list that all their statuses share (stored
        objects are never mutated)."""
        ips = self._host_ips.get(node)
        if ips is None:
            ips = self._host_ips[node] = [{"ip": self.node_ip(node)}]
        return ips

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

    # ----- node filesystems and volumes ---------------------------------------------------------

    def os_image(self, node: str) -> str:
        """The node's `nodeInfo.osImage` (the configured default for unknown nodes)."""
        stored = self.store.peek(NODE_KEY, "", node)
        info = ((stored.obj.get("status") or {}).get("nodeInfo") or {}) if stored else {}
        return str(info.get("osImage") or self.config.os_image)

    def node_root(self, node: str) -> Path:
        """A node's root directory (its `/`) on this machine."""
        if self.filesystems is None:
            raise RuntimeError(
                "no node filesystems: the cluster is not running or has node_filesystems=False"
            )
        return self.filesystems.root(node)

    def host_path(self, node: str, path: str = "/") -> Path:
        """A node path on this machine; symlinks resolve inside the node's root."""
        return resolve_within(self.node_root(node), path)

    def track_volumes(self, worker: _PodWorker) -> None:
        """Remember which ConfigMaps and Secrets a pod's volumes read (to update or retry them)."""
        if worker.volumes is None:
            return
        for resource, name in worker.volumes.references:
            self._volume_users.setdefault((worker.key[0], resource, name), set()).add(worker.key)

    def untrack_volumes(self, worker: _PodWorker) -> None:
        """Forget a pod's volume sources."""
        if worker.volumes is None:
            return
        for resource, name in worker.volumes.references:
            users = self._volume_users.get((worker.key[0], resource, name))
            current = self.workers.get(worker.key)
            if users is not None and (current is None or current is worker):
                users.discard(worker.key)
                if not users:
                    del self._volume_users[(worker.key[0], resource, name)]

    def _volume_source_changed(self, namespace: str, resource: str, name: str) -> None:
        for pod_key in list(self._volume_users.get((namespace, resource, name), ())):
            worker = self.workers.get(pod_key)
            if worker is None or worker.volumes is None:
                continue
            if worker.sandbox_ready:
                worker.volumes.refresh()
            elif worker.wake is not None:
                worker.wake.set()

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
            pod_key = (meta["namespace"], meta["name"])
            worker = self.workers.get(pod_key)
            if (
                worker is not None
                and event.old is not None
                and worker.uid == meta.get("uid")
                and worker.volumes is None
                and status_only_change(event.old.obj, event.new.obj)
            ):
                # A status write (most often this kubelet's own) to a pod it runs: a reconcile
                # would find nothing to do.
                return
            if (event.new.obj.get("spec") or {}).get("nodeName") or worker is not None:
                self.enqueue(("pod", meta["namespace"], meta["name"]))
        elif event.key == NODE_KEY and event.type == "DELETED":
            self.enqueue(("node-gone", event.new.obj["metadata"]["name"]))
        elif event.key in (CONFIGMAP_KEY, SECRET_KEY) and self._volume_users:
            meta = event.new.obj["metadata"]
            resource = event.key[1]
            if (meta.get("namespace", ""), resource, meta["name"]) in self._volume_users:
                self.enqueue(("volume-source", meta.get("namespace", ""), resource, meta["name"]))

    def reconcile(self, key: Any) -> None:
        if key[0] == "node-gone":
            for bound_key, bound in list(self.workers.items()):
                if bound.pod["spec"].get("nodeName") == key[1]:
                    self._discard(bound_key)
            self.images.pop(key[1], None)
            self._spawn(self.devices.forget(key[1]))
            self._spawn(self.dra.forget(key[1]))
            if self.filesystems is not None and self.store.peek(NODE_KEY, "", key[1]) is None:
                self.filesystems.remove(key[1])
            return
        if key[0] == "volume-source":
            self._volume_source_changed(*key[1:])
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
        if worker is not None and worker.volumes is not None and worker.sandbox_ready:
            meta, before = pod["metadata"], worker.volumes.pod["metadata"]
            if meta.get("labels") != before.get("labels") or meta.get("annotations") != before.get(
                "annotations"
            ):
                worker.volumes.refresh(pod)  # downward API files follow labels and annotations
        if worker is not None and (pod.get("spec") or {}).get("ephemeralContainers"):
            worker.sync_ephemeral(pod)
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
                await worker.stop(grace, announce=True)
            # The pod object stays until the DRA drivers have unprepared its claims.
            await self.unprepare(pod["spec"].get("nodeName", ""), pod)
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

    def unprepare_later(self, node: str, pod: dict[str, Any]) -> None:
        """Unprepare a finished pod's claims in the background (no-op without claims)."""
        if uses_claims(pod) and self.dra.might_need_unprepare(node, pod["metadata"]["uid"]):
            self._spawn(self.unprepare(node, pod))

    async def unprepare(self, node: str, pod: dict[str, Any]) -> None:
        """Unprepare a pod's claims, trying again with back-off until the drivers did it (as
        the kubelet's pod worker retries terminating a pod), or the node is gone."""
        if not uses_claims(pod):
            return
        delay = max(self.config.dra_registration_retry, 0.01)
        while self.dra.might_need_unprepare(node, pod["metadata"]["uid"]):
            try:
                await self.dra.unprepare(node, pod)
                return
            except UnprepareError as exc:
                log.warning(
                    "pod %s/%s: %s",
                    pod["metadata"].get("namespace"),
                    pod["metadata"].get("name"),
                    exc.message,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)

    # ----- status writes ----------------------------------------------------------------------

    def mark_dirty(self, pod_key: tuple[str, str]) -> None:
        """Queue a status write for a pod, coalesced with other changes in this loop turn."""
        self._dirty.add(pod_key)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = list(self._dirty), set()
        rt = self.rt("pods")
        deadline = time.perf_counter() + SLICE_SECONDS
        for at, pod_key in enumerate(dirty):
            if at and (time.perf_counter() >= deadline or TURNS.due()):
                # The API server shares this event loop: the other pods' status writes wait
                # for its next turn (a thousand pods starting at once took 0.1 s here).
                self._dirty.update(dirty[at:])
                self._flush_scheduled = True
                TURNS.call_next_turn(self._flush)
                return
            worker = self.workers.get(pod_key)
            stored = self.store.peek(POD_KEY, *pod_key)
            if worker is None or stored is None or stored.obj["metadata"]["uid"] != worker.uid:
                continue
            if stored.obj["metadata"].get("deletionTimestamp"):
                continue
            status = worker.status()
            if stored.obj.get("status") == status:
                continue
            # A status write reads only metadata and status: no need to copy the whole pod.
            obj = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod_key[1], "namespace": pod_key[0]},
                "status": detached_status(status),
            }
            try:
                # Built in decoded form (see PodWorker.status): the store skips decoding it.
                self.store.replace(
                    rt,
                    obj,
                    namespace=pod_key[0],
                    name=pod_key[1],
                    subresource="status",
                    trusted=True,
                )
            except errors.ApiError as exc:
                log.debug("kubelet status write for %s/%s failed: %s", *pod_key, exc.message)

    def set_container_ready(self, ctx: PodContext, ready: bool) -> None:
        """Apply a runner's readiness verdict to the container status."""
        worker = self.workers.get((ctx.namespace, ctx.name))
        if worker is None:
            return
        for status in [*worker.statuses, *worker.init_statuses]:
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
                    await TURNS.pause()

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
        self.node_event(
            name,
            "NodeReady" if ready else "NodeNotReady",
            # A lost node does not report itself; the node lifecycle controller notices.
            component="node-controller" if unreachable else "kubelet",
        )
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
            self._spawn(worker.stop(0, keep_volumes=True))
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
            self.events.record(
                current.obj,
                "Warning",
                "NodeNotReady",
                "Node is not ready",
                component="node-controller",
            )

    def node_event(
        self, name: str, reason: str, message: str = "", *, component: str = "kubelet"
    ) -> None:
        """A node Event as the kubelet (`involvedObject.uid` is the node name, as the kubelet
        sets it) or the node lifecycle controller (the node's uid) records it."""
        stored = self.store.peek(NODE_KEY, "", name)
        uid = name if component == "kubelet" or stored is None else stored.obj["metadata"]["uid"]
        subject = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": uid}}
        self.events.record(
            subject,
            "Normal",
            reason,
            message or f"Node {name} status is now: {reason}",
            component=component,
            host=name if component == "kubelet" else "",
        )

    def node_registered(self, name: str, *, ready: bool = True) -> None:
        """The Events of a kubelet that starts and registers its node, and the node controller
        noticing it (kubesim records the start, readiness and registration, not each condition)."""
        self.node_event(name, "Starting", "Starting kubelet.")
        if ready:
            self.node_event(name, "NodeReady")
        self.node_event(
            name,
            "RegisteredNode",
            f"Node {name} event: Registered Node {name} in Controller",
            component="node-controller",
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


def status_only_change(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether a pod version changes nothing a running pod's kubelet acts on: the same spec
    (the very object: status writes share it) without ephemeral containers, no deletion, and
    the same labels and annotations (which downward API volumes follow)."""
    spec = new.get("spec")
    if spec is not old.get("spec") or (spec or {}).get("ephemeralContainers"):
        return False
    meta, old_meta = new["metadata"], old["metadata"]
    return (
        "deletionTimestamp" not in meta
        and meta.get("labels") == old_meta.get("labels")
        and meta.get("annotations") == old_meta.get("annotations")
    )


# The lists of container status dicts in a pod status (PodWorker.status).
_CONTAINER_STATUS_LISTS = (
    "initContainerStatuses",
    "containerStatuses",
    "ephemeralContainerStatuses",
)


def detached_status(status: dict[str, Any]) -> dict[str, Any]:
    """A pod status from `_PodWorker.status()` that the store may keep for good: the container
    status dicts, which the worker goes on changing in place, are copied; everything under them
    (states, conditions), which the worker only ever replaces with new dicts, is shared. Equal
    to a deep copy, without encoding and decoding the status and with one copy of its strings
    for the worker and the stored pod."""
    detached = dict(status)
    for field_name in _CONTAINER_STATUS_LISTS:
        statuses = detached.get(field_name)
        if statuses is not None:
            detached[field_name] = [dict(s) for s in statuses]
    return detached


def json_copy(value: Any) -> Any:
    """A deep copy via JSON (fast for plain data)."""
    return loads(dumps(value))
