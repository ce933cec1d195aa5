"""The node programs of the demo: the real agents (GFD, device plugin, config manager, MPS
control daemon, ...) on each node's mock GPUs, the driver container on each node's simulated
host (`demo.driver`), the validator in every validation init container (`demo.validator`), and
simulations of the operands whose agents do not exist yet.

Operands wait for what they depend on through the validator's marker files, as on a real node
(driver -> toolkit -> device plugin); simulated ones take a realistic, per-node jittered time to
get ready.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
from dataclasses import dataclass

import kubesim
from gpu_operator.nvml import mock
from gpu_operator.operands import config_manager as cm_operand
from gpu_operator.operands import registry
from gpudemo import agent_pods, compute_domains, exporters, vm
from gpudemo import driver_manager as driver_manager_demo
from gpudemo import mig as mig_demo
from gpudemo import nvidia_toolkit as nvidia_toolkit_demo
from gpudemo import toolkit as toolkit_demo
from gpudemo import validator as validator_demo
from kubesim import PodContext
from simhost import containerd, cuda_samples, gpu_faults, imex, nvidia_smi, runtime_boot
from simhost import driver as driver_demo
from simhost.processes import ProcessTable

log = logging.getLogger("gpu_operator.demo")

GFD_APP = "gpu-feature-discovery"
PLUGIN_APP = "nvidia-device-plugin-daemonset"
MPS_APP = "nvidia-device-plugin-mps-control-daemon"
MPS_CONTAINERS = ("mps-control-daemon-mounts", "mps-control-daemon-ctr")
DRIVER_APP_PREFIX = "nvidia-driver-daemonset"
DRIVER_CTR = "nvidia-driver-ctr"
# A GPUCluster's kubelet-plugin DaemonSet (operands/dra_driver.py): its `gpus` container runs our
# GPU DRA kubelet plugin (NVIDIA's image or ours alike).
DRA_PLUGIN_APP = "nvidia-dra-driver-kubelet-plugin"
DRA_PLUGIN_CTR = "gpus"
# Seconds each simulated main container takes to get ready (before jitter and scaling).
MAIN_DELAYS: dict[str, float] = {
    "nvidia-device-plugin-daemonset": 0.5,
    "nvidia-device-plugin-mps-control-daemon": 0.5,
    "nvidia-dcgm": 0.8,
    "nvidia-dcgm-exporter": 1.0,
    "nvidia-mig-manager": 0.6,
    "nvidia-node-status-exporter": 0.3,
}
DEFAULT_MAIN_DELAY = 0.5
INIT_DELAYS: dict[str, float] = {}
DEFAULT_INIT_DELAY = 0.1
# Operands whose real agent runs in the demo; every other operand is simulated.
REAL_AGENTS = frozenset(
    {GFD_APP, mig_demo.APP, PLUGIN_APP, MPS_APP, *exporters.APPS, *vm.REAL_AGENTS,
     DRIVER_APP_PREFIX,  # the driver container on the simulated host (demo.driver)
     toolkit_demo.APP,
     validator_demo.VALIDATOR_APP,  # the validator in its init containers (demo.validator)
     DRA_PLUGIN_APP,  # the GPU DRA kubelet plugin (demo.agent_pods)
     compute_domains.CONTROLLER_APP}  # the compute-domain controller (demo.compute_domains)
)  # fmt: skip


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
    """One simulated node: its mock GPUs (None on CPU nodes)."""

    name: str
    machine: mock.MockMachine | None


def app_of(ctx: PodContext) -> str:
    """The DaemonSet (app label) a pod belongs to; driver pools share one prefix."""
    app = ctx.labels.get("app", "")
    return DRIVER_APP_PREFIX if app.startswith(DRIVER_APP_PREFIX) else app


class Programs:
    """Registers the demo's pod runners on a kubesim cluster and keeps per-node state."""

    def __init__(
        self, sim: kubesim.Cluster, timing: Timing, *, nvidia_toolkit: bool = False
    ) -> None:
        self.sim = sim
        self.timing = timing
        # Toolkit pods of NVIDIA's image behave as NVIDIA's toolkit (gpudemo.nvidia_toolkit)
        # instead of running our agent.
        self.nvidia_toolkit = nvidia_toolkit
        self.nodes: dict[str, SimNode] = {}
        # Simulated processes of operand pods, for the config manager's signals.
        self.processes = ProcessTable()
        # Each node's container runtime (demo.containerd), the kubelets' CRI hook.
        self.runtimes = containerd.NodeRuntimes()
        # The IMEX daemons' network: who answers at each daemon pod's address.
        self.imex_network = imex.Registry()

    def add_node(self, name: str, machine: mock.MockMachine | None) -> None:
        self.nodes[name] = SimNode(name, machine)

    def node(self, name: str) -> SimNode:
        return self.nodes.setdefault(name, SimNode(name, None))

    def runtime(self, name: str) -> containerd.SimulatedRuntime | None:
        """The node's container runtime (None on Docker nodes, which kubesim runs unchecked)."""
        return self.runtimes.get(name)

    def boot_runtime(self, name: str, runtime: str, version: str) -> None:
        """Write the node's original runtime configuration and start its runtime; the node
        follows the runtime (NotReady while it is down)."""
        root = self.sim.node_root(name)
        runtime_boot.write(root, runtime, version)
        machine = self.node(name).machine
        devices = None if machine is None else lambda: containerd.device_table(machine)
        simulated: containerd.SimulatedRuntime
        if runtime == "containerd":
            simulated = containerd.SimulatedContainerd(name, root, version=version, devices=devices)
        elif runtime == "cri-o":
            simulated = containerd.SimulatedCrio(name, root, version=version, devices=devices)
        else:
            return
        self.runtimes.add(simulated)
        if not simulated.start():
            self.sim.set_node_ready(name, False)

        def follow(up: bool, _reason: str) -> None:
            self.sim.set_node_ready(name, up)

        simulated.on_state = follow

    def injected(self, view: kubesim.ContainerView) -> containerd.Injection | None:
        """What the node's container runtime put into this container (contract C2)."""
        runtime = self.runtimes.get(view.node_name)
        if runtime is not None:
            return runtime.injected(view)
        # Docker nodes have no simulated runtime: the device plugin's allocation stands for it.
        visible = nvidia_smi.visible_devices(view.env, view.allocation)
        if visible is None:
            return None
        return containerd.Injection(
            handler="",
            mode="legacy",
            all_gpus=visible.all,
            gpu_ids=visible.ids,
            uuids=tuple(exporters.allocation_uuids(view.allocation)),
            mounts=("/usr/bin/nvidia-smi",),
        )

    def register(self) -> None:
        """Operand pods (by upstream's pod labels: their `app`, or a driver pool's component) get
        ours; other pods run as kubesim runs them (a container with a command finishes, one
        without keeps serving)."""
        for selector in (
            *registry.OPERAND_POD_SELECTORS,
            f"app={DRA_PLUGIN_APP}",
            f"app={compute_domains.CONTROLLER_APP}",
            compute_domains.DAEMON_SELECTOR,
        ):
            self.sim.register_pod_runner(
                self.operand, label_selector=selector, reports_readiness=True
            )
        # What the NVIDIA container runtime puts into GPU containers (and the driver ships).
        self.sim.register_container_runtime(self.runtimes)
        self.sim.register_program("nvidia-smi", self.nvidia_smi, available=self.has_nvidia_smi)
        self.sim.register_program(
            "demo-gpu-fault", self.gpu_fault, available=self._gpu_driver_container
        )
        # DCGM's load generator, which NVIDIA's docs use to see metrics move: here it loads the
        # container's mock GPUs (utilisation, memory, power, temperature) for its duration.
        for name in PROFTESTERS:
            self.sim.register_program(name, self.proftester, available=self.has_gpus)
        # The validator image's CUDA sample, which its cuda and plugin workload pods run.
        self.sim.register_program("vectorAdd", self.vector_add, available=self.has_gpus)
        # `ls /dev/nvidia-caps-imex-channels` in containers an IMEX channel was injected into.
        self.sim.register_program("ls", self.ls_channels, available=self.has_channels)

    @staticmethod
    def _driver_container(view: kubesim.ContainerView) -> bool:
        labels = view.pod["metadata"].get("labels") or {}
        return driver_demo.is_driver_pod(labels) and view.container_name == DRIVER_CTR

    def has_nvidia_smi(self, view: kubesim.ContainerView) -> bool:
        """GPU containers (the runtime injected devices) and the driver container have it."""
        if self.node(view.node_name).machine is None:
            return False
        if self._driver_container(view):
            return True
        injection = self.injected(view)
        return injection is not None and injection.nvidia_smi

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

        elif not self.has_nvidia_smi(run.view) and run.argv[0].startswith("/"):
            # The driver's own nvidia-smi that a volume brings (the host's, or the driver
            # container's root): the privileged validator runs it and sees every GPU.
            visible = nvidia_smi.Visible(all=True)
        else:
            injection = self.injected(run.view)
            visible = None
            if injection is not None:
                visible = nvidia_smi.Visible(all=injection.all_gpus, ids=injection.gpu_ids)
        code, text = nvidia_smi.run(
            machine.nvml(),
            visible or nvidia_smi.Visible(),
            run.argv[1:],
            dt.datetime.now(),
            reset=reset,
            host=machine,
        )
        run.stdout.write(text)
        return code

    def has_gpus(self, view: kubesim.ContainerView) -> bool:
        """Containers the runtime put GPUs into, on a node with mock GPUs."""
        machine = self.node(view.node_name).machine
        injection = self.injected(view)
        return machine is not None and injection is not None and bool(injection.uuids)

    async def proftester(self, run: kubesim.ProgramRun) -> int:
        """`dcgmproftester12 [-t FIELD] [-d SECONDS] [--no-dcgm-validation]`: load on the
        container's GPUs for the duration (default 30 s), as the real tool generates it."""
        machine = self.node(run.view.node_name).machine
        injection = self.injected(run.view)
        assert machine is not None  # present only where the container has mock GPUs
        uuids = list(injection.uuids) if injection is not None else []
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

    async def vector_add(self, run: kubesim.ProgramRun) -> int:
        """`vectorAdd` on the first GPU the runtime put into the container (demo.cuda_samples)."""
        machine = self.node(run.view.node_name).machine
        injection = self.injected(run.view)
        assert machine is not None  # present only where the container has mock GPUs
        visible = nvidia_smi.Visible()
        if injection is not None:
            visible = nvidia_smi.Visible(all=injection.all_gpus, ids=injection.gpu_ids)
        code, out, err = cuda_samples.run(machine.nvml(), visible, dt.datetime.now())
        run.stdout.write(out)
        run.stderr.write(err)
        return code

    def has_channels(self, view: kubesim.ContainerView) -> bool:
        return bool(compute_domains.channel_paths(view, self.sim.node_root(view.node_name)))

    async def ls_channels(self, run: kubesim.ProgramRun) -> int:
        paths = compute_domains.channel_paths(run.view, self.sim.node_root(run.view.node_name))
        code, text = compute_domains.ls_text(paths, run.argv[1:])
        (run.stdout if code == 0 else run.stderr).write(text)
        return code

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
        if ctx.container_name == driver_manager_demo.CONTAINER:  # driver, VFIO, vGPU managers
            return await driver_manager_demo.run(ctx, node.machine)
        if vm.handles(ctx):  # the VM-workload operands (demo.vm)
            return await vm.run(ctx)
        if driver_demo.handles(ctx):  # the driver container on the node's simulated host
            host = driver_demo.Host(
                node.machine, lambda base, what: self._sleep(base, node.name, f"driver/{what}")
            )
            return await driver_demo.run(ctx, host)
        if toolkit_demo.guard_handles(ctx):  # the runtime-config guard next to the toolkit
            return await toolkit_demo.guard(ctx, self.runtime(node.name))
        if self.nvidia_toolkit and nvidia_toolkit_demo.handles(ctx, self.runtime(node.name)):
            return await nvidia_toolkit_demo.run(ctx, node.machine, self.runtime(node.name))
        if toolkit_demo.handles(ctx):  # the container toolkit agent (demo.toolkit)
            return await self._toolkit(ctx, node)
        if validator_demo.handles(ctx):  # validations and the validator (demo.validator)
            return await validator_demo.run(ctx)
        if ctx.init:
            await self._sleep(
                INIT_DELAYS.get(ctx.container_name, DEFAULT_INIT_DELAY), node.name,
                ctx.container_name,
            )  # fmt: skip
            return 0
        app = app_of(ctx)
        if compute_domains.DAEMON_SELECTOR in ctx.labels:
            return await compute_domains.daemon(ctx, node.machine, self.imex_network)
        if app == compute_domains.CONTROLLER_APP:
            return await compute_domains.controller(ctx)
        if app == DRA_PLUGIN_APP and ctx.container_name == compute_domains.PLUGIN_CTR:
            return await compute_domains.kubelet_plugin(ctx, node.machine)
        if app == DRA_PLUGIN_APP and ctx.container_name == DRA_PLUGIN_CTR:
            return await agent_pods.dra_kubelet_plugin(ctx, node.machine)
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
        ctx.set_ready(True)
        await ctx.stopping.wait()
        return 0

    async def _toolkit(self, ctx: PodContext, node: SimNode) -> int:
        """The real toolkit agent (the validator's toolkit-validation checks its work)."""
        return await toolkit_demo.run(
            ctx, node.machine, self.runtime(node.name), on_ready=lambda: None
        )

    async def _device_plugin(self, ctx: PodContext, node: SimNode) -> int:
        """The real device plugin (the validator's plugin-validation checks its GPUs)."""
        return await agent_pods.device_plugin(
            ctx, node.machine, self.processes, on_serving=lambda: None
        )
