"""The reads behind `gpu-operator explain policy` for a GPUCluster: the GPUCluster, the
ClusterPolicies, the API server's version, the nodes' driver versions (GFD's labels, else the
driverVersion the DRA kubelet plugin publishes in its ResourceSlices) and CDI labels, the states'
workloads with their pods, ControllerRevisions, Events and the failing containers' log tails."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from lightkube import ApiError, AsyncClient

from gpu_operator.api import keys
from gpu_operator.kube import explain_read, resources, server_version
from gpu_operator.operands import dra_driver
from gpu_operator.status import explain as chain
from gpu_operator.status import gpucluster_explain

log = logging.getLogger(__name__)
Obj = dict[str, Any]
NOT_FOUND = 404
FORBIDDEN = 403
# GFD's labels telling a node's driver (major first), and the toolkit's CDI label.
DRIVER_LABELS = ("nvidia.com/cuda.driver-version.full", "nvidia.com/cuda.driver-version.major",
                 "nvidia.com/cuda.driver.major")  # fmt: skip
CDI_LABEL = "nvidia.com/cdi.enabled"
GPU_DRIVER = "gpu.nvidia.com"


async def _list(client: AsyncClient, resource: Any, **kwargs: Any) -> list[Obj]:
    """Every object, [] for a kind the server does not serve or we may not read."""
    try:
        return [dict(obj) async for obj in client.list(resource, **kwargs)]
    except ApiError as err:
        if err.status.code in (NOT_FOUND, FORBIDDEN):
            log.debug("listing %s: %s", resource, err)
            return []
        raise


def node_drivers(nodes: list[Obj], slices: list[Obj]) -> dict[str, str]:
    """Each node's driver version as far as the cluster says: GFD's labels, else the
    driverVersion attribute the DRA kubelet plugin publishes for the node's GPUs."""
    found: dict[str, str] = {}
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("driver") != GPU_DRIVER or not spec.get("nodeName"):
            continue
        for device in spec.get("devices") or []:
            version = ((device.get("attributes") or {}).get("driverVersion") or {}).get("version")
            if version:
                found[str(spec["nodeName"])] = str(version)
                break
    for node in nodes:
        meta = node.get("metadata") or {}
        labels: Mapping[str, str] = meta.get("labels") or {}
        for label in DRIVER_LABELS:
            if labels.get(label):
                found[str(meta.get("name"))] = str(labels[label])
                break
    return found


def selects(workload: Obj, pod: Obj) -> bool:
    """Whether the workload's selector (matchLabels) picks the pod."""
    wanted = ((workload.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return bool(wanted) and all(labels.get(k) == v for k, v in wanted.items())


async def snapshot(
    client: AsyncClient, cluster: Obj, policies: list[Obj], *, logs: bool = True
) -> gpucluster_explain.ClusterSnapshot:
    """Everything the GPUCluster's explanation reads, from the API."""
    status = cluster.get("status") or {}
    namespace = str(status.get("namespace") or explain_read.DEFAULT_NAMESPACE)
    try:
        version = await server_version.git_version(client)
    except Exception as err:  # an old or odd server: the link says it was not read
        log.debug("reading /version: %s", err)
        version = None
    nodes = await _list(client, resources.NODE)
    slices = await _list(client, resources.RESOURCE_SLICE)
    workloads = []
    for kind, resource in (("DaemonSet", resources.DAEMONSET),
                           ("Deployment", resources.DEPLOYMENT)):  # fmt: skip
        for obj in await _list(client, resource, namespace=namespace):
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if labels.get(keys.OPERATOR_STATE_LABEL) in dra_driver.STATES:
                workloads.append({**obj, "kind": kind})
    pods = await _list(client, resources.POD, namespace=namespace)
    pods = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    revisions = await _list(client, resources.CONTROLLER_REVISION, namespace=namespace)
    events = await _list(client, resources.EVENT, namespace=namespace)
    name = str((cluster.get("metadata") or {}).get("name"))
    events += await _list(
        client, resources.EVENT, namespace=resources.ALL_NAMESPACES,
        fields={"involvedObject.name": name},
    )  # fmt: skip
    tails: dict[tuple[str, str], str] | None = None
    if logs:
        tails = {}
        for pod in pods:
            meta = pod.get("metadata") or {}
            if not any(selects(w, pod) for w in workloads):
                continue
            for view in chain.container_views(pod):
                if view.ready or view.succeeded:
                    continue
                text = ""
                if view.restarts:
                    text = await explain_read.pod_log(
                        client, namespace, str(meta["name"]), view.name, previous=True
                    )
                text += await explain_read.pod_log(client, namespace, str(meta["name"]), view.name)
                if text:
                    tails[(str(meta["name"]), view.name)] = text
    return gpucluster_explain.ClusterSnapshot(
        cluster=cluster,
        policies=policies,
        server_version=version,
        node_drivers=node_drivers(nodes, slices),
        cdi_disabled=sorted(
            str(n["metadata"]["name"])
            for n in nodes
            if ((n.get("metadata") or {}).get("labels") or {}).get(CDI_LABEL) == "false"
        ),
        workloads=workloads,
        pods=pods,
        revisions=revisions,
        events=events,
        logs=tails,
    )


__all__ = ["node_drivers", "snapshot"]
