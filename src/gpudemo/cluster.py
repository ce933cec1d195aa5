"""The demo cluster both installs share: how to run the demo (`Options`), what a finished run saw
(`Result`), the running demo (`Demo`: nodes, their hardware and programs, the live view) and the
simulated kubelets' settings. `session.run` (in-process operator) and `helm_session.run` (`helm
install` of the chart) drive it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

import kubesim
from gpu_operator.api import crds
from gpu_operator.nvml import mock
from gpudemo import fleet as fleet_mod
from gpudemo import install as install_mod
from gpudemo import programs, view
from kubesim import KubeletConfig
from kubesim import errors as sim_errors
from simhost import driver, hardware, nfd

NAMESPACE = "gpu-operator"
POLICY_NAME = "cluster-policy"
DEFAULT_KUBECONFIG = Path("~/.kube/gpu-operator-demo.yaml")
# Every section the Helm chart turns on by default; images come from the operator env.
DEFAULT_POLICY: dict[str, Any] = {
    "apiVersion": "nvidia.com/v1",
    "kind": "ClusterPolicy",
    "metadata": {"name": POLICY_NAME},
    "spec": {
        "operator": {"runtimeClass": "nvidia"},
        "daemonsets": {
            "priorityClassName": "system-node-critical",
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "updateStrategy": "RollingUpdate",
        },
        "mig": {"strategy": "single"},
        "cdi": {"enabled": True},
        "driver": {"enabled": True},
        "toolkit": {"enabled": True},
        "validator": {},
        "devicePlugin": {"enabled": True},
        "dcgm": {"enabled": False},
        "dcgmExporter": {"enabled": True},
        "gfd": {"enabled": True},
        "migManager": {"enabled": True},
        "nodeStatusExporter": {"enabled": False},
    },
}
NODE_CAPACITY = {"cpu": "64", "memory": "512Gi", "pods": "110"}


@dataclass
class Options:
    """How to run the demo."""

    fleet: fleet_mod.Fleet
    policy: dict[str, Any] = field(default_factory=lambda: DEFAULT_POLICY)
    # Objects to create before the policy (e.g. the ConfigMaps a policy file names).
    objects: list[dict[str, Any]] = field(default_factory=list)
    # Called once the cluster serves (with --serve), with the cluster and the node programs
    # (tests use it to reach the mock GPUs).
    on_serving: Callable[[kubesim.Cluster, programs.Programs], None] | None = None
    serve: bool = False
    kubeconfig_out: Path | None = None
    # How the operator gets onto the cluster: "in-process" (the operator runs in this process
    # against kubesim) or "helm" (real `helm install --wait` of the chart; see demo/helm_session).
    install: str = "in-process"
    # With install="helm": values files for `helm install -f`, and the chart (default: checkout).
    values: list[Path] = field(default_factory=list)
    # ... and `helm install --set` items (e.g. agents.builtin=true), and `--set-json` items.
    sets: list[str] = field(default_factory=list)
    set_json: list[str] = field(default_factory=list)
    chart: Path | None = None
    # Toolkit pods of NVIDIA's image behave as NVIDIA's toolkit (gpudemo.nvidia_toolkit).
    nvidia_toolkit: bool = False
    # Images the simulated registries hold besides kubesim's defaults (the chart's, the
    # examples'), as kubesim.images patterns: `registry.example.com/nvidia/*` for a values
    # file that points at a private mirror.
    images: list[str] = field(default_factory=list)
    timing: programs.Timing = field(default_factory=programs.Timing)
    # Extra operator Settings fields for the in-process operator (e.g. `coexist`).
    operator_settings: dict[str, Any] = field(default_factory=dict)
    timeout: float = 120.0
    live: bool | None = None  # None: live table only on a terminal
    refresh_per_second: float = 4.0
    progress_interval: float = 1.0


@dataclass
class Result:
    """What a finished run saw (for tests and the exit status)."""

    converged: bool
    summary: view.Summary | None
    kubeconfig: Path | None
    node_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    node_allocatable: dict[str, dict[str, str]] = field(default_factory=dict)
    policy_status: dict[str, Any] = field(default_factory=dict)


class Demo:
    """A running demo cluster (used by `run`, and by tests that want to poke at it)."""

    def __init__(self, options: Options, console: Console) -> None:
        self.options = options
        self.console = console
        self.gpu_nodes: set[str] = set()
        # Each GPU node's GPUs by model, from its machine (the summary counts the GPUs of nodes
        # GFD does not label, such as VM nodes, from these).
        self.hardware: dict[str, dict[str, int]] = {}
        self.started = time.monotonic()
        self.policy_created: float | None = None

    def elapsed(self) -> float:
        start = self.policy_created if self.policy_created is not None else self.started
        return time.monotonic() - start

    def snapshot(self, sim: kubesim.Cluster) -> view.Snapshot:
        return view.snapshot(sim.store, NAMESPACE, POLICY_NAME, self.elapsed(), self.gpu_nodes)

    def populate(
        self, sim: kubesim.Cluster, nodes: programs.Programs, *, install: bool = True
    ) -> None:
        """The fleet's nodes (with their mock machines and host files); with `install` also the
        namespace and CRDs, and NFD's labels (the chart installs those otherwise)."""
        if install:
            sim.store.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
            )
            for crd in crds.all_crds().values():
                sim.store.create(crd)
            # NFD's CRDs (the chart's sub-chart installs them otherwise), so the in-process NFD
            # below publishes NodeFeatures as nfd-worker does (the coexistence detector reads them).
            with contextlib.suppress(FileNotFoundError):
                for crd in nfd.chart_crds(install_mod.find_chart()):
                    sim.store.create(crd)
        roots = {}
        for plan in fleet_mod.plan_nodes(self.options.fleet):
            machine = None
            spec = plan.pool.machine_spec()
            if spec is not None:
                machine = mock.MockMachine(spec, seed=plan.seed)
                self.gpu_nodes.add(plan.name)
                self.hardware[plan.name] = view.machine_gpus(machine.spec)
            nodes.add_node(plan.name, machine)
            sim.add_node(
                plan.name, labels=plan.labels, capacity=dict(NODE_CAPACITY),
                node_info=plan.node_info, taints=[dict(t) for t in plan.taints] or None,
            )  # fmt: skip
            roots[plan.name] = sim.node_root(plan.name)
            hardware.write(roots[plan.name], plan.pool, machine)
            nodes.boot_runtime(plan.name, plan.pool.runtime, plan.pool.container_runtime_version)
            if machine is not None:
                # The node's mock NVML answers only while a driver is loaded on its host.
                machine.driver_probe = driver.probe(roots[plan.name])
        if install:
            # No NFD pods in-process: NFD's worker and master logic label the nodes directly.
            nfd.label_directly(
                roots,
                lambda name, patch: sim.store.patch("nodes", name, patch),
                lambda name: _labels_and_annotations(sim, name),
                _feature_writer(sim),
                NAMESPACE,
            )

    async def watch(
        self, sim: kubesim.Cluster, stop: asyncio.Event, until: Callable[[view.Snapshot], bool]
    ) -> view.Snapshot:
        """Show progress until `until(snapshot)` holds or `stop` is set; returns the last one."""
        live = self.options.live if self.options.live is not None else self.console.is_terminal
        title = f"gpu-operator demo: fleet {self.options.fleet.name}"
        snap = self.snapshot(sim)
        if live:
            with Live(
                view.table(snap, title),
                console=self.console,
                refresh_per_second=self.options.refresh_per_second,
                auto_refresh=False,
            ) as display:
                while not until(snap) and not stop.is_set():
                    await _wait(stop, 1.0 / self.options.refresh_per_second)
                    snap = self.snapshot(sim)
                    display.update(view.table(snap, title), refresh=True)
            return snap
        last = ""
        next_line = 0.0
        while True:
            line = view.progress_line(snap)
            key = line.split("]", 1)[1]
            done = until(snap) or stop.is_set()
            if (key != last and time.monotonic() >= next_line) or done:
                self.console.print(line, markup=False, highlight=False)
                last, next_line = key, time.monotonic() + self.options.progress_interval
            if done:
                return snap
            await _wait(stop, 0.25)
            snap = self.snapshot(sim)


