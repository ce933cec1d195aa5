"""The MIG manager in the demo: the real agent runs in each `nvidia-mig-manager` pod, on that
node's mock GPUs, with the pod's kubeconfig, mounted config files and host root.

A MIG change really changes the mock GPUs. The node protocol pauses the device plugin and GFD
(their pods leave the node) and restores them afterwards; their new pods read the new GPU and
compute instances from NVML when they start, which is how allocatable resources and GFD labels
follow a change (the same hook upstream relies on: no NVML event announces a MIG change).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from gpu_operator.agents.mig_manager import command, planner
from gpu_operator.agents.mig_manager import config as cfg
from gpu_operator.agents.mig_manager import gpus as gpus_mod
from gpu_operator.agents.mig_manager import host as host_mod
from gpu_operator.kube import mig_node
from gpu_operator.nvml import mock
from gpu_operator.operands import mig_manager as mig_operand
from kubesim import PodContext
from kubesim.controllers.volumes import PathNotMounted

log = logging.getLogger("gpu_operator.agents.mig_manager")

APP = "nvidia-mig-manager"
POLL_INTERVAL = 0.2


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _container_path(ctx: PodContext, path: str) -> str:
    """A file of the container as a path on this machine ('' when unset or not mounted)."""
    if not path:
        return ""
    try:
        return str(ctx.path(path))
    except PathNotMounted:
        log.warning("%s is not mounted in %s/%s", path, ctx.namespace, ctx.name)
        return ""


def options_from(ctx: PodContext) -> command.Options:
    """The agent's options from the container env, with files resolved through its mounts."""
    env = ctx.env
    host_root = env.get("HOST_ROOT_MOUNT", "/host")
    return command.Options(
        node_name=env.get("NODE_NAME") or ctx.node_name,
        config_file=_container_path(ctx, env.get("CONFIG_FILE", "")),
        default_config_file=_container_path(ctx, env.get("DEFAULT_CONFIG_FILE", "")),
        generated_config_file="",  # not mounted: the container's own filesystem
        gpu_clients_file=_container_path(ctx, env.get("GPU_CLIENTS_FILE", "")),
        host_root_mount=_container_path(ctx, host_root),
        host_mig_manager_state_file=env.get(
            "HOST_MIG_MANAGER_STATE_FILE", command.Options.host_mig_manager_state_file
        ),
        with_reboot=_true(env.get("WITH_REBOOT")),
        with_shutdown_host_gpu_clients=_true(env.get("WITH_SHUTDOWN_HOST_GPU_CLIENTS")),
        default_gpu_clients_namespace=env.get("DEFAULT_GPU_CLIENTS_NAMESPACE") or ctx.namespace,
        cdi_enabled=_true(env.get("CDI_ENABLED")),
        validations_dir=_container_path(
            ctx, env.get("VALIDATIONS_DIR", command.Options.validations_dir)
        ),
        pod_name=env.get("POD_NAME") or ctx.name,
        pod_namespace=env.get("POD_NAMESPACE") or ctx.namespace,
        backend="mock",
    )


async def run(ctx: PodContext, machine: mock.MockMachine | None) -> int:
    """The `nvidia-mig-manager` container: the real agent on this node's mock GPUs."""
    if machine is None:
        log.warning("MIG manager pod on %s, which has no mock GPUs", ctx.node_name)
        ctx.set_ready(True)
        await ctx.stopping.wait()
        return 0
    options = options_from(ctx)
    root = Path(options.host_root_mount) if options.host_root_mount else None
    host = host_mod.MockHost(machine, root=root, state_file=options.host_mig_manager_state_file)
    api = mig_node.NodeApi(
        mig_node.connect(str(ctx.kubeconfig_path)), options.node_name, options.pod_namespace
    )
    try:
        await command.serve(
            options,
            open_nvml=machine.nvml,
            host=host,
            api=api,
            stop=ctx.stopping,
            on_idle=lambda: ctx.set_ready(True),
            poll_interval=POLL_INTERVAL,
        )
    except (command.UsageError, cfg.ConfigError) as err:
        log.error("mig-manager: %s", err)
        return 2
    finally:
        await api.close()
    return 0


@functools.cache
def preset_mig_config(preset: str) -> str | None:
    """The default config that describes a MIG-enabled preset's layout, e.g. `all-balanced`.

    A node whose GPUs were partitioned before the operator came carries the label naming its
    layout (otherwise the operator's `all-disabled` default would undo it).
    """
    machine = mock.MockMachine.from_preset(preset)
    states = gpus_mod.Gpus(machine.nvml, host_mod.MockHost(machine)).read()
    if not any(s.mig_enabled for s in states):
        return None
    configs = cfg.parse(
        {"version": "v1", "mig-configs": mig_operand.default_mig_configs()}, "default"
    )
    capable = sum(1 for s in states if s.mig_capable)
    for name in sorted(configs.configs):
        try:
            plan = planner.plan_node(name, configs.select(name), states)
        except planner.PlanError:
            continue
        if plan.applied and len(plan.gpus) == capable:  # covers every GPU, not vacuously
            return name
    return None
