"""Compute domains in the demo: the GPUCluster's compute-domain controller Deployment and the
`compute-domains` container of its kubelet-plugin DaemonSet run our agents; the IMEX daemon
pods of each ComputeDomain's DaemonSet run the simulated IMEX daemon (simhost.imex) on their
node's mock GPUs, write the nodes config from the domain's daemon pods in their clique, answer
the `compute-domain-daemon check` probe (readiness), and report what keeps the domain from
being whole on their pod (the controller turns it into status and Events). `ls` in a container
lists the IMEX channel devices its CDI devices inject.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import posixpath
from typing import Any

import kubesim
from gpu_operator.agents.compute_domain_plugin import devices as cd_devices
from gpu_operator.agents.compute_domain_plugin import plugin as cd_plugin
from gpu_operator.api import computedomain as cdapi
from gpu_operator.controller import computedomain as cd_controller
from gpu_operator.kube import node_features
from gpu_operator.kube.computedomains import ComputeDomainApi
from gpu_operator.kube.resource_slices import SliceApi
from gpu_operator.nvml import mock
from gpu_operator.status import computedomain as cd_planner
from kubesim import PodContext
from simhost import imex
from simhost.cdi_registry import Registry as CdiRegistry

log = logging.getLogger("gpu_operator.demo.compute_domains")

CONTROLLER_APP = "nvidia-dra-driver-controller"
PLUGIN_CTR = "compute-domains"
DAEMON_SELECTOR = cdapi.DOMAIN_LABEL
# What the loaded driver registers in /proc/devices on a node with an NVLink fabric.
PROC_DEVICES = "Character devices:\n195 nvidia\n234 nvidia-caps-imex-channels\n"
CHECK_INTERVAL = 0.5


async def controller(ctx: PodContext) -> int:
    """Our compute-domain controller in the Deployment's pod."""
    api = node_features.client(ctx.kubeconfig_path)
    image = ctx.env.get("IMAGE_NAME") or ctx.image
    ready = asyncio.Event()

    async def report_ready() -> None:
        await ready.wait()
        ctx.set_ready(True)

    helper = asyncio.ensure_future(report_ready())
    try:
        await cd_controller.serve(api, ctx.namespace, image, ctx.stopping, ready=ready)
    finally:
        helper.cancel()
        await api.close()
    return 0


async def kubelet_plugin(ctx: PodContext, machine: mock.MockMachine | None) -> int:
    """Our compute-domain kubelet plugin in the `compute-domains` container."""
    env = ctx.env
    node_root = ctx.node_root
    if machine is not None and machine.gpus:
        proc = node_root / "proc"
        proc.mkdir(parents=True, exist_ok=True)
        if not (proc / "devices").exists():
            (proc / "devices").write_text(PROC_DEVICES)
    plugins = env.get("KUBELET_PLUGINS_DIRECTORY_PATH") or "/var/lib/kubelet/plugins"
    settings = cd_plugin.Settings(
        node_name=ctx.node_name,
        kubelet_root_view=ctx.path(plugins).parent,
        kubelet_root=posixpath.dirname(plugins.rstrip("/")),
        cdi_root=ctx.path(env.get("CDI_ROOT") or "/var/run/cdi"),
        dev_root="/",
        proc_root=node_root,
    )
    api = node_features.client(ctx.kubeconfig_path)
    if machine is None:
        ctx.write_termination_message("compute-domain-kubelet-plugin: no NVIDIA GPUs here\n")
        return 1
    open_nvml = machine.nvml
    plugin = cd_plugin.Plugin(
        settings,
        open_nvml,
        SliceApi(api, ctx.node_name, cd_devices.DRIVER),
        ComputeDomainApi(api, ctx.namespace, "compute-domain-kubelet-plugin"),
    )

    async def report_registered() -> None:
        await plugin.registered.wait()
        ctx.set_ready(True)

    helper = asyncio.ensure_future(report_registered())
    try:
        await plugin.run(ctx.stopping)
    except cd_plugin.StartError as err:
        ctx.write_termination_message(f"compute-domain-kubelet-plugin: {err}\n")
        return 1
    finally:
        helper.cancel()
        await api.close()
    return 0


