"""The node programs of the demo: the real agents (GFD, device plugin, config manager, MPS
control daemon, ...) on each node's mock GPUs, and simulations of the operands whose agents do not
exist yet (driver, toolkit, validator, ...).

Simulated operands wait for what they depend on, as the real validation init containers do
(driver -> toolkit -> device plugin), and take a realistic, per-node jittered time to get ready.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
from dataclasses import dataclass, field

import kubesim
from gpu_operator.api import keys
from gpu_operator.demo import agent_pods, exporters, gpu_faults, nvidia_smi, vm
from gpu_operator.demo import mig as mig_demo
from gpu_operator.demo.processes import ProcessTable
from gpu_operator.nvml import mock
from gpu_operator.operands import config_manager as cm_operand
from kubesim import PodContext

log = logging.getLogger("gpu_operator.demo")

GFD_APP = "gpu-feature-discovery"
PLUGIN_APP = "nvidia-device-plugin-daemonset"
MPS_APP = "nvidia-device-plugin-mps-control-daemon"
MPS_CONTAINERS = ("mps-control-daemon-mounts", "mps-control-daemon-ctr")
DRIVER_APP_PREFIX = "nvidia-driver-daemonset"
DRIVER_CTR = "nvidia-driver-ctr"
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
REAL_AGENTS = frozenset(
    {GFD_APP, mig_demo.APP, PLUGIN_APP, MPS_APP, *exporters.APPS, *vm.REAL_AGENTS}
)


# DCGM's load generators (by CUDA major version) and the utilisation they drive (percent).
PROFTESTERS = ("dcgmproftester11", "dcgmproftester12", "dcgmproftester13")
PROFTESTER_LOAD = 95


def _option_value(args: list[str], flag: str, default: str) -> str:
    """The value after `flag` (`-d 30` or `-d=30`), or `default`."""
    for i, arg in enumerate(args):
        if arg == flag:
            if i + 1 >= len(args):
                raise ValueError("missing")
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1 :]
    return default


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


class Programs:
    """Registers the demo's pod runners on a kubesim cluster and keeps per-node state."""

    def __init__(self, sim: kubesim.Cluster, timing: Timing) -> None:
        self.sim = sim
        self.timing = timing
        self.nodes: dict[str, SimNode] = {}
        # Simulated processes of operand pods, for the config manager's signals.
        self.processes = ProcessTable()

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
        # What the NVIDIA container runtime puts into GPU containers (and the driver ships).
        self.sim.register_program("nvidia-smi", self.nvidia_smi, available=self.has_nvidia_smi)
        self.sim.register_program(
            "demo-gpu-fault", self.gpu_fault, available=self._gpu_driver_container
        )
        # DCGM's load generator, which NVIDIA's docs use to see metrics move: here it loads the
        # container's mock GPUs (utilisation, memory, power, temperature) for its duration.
        for name in PROFTESTERS:
            self.sim.register_program(name, self.proftester, available=self.has_gpus)

    @staticmethod
    def _driver_container(view: kubesim.ContainerView) -> bool:
        app = (view.pod["metadata"].get("labels") or {}).get("app", "")
        return app.startswith(DRIVER_APP_PREFIX) and view.container_name == DRIVER_CTR

    def has_nvidia_smi(self, view: kubesim.ContainerView) -> bool:
        """GPU containers (the runtime injected devices) and the driver container have it."""
        if self.node(view.node_name).machine is None:
            return False
        if self._driver_container(view):
            return True
        return nvidia_smi.has_nvidia_smi(view.env, view.allocation)

    async def nvidia_smi(self, run: kubesim.ProgramRun) -> int:
        """`nvidia-smi` on the node's mock GPUs, showing the container's devices only."""
        machine = self.node(run.view.node_name).machine
        if machine is None:
            run.stdout.write(nvidia_smi.NO_DEVICES + "\n")
            return nvidia_smi.EXIT_NOT_FOUND
        reset = None
        if self._driver_container(run.view):
            visible: nvidia_smi.Visible | None = nvidia_smi.Visible(all=True)

            def reset(index: int) -> str:
                machine.reset(index)
                return machine.gpus[index].bus_id

        else:
            visible = nvidia_smi.visible_devices(run.view.env, run.view.allocation)
        code, text = nvidia_smi.run(
            machine.nvml(),
            visible or nvidia_smi.Visible(),
            run.argv[1:],
            dt.datetime.now(),
            reset=reset,
        )
        run.stdout.write(text)
        return code

    def has_gpus(self, view: kubesim.ContainerView) -> bool:
        """Containers the device plugin gave GPUs on a node with mock GPUs."""
        machine = self.node(view.node_name).machine
        return machine is not None and bool(exporters.allocation_uuids(view.allocation))

    async def proftester(self, run: kubesim.ProgramRun) -> int:
        """`dcgmproftester12 [-t FIELD] [-d SECONDS] [--no-dcgm-validation]`: load on the
        container's GPUs for the duration (default 30 s), as the real tool generates it."""
        machine = self.node(run.view.node_name).machine
        uuids = exporters.allocation_uuids(run.view.allocation)
        assert machine is not None  # present only where the container has mock GPUs
        try:
            seconds = _option_value(run.argv[1:], "-d", "30")
            duration = float(seconds)
            if duration <= 0:
                raise ValueError(seconds)
        except ValueError as err:
            run.stderr.write(f"{run.argv[0]}: -d needs a positive number of seconds: {err}\n")
            return 2
        run.stdout.write(f"Generating load on {len(uuids)} GPU(s) for {duration:g} s\n")
        job = machine.start_workload(uuids, load=PROFTESTER_LOAD)
        try:
            await asyncio.sleep(duration)
        finally:
            machine.stop_workload(job)
        run.stdout.write("Done\n")
        return 0

    def _gpu_driver_container(self, view: kubesim.ContainerView) -> bool:
        return self._driver_container(view) and self.node(view.node_name).machine is not None

    async def gpu_fault(self, run: kubesim.ProgramRun) -> int:
        """The demo-only fault injector (see gpu_faults)."""
        machine = self.node(run.view.node_name).machine
        assert machine is not None  # present only where the node has mock GPUs
        code, text = gpu_faults.run(machine, run.argv[1:])
        (run.stdout if code == 0 else run.stderr).write(text)
        return code

    async def _sleep(self, base: float, node: str, what: str) -> None:
        seconds = self.timing.delay(base, node, what)
        if seconds > 0:
            await asyncio.sleep(seconds)

    async def operand(self, ctx: PodContext) -> int | None:
        """One container of an operand pod: init containers wait or pass, main ones run."""
        node = self.node(ctx.node_name)
        if ctx.container_name in (cm_operand.INIT, cm_operand.SIDECAR):
            return await agent_pods.config_manager(ctx, self.processes)
        if app_of(ctx) == MPS_APP and ctx.container_name in MPS_CONTAINERS:
            return await agent_pods.mps_control_daemon(ctx, node.machine, self.processes)
        if vm.handles(ctx):  # VM-workload operands and the driver manager (demo.vm)
            return await vm.run(ctx)
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
            return await agent_pods.gpu_feature_discovery(ctx, node.machine, self.processes)
        if app == PLUGIN_APP:
            return await self._device_plugin(ctx, node)
        if app == mig_demo.APP:
            return await mig_demo.run(ctx, node.machine)
        if app in exporters.APPS:
            return await exporters.run(app, ctx, node.machine)
        return await self._simulated(ctx, node, app)

    async def _simulated(self, ctx: PodContext, node: SimNode, app: str) -> int:
        await self._sleep(MAIN_DELAYS.get(app, DEFAULT_MAIN_DELAY), node.name, app)
        milestone = MILESTONES.get(app)
        if app == DRIVER_APP_PREFIX:
            vm.driver_loaded(ctx)  # the GPUs bind to nvidia on the node's simulated PCI host
        if milestone is not None:
            node.milestone(milestone).set()
        ctx.set_ready(True)
        try:
            await ctx.stopping.wait()
        finally:
            if milestone is not None:
                node.milestone(milestone).clear()
            if app == DRIVER_APP_PREFIX:
                vm.driver_stopped(ctx)
        return 0

    async def _device_plugin(self, ctx: PodContext, node: SimNode) -> int:
        """The real device plugin; the node's plugin milestone (what the validator's
        plugin-validation waits for) holds while it serves."""
        milestone = node.milestone(MILESTONES[PLUGIN_APP])
        try:
            return await agent_pods.device_plugin(
                ctx, node.machine, self.processes, on_serving=milestone.set
            )
        finally:
            milestone.clear()
