"""The scaffolding every DRA kubelet plugin of ours shares.

`KubeletPlugin` serves the DRA service (v1, and v1beta1 answered by the v1 handlers) on
`<kubelet root>/plugins/<driver>/dra.sock`, registers through
`<kubelet root>/plugins_registry/<driver>-reg.sock`, answers `NodePrepareResources` /
`NodeUnprepareResources` claim by claim under one lock (an error goes back in that claim's
entry, the kubelet retries) and keeps the prepared claims in the checkpoint. A plugin supplies
what is its own: `_prepare` and `_unprepare` for one claim, and which errors are a claim's.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from grpc import aio

import kubeletapi
from gpu_operator.agents.dra_kubelet_plugin import checkpoint
from kubeletapi.dra.v1 import api_pb2 as dra
from kubeletapi.dra.v1 import api_pb2_grpc as dra_grpc
from kubeletapi.dra.v1beta1 import api_pb2 as dra_beta
from kubeletapi.dra.v1beta1 import api_pb2_grpc as dra_beta_grpc
from kubeletapi.pluginregistration.v1 import api_pb2 as reg
from kubeletapi.pluginregistration.v1 import api_pb2_grpc as reg_grpc

KUBELET_ROOT = "/var/lib/kubelet"
DRA_SOCKET = "dra.sock"


class StartError(Exception):
    """The plugin cannot start (the message says why)."""


@dataclass
class KubeletPluginSettings:
    """Where a plugin finds the kubelet: as this process sees it (`kubelet_root_view`) and as
    the node path the kubelet knows it by (`kubelet_root`). A plugin's settings name its
    `driver`."""

    driver: ClassVar[str]
    node_name: str
    kubelet_root_view: Path = Path(KUBELET_ROOT)
    kubelet_root: str = KUBELET_ROOT
    cdi_root: Path = Path("/var/run/cdi")

    @property
    def plugin_dir(self) -> Path:
        return self.kubelet_root_view / "plugins" / self.driver

    @property
    def registration_socket(self) -> Path:
        return self.kubelet_root_view / "plugins_registry" / f"{self.driver}-reg.sock"

    @property
    def endpoint(self) -> str:
        """The DRA socket as the kubelet's node path."""
        return f"{self.kubelet_root.rstrip('/')}/plugins/{self.driver}/{DRA_SOCKET}"


