"""The public Python handle: `async with kubesim.Cluster() as sim:` runs a simulated cluster."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from aiohttp import web

from kubesim import admission, errors, service_ips
from kubesim.auth import Auth
from kubesim.clock import Clock
from kubesim.controllers.base import Controller
from kubesim.controllers.clusterrole_aggregation import ClusterRoleAggregationController
from kubesim.controllers.cronjob import CronJobController
from kubesim.controllers.daemonset import DaemonSetController
from kubesim.controllers.deployment import DeploymentController, ReplicaSetController
from kubesim.controllers.disruption import DisruptionController
from kubesim.controllers.endpoints import EndpointsController
from kubesim.controllers.endpointslice import EndpointSliceController
from kubesim.controllers.events import EventRecorder
from kubesim.controllers.garbage_collector import GarbageCollector
from kubesim.controllers.job import JobController
from kubesim.controllers.kubelet import Kubelet, KubeletConfig, PodRunner, RunnerRegistration
from kubesim.controllers.namespace import NamespaceController
from kubesim.controllers.resourceclaim import ResourceClaimController
from kubesim.controllers.scheduler import Scheduler
from kubesim.controllers.statefulset import StatefulSetController
from kubesim.controllers.ttl_after_finished import TTLAfterFinishedController
from kubesim.controllers.volumes import NodeFilesystems
from kubesim.cri import RuntimeService
from kubesim.devicemanager import DeviceManager
from kubesim.dramanager import DRAManager
from kubesim.faults import Faults
from kubesim.images import ImageCatalog
from kubesim.programs import Predicate, Program
from kubesim.server import ApiServer
from kubesim.stats import Stats
from kubesim.store import Store
from kubesim.tls import ServingCertificate

ALL_CONTROLLERS = (
    "namespace",
    "garbage-collector",
    "daemonset",
    "deployment",
    "replicaset",
    "scheduler",
    "resourceclaim",
    "disruption",
    "kubelet",
    "clusterrole-aggregation",
    "job",
    "ttl-after-finished",
    "cronjob",
    "statefulset",
    "endpoint",
    "endpointslice",
)
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def short_temp_dir() -> str:
    """Where the default work_dir goes: the system's temporary directory, or `/tmp` when that
    path is long (macOS), because node sockets such as
    `<work_dir>/nodes/<node>/var/lib/kubelet/device-plugins/kubelet.sock` must fit AF_UNIX's
    107 bytes."""
    default = tempfile.gettempdir()
    if len(default) > 16 and os.access("/tmp", os.W_OK):
        return "/tmp"
    return default


def kubeconfig(
    url: str, name: str = "kubesim", token: str = "kubesim", ca_data: str | None = None
) -> dict[str, Any]:
    """A kubeconfig document for a kubesim server, authenticating with `token` (sent by kubectl
    only over HTTPS, whose CA `ca_data` is then)."""
    cluster: dict[str, Any] = {"server": url}
    if ca_data:
        cluster["certificate-authority-data"] = ca_data
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [
            {"name": name, "context": {"cluster": name, "user": name, "namespace": "default"}}
        ],
        "current-context": name,
        "preferences": {},
    }


def _catalog(given: Iterable[str] | ImageCatalog) -> ImageCatalog:
    if isinstance(given, ImageCatalog):
        return given
    if isinstance(given, str):
        raise TypeError("images is a list of image patterns, not one string")
    return ImageCatalog(given)


class Cluster:
    """A running simulated cluster: API server on loopback, store, controllers, faults and stats."""

    def __init__(
        self,
        nodes: int = 0,
        *,
        kubelet: KubeletConfig | None = None,
        controllers: Iterable[str] | None = None,
        version: str = "1.35.0",
        host: str = "127.0.0.1",
        port: int = 0,
        kubeconfig_path: Path | str | None = None,
        history: int = 10_000,
        bookmark_interval: float = 5.0,
        seed: int | None = None,
        events: bool = True,
        work_dir: Path | str | None = None,
        node_filesystems: bool = True,
        authorization: str = "open",
        authentication: bool | None = None,
        anonymous: bool = False,
        tls: bool | None = None,
        images: Iterable[str] | ImageCatalog = (),
    ) -> None:
        enabled = set(ALL_CONTROLLERS if controllers is None else controllers)
        unknown = enabled - set(ALL_CONTROLLERS)
        if unknown:
            raise ValueError(
                f"unknown controllers {sorted(unknown)}; choose from {ALL_CONTROLLERS}"
            )
        self.enabled = enabled
        self.initial_nodes = nodes
        self.kubelet_config = kubelet or KubeletConfig()
        self.host = host
        self.port = port
        self.store = Store(history=history)
        admission.install(self.store)
        self.stats = Stats()
        self.faults = Faults(self.store, seed=seed)
        # "open" allows everything (AlwaysAllow); "rbac" enforces RBAC with bearer tokens.
        self.auth = Auth(
            self.store,
            authorization=authorization,
            authentication=authentication,
            anonymous=anonymous,
        )
        # HTTPS whenever tokens matter: client-go never sends a bearer token over plain HTTP.
        self.tls = (
            ServingCertificate(host) if (self.auth.authentication if tls is None else tls) else None
        )
        self.server = ApiServer(
            self.store,
            stats=self.stats,
            faults=self.faults,
            version=version,
            bookmark_interval=bookmark_interval,
            auth=self.auth,
        )
        self._requested_kubeconfig = Path(kubeconfig_path) if kubeconfig_path else None
        # Node root directories live under `<work_dir>/nodes` (a temporary directory by default).
        self._requested_work_dir = Path(work_dir) if work_dir else None
        # False skips node trees and pod volumes entirely (scale runs; runners get no files).
        self.node_filesystems = node_filesystems
        self._tempdir: str | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.kubeconfig_path = Path()
        self.controllers: dict[str, Controller] = {}
        self.events = EventRecorder(self.store, enabled=events)
        self.kubelet = Kubelet(self.store, self.kubelet_config)
        self.kubelet.events = self.events
        # The registries and images the nodes can pull: the defaults (kubesim.images) and
        # `images` (patterns, or a whole catalog); more can be added at run time
        # (`sim.images.add(...)`), and the next pull retry finds them.
        self.images = self.kubelet.catalog = _catalog(images)
        # Logs, exec, attach, port-forward and proxy read the kubelet's container runtime.
        self.server.streaming.runtime = self.kubelet.runtime
        # Time-driven controllers read this clock; tests move it with `sim.clock.advance(s)`.
        self.clock = Clock()

    async def __aenter__(self) -> Cluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start the API server, write the kubeconfig, create namespaces, start controllers."""
        self._runner = web.AppRunner(self.server.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            self.host,
            self.port,
            ssl_context=self.tls.server_context() if self.tls else None,
        )
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1]
        self.url = f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"
        if self._requested_kubeconfig is not None:
            self.kubeconfig_path = self._requested_kubeconfig
        else:
            self._tempdir = tempfile.mkdtemp(prefix="kubesim-", dir=short_temp_dir())
            self.kubeconfig_path = Path(self._tempdir) / "kubeconfig"
        self.kubeconfig_path.parent.mkdir(parents=True, exist_ok=True)
        if self._requested_work_dir is None and self._tempdir is None:
            self._tempdir = tempfile.mkdtemp(prefix="kubesim-", dir=short_temp_dir())
        work_dir = self._requested_work_dir or Path(self._tempdir or ".")
        if self.node_filesystems:
            self.kubelet.filesystems = NodeFilesystems(
                work_dir / "nodes", os_image=self.kubelet.os_image
            )
        self.auth.url = self.url
        self.auth.ca_data = self.tls.ca_data if self.tls else None
        self.auth.write_kubeconfig(self.auth.admin_token, self.kubeconfig_path)  # mode 0600
        if self.auth.mode == "rbac":
            self.auth.install_bootstrap_policy()
        self.kubelet.url = self.url
        self.kubelet.kubeconfig_path = self.kubeconfig_path
        ns_rt = self.store.registry.resolve("namespaces")
        for name in DEFAULT_NAMESPACES:
            if self.store.peek(ns_rt.key, "", name) is None:
                self.store.insert(
                    ns_rt, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
                )
        service_ips.ensure_kubernetes_service(self.store, self.host, self.port)
        factories: dict[str, Callable[[], Controller]] = {
            "namespace": lambda: NamespaceController(self.store),
            "garbage-collector": lambda: GarbageCollector(self.store),
            "daemonset": lambda: DaemonSetController(self.store),
            "deployment": lambda: DeploymentController(self.store, self.clock),
            "replicaset": lambda: ReplicaSetController(self.store),
            "scheduler": lambda: Scheduler(self.store),
            "resourceclaim": lambda: ResourceClaimController(self.store),
            "disruption": lambda: DisruptionController(self.store),
            "kubelet": lambda: self.kubelet,
            "clusterrole-aggregation": lambda: ClusterRoleAggregationController(self.store),
            "job": lambda: JobController(self.store, self.clock),
            "ttl-after-finished": lambda: TTLAfterFinishedController(self.store, self.clock),
            "cronjob": lambda: CronJobController(self.store, self.clock),
            "statefulset": lambda: StatefulSetController(self.store),
            "endpoint": lambda: EndpointsController(self.store),
            "endpointslice": lambda: EndpointSliceController(self.store),
        }
        for name in ALL_CONTROLLERS:
            if name in self.enabled:
                controller = factories[name]()
                controller.events = self.events
                self.controllers[name] = controller
                controller.start()
        if "kubelet" in self.enabled:
            self.faults.set_node_loss_handler(
                lambda node: self.kubelet.set_node_ready(node, False, unreachable=True)
            )
        for index in range(self.initial_nodes):
            self.add_node(f"node-{index + 1}")

    async def stop(self) -> None:
        """Stop controllers and the server, and remove the temporary kubeconfig."""
        for controller in reversed(list(self.controllers.values())):
            await controller.stop()
        self.controllers.clear()
        # Managers started by hand also run without the kubelet controller.
        await self.kubelet.devices.stop_all()
        self.store.close_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.kubelet.filesystems is not None:
            self.kubelet.filesystems.remove_all()
            self.kubelet.filesystems = None
        if self._tempdir:
            shutil.rmtree(self._tempdir, ignore_errors=True)
            self._tempdir = None

    # ----- nodes ------------------------------------------------------------------------------

    def add_node(
        self,
        name: str,
        *,
        labels: dict[str, str] | None = None,
        capacity: dict[str, str] | None = None,
        node_info: dict[str, str] | None = None,
        taints: list[dict[str, Any]] | None = None,
        ready: bool = True,
    ) -> dict[str, Any]:
        """Register a node as its kubelet would (status, capacity, nodeInfo, Lease)."""
        node = self.kubelet.node_object(name, labels, capacity, node_info, taints)
        stored = self.store.insert(self.store.registry.resolve("nodes"), node)
        self.kubelet.node_registered(name, ready=ready)
        self.kubelet.ensure_lease(name)
        if not ready:
            self.kubelet.set_node_ready(name, False)
        return stored.copy()

    def load_image(self, image: str, nodes: Iterable[str] | None = None) -> None:
        """Put an image on nodes (all current nodes when None) without a pull, as `kind load`
        or a node image with it pre-pulled would: `imagePullPolicy: Never` then finds it.
        Raises ValueError for a name the kubelet could not parse."""
        targets = (
            list(nodes)
            if nodes is not None
            else [s.obj["metadata"]["name"] for s in self.store.scan(("", "nodes"))]
        )
        for node in targets:
            self.kubelet.load_image(node, image)

    def remove_node(self, name: str) -> None:
        """Delete a node (its pods are garbage-collected and their runners stopped)."""
        self.store.delete("nodes", name)
        with contextlib.suppress(errors.ApiError):
            self.store.delete("leases.coordination.k8s.io", name, "kube-node-lease")

    def set_node_ready(self, name: str, ready: bool) -> None:
        """Make a node Ready or NotReady (NotReady stops its pods' runners until Ready again)."""
        self.kubelet.set_node_ready(name, ready)

    def node_root(self, name: str) -> Path:
        """The node's root directory (its `/`): hostPath volumes of its pods live here."""
        return self.kubelet.node_root(name)

    async def start_device_manager(self, node: str) -> DeviceManager:
        """Start a node's device manager now: `kubelet.sock` in its
        `/var/lib/kubelet/device-plugins/` and the pod-resources socket. It also starts by itself
        when a pod with a runner starts on the node. Needs node filesystems."""
        if self.store.peek(("", "nodes"), "", node) is None:
            raise errors.not_found("nodes", "", node)
        return await self.kubelet.devices.ensure(node)

    def device_manager(self, node: str) -> DeviceManager | None:
        """A node's device manager, if started (devices, capacity, allocations)."""
        return self.kubelet.devices.get(node)

    async def start_dra_manager(self, node: str) -> DRAManager:
        """Start a node's DRA manager now: it watches the node's
        `/var/lib/kubelet/plugins_registry/` for DRA plugins. It also starts by itself when a
        pod with a runner or with ResourceClaims starts on the node. Needs node filesystems."""
        if self.store.peek(("", "nodes"), "", node) is None:
            raise errors.not_found("nodes", "", node)
        return await self.kubelet.dra.ensure(node)

    def dra_manager(self, node: str) -> DRAManager | None:
        """A node's DRA manager, if started (registered plugins, prepared claims)."""
        return self.kubelet.dra.get(node)

    async def restart_kubelet(self, node: str) -> None:
        """Restart a node's kubelet: its pods keep running, its device manager stops and starts
        again from the checkpoint (a new `kubelet.sock`, which plugins watch to register again),
        its DRA manager (if started) restarts from its checkpoint, re-registers the DRA plugins
        whose sockets are there and deletes the node's ResourceSlices, and the node records
        `Starting`."""
        if self.store.peek(("", "nodes"), "", node) is None:
            raise errors.not_found("nodes", "", node)
        await self.kubelet.devices.restart(node)
        if self.kubelet.dra.get(node) is not None:
            await self.kubelet.dra.restart(node)
        self.kubelet.node_event(node, "Starting", "Starting kubelet.")

    def register_pod_runner(
        self,
        runner: PodRunner,
        *,
        image: str | None = None,
        label_selector: str | None = None,
        container: str | None = None,
        reports_readiness: bool = False,
    ) -> RunnerRegistration:
        """Run `runner` as the program of containers matching an image or pod label selector;
        with `reports_readiness` its containers are ready only when it says so."""
        if image is None and label_selector is None:
            raise ValueError("register a pod runner by image or by label_selector")
        registration = RunnerRegistration(
            runner, image, label_selector, container, reports_readiness
        )
        self.kubelet.register(registration)
        return registration

    def register_container_runtime(self, service: RuntimeService | None) -> None:
        """Make `service` the nodes' container runtime: the kubelets run every sandbox and
        create every container through it and report its refusals as the real kubelet does
        (see kubesim.cri); None goes back to no runtime checks."""
        self.kubelet.cri = service

    def register_program(
        self, name: str, program: Program, *, available: Predicate | None = None
    ) -> None:
        """Install an executable called `name` in the containers for which `available` holds
        (all when None): a container whose command names it runs it, and `kubectl exec` finds
        it (see kubesim.programs)."""
        self.kubelet.programs.register(name, program, available=available)

    # ----- waiting ----------------------------------------------------------------------------

    async def wait_for(
        self, predicate: Callable[[], bool], timeout: float = 60.0, message: str = "condition"
    ) -> None:
        """Wait until `predicate()` holds, re-checking on every store change (and periodically).

        The default deadline suits a loaded machine: a wait ends as soon as the predicate holds.
        """
        if predicate():
            return
        changed = asyncio.Event()
        unsubscribe = self.store.subscribe(lambda _event: changed.set())
        deadline = time.monotonic() + timeout
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"timed out after {timeout}s waiting for {message}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(remaining, 0.05))
                changed.clear()
                if predicate():
                    return
        finally:
            unsubscribe()

    async def settle(self, timeout: float = 60.0) -> None:
        """Wait until every controller's queue is drained."""
        deadline = time.monotonic() + timeout
        while True:
            await asyncio.sleep(0)
            if all(c.idle.is_set() for c in self.controllers.values()):
                await asyncio.sleep(0)
                if all(c.idle.is_set() for c in self.controllers.values()):
                    return
            if time.monotonic() > deadline:
                busy = sorted(name for name, c in self.controllers.items() if not c.idle.is_set())
                raise TimeoutError(
                    f"controllers did not settle within {timeout:g}s; still busy: "
                    + ", ".join(busy)
                )
            await asyncio.wait(
                [asyncio.ensure_future(c.idle.wait()) for c in self.controllers.values()],
                timeout=max(0.0, deadline - time.monotonic()),
            )
