"""The node programs of the demo: the real GFD agent on each node's mock GPUs, and simulations
of the operands whose agents do not exist yet (driver, toolkit, validator, device plugin, ...).

Simulated operands wait for what they depend on, as the real validation init containers do
(driver -> toolkit -> device plugin), and take a realistic, per-node jittered time to get ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import kubesim
from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.gfd import command as gfd_command
from gpu_operator.agents.gfd import facts as gfd_facts
from gpu_operator.agents.gfd import labels as gfd_labels
from gpu_operator.agents.gfd import runner as gfd_runner
from gpu_operator.api import keys
from gpu_operator.kube import node_features
from gpu_operator.nvml import mock
from kubesim import PodContext
from kubesim import errors as sim_errors

log = logging.getLogger("gpu_operator.demo")

GFD_APP = "gpu-feature-discovery"
DRIVER_APP_PREFIX = "nvidia-driver-daemonset"
# Seconds each simulated main container takes to get ready (before jitter and scaling).
MAIN_DELAYS: dict[str, float] = {
    DRIVER_APP_PREFIX: 3.0,  # module build and load
    "nvidia-container-toolkit-daemonset": 0.8,
    "nvidia-device-plugin-daemonset": 0.5,
    "nvidia-device-plugin-mps-control-daemon": 0.5,
    "nvidia-operator-validator": 0.2,
    "nvidia-dcgm": 0.8,
    "nvidia-dcgm-exporter": 1.0,
    "nvidia-mig-manager": 0.6,
    "nvidia-node-status-exporter": 0.3,
}
DEFAULT_MAIN_DELAY = 0.5
INIT_DELAYS: dict[str, float] = {"k8s-driver-manager": 0.3, "cuda-validation": 0.4}
DEFAULT_INIT_DELAY = 0.1
# Init containers that wait for an operand on the same node (the validator's marker files).
WAITS_FOR: dict[str, str] = {
    "driver-validation": "driver",
    "toolkit-validation": "toolkit",
    "plugin-validation": "device-plugin",
}
# Which milestone a main container reaches when it is ready.
MILESTONES: dict[str, str] = {
    DRIVER_APP_PREFIX: "driver",
    "nvidia-container-toolkit-daemonset": "toolkit",
    "nvidia-device-plugin-daemonset": "device-plugin",
}
# Operands whose real agent runs in the demo; every other operand is simulated.
REAL_AGENTS = frozenset({GFD_APP})


@dataclass(frozen=True)
class Timing:
    """Scales every simulated delay (0 = instant); jitter is a stable function of the node."""

    scale: float = 1.0
    jitter: float = 0.4

    def delay(self, base: float, node: str, what: str) -> float:
        digest = hashlib.sha256(f"{node}/{what}".encode()).digest()
        spread = 1.0 + self.jitter * (digest[0] / 255.0)
        return base * spread * self.scale


@dataclass
class SimNode:
    """One simulated node: its mock GPUs (None on CPU nodes) and operand milestones."""

    name: str
    machine: mock.MockMachine | None
    milestones: dict[str, asyncio.Event] = field(default_factory=dict)

    def milestone(self, name: str) -> asyncio.Event:
        return self.milestones.setdefault(name, asyncio.Event())


def app_of(ctx: PodContext) -> str:
    """The DaemonSet (app label) a pod belongs to; driver pools share one prefix."""
    app = ctx.labels.get("app", "")
    return DRIVER_APP_PREFIX if app.startswith(DRIVER_APP_PREFIX) else app


def device_resources(facts: gfd_facts.NodeFacts, strategy: str) -> dict[str, int]:
    """The extended resources a device plugin would advertise for these GPUs and MIG strategy."""
    counts: Counter[str] = Counter()
    for gpu in facts.gpus:
        if gpu.mig_enabled and strategy == "single":
            counts["nvidia.com/gpu"] += len(gpu.mig_devices)
        elif gpu.mig_enabled and strategy == "mixed":
            for mig in gpu.mig_devices:
                counts[f"nvidia.com/mig-{mig.profile}"] += 1
        else:
            counts["nvidia.com/gpu"] += 1
    return dict(counts)


def _env_bool(value: str | None) -> bool | None:
    if value is None:
        return None
    return value.strip().lower() in ("1", "true", "yes", "on")


class _ReadyAfterFirstWrite:
    """A GFD sink that marks the container ready once labels have been written."""

    def __init__(self, inner: node_features.NodeLabelWriter, on_write: Callable[[], None]) -> None:
        self.inner = inner
        self.on_write = on_write

    async def write(self, labels: gfd_labels.Labels) -> None:
        await self.inner.write(labels)
        self.on_write()

    async def remove(self) -> None:
        await self.inner.remove()


class Programs:
    """Registers the demo's pod runners on a kubesim cluster and keeps per-node state."""

    def __init__(self, sim: kubesim.Cluster, timing: Timing) -> None:
        self.sim = sim
        self.timing = timing
        self.nodes: dict[str, SimNode] = {}

    def add_node(self, name: str, machine: mock.MockMachine | None) -> None:
        self.nodes[name] = SimNode(name, machine)

    def node(self, name: str) -> SimNode:
        return self.nodes.setdefault(name, SimNode(name, None))

    def register(self) -> None:
        """Operand pods (by the operator's state label) get ours; other pods run as kubesim runs
        them (a container with a command finishes, one without keeps serving)."""
        self.sim.register_pod_runner(
            self.operand, label_selector=keys.OPERATOR_STATE_LABEL, reports_readiness=True
        )

    async def _sleep(self, base: float, node: str, what: str) -> None:
        seconds = self.timing.delay(base, node, what)
        if seconds > 0:
            await asyncio.sleep(seconds)

    async def operand(self, ctx: PodContext) -> int | None:
        """One container of an operand pod: init containers wait or pass, main ones run."""
        node = self.node(ctx.node_name)
        if ctx.init:
            needed = WAITS_FOR.get(ctx.container_name)
            if needed is not None:
                await node.milestone(needed).wait()
            await self._sleep(
                INIT_DELAYS.get(ctx.container_name, DEFAULT_INIT_DELAY), node.name,
                ctx.container_name,
            )  # fmt: skip
            return 0
        app = app_of(ctx)
        if app == GFD_APP:
            return await self._gfd(ctx, node)
        return await self._simulated(ctx, node, app)

    async def _simulated(self, ctx: PodContext, node: SimNode, app: str) -> int:
        await self._sleep(MAIN_DELAYS.get(app, DEFAULT_MAIN_DELAY), node.name, app)
        if app == "nvidia-device-plugin-daemonset":
            self._advertise(node, ctx.env.get("MIG_STRATEGY", "none"))
        elif app == "nvidia-mig-manager":
            self._mig_applied(node.name)
        milestone = MILESTONES.get(app)
        if milestone is not None:
            node.milestone(milestone).set()
        ctx.set_ready(True)
        try:
            await ctx.stopping.wait()
        finally:
            if milestone is not None:
                node.milestone(milestone).clear()
            if app == "nvidia-device-plugin-daemonset":
                self._withdraw(node.name)
        return 0

    def _advertise(self, node: SimNode, strategy: str) -> None:
        # The kubelet (not the plugin) writes capacity once a plugin registers; the demo plays
        # the kubelet, so it writes the node status in-process.
        if node.machine is None:
            return
        lib = node.machine.nvml()
        lib.init()
        try:
            facts = gfd_facts.collect(lib, machine_type=node.machine.spec.product_name)
        finally:
            lib.shutdown()
        resources = {k: str(v) for k, v in device_resources(facts, strategy).items()}
        self._patch_capacity(node.name, resources)

    def _withdraw(self, name: str) -> None:
        current = self.sim.store.get("nodes", name)
        if current is None:
            return
        capacity = (current.get("status") or {}).get("capacity") or {}
        gone: dict[str, str | None] = {k: None for k in capacity if k.startswith("nvidia.com/")}
        if gone:
            self._patch_capacity(name, gone)

    def _patch_capacity(self, name: str, resources: dict[str, str] | dict[str, str | None]) -> None:
        patch = {"status": {"capacity": resources, "allocatable": resources}}
        with contextlib.suppress(sim_errors.ApiError):  # the node may be gone meanwhile
            self.sim.store.patch("nodes", name, patch, status=True)

    def _mig_applied(self, name: str) -> None:
        current = self.sim.store.get("nodes", name)
        labels = ((current or {}).get("metadata") or {}).get("labels") or {}
        if keys.MIG_CONFIG in labels and labels.get(keys.MIG_CONFIG_STATE) != "success":
            with contextlib.suppress(sim_errors.ApiError):
                self.sim.store.patch(
                    "nodes", name, {"metadata": {"labels": {keys.MIG_CONFIG_STATE: "success"}}}
                )

    async def _gfd(self, ctx: PodContext, node: SimNode) -> int:
        """The real GFD agent, writing node labels over the API with this node's mock GPUs."""
        if node.machine is None:
            log.warning("GFD pod on %s, which has no mock GPUs", node.name)
            await ctx.stopping.wait()
            return 0
        env = ctx.env
        options = gfd_command.Options(
            backend="mock",
            mig_strategy=env.get("GFD_MIG_STRATEGY") or env.get("MIG_STRATEGY"),
            sleep_interval=env.get("GFD_SLEEP_INTERVAL"),
            oneshot=_env_bool(env.get("GFD_ONESHOT")),
            no_timestamp=_env_bool(env.get("GFD_NO_TIMESTAMP")),
            fail_on_init_error=_env_bool(env.get("GFD_FAIL_ON_INIT_ERROR")),
            node_labels=True,
            node_name=ctx.node_name,
        )
        try:
            settings = gfd_command.build_settings(options)
        except pc.ConfigError as err:
            log.warning("GFD on %s: %s", node.name, err)
            return 2
        settings.machine_type = node.machine.spec.product_name or "unknown"
        api = node_features.client(ctx.kubeconfig_path)
        sink = _ReadyAfterFirstWrite(
            node_features.NodeLabelWriter(api, ctx.node_name), lambda: ctx.set_ready(True)
        )
        try:
            await gfd_runner.run(
                node.machine.nvml, sink, settings, stop=ctx.stopping, install_signals=False
            )
        finally:
            await api.close()
        return 0
