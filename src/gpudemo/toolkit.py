"""The container toolkit in the demo: the real agent (`gpu_operator.agents.container_toolkit`)
runs in each toolkit pod's main container, on the node's root directory through the pod's mounts.

What upstream's entrypoint does before starting the installer is done here too: the validator's
`driver-ready` file fills NVIDIA_DRIVER_ROOT and DRIVER_ROOT_CTR_PATH (without the file the driver
is looked for where the operator's driver container or a preinstalled driver puts it). The
restart modes act on the node's simulated runtime (contract C3): `signal` is SIGHUP to it,
`systemd` its `restart()`. The NVIDIA runtime's binaries are written as stand-ins (a simulated
node has no NVIDIA image to take them from).
"""

from __future__ import annotations

import logging
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path

from gpu_operator import nvml
from gpu_operator.agents.container_toolkit import restart, runner, settings
from gpu_operator.kube import node_features, node_watch
from gpu_operator.nvml import mock
from kubesim import PodContext
from kubesim.controllers.volumes import PathNotMounted
from simhost import containerd

log = logging.getLogger("gpu_operator.agents.container_toolkit")

APP = "nvidia-container-toolkit-daemonset"
CONTAINER = "nvidia-container-toolkit-ctr"
DRIVER_READY = "/run/nvidia/validations/driver-ready"
OPERATOR_DRIVER_ROOT = "/run/nvidia/driver"
# Drift checks in the demo: often enough that an edit behind the toolkit's back shows quickly.
DRIFT_INTERVAL = "1"


def handles(ctx: PodContext) -> bool:
    """The toolkit DaemonSet's main container."""
    return ctx.labels.get("app") == APP and ctx.container_name == CONTAINER and not ctx.init


class RuntimeRestarter:
    """The restart modes on the node's simulated runtime."""

    def __init__(self, runtime: containerd.SimulatedRuntime | None, mode: str, service: str):
        self.runtime = runtime
        self.mode = mode
        self.service = service

    @property
    def description(self) -> str:
        if self.mode == "none":
            return restart.NoRestart(self.service).description
        if self.mode == "systemd":
            return f"chroot /host systemctl restart {self.service}"
        return f"SIGHUP to {self.service} (its pid from the peer of its socket)"

    async def restart(self) -> None:
        if self.mode == "none":
            await restart.NoRestart(self.service).restart()
            return
        if self.runtime is None:
            log.warning("this node's %s is not simulated: nothing to restart", self.service)
            return
        if self.mode == "systemd":
            self.runtime.restart()
        else:
            if not self.runtime.up:
                raise restart.RestartError(
                    f"could not signal {self.service}: dial unix "
                    f"{self.runtime.socket_node_path}: connect: connection refused"
                )
            self.runtime.signal(signal.SIGHUP)
        if not self.runtime.up:
            raise restart.RestartError(
                f"{self.service} did not come back after the restart: {self.runtime.error}"
            )
        log.info(
            "%s restarted: serving handlers %s",
            self.service,
            ", ".join(sorted(self.runtime.handlers())),
        )


def environment(ctx: PodContext) -> dict[str, str]:
    """The container env as upstream's entrypoint leaves it (driver-ready sourced)."""
    env = dict(ctx.env)
    ready = ctx.host_path(DRIVER_READY)
    if ready.is_file():
        values = settings.read_driver_ready(ready.read_text())
        log.info("driver-ready: %s", " ".join(f"{k}={v}" for k, v in values.items()))
        for key, value in values.items():
            env.setdefault(key, value)
    elif "NVIDIA_DRIVER_ROOT" not in env:
        if (ctx.host_path(OPERATOR_DRIVER_ROOT) / "usr/bin/nvidia-smi").exists():
            env.update(NVIDIA_DRIVER_ROOT=OPERATOR_DRIVER_ROOT, DRIVER_ROOT_CTR_PATH="/driver-root")
        elif (ctx.node_root / "usr/bin/nvidia-smi").exists():
            env.update(NVIDIA_DRIVER_ROOT="/", DRIVER_ROOT_CTR_PATH="/host")
        log.info(
            "no %s yet: driver root %s",
            DRIVER_READY,
            env.get("NVIDIA_DRIVER_ROOT", settings.DEFAULT_DRIVER_ROOT),
        )
    env.setdefault("NODE_NAME", ctx.node_name)
    env.setdefault("RUNTIME_CONFIG_DRIFT_INTERVAL", DRIFT_INTERVAL)
    return env