def _feature_writer(sim: kubesim.Cluster) -> Callable[[dict[str, Any]], object] | None:
    """Writes NodeFeatures when NFD's CRD is installed (None otherwise)."""
    if sim.store.get("customresourcedefinitions", "nodefeatures.nfd.k8s-sigs.io") is None:
        return None
    return sim.store.create


def _labels_and_annotations(
    sim: kubesim.Cluster, name: str
) -> tuple[dict[str, str], dict[str, str]]:
    meta = (sim.store.get("nodes", name) or {}).get("metadata") or {}
    return dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})


async def _wait(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)


_QUIET = ("gpu_operator", "kubesim", "aiohttp", "httpx", "lightkube")
_AGENTS = "gpu_operator.agents"
# Loggers as they were before the first running demo quietened them, and how many demos run.
_saved_logs: list[tuple[logging.Logger, int, bool, list[logging.Handler]]] = []
_quiet_demos = 0


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """Quieten the process's logs while a demo runs; the last demo to end restores them.

    A demo runs in-process next to other code (the tests run many in one process), so the
    loggers it changes must come back as they were: their levels, `propagate` and handlers."""
    global _quiet_demos
    if _quiet_demos == 0:
        loggers = [logging.getLogger(name) for name in (*_QUIET, _AGENTS)]
        _saved_logs[:] = [(lg, lg.level, lg.propagate, list(lg.handlers)) for lg in loggers]
        # The operator and kubesim log retries while things converge; the table says it better.
        for name in _QUIET:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        # Node programs log as in their pods: to the container log (`kubectl logs`), not the
        # console.
        agents = logging.getLogger(_AGENTS)
        agents.setLevel(logging.INFO)
        agents.propagate = False
        if not any(isinstance(h, kubesim.ContainerLogHandler) for h in agents.handlers):
            handler = kubesim.ContainerLogHandler()
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
            )
            agents.addHandler(handler)
    _quiet_demos += 1
    try:
        yield
    finally:
        _quiet_demos -= 1
        if _quiet_demos == 0:
            for lg, level, propagate, handlers in _saved_logs:
                lg.setLevel(level)
                lg.propagate = propagate
                lg.handlers[:] = handlers
            _saved_logs.clear()