def daemon_dir(ctx: PodContext, uid: str) -> Any:
    return (
        ctx.node_root / "var/lib/kubelet/plugins" / cd_devices.DRIVER / cd_plugin.DOMAINS_DIR / uid
    )


async def daemon(ctx: PodContext, machine: mock.MockMachine | None, network: imex.Registry) -> int:
    """`compute-domain-daemon run`: the simulated IMEX daemon of one domain on this node."""
    uid = ctx.labels.get(cdapi.DOMAIN_LABEL, "")
    api = node_features.client(ctx.kubeconfig_path)
    cds = ComputeDomainApi(api, ctx.namespace, "compute-domain-daemon")
    root = daemon_dir(ctx, uid)
    pod_ip = ""
    reported: str | None = None
    registered = False
    try:
        while not ctx.stopping.is_set():
            pods = await cds.daemon_pods(uid)
            me = next((p for p in pods if p["metadata"]["name"] == ctx.name), None)
            pod_ip = str(((me or {}).get("status") or {}).get("podIP") or "")
            if pod_ip and not registered:
                network.add(pod_ip, ctx.node_name, machine)
                network.set_daemon(ctx.node_name, True)
                registered = True
            clique = ""
            if me is not None:
                slices = await cds.channel_nodes()
                clique = slices.get(ctx.node_name, "")
                peers = sorted(
                    (p for p in pods if not p["metadata"].get("deletionTimestamp")),
                    key=lambda p: str((p.get("spec") or {}).get("nodeName")),
                )
                addresses = [
                    str((p.get("status") or {}).get("podIP") or "")
                    for p in peers
                    if slices.get(str((p.get("spec") or {}).get("nodeName")), "") == clique
                ]
                root.mkdir(parents=True, exist_ok=True)
                (root / "imexd.cfg").write_text(
                    f"SERVER_PORT={imex.SERVER_PORT}\nIMEX_CMD_PORT={imex.CMD_PORT}\n"
                    f"IMEX_CMD_ENABLED=1\nIMEX_NODE_CONFIG_FILE={imex.DAEMON_NODES_CONFIG}\n"
                )
                (root / "nodes.cfg").write_text("".join(f"{a}\n" for a in addresses if a))
            if pod_ip:
                # The pod's view: its /imexd is the domain's config directory (a CDI mount).
                pod_root = ctx.node_root / "run/imex-pods" / ctx.name
                pod_root.mkdir(parents=True, exist_ok=True)
                link = pod_root / "imexd"
                if not link.is_symlink():
                    link.symlink_to(root, target_is_directory=True)
                runner = imex.ImexDaemon(ctx.node_name, pod_ip, pod_root, network)
                code, _ = imex.check(runner, clique)
                domain = runner.status()
                ctx.set_ready(code == imex.EXIT_OK)
                problems = "\n".join(domain.problems)
                if problems != reported:
                    with contextlib.suppress(Exception):
                        await cds.annotate_pod(
                            ctx.name, {cd_planner.PROBLEMS_ANNOTATION: problems or None}
                        )
                    reported = problems
            await _wait(ctx.stopping, CHECK_INTERVAL)
    finally:
        if registered:
            with contextlib.suppress(KeyError):
                network.set_daemon(ctx.node_name, False)
        await api.close()
    return 0


async def _wait(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)


def channel_paths(view: kubesim.ContainerView, node_root: Any) -> list[str]:
    """The IMEX channel device nodes the container's CDI devices inject."""
    resolved = CdiRegistry.load(node_root).resolve(view.cdi_devices)
    return sorted(p for p in resolved.device_nodes if p.startswith(cd_devices.CHANNEL_DIR + "/"))


def ls_text(paths: list[str], args: list[str]) -> tuple[int, str]:
    """`ls [DIR]` for the channel directory."""
    target = next((a for a in args if not a.startswith("-")), cd_devices.CHANNEL_DIR).rstrip("/")
    if target != cd_devices.CHANNEL_DIR:
        return 2, f"ls: cannot access '{target}': No such file or directory\n"
    return 0, "".join(posixpath.basename(p) + "\n" for p in paths)


__all__ = ["channel_paths", "controller", "daemon", "json", "kubelet_plugin", "ls_text"]