def _view(ctx: PodContext) -> Callable[[str], Path]:
    """Container paths through the pod's mounts; unmounted ones in a scratch directory that
    stands for the container's own filesystem."""
    scratch: list[Path] = []

    def view(path: str) -> Path:
        try:
            return ctx.path(path)
        except PathNotMounted:
            if not scratch:
                scratch.append(Path(tempfile.mkdtemp(prefix="toolkit-ctr-")))
            return scratch[0] / path.lstrip("/")

    return view


def _no_gpus() -> nvml.Nvml:
    raise nvml.LibraryNotFound("no NVIDIA GPUs on this simulated node")


async def run(
    ctx: PodContext,
    machine: mock.MockMachine | None,
    runtime: containerd.SimulatedRuntime | None,
    on_ready: Callable[[], None],
) -> int:
    """The toolkit agent in this container until the pod stops (then it restores the node)."""
    try:
        s = settings.from_env(environment(ctx))
    except settings.SettingsError as err:
        log.error("container-toolkit: %s", err)
        return 2
    service = runner.SERVICES[s.runtime]
    api = node_features.client(ctx.kubeconfig_path)
    events = node_watch.NodeEvents(api, ctx.node_name, ctx.namespace, runner.COMPONENT)

    def ready() -> None:
        ctx.set_ready(True)
        on_ready()

    agent = runner.Agent(
        s,
        restarter=RuntimeRestarter(runtime, s.restart_mode, service),
        view=_view(ctx),
        open_nvml=machine.nvml if machine is not None else _no_gpus,
        events=events,
        stand_ins=True,
        sys_root=ctx.node_root,
    )
    try:
        code = await agent.run(ctx.stopping, on_ready=ready)
        if agent.failure is not None:
            ctx.write_termination_message(agent.failure + "\n")
        return code
    finally:
        await api.close()


GUARD_CONTAINERS = ("runtime-config-save", "runtime-config-guard")


def guard_handles(ctx: PodContext) -> bool:
    """The runtime-config guard's containers in a toolkit pod (init `save`, sidecar `watch`)."""
    return ctx.labels.get("app") == APP and ctx.container_name in GUARD_CONTAINERS


async def guard(ctx: PodContext, runtime: containerd.SimulatedRuntime | None) -> int:
    """The real guard (`agents/container_toolkit/guard.py`) on the node's files: save in the
    init container; in the sidecar, restore once the pod stops (after the toolkit container,
    as Kubernetes stops a native sidecar) and restart the node's runtime."""
    from gpu_operator.agents.container_toolkit import guard as guard_mod

    glog = guard_mod.log
    try:
        s = settings.from_env(environment(ctx))
    except settings.SettingsError as err:
        glog.error("runtime-config-guard: %s", err)
        return 2
    view = _view(ctx)
    if ctx.container_name == GUARD_CONTAINERS[0]:
        for line in guard_mod.save(s, view):
            glog.info("%s", line)
        return 0
    ctx.set_ready(True)
    glog.info("guarding the %s config until this pod stops", s.runtime)
    await ctx.stopping.wait()
    glog.info("the pod stops: restoring the node's runtime config")
    restored = guard_mod.restore(s, view)
    for line in restored.exact:
        glog.info("%s", line)
    for line in restored.kept:
        glog.warning("%s", line)
    if restored.changed:
        restarter = RuntimeRestarter(runtime, s.restart_mode, runner.SERVICES[s.runtime])
        try:
            await restarter.restart()
        except restart.RestartError as err:
            glog.error("%s", err)
    return 0
