"""A small fake DRA driver for kubesim tests: the kubelet-plugin half of a real one.

It registers through a socket in the node's `/var/lib/kubelet/plugins_registry/` (the
plugin-registration API), serves the DRA plugin service on its own socket under
`/var/lib/kubelet/plugins/<driver>/`, publishes its devices in a ResourceSlice by hand, and
answers NodePrepareResources by reading each claim's allocation from the API (as real drivers do),
writing a CDI spec for the claim under `/var/run/cdi/` and returning its CDI device ids. Failures
can be switched on to exercise the kubelet's error paths.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpc import aio

import kubeletapi
import kubesim
from kubeletapi.dra.v1 import api_pb2 as dra
from kubeletapi.dra.v1 import api_pb2_grpc as dra_grpc
from kubeletapi.dra.v1beta1 import api_pb2 as dra_beta
from kubeletapi.dra.v1beta1 import api_pb2_grpc as dra_beta_grpc
from kubeletapi.pluginregistration.v1 import api_pb2 as reg
from kubeletapi.pluginregistration.v1 import api_pb2_grpc as reg_grpc

CDI_DIR = "/var/run/cdi"


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, driver: FakeDRADriver) -> None:
        self.driver = driver

    async def GetInfo(self, request: reg.InfoRequest, context: aio.ServicerContext) -> Any:
        d = self.driver
        return reg.PluginInfo(
            type=d.plugin_type, name=d.name, endpoint=d.endpoint, supported_versions=d.services
        )

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: aio.ServicerContext
    ) -> Any:
        self.driver.statuses.append((request.plugin_registered, request.error))
        return reg.RegistrationStatusResponse()


class _Beta(dra_beta_grpc.DRAPluginServicer):
    """The v1beta1 service: the same messages, answered by the v1 handlers."""

    def __init__(self, driver: FakeDRADriver) -> None:
        self.driver = driver

    async def NodePrepareResources(self, request: Any, context: aio.ServicerContext) -> Any:
        self.driver.beta_calls += 1
        v1 = dra.NodePrepareResourcesRequest.FromString(request.SerializeToString())
        answer = await self.driver.NodePrepareResources(v1, context)
        return dra_beta.NodePrepareResourcesResponse.FromString(answer.SerializeToString())

    async def NodeUnprepareResources(self, request: Any, context: aio.ServicerContext) -> Any:
        self.driver.beta_calls += 1
        v1 = dra.NodeUnprepareResourcesRequest.FromString(request.SerializeToString())
        answer = await self.driver.NodeUnprepareResources(v1, context)
        return dra_beta.NodeUnprepareResourcesResponse.FromString(answer.SerializeToString())


class FakeDRADriver(dra_grpc.DRAPluginServicer):
    """A DRA driver's kubelet plugin on one simulated node."""

    def __init__(
        self,
        sim: kubesim.Cluster,
        node: str,
        *,
        name: str = "gpu.example.com",
        devices: tuple[str, ...] = ("gpu-0", "gpu-1"),
        services: tuple[str, ...] = (kubeletapi.DRA_PLUGIN_SERVICE_V1,),
        plugin_type: str = kubeletapi.DRA_PLUGIN_TYPE,
        cdi_kind: str = "example.com/gpu",
    ) -> None:
        self.sim = sim
        self.node = node
        self.name = name
        self.devices = devices
        self.services = list(services)
        self.plugin_type = plugin_type
        self.cdi_kind = cdi_kind
        self.endpoint = f"{kubeletapi.DRA_PLUGINS_PATH}{name}/dra.sock"
        self.statuses: list[tuple[bool, str]] = []
        self.prepare_calls: list[list[str]] = []
        self.unprepare_calls: list[list[str]] = []
        self.beta_calls = 0
        # Failure switches: an error for every claim, or a failing call.
        self.claim_error = ""
        self.call_error = ""
        self._registration: aio.Server | None = None
        self._service: aio.Server | None = None

    # ----- paths ----------------------------------------------------------------------------

    def node_path(self, path: str) -> Path:
        return self.sim.node_root(self.node) / path.lstrip("/")

    @property
    def registration_socket(self) -> Path:
        return self.node_path(kubeletapi.PLUGINS_REGISTRY_PATH) / f"{self.name}-reg.sock"

    def cdi_spec(self, claim_uid: str) -> Path:
        return self.node_path(CDI_DIR) / f"{self.name}-{claim_uid}.json"

    # ----- lifecycle ------------------------------------------------------------------------

    async def start(self, *, register: bool = True) -> None:
        """Serve the DRA service, then (unless told not to) the registration socket."""
        service_socket = self.node_path(self.endpoint)
        service_socket.parent.mkdir(parents=True, exist_ok=True)
        self._service = aio.server()
        dra_grpc.add_DRAPluginServicer_to_server(self, self._service)
        dra_beta_grpc.add_DRAPluginServicer_to_server(_Beta(self), self._service)
        self._service.add_insecure_port(f"unix://{service_socket}")
        await self._service.start()
        if register:
            await self.serve_registration()

    async def serve_registration(self) -> None:
        self.registration_socket.parent.mkdir(parents=True, exist_ok=True)
        self._registration = aio.server()
        reg_grpc.add_RegistrationServicer_to_server(_Registration(self), self._registration)
        self._registration.add_insecure_port(f"unix://{self.registration_socket}")
        await self._registration.start()

    async def stop(self) -> None:
        """Stop serving and remove the registration socket (the kubelet unregisters us)."""
        for server in (self._registration, self._service):
            if server is not None:
                await server.stop(None)
        self._registration = self._service = None
        self.registration_socket.unlink(missing_ok=True)

    # ----- the API side ---------------------------------------------------------------------

    def publish_slice(self, pool: str | None = None) -> dict[str, Any]:
        """Publish this node's devices in one ResourceSlice (what a real driver does once
        registered)."""
        pool = pool or self.node
        return self.sim.store.create(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{self.node}-{self.name}"},
                "spec": {
                    "driver": self.name,
                    "nodeName": self.node,
                    "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                    "devices": [
                        {
                            "name": device,
                            "attributes": {
                                "index": {"int": index},
                                "model": {"string": "Example GPU"},
                            },
                            "capacity": {"memory": {"value": "80Gi"}},
                        }
                        for index, device in enumerate(self.devices)
                    ],
                },
            }
        )

    # ----- DRA service ----------------------------------------------------------------------

    async def NodePrepareResources(
        self, request: dra.NodePrepareResourcesRequest, context: aio.ServicerContext
    ) -> dra.NodePrepareResourcesResponse:
        self.prepare_calls.append([c.name for c in request.claims])
        if self.call_error:
            await context.abort(_status_unavailable(), self.call_error)
        answer = dra.NodePrepareResourcesResponse()
        for claim in request.claims:
            if self.claim_error:
                answer.claims[claim.uid].error = self.claim_error
                continue
            stored = self.sim.store.get("resourceclaims", claim.name, claim.namespace) or {}
            results = (
                ((stored.get("status") or {}).get("allocation") or {}).get("devices") or {}
            ).get("results") or []
            devices = []
            for result in results:
                if result.get("driver") != self.name:
                    continue
                cdi_name = f"claim-{claim.uid}-{result['device']}"
                devices.append(
                    dra.Device(
                        request_names=[str(result["request"]).split("/")[0]],
                        pool_name=result["pool"],
                        device_name=result["device"],
                        cdi_device_ids=[f"{self.cdi_kind}={cdi_name}"],
                    )
                )
            self._write_cdi_spec(claim.uid, devices)
            answer.claims[claim.uid].devices.extend(devices)
        return answer

    async def NodeUnprepareResources(
        self, request: dra.NodeUnprepareResourcesRequest, context: aio.ServicerContext
    ) -> dra.NodeUnprepareResourcesResponse:
        self.unprepare_calls.append([c.name for c in request.claims])
        if self.call_error:
            await context.abort(_status_unavailable(), self.call_error)
        answer = dra.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            self.cdi_spec(claim.uid).unlink(missing_ok=True)
            answer.claims[claim.uid].error = ""
        return answer

    def _write_cdi_spec(self, claim_uid: str, devices: list[dra.Device]) -> None:
        """A CDI spec whose devices set an environment variable naming the device."""
        spec = {
            "cdiVersion": "0.6.0",
            "kind": self.cdi_kind,
            "devices": [
                {
                    "name": d.cdi_device_ids[0].split("=", 1)[1],
                    "containerEdits": {"env": [f"EXAMPLE_GPU_{d.device_name.upper()}=present"]},
                }
                for d in devices
            ],
        }
        path = self.cdi_spec(claim_uid)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(spec))


def _status_unavailable() -> Any:
    import grpc

    return grpc.StatusCode.UNAVAILABLE


def cdi_env(sim: kubesim.Cluster, node: str, names: tuple[str, ...]) -> dict[str, str]:
    """The environment CDI edits add for `names`, resolved from the node's /var/run/cdi specs
    (what a CDI-enabled runtime does at container creation)."""
    env: dict[str, str] = {}
    directory = sim.node_root(node) / CDI_DIR.lstrip("/")
    specs = [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]
    for name in names:
        kind, _, device = name.partition("=")
        for spec in specs:
            if spec.get("kind") != kind:
                continue
            for entry in spec.get("devices") or []:
                if entry.get("name") == device:
                    for item in (entry.get("containerEdits") or {}).get("env") or []:
                        key, _, value = item.partition("=")
                        env[key] = value
    return env
