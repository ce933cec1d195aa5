"""The real metrics exporter and node status exporter in the demo's operand pods, and a GPU job
runner that loads exactly the GPUs a pod was allocated.

Each agent gets its files through the pod's volume mounts (the counters ConfigMap, the kubelet's
pod-resources socket, the validation markers), its GPUs from the node's mock machine, and serves
its container port through the pod runner, so `kubectl port-forward <pod> 9400:9400` reaches it.
The demo collects every 5 s unless the pod's env says otherwise (upstream's default, 30 s, is long
for a demo).
"""

from __future__ import annotations

import asyncio
import logging

from gpu_operator import http_endpoint, nvml
from gpu_operator.agents.dcgm_exporter import command as exporter_command
from gpu_operator.agents.dcgm_exporter import counters as exporter_counters
from gpu_operator.agents.dcgm_exporter import server as exporter_server
from gpu_operator.agents.dcgm_exporter.attribution import gpu_resource
from gpu_operator.agents.node_status_exporter import runner as status_runner
from gpu_operator.kube import node_capacity, node_features
from gpu_operator.nvml import mock
from kubesim import PodContext
from kubesim.devicemanager import ContainerAllocation

log = logging.getLogger("gpu_operator.agents.demo")

DCGM_EXPORTER_APP = "nvidia-dcgm-exporter"
# A GPUCluster's exporter (operands/dra_driver.py): the same agent, its GPUs by an admin claim.
DCGM_EXPORTER_DRA_APP = "nvidia-dcgm-exporter-dra"
NODE_STATUS_EXPORTER_APP = "nvidia-node-status-exporter"
APPS = frozenset({DCGM_EXPORTER_APP, DCGM_EXPORTER_DRA_APP, NODE_STATUS_EXPORTER_APP})
DEMO_INTERVAL_MS = 5000
DEMO_STATUS_INTERVAL = 5.0
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
VALIDATIONS_DIR = "/run/nvidia/validations"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on", "t")


def _host_path(ctx: PodContext, container_path: str) -> str:
    """A container path as a file on this machine; unmounted paths stay as they are."""
    try:
        return str(ctx.path(container_path))
    except FileNotFoundError:
        return container_path


def exporter_options(ctx: PodContext) -> exporter_command.Options:
    """The exporter's options from the container's env, with paths through its mounts."""
    env = ctx.env
    interval = env.get("DCGM_EXPORTER_INTERVAL")
    collectors = env.get("DCGM_EXPORTER_COLLECTORS") or exporter_command.DEFAULT_COUNTERS_PATH
    socket = env.get("DCGM_POD_RESOURCES_KUBELET_SOCKET") or POD_RESOURCES_SOCKET
    return exporter_command.Options(
        collectors=_host_path(ctx, collectors),
        listen=env.get("DCGM_EXPORTER_LISTEN") or ":9400",
        interval_ms=int(interval) if interval and interval.isdigit() else DEMO_INTERVAL_MS,
        kubernetes=_truthy(env.get("DCGM_EXPORTER_KUBERNETES")),
        pod_resources_socket=_host_path(ctx, socket),
        remote_hostengine=env.get("DCGM_REMOTE_HOSTENGINE_INFO"),
        node_name=env.get("NODE_NAME") or ctx.node_name,
        virtual_gpus=_truthy(env.get("KUBERNETES_VIRTUAL_GPUS")),
        resource_names=tuple(
            n.strip() for n in (env.get("NVIDIA_RESOURCE_NAMES") or "").split(",") if n.strip()
        ),
        enable_pod_labels=_truthy(env.get(exporter_command.POD_LABELS_ENV)),
        enable_pod_uid=_truthy(env.get(exporter_command.POD_UID_ENV)),
    )


async def dcgm_exporter(ctx: PodContext, machine: mock.MockMachine | None) -> int:
    """`gpu-operator agent dcgm-exporter` on the node's mock GPUs, serving the pod's port 9400."""
    if machine is None:
        log.error("no GPUs on node %s: nothing to export", ctx.node_name)
        return 1
    options = exporter_options(ctx)
    try:
        collector = exporter_command.build_collector(options, machine.nvml)
    except (exporter_command.UsageError, exporter_counters.CsvError) as err:
        log.error("dcgm-exporter: %s", err)
        return 2
    exporter_command.log_ignored(options)
    try:
        collector.start()
    except nvml.NvmlError as err:
        log.error("dcgm-exporter: NVML: %s", err)
        return 1
    stop = asyncio.Event()
    task = asyncio.create_task(collector.run(stop))
    try:
        await collector.attempted.wait()
        _, port = exporter_server.parse_listen(options.listen)
        await ctx.serve_port(port, exporter_server.handler(collector))
        log.info("serving GPU metrics on :%d (/metrics, /health)", port)
        ctx.set_ready(True)
        await ctx.stopping.wait()
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        collector.stop()
    return 0


async def node_status_exporter(ctx: PodContext, machine: mock.MockMachine | None) -> int:
    """`gpu-operator agent node-status-exporter` with the node's markers and mock GPUs."""
    env = ctx.env
    api = node_features.client(ctx.kubeconfig_path)
    node = env.get("NODE_NAME") or ctx.node_name

    async def count_devices() -> int:
        return await node_capacity.gpu_device_count(api, node)

    def no_driver() -> nvml.Nvml:
        raise nvml.LibraryNotFound("no GPUs on this node")

    probes = status_runner.Probes(
        validations_dir=ctx.path(VALIDATIONS_DIR),
        open_nvml=machine.nvml if machine is not None else no_driver,
        count_devices=count_devices,
        count_pci=lambda: len(machine.gpus) if machine is not None else 0,
    )
    exporter = status_runner.Exporter(node, probes, interval=DEMO_STATUS_INTERVAL)
    stop = asyncio.Event()
    task = asyncio.create_task(exporter.run(stop))
    try:
        async with exporter.polled:
            await exporter.polled.wait_for(lambda: exporter.polls >= 1)
        port = env.get("METRICS_PORT") or "8000"
        await ctx.serve_port(
            int(port), http_endpoint.Handler(exporter.routes(), what="node status exporter")
        )
        ctx.set_ready(True)
        await ctx.stopping.wait()
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
    return 0


async def run(app: str, ctx: PodContext, machine: mock.MockMachine | None) -> int:
    """The main container of one of `APPS`."""
    if app in (DCGM_EXPORTER_APP, DCGM_EXPORTER_DRA_APP):
        return await dcgm_exporter(ctx, machine)
    return await node_status_exporter(ctx, machine)


def allocated_uuids(ctx: PodContext) -> list[str]:
    """The GPU and MIG device UUIDs the kubelet gave this container (replica suffixes dropped)."""
    return allocation_uuids(ctx.allocation)


def allocation_uuids(allocation: ContainerAllocation | None) -> list[str]:
    """The GPU and MIG device UUIDs of a container's allocation (replica suffixes dropped)."""
    if allocation is None:
        return []
    uuids: dict[str, None] = {}
    for resource, ids in allocation.device_ids.items():
        if gpu_resource(resource):
            for device_id in ids:
                uuids.setdefault(device_id.partition("::")[0], None)
    return list(uuids)
