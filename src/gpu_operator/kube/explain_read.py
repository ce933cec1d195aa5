"""The reads behind `gpu-operator explain` and `must-gather`: one node's chain snapshot, the
active ClusterPolicy, and pod logs bounded in lines and bytes (current or previous run)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from lightkube import ApiError, AsyncClient
from lightkube.resources import core_v1

from gpu_operator.api import keys
from gpu_operator.kube import resources
from gpu_operator.nodes import gate, labelling
from gpu_operator.operands import readiness
from gpu_operator.status import explain

log = logging.getLogger(__name__)
Obj = dict[str, Any]
NOT_FOUND = 404
FORBIDDEN = 403
DEFAULT_NAMESPACE = "gpu-operator"
# Per container: enough lines to hold a failure and what led to it.
EXPLAIN_TAIL_LINES = 50
EXPLAIN_LIMIT_BYTES = 64 * 1024


class NodeNotFound(Exception):
    """The node named on the command line does not exist."""


async def _list(client: AsyncClient, resource: Any, **kwargs: Any) -> list[Obj]:
    try:
        return [dict(obj) async for obj in client.list(resource, **kwargs)]
    except ApiError as err:
        if err.status.code == NOT_FOUND:  # a kind whose CRD is not installed
            return []
        raise


async def policies(client: AsyncClient) -> list[Obj]:
    return await _list(client, resources.CLUSTER_POLICY)


def active_policy(found: list[Obj]) -> Obj | None:
    """The ClusterPolicy in charge: the oldest one not being deleted (as the controller)."""
    live = [p for p in found if not (p.get("metadata") or {}).get("deletionTimestamp")]
    if not live:
        return None
    return min(live, key=lambda p: (str(p["metadata"].get("creationTimestamp") or ""),
                                    str(p["metadata"].get("name"))))  # fmt: skip


def operator_namespace(policy: Obj | None, given: str | None) -> str:
    """The operands' namespace: as given, else as the ClusterPolicy status reports it."""
    if given:
        return given
    return str(((policy or {}).get("status") or {}).get("namespace") or DEFAULT_NAMESPACE)


async def startup_taint(client: AsyncClient, namespace: str) -> gate.StartupTaint | None:
    """The readiness gate's startup taint, as the operator Deployment in the namespace sets it
    (env STARTUP_TAINT from the chart's operator.startupTaint); None when off or not readable."""
    try:
        deployments = await _list(client, resources.resource("apps/v1", "Deployment"),
                                  namespace=namespace)  # fmt: skip
    except ApiError as err:
        log.debug("listing Deployments in %s: %s", namespace, err)  # e.g. forbidden: no gate
        return None
    return startup_taint_of(deployments)


def startup_taint_of(deployments: Iterable[Obj]) -> gate.StartupTaint | None:
    """The startup taint a Deployment's container sets in STARTUP_TAINT (the operator's)."""
    for deployment in deployments:
        template = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
        for container in template.get("containers") or []:
            for env in container.get("env") or []:
                if env.get("name") == gate.ENV and str(env.get("value") or "").strip():
                    try:
                        return gate.StartupTaint.parse(str(env["value"]))
                    except ValueError:
                        return None  # the operator refuses to start with it: no gate runs
    return None


async def clusters(client: AsyncClient) -> list[Obj]:
    try:
        return await _list(client, resources.GPU_CLUSTER)
    except ApiError as err:
        if err.status.code == FORBIDDEN:  # an explain user who may not read GPUClusters
            return []
        raise


def active_cluster(found: list[Obj]) -> Obj | None:
    """The GPUCluster in charge: the oldest one not being deleted (as the controller)."""
    live = [c for c in found if not (c.get("metadata") or {}).get("deletionTimestamp")]
    if not live:
        return None
    return min(live, key=lambda c: (str(c["metadata"].get("creationTimestamp") or ""),
                                    str(c["metadata"].get("name"))))  # fmt: skip


async def pod_log(
    client: AsyncClient,
    namespace: str,
    name: str,
    container: str,
    *,
    previous: bool = False,
    tail_lines: int | None = EXPLAIN_TAIL_LINES,
    limit_bytes: int | None = EXPLAIN_LIMIT_BYTES,
) -> str:
    """A container's log, bounded ("" when there is none, e.g. no previous run).

    lightkube's `log()` has no `previous` or `limitBytes`, so the request is built the way it
    builds its own, with those parameters added.
    """
    inner = client._client
    request = inner.prepare_request(
        "get", core_v1.PodLog, name=name, namespace=namespace,
        params={"container": container, "previous": previous or None,
                "tailLines": tail_lines, "limitBytes": limit_bytes},
    )  # fmt: skip
    try:
        response = await inner.send(inner.build_adapter_request(request))  # type: ignore[no-untyped-call]
        inner.raise_for_status(response)  # type: ignore[no-untyped-call]
    except ApiError as err:
        log.debug("log of %s/%s %s: %s", namespace, name, container, err)
        return ""
    return str(response.text)


