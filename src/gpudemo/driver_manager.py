"""The `k8s-driver-manager` init container of the demo's driver, VFIO manager and vGPU manager
pods: the real driver manager (`gpu_operator.agents.driver_manager`) on the node's simulated host.

The host is the node's root directory (`NodeRootHost`: modules through `SimulatedKernel`, the
driver container's root at `/run/nvidia/driver`); the API is reached with the pod's kubeconfig.
Only our own knobs get demo defaults (polls every 0.1 s, a preinstalled driver reported without
the 60 s pause): upstream's variables come from the pod's env as rendered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpu_operator.agents.driver_manager import runner as runner_mod
from gpu_operator.agents.driver_manager import settings as settings_mod
from gpu_operator.kube import driver_node
from gpu_operator.nvml import mock
from kubesim import PodContext
from simhost import driver_host

log = logging.getLogger("gpu_operator.agents.driver_manager")

CONTAINER = "k8s-driver-manager"
DEMO_DEFAULTS = settings_mod.Settings(
    node_name="", poll_interval=0.1, preinstalled_exit_delay=5.0, operand_wait_timeout=60.0
)


def gpu_processes(machine: mock.MockMachine | None) -> Callable[[], list[str]] | None:
    """The processes on the node's mock GPUs (`pid N on GPU i`), which keep the driver in use."""
    if machine is None:
        return None

    def running() -> list[str]:
        return [
            f"pid {pid} on GPU {gpu.index}" for gpu in machine.gpus for pid in sorted(gpu.processes)
        ]

    return running


async def run(ctx: PodContext, machine: mock.MockMachine | None = None) -> int:
    """`driver-manager uninstall_driver` in this pod's init container."""
    try:
        settings = settings_mod.parse(ctx.env, DEMO_DEFAULTS)
    except settings_mod.SettingsError as err:
        log.error("%s", err)
        return runner_mod.EXIT_USAGE
    api = driver_node.DriverNodeApi(
        driver_node.connect(str(ctx.kubeconfig_path)),
        settings.node_name,
        settings.operator_namespace,
        CONTAINER,
    )
    try:
        runner = runner_mod.Runner(
            settings,
            driver_host.NodeRootHost(ctx.node_root, gpu_processes(machine)),
            api,
            ctx.stopping,
        )
        outcome = await runner.run()
    finally:
        await api.close()
    return outcome.code
