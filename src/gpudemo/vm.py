"""VM workloads in the demo: the real VFIO manager, vGPU device manager, sandbox validator and
sandbox device plugin in their operand pods, on each node's simulated PCI host.

The host is the node's root directory (`simhost.pci`): sysfs writes take
effect through a `SimulatedKernel` the agents are given instead of the real one, so the agents'
code is the same as on a host. The drivers act on the same host: the NVIDIA driver container
(`simhost.driver`) binds the GPUs to `nvidia` when it loads the driver and releases
them when it unloads it; the vGPU manager loads the vGPU host driver (and enables SR-IOV VFs,
as `sriov-manage -e ALL`); the `k8s-driver-manager` init containers unload the driver before the
VFIO or vGPU manager takes the GPUs, and release vfio devices and vGPUs (waiting for the pods
holding them) before the NVIDIA driver comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import kubeletapi
from gpu_operator.agents.pci import sysfs
from gpu_operator.agents.sandbox_device_plugin import manager as plugin_manager
from gpu_operator.agents.sandbox_validator import command as validator
from gpu_operator.agents.vfio_manager import command as vfio
from gpu_operator.agents.vfio_manager import holders as holders_mod
from gpu_operator.agents.vgpu_device_manager import runner as vgpu_runner
from gpu_operator.kube import mig_node
from gpu_operator.operands import common
from kubesim import PodContext
from kubesim.controllers.volumes import PathNotMounted
from simhost import pci as simulated

log = logging.getLogger("gpu_operator.agents.vm")

VFIO_APP = "nvidia-vfio-manager"
VGPU_MANAGER_APP = "nvidia-vgpu-manager-daemonset"
VGPU_DM_APP = "nvidia-vgpu-device-manager"
VALIDATOR_APP = "nvidia-sandbox-validator"
PLUGIN_APP = "nvidia-sandbox-device-plugin-daemonset"
DRIVER_MANAGER = "k8s-driver-manager"
# Operands whose real agent runs here (the vGPU manager is a driver: simulated, on the host).
REAL_AGENTS = frozenset({VFIO_APP, VGPU_DM_APP, VALIDATOR_APP, PLUGIN_APP})
APPS = REAL_AGENTS | {VGPU_MANAGER_APP}
POLL = 0.1


def _app(ctx: PodContext) -> str:
    return ctx.labels.get("app", "")


def handles(ctx: PodContext) -> bool:
    """Whether this module runs the container (the VM operands; their `k8s-driver-manager`
    init containers run the real driver manager, `gpudemo.driver_manager`)."""
    return _app(ctx) in APPS and ctx.container_name != DRIVER_MANAGER


def _kernel(ctx: PodContext) -> simulated.SimulatedKernel:
    # Privileged node agents see the host's /sys (and /host); the node root is that host.
    return simulated.SimulatedKernel(ctx.node_root)


def _holders(ctx: PodContext) -> holders_mod.Holders:
    return holders_mod.Holders(ctx.host_path(kubeletapi.POD_RESOURCES_SOCKET))


def _validations(ctx: PodContext) -> Path:
    return ctx.host_path(common.VALIDATIONS_DIR)


async def run(ctx: PodContext) -> int:
    """One container of a VM operand pod."""
    app = _app(ctx)
    if app == VFIO_APP:
        return await _vfio_manager(ctx)
    if app == VGPU_MANAGER_APP:
        return await _vgpu_manager(ctx)
    if app == VGPU_DM_APP:
        return await _vgpu_device_manager(ctx)
    if app == VALIDATOR_APP:
        return await _sandbox_validator(ctx)
    return await _sandbox_device_plugin(ctx)


# ----- drivers (simulated, on the simulated host) -------------------------------------------


async def _vgpu_manager(ctx: PodContext) -> int:
    """The vGPU manager (the vGPU host driver container), simulated on the host."""
    if ctx.init:
        return 0
    kernel = _kernel(ctx)
    if kernel.loaded(simulated.NVIDIA_MODULE) and not kernel.loaded(simulated.VGPU_MODULE):
        log.error("a non-vGPU NVIDIA driver is loaded; the vGPU host driver cannot load")
        return 1
    kernel.load_nvidia(vgpu=True, enable_vfs=True)
    marker = _validations(ctx) / validator.DRIVER_CTR_READY
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("")
    ctx.set_ready(True)
    try:
        await ctx.stopping.wait()
    finally:
        with contextlib.suppress(FileNotFoundError):
            marker.unlink()  # its preStop
    return 0


# ----- the real agents ------------------------------------------------------------------


async def _vfio_manager(ctx: PodContext) -> int:
    """`vfio-manage bind --all`, ready, and `vfio-manage unbind --all` when the pod stops."""
    options = vfio.Options(
        nvswitches=(ctx.env.get("BIND_NVSWITCHES") or "").lower() == "true",
        poll_interval=POLL,
        release_timeout=10.0,
    )
    holders = _holders(ctx)
    node = _node_api(ctx, VFIO_APP)

    async def notify(message: str) -> None:
        await node.event("Warning", "GPUsInUse", message)

    try:
        return await vfio.run(
            _kernel(ctx), options, holders, ctx.stopping, on_bound=lambda: ctx.set_ready(True),
            notify=notify,
        )  # fmt: skip
    finally:
        await holders.close()
        await node.close()


def _node_api(ctx: PodContext, component: str) -> mig_node.NodeApi:
    return mig_node.NodeApi(
        mig_node.connect(str(ctx.kubeconfig_path)), ctx.node_name, ctx.namespace, component
    )


async def _wait_for_files(ctx: PodContext, names: tuple[str, ...]) -> bool:
    base = _validations(ctx)
    while not any((base / n).exists() for n in names):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ctx.stopping.wait(), POLL)
        if ctx.stopping.is_set():
            return False
    return True


async def _vgpu_device_manager(ctx: PodContext) -> int:
    if ctx.init:  # waits for the vGPU manager's validation
        ok = await _wait_for_files(ctx, ("vgpu-manager-ready", "host-vgpu-manager-ready"))
        return 0 if ok else 1
    env = ctx.env
    try:
        config = ctx.path(env.get("CONFIG_FILE", "/vgpu-config/config.yaml"))
    except PathNotMounted as err:
        log.error("vgpu-device-manager: %s", err)
        return 2
    settings = vgpu_runner.Settings(
        config_file=config,
        default_config=env.get("DEFAULT_VGPU_CONFIG") or "default",
        shutdown_timeout=60.0,
        poll_interval=POLL,
    )
    node = _node_api(ctx, VGPU_DM_APP)
    try:
        manager = vgpu_runner.Manager(settings, node, _kernel(ctx))
        await manager.run(ctx.stopping, on_first=lambda: ctx.set_ready(True))
    finally:
        await node.close()
    return 0


async def _sandbox_validator(ctx: PodContext) -> int:
    validations = _validations(ctx)
    if not ctx.init:
        ctx.set_ready(True)
        try:
            await ctx.stopping.wait()
        finally:
            validator.remove_ready_markers(validations)  # its preStop
        return 0
    component = ctx.env.get("COMPONENT") or ctx.container_name.removesuffix("-validation")
    settings = validator.Settings(
        component=component,
        root=ctx.node_root,
        validations_dir=validations,
        default_workload=ctx.env.get("DEFAULT_GPU_WORKLOAD_CONFIG"),
        with_wait=(ctx.env.get("WITH_WAIT") or "true").lower() == "true",
        poll_interval=POLL,
        timeout=60.0 if component == "vgpu-manager" else None,
    )
    node = _node_api(ctx, VALIDATOR_APP)
    try:

        async def labels() -> dict[str, str]:
            return (await node.metadata())[0]

        return await validator.validate(settings, labels, ctx.stopping)
    finally:
        await node.close()


async def _sandbox_device_plugin(ctx: PodContext) -> int:
    validations = _validations(ctx)
    if ctx.init:
        ok = await validator.wait_for_plugin_prerequisites(
            validations, vgpu=True, poll_interval=POLL, stop=ctx.stopping
        )
        return 0 if ok else 1
    plugin_dir = ctx.path(kubeletapi.DEVICE_PLUGIN_PATH.rstrip("/"))
    settings = plugin_manager.Settings(
        root=ctx.node_root,
        plugin_dir=plugin_dir,
        kubelet_socket=plugin_dir / "kubelet.sock",
        pci_ids={},
        poll_interval=0.5,
        retry_interval=0.5,
    )
    await plugin_manager.Manager(settings).run(ctx.stopping, on_serving=lambda: ctx.set_ready(True))
    return 0


def vfio_groups(root: Path) -> dict[str, int | None]:
    """Each vfio-bound device's IOMMU group (for tests and the summary)."""
    return {
        f.address: f.iommu_group
        for f in sysfs.scan(root)
        if f.nvidia and sysfs.is_vfio_driver(f.driver)
    }