async def _logs_for(
    client: AsyncClient, namespace: str, pods: list[Obj]
) -> dict[tuple[str, str], str]:
    """Log tails of the containers that are failing or restarted (current and previous run),
    and of the device plugin (it names the devices it marked unhealthy)."""
    out: dict[tuple[str, str], str] = {}
    for pod in pods:
        name = str(pod["metadata"]["name"])
        app = str((pod["metadata"].get("labels") or {}).get("app") or "")
        for view in explain.container_views(pod):
            failing = not view.ready and not view.succeeded
            if not (failing or view.restarts or app == explain.PLUGIN_APP):
                continue
            text = ""
            if view.restarts:
                text = await pod_log(client, namespace, name, view.name, previous=True)
            text += await pod_log(client, namespace, name, view.name)
            if text:
                out[(name, view.name)] = text
    return out


async def gpu_pods(client: AsyncClient, node_name: str, namespace: str) -> dict[str, int] | None:
    """The pods outside the operator's namespace that hold GPUs on the node ("namespace/name" ->
    GPU resources requested); None when pods cannot be listed in every namespace (RBAC)."""
    try:
        pods = await _list(client, resources.POD, namespace=resources.ALL_NAMESPACES,
                           fields={"spec.nodeName": node_name})  # fmt: skip
    except ApiError as err:
        log.debug("listing the pods on %s: %s", node_name, err)
        return None
    found: dict[str, int] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase")
        if meta.get("namespace") == namespace or phase in ("Succeeded", "Failed"):
            continue
        count = explain.gpu_requests(pod)
        if count:
            found[f"{meta.get('namespace')}/{meta.get('name')}"] = count
    return found


async def _served(client: AsyncClient, resource: Any, **kwargs: Any) -> list[Obj] | None:
    """The objects, or None when the API does not serve the kind (or we may not read it)."""
    try:
        return [dict(obj) async for obj in client.list(resource, **kwargs)]
    except ApiError as err:
        if err.status.code in (NOT_FOUND, FORBIDDEN):
            log.debug("listing %s: %s", resource, err)
            return None
        raise


def _on_node(claim: Obj, node_name: str) -> tuple[str, ...] | None:
    """The devices of the node's pool a claim is allocated (None: not allocated on the node)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    devices = tuple(
        str(r.get("device")) for r in results
        if r.get("pool") == node_name and r.get("driver") == explain.DRA_DRIVER
    )  # fmt: skip
    if devices:
        return devices
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    for term in terms:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and node_name in (field.get("values") or []):
                return ()
    return None


async def _claim_pod(client: AsyncClient, namespace: str, name: str) -> explain.ClaimPod:
    ref = f"{namespace}/{name}"
    try:
        pod = dict(await client.get(resources.POD, name, namespace=namespace))
    except ApiError as err:
        if err.status.code == NOT_FOUND:
            return explain.ClaimPod(ref, "Gone", "the pod no longer exists")
        raise
    events = await _list(client, resources.EVENT, namespace=namespace,
                         fields={"involvedObject.name": name})  # fmt: skip
    said = tuple(
        f"{e.get('reason', '')}: {e.get('message', '')}" for e in events
        if e.get("type") == "Warning"
    )  # fmt: skip
    problem = readiness.pod_problem(pod)
    phase = str((pod.get("status") or {}).get("phase") or "Pending")
    if phase == "Succeeded":
        problem = None
    return explain.ClaimPod(ref, phase, problem[1] if problem else None, said)


async def dra_snapshot(
    client: AsyncClient, node_name: str, mode: Literal["label", "gpucluster"], *, logs: bool
) -> tuple[explain.DraFacts, dict[tuple[str, str], str]]:
    """The DRA chain's facts of a DRA node: the kubelet plugin's pods (any namespace), the
    node's ResourceSlices and the claims allocated on it (only when resource.k8s.io/v1 is
    served), and the plugin's log tails."""
    pods = await _list(client, resources.POD, namespace=resources.ALL_NAMESPACES,
                       labels={"app": explain.DRA_PLUGIN_APP},
                       fields={"spec.nodeName": node_name})  # fmt: skip
    pods = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    views = []
    tails: dict[tuple[str, str], str] = {}
    for pod in pods:
        problem = readiness.pod_problem(pod)
        views.append(explain.pod_view(pod, problem[1] if problem else None))
        meta = pod["metadata"]
        for view in explain.container_views(pod) if logs else ():
            text = await pod_log(client, str(meta.get("namespace")), str(meta["name"]), view.name)
            if text:
                tails[(str(meta["name"]), view.name)] = text
    slices = await _served(client, resources.RESOURCE_SLICE,
                           fields={"spec.nodeName": node_name})  # fmt: skip
    claims: list[explain.ClaimView] | None = None
    if slices is not None:
        found = await _served(client, resources.RESOURCE_CLAIM,
                              namespace=resources.ALL_NAMESPACES)  # fmt: skip
        if found is not None:
            claims = []
            for claim in found:
                devices = _on_node(claim, node_name)
                if devices is None:
                    continue
                meta = claim.get("metadata") or {}
                ns = str(meta.get("namespace"))
                reserved = (claim.get("status") or {}).get("reservedFor") or []
                claim_pods = [
                    await _claim_pod(client, ns, str(r.get("name")))
                    for r in reserved if r.get("resource") == "pods"
                ]  # fmt: skip
                claims.append(explain.ClaimView(f"{ns}/{meta.get('name')}", devices,
                                                tuple(claim_pods)))  # fmt: skip
    facts = explain.DraFacts(
        mode=mode,
        plugin_pods=tuple(views),
        slices=tuple(slices) if slices is not None else None,
        claims=tuple(claims) if claims is not None else None,
    )
    return facts, tails