def with_namespace(obj: dict[str, Any]) -> dict[str, Any]:
    """A namespaced object from a policy file, in the operator's namespace unless it says."""
    meta = dict(obj.get("metadata") or {})
    meta.setdefault("namespace", NAMESPACE)
    return {**obj, "metadata": meta}


def kubectl_help(path: Path, kind: str = "ClusterPolicy") -> list[str]:
    """What to try on the served cluster; `kind`: the policy the demo created (a GPUCluster's
    hints name it and its objects)."""
    k = f"kubectl --kubeconfig {path}"
    if kind == "GPUCluster":
        policy = [
            f"  {k} get gpucluster",
            f"  {k} -n {NAMESPACE} get daemonsets,pods -o wide",
            f"  {k} get resourceslices,deviceclasses",
            f"  {k} edit gpucluster gpu-cluster     # e.g. set spec.dcgm.enabled: true",
        ]
    else:
        policy = [
            f"  {k} get clusterpolicy",
            f"  {k} -n {NAMESPACE} get daemonsets,pods -o wide",
            f"  {k} edit clusterpolicy {POLICY_NAME}     # e.g. set spec.migManager.enabled: false",
        ]
    return [
        "",
        f"The cluster keeps running. Kubeconfig: {path}",
        f"  {k} get nodes --show-labels",
        *policy,
        f"  {k} label node <gpu-node> nvidia.com/gpu.deploy.operands=false --overwrite",
        "Press Ctrl-C to stop.",
    ]


def observe(sim: kubesim.Cluster, converged: bool, kubeconfig: Path | None) -> Result:
    """What the cluster looks like now: node labels, allocatable resources, policy status."""
    result = Result(converged, None, kubeconfig)
    for node in sim.store.list("nodes"):
        name = node["metadata"]["name"]
        result.node_labels[name] = dict(node["metadata"].get("labels") or {})
        result.node_allocatable[name] = dict((node.get("status") or {}).get("allocatable") or {})
    try:
        policy = sim.store.get("clusterpolicies.nvidia.com", POLICY_NAME) or {}
    except sim_errors.ApiError:  # no CRD: the chart never got installed
        policy = {}
    result.policy_status = dict(policy.get("status") or {})
    return result


def kubelet_config(options: Options) -> KubeletConfig:
    """The simulated kubelets of the demo (delays scaled with the operands' timing)."""
    return KubeletConfig(
        start_delay=0.05 * options.timing.scale,
        init_container_duration=0.05 * options.timing.scale,
        kernel_version="6.8.0-52-generic",
        os_image="Ubuntu 22.04.5 LTS",
        pull_delay=KubeletConfig.pull_delay * options.timing.scale,
    )
