"""The kubelet's pod-resources API (v1) on `/var/lib/kubelet/pod-resources/kubelet.sock`.

Served from the device manager's accounting: which devices each container of the node's active
pods holds (`List`, `Get`) and which healthy devices the node has (`GetAllocatableResources`).
Each container also lists its prepared DRA claims in `dynamic_resources` (kubelet 1.35 has
KubeletPodResourcesDynamicResources on by default, beta since 1.34): per claim the container
lists in `resources.claims`, its name and namespace and, per device the driver prepared for it
(only the named request's when the entry names one), the driver, pool, device and CDI device
ids. CPU ids and memory are left empty: kubesim manages neither CPUs nor memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import grpc
from grpc import aio

from kubeletapi.deviceplugin.v1beta1 import api_pb2 as plugin_pb2
from kubeletapi.podresources.v1 import api_pb2, api_pb2_grpc


# What the server reads of the device manager (the kubelet's devices and pods providers); the
# manager (devicemanager/manager.py) starts the server with itself as the provider.
class AssignedDevices(Protocol):
    """One container's devices of one resource, by NUMA node."""

    @property
    def by_numa(self) -> Mapping[int, list[str]]: ...


class ResourceDevices(Protocol):
    """The devices a plugin listed for one resource name, and which of them are healthy."""

    @property
    def devices(self) -> Mapping[str, plugin_pb2.Device]: ...

    @property
    def healthy(self) -> set[str]: ...


class DevicesProvider(Protocol):
    @property
    def pod_devices(self) -> Mapping[str, Mapping[str, Mapping[str, AssignedDevices]]]:
        """Pod UID -> container name -> resource -> devices."""
        ...

    @property
    def resources(self) -> Mapping[str, ResourceDevices]: ...

    def pods(self, *, active_only: bool = False) -> list[dict[str, Any]]: ...

    def dynamic_resources(
        self, pod: dict[str, Any], container: dict[str, Any]
    ) -> list[api_pb2.DynamicResource]:
        """A container's prepared DRA claims."""
        ...


def _topology(numa: int) -> api_pb2.TopologyInfo | None:
    if numa < 0:
        return None  # the kubelet's marker for devices without NUMA affinity
    return api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=numa)])


def container_resources(
    manager: DevicesProvider, pod: dict[str, Any], container: dict[str, Any]
) -> api_pb2.ContainerResources:
    """One container's entry: its devices grouped per resource and NUMA node."""
    name = container.get("name", "")
    assigned = manager.pod_devices.get(pod["metadata"].get("uid", ""), {}).get(name, {})
    devices = [
        api_pb2.ContainerDevices(resource_name=resource, device_ids=ids, topology=_topology(numa))
        for resource in sorted(assigned)
        for numa, ids in sorted(assigned[resource].by_numa.items())
        if ids
    ]
    return api_pb2.ContainerResources(
        name=name, devices=devices, dynamic_resources=manager.dynamic_resources(pod, container)
    )


def pod_resources(manager: DevicesProvider, pod: dict[str, Any]) -> api_pb2.PodResources:
    """A pod's entry: its sidecars (restartable init containers) and app containers, as the
    kubelet lists them (ordinary init containers have finished by then)."""
    spec = pod.get("spec") or {}
    containers = [
        container_resources(manager, pod, c)
        for c in spec.get("initContainers") or []
        if c.get("restartPolicy") == "Always"
    ]
    containers += [container_resources(manager, pod, c) for c in spec.get("containers") or []]
    meta = pod["metadata"]
    return api_pb2.PodResources(
        name=meta.get("name", ""), namespace=meta.get("namespace", ""), containers=containers
    )


class _PodResourcesServicer(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, manager: DevicesProvider) -> None:
        self.manager = manager

    async def List(
        self, request: api_pb2.ListPodResourcesRequest, context: aio.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        pods = self.manager.pods(active_only=True)
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[pod_resources(self.manager, pod) for pod in pods]
        )

    async def Get(
        self, request: api_pb2.GetPodResourcesRequest, context: aio.ServicerContext
    ) -> api_pb2.GetPodResourcesResponse:
        for pod in self.manager.pods():
            meta = pod["metadata"]
            if meta.get("name") == request.pod_name and (
                meta.get("namespace") == request.pod_namespace
            ):
                return api_pb2.GetPodResourcesResponse(
                    pod_resources=pod_resources(self.manager, pod)
                )
        # A plain error from the kubelet's handler reaches the client as code Unknown.
        await context.abort(
            grpc.StatusCode.UNKNOWN,
            f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
        )
        raise AssertionError("abort raises")

    async def GetAllocatableResources(
        self, request: api_pb2.AllocatableResourcesRequest, context: aio.ServicerContext
    ) -> api_pb2.AllocatableResourcesResponse:
        devices = []
        for resource in sorted(self.manager.resources):
            state = self.manager.resources[resource]
            for device_id in sorted(state.healthy):
                device = state.devices.get(device_id)
                nodes = [n.ID for n in device.topology.nodes] if device is not None else []
                # One entry per device and NUMA node, as the kubelet reports them.
                for numa in nodes or [-1]:
                    devices.append(
                        api_pb2.ContainerDevices(
                            resource_name=resource,
                            device_ids=[device_id],
                            topology=_topology(numa),
                        )
                    )
        return api_pb2.AllocatableResourcesResponse(devices=devices)


async def serve_pod_resources(manager: DevicesProvider, path: Path) -> aio.Server:
    """Start the pod-resources server of a node on a unix socket."""
    server = aio.server()
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(_PodResourcesServicer(manager), server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    return server