async def node_snapshot(
    client: AsyncClient, node_name: str, namespace: str | None = None, *, logs: bool = True
) -> explain.NodeFacts:
    """Everything the chain reads about one node, from the API."""
    try:
        node = dict(await client.get(resources.NODE, node_name))
    except ApiError as err:
        if err.status.code == NOT_FOUND:
            raise NodeNotFound(f"node {node_name!r} not found") from None
        raise
    policy = active_policy(await policies(client))
    ns = operator_namespace(policy, namespace)
    pods = await _list(client, resources.POD, namespace=ns, fields={"spec.nodeName": node_name})
    pods = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    events = await _list(client, resources.EVENT, namespace=ns)
    events += await _list(
        client, resources.EVENT, namespace=resources.ALL_NAMESPACES,
        fields={"involvedObject.name": node_name},
    )  # fmt: skip
    names = {node_name, *(str(p["metadata"]["name"]) for p in pods)}
    events = [e for e in events if (e.get("involvedObject") or {}).get("name") in names]
    daemonsets: dict[str, Obj] = {}
    for ds in await _list(client, resources.DAEMONSET, namespace=ns):
        meta = ds.get("metadata") or {}
        daemonsets[str((meta.get("labels") or {}).get("app") or meta.get("name"))] = ds
    views = []
    for pod in pods:
        problem = readiness.pod_problem(pod)
        views.append(explain.pod_view(pod, problem[1] if problem else None))
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    labels = dict(meta.get("labels") or {})
    node_logs = await _logs_for(client, ns, pods) if logs else None
    dra = None
    mode: Literal["label", "gpucluster"] | None = None
    if labels.get(keys.DRA_NODE) == "true":
        mode = "label"
    elif policy is None and active_cluster(await clusters(client)):
        mode = "gpucluster"  # every GPU node of a GPUCluster gets its GPUs through DRA
    if mode is not None:
        dra, tails = await dra_snapshot(client, node_name, mode, logs=logs)
        if node_logs is not None:
            node_logs.update(tails)
    return explain.NodeFacts(
        name=node_name,
        labels=labels,
        annotations=dict(meta.get("annotations") or {}),
        capacity=dict(status.get("capacity") or {}),
        allocatable=dict(status.get("allocatable") or {}),
        conditions=list(status.get("conditions") or []),
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        pods=tuple(views),
        events=events,
        logs=node_logs,
        policy=explain.policy_view((policy or {}).get("spec")) if policy else None,
        daemonsets=daemonsets,
        taints=list((node.get("spec") or {}).get("taints") or []),
        startup_taint=await startup_taint(client, ns),
        gpu_pods=await gpu_pods(client, node_name, ns),
        dra=dra,
    )


async def gpu_nodes(client: AsyncClient) -> list[Obj]:
    """Nodes NFD or the operator say have an NVIDIA GPU."""
    found = []
    async for node in client.list(resources.NODE):
        labels: Mapping[str, str] = (node.metadata.labels if node.metadata else None) or {}
        if labelling.has_gpu(labels) or labels.get("nvidia.com/gpu.present") == "true":
            found.append(dict(node))
    return found