class KubeletPlugin(dra_grpc.DRAPluginServicer):
    """The DRA service, its registration and the checkpoint; see the module's docstring."""

    log: ClassVar[logging.Logger]
    # The errors that fail one claim (reported in its entry), and how a prepare error is logged.
    prepare_errors: ClassVar[tuple[type[Exception], ...]]
    prepare_error_level: ClassVar[int] = logging.WARNING
    unprepare_errors: ClassVar[tuple[type[Exception], ...]]

    def __init__(self, settings: KubeletPluginSettings) -> None:
        self.checkpoint = checkpoint.Checkpoint()
        self.registered = asyncio.Event()
        self.statuses: list[tuple[bool, str]] = []
        self._settings = settings
        self._lock = asyncio.Lock()
        self._servers: list[aio.Server] = []

    # ----- checkpoint ---------------------------------------------------------------------

    @property
    def checkpoint_path(self) -> Path:
        return self._settings.plugin_dir / checkpoint.FILE_NAME

    def _open_checkpoint(self, boot_id: str) -> None:
        """Load the checkpoint (a reboot, another `boot_id`, forgets it) and write it back."""
        try:
            self.checkpoint = checkpoint.load(self.checkpoint_path, boot_id)
        except checkpoint.CorruptCheckpoint as err:
            raise StartError(f"{self.checkpoint_path}: {err}") from None
        checkpoint.save(self.checkpoint_path, self.checkpoint)

    def _record(self, uid: str, claim: checkpoint.Claim | None) -> None:
        claims = dict(self.checkpoint.claims)
        if claim is None:
            claims.pop(uid, None)
        else:
            claims[uid] = claim
        self.checkpoint = replace(self.checkpoint, claims=claims)
        checkpoint.save(self.checkpoint_path, self.checkpoint)

    # ----- sockets ------------------------------------------------------------------------

    async def _serve(self) -> None:
        s = self._settings
        dra_socket = s.plugin_dir / DRA_SOCKET
        dra_socket.parent.mkdir(parents=True, exist_ok=True)
        dra_socket.unlink(missing_ok=True)
        service = aio.server()
        dra_grpc.add_DRAPluginServicer_to_server(self, service)
        dra_beta_grpc.add_DRAPluginServicer_to_server(_Beta(self), service)
        service.add_insecure_port(f"unix://{dra_socket}")
        await service.start()
        self._servers.append(service)
        s.registration_socket.parent.mkdir(parents=True, exist_ok=True)
        s.registration_socket.unlink(missing_ok=True)
        registration = aio.server()
        reg_grpc.add_RegistrationServicer_to_server(_Registration(self), registration)
        registration.add_insecure_port(f"unix://{s.registration_socket}")
        await registration.start()
        self._servers.append(registration)
        self.log.info("serving %s, registering at %s", dra_socket, s.registration_socket)

    async def _stop_serving(self) -> None:
        for server in self._servers:
            await server.stop(None)
        self._servers.clear()
        self._settings.registration_socket.unlink(missing_ok=True)

    def _registration_status(self, registered: bool, error: str) -> None:
        self.statuses.append((registered, error))
        if registered:
            self.registered.set()
            self.log.info("registered with the kubelet")
        else:
            self.log.error("the kubelet refused the registration: %s", error)

    # ----- the DRA service ----------------------------------------------------------------

    async def _prepare(self, uid: str, namespace: str, name: str) -> tuple[checkpoint.Device, ...]:
        raise NotImplementedError

    async def _unprepare(self, uid: str) -> None:
        raise NotImplementedError

    async def NodePrepareResources(
        self, request: dra.NodePrepareResourcesRequest, context: aio.ServicerContext
    ) -> dra.NodePrepareResourcesResponse:
        answer = dra.NodePrepareResourcesResponse()
        async with self._lock:
            for claim in request.claims:
                entry = answer.claims[claim.uid]
                try:
                    devices = await self._prepare(claim.uid, claim.namespace, claim.name)
                except self.prepare_errors as err:
                    self.log.log(
                        self.prepare_error_level,
                        "prepare %s/%s: %s",
                        claim.namespace,
                        claim.name,
                        err,
                    )
                    entry.error = str(err)
                    continue
                entry.devices.extend(
                    dra.Device(
                        request_names=[d.request],
                        pool_name=d.pool,
                        device_name=d.device,
                        cdi_device_ids=list(d.cdi_ids),
                    )
                    for d in devices
                )
        return answer

    async def NodeUnprepareResources(
        self, request: dra.NodeUnprepareResourcesRequest, context: aio.ServicerContext
    ) -> dra.NodeUnprepareResourcesResponse:
        answer = dra.NodeUnprepareResourcesResponse()
        async with self._lock:
            for claim in request.claims:
                entry = answer.claims[claim.uid]
                try:
                    await self._unprepare(claim.uid)
                except self.unprepare_errors as err:  # reported to the kubelet, which retries
                    entry.error = f"unprepare {claim.namespace}/{claim.name}: {err}"
        return answer


class _Beta(dra_beta_grpc.DRAPluginServicer):
    """v1beta1: the same messages, answered by the v1 handlers."""

    def __init__(self, plugin: KubeletPlugin) -> None:
        self.plugin = plugin

    async def NodePrepareResources(self, request: Any, context: aio.ServicerContext) -> Any:
        v1 = dra.NodePrepareResourcesRequest.FromString(request.SerializeToString())
        answer = await self.plugin.NodePrepareResources(v1, context)
        return dra_beta.NodePrepareResourcesResponse.FromString(answer.SerializeToString())

    async def NodeUnprepareResources(self, request: Any, context: aio.ServicerContext) -> Any:
        v1 = dra.NodeUnprepareResourcesRequest.FromString(request.SerializeToString())
        answer = await self.plugin.NodeUnprepareResources(v1, context)
        return dra_beta.NodeUnprepareResourcesResponse.FromString(answer.SerializeToString())


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, plugin: KubeletPlugin) -> None:
        self.plugin = plugin

    async def GetInfo(self, request: reg.InfoRequest, context: aio.ServicerContext) -> Any:
        s = self.plugin._settings
        return reg.PluginInfo(
            type=kubeletapi.DRA_PLUGIN_TYPE,
            name=s.driver,
            endpoint=s.endpoint,
            supported_versions=list(kubeletapi.DRA_PLUGIN_SERVICES),
        )

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: aio.ServicerContext
    ) -> Any:
        self.plugin._registration_status(request.plugin_registered, request.error)
        return reg.RegistrationStatusResponse()
