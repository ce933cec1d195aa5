"""The kubelet's plugin manager as far as DRA goes: registration sockets and the DRA plugins.

A DRA driver's kubelet plugin creates a unix socket in `<kubelet root>/plugins_registry/` and
serves the plugin-registration API (pluginregistration v1) on it. The kubelet notices the socket
(the real one through inotify, kubesim by looking at the directory every
`dra_plugin_watch_interval`), dials it, asks `GetInfo`, checks the plugin type (`DRAPlugin` is
the only handler kubesim has) and the listed services, and answers with
`NotifyRegistrationStatus`. A failed registration is tried again with a doubling back-off; a
socket that disappears unregisters the plugin, one that is replaced registers again. Files whose
names start with a dot are ignored, as the kubelet ignores them.

The kubelet then calls the DRA service on the endpoint the plugin named (its registration socket
when it named none), choosing the first service of the plugin's list it knows (`v1.DRAPlugin`,
then `v1beta1.DRAPlugin`). Several plugins of one driver may be registered (a rolling update);
calls go to the most recently registered one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpc import aio

import kubeletapi
from kubeletapi.dra.v1 import api_pb2 as dra_v1
from kubeletapi.dra.v1 import api_pb2_grpc as dra_v1_grpc
from kubeletapi.dra.v1beta1 import api_pb2 as dra_v1beta1
from kubeletapi.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from kubeletapi.pluginregistration.v1 import api_pb2 as reg
from kubeletapi.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from kubesim.controllers.volumes import resolve_within
from kubesim.devicemanager.manager import check_socket_path, go_quote, go_rpc_error

log = logging.getLogger("kubesim.dramanager")

# How long the kubelet waits for a registration socket to accept, and for GetInfo and
# NotifyRegistrationStatus to answer (the plugin manager's 10 s, 1 s and 5 s).
DIAL_TIMEOUT = 10.0
GET_INFO_TIMEOUT = 1.0
NOTIFY_TIMEOUT = 5.0


class RegistrationError(Exception):
    """A plugin the kubelet refused; the text is what the kubelet logs (and, where it says
    so, what it sends the plugin in NotifyRegistrationStatus)."""


class PluginCallError(Exception):
    """A DRA plugin call that failed as a whole (the gRPC error, as Go prints it)."""


def go_error(exc: aio.AioRpcError) -> str:
    """A failed call as the kubelet quotes it; a timeout reads as Go's context error."""
    text = go_rpc_error(exc)
    if "code = DeadlineExceeded" in text:
        return "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
    return text


def go_quote_list(values: list[str] | tuple[str, ...]) -> str:
    """A string slice as Go's `%q` prints it: `["a" "b"]`."""
    return "[" + " ".join(go_quote(v) for v in values) + "]"


def choose_service(driver: str, endpoint: str, services: list[str]) -> str:
    """The DRA service the kubelet will call: the first of the plugin's list it supports.
    Raises RegistrationError with the kubelet's message."""
    prefix = f"invalid supported gRPC versions of DRA driver plugin {driver} at endpoint {endpoint}"
    if not services:
        raise RegistrationError(
            f"{prefix}: empty list of supported gRPC services (aka supported versions)"
        )
    for service in services:
        if service in kubeletapi.DRA_PLUGIN_SERVICES:
            return service
    raise RegistrationError(
        f"{prefix}: none of services supported by the plugin ({go_quote_list(services)}) are "
        f"supported by the kubelet ({go_quote_list(kubeletapi.DRA_PLUGIN_SERVICES)})"
    )


class DRAPlugin:
    """The kubelet's client of one registered plugin of a DRA driver."""

    def __init__(
        self, driver: str, endpoint: str, socket_path: Path, service: str, timeout: float
    ) -> None:
        self.driver = driver
        self.endpoint = endpoint  # as the plugin named it (a path on the node)
        self.socket_path = socket_path  # where that path is in the simulation
        self.service = service
        self.timeout = timeout
        self.channel = aio.insecure_channel(f"unix://{socket_path}")
        self._v1 = dra_v1_grpc.DRAPluginStub(self.channel)
        self._v1beta1 = dra_v1beta1_grpc.DRAPluginStub(self.channel)

    async def prepare(self, claims: list[dra_v1.Claim]) -> dra_v1.NodePrepareResourcesResponse:
        """NodePrepareResources (answers in v1 messages whatever service was chosen)."""
        try:
            if self.service == kubeletapi.DRA_PLUGIN_SERVICE_V1:
                response: dra_v1.NodePrepareResourcesResponse = await self._v1.NodePrepareResources(
                    dra_v1.NodePrepareResourcesRequest(claims=claims), timeout=self.timeout
                )
                return response
            old = await self._v1beta1.NodePrepareResources(
                dra_v1beta1.NodePrepareResourcesRequest(
                    claims=[dra_v1beta1.Claim(**_claim_fields(c)) for c in claims]
                ),
                timeout=self.timeout,
            )
        except aio.AioRpcError as exc:
            raise PluginCallError(go_error(exc)) from None
        # The messages of both versions are the same on the wire.
        converted = dra_v1.NodePrepareResourcesResponse()
        converted.ParseFromString(old.SerializeToString())
        return converted

    async def unprepare(self, claims: list[dra_v1.Claim]) -> dra_v1.NodeUnprepareResourcesResponse:
        """NodeUnprepareResources (answers in v1 messages)."""
        try:
            if self.service == kubeletapi.DRA_PLUGIN_SERVICE_V1:
                response: dra_v1.NodeUnprepareResourcesResponse = (
                    await self._v1.NodeUnprepareResources(
                        dra_v1.NodeUnprepareResourcesRequest(claims=claims),
                        timeout=self.timeout,
                    )
                )
                return response
            old = await self._v1beta1.NodeUnprepareResources(
                dra_v1beta1.NodeUnprepareResourcesRequest(
                    claims=[dra_v1beta1.Claim(**_claim_fields(c)) for c in claims]
                ),
                timeout=self.timeout,
            )
        except aio.AioRpcError as exc:
            raise PluginCallError(go_error(exc)) from None
        converted = dra_v1.NodeUnprepareResourcesResponse()
        converted.ParseFromString(old.SerializeToString())
        return converted

    async def close(self) -> None:
        await self.channel.close()


def _claim_fields(claim: dra_v1.Claim) -> dict[str, str]:
    return {"namespace": claim.namespace, "uid": claim.uid, "name": claim.name}


@dataclass
class _Socket:
    """A registration socket the watcher has seen."""

    identity: tuple[int, int]  # (inode, mtime): a new socket at the same path differs
    registered: tuple[str, str] | None = None  # (driver, endpoint) once registered
    attempts: int = 0
    next_try: float = 0.0
    last_error: str = ""


@dataclass
class PluginStore:
    """The registered DRA plugins of one node, per driver in registration order."""

    plugins: dict[str, list[DRAPlugin]] = field(default_factory=dict)

    def get(self, driver: str) -> DRAPlugin:
        """The plugin to call for a driver (raises RegistrationError with the kubelet's
        message when there is none)."""
        if not driver:
            raise RegistrationError("DRA driver name is empty")
        plugins = self.plugins.get(driver)
        if not plugins:
            raise RegistrationError(f"DRA driver {driver} is not registered")
        return plugins[-1]

    def add(self, plugin: DRAPlugin) -> None:
        plugins = self.plugins.setdefault(plugin.driver, [])
        if any(p.endpoint == plugin.endpoint for p in plugins):
            raise RegistrationError(
                f"endpoint {plugin.endpoint} already registered for DRA driver plugin "
                f"{plugin.driver}"
            )
        plugins.append(plugin)

    def remove(self, driver: str, endpoint: str) -> DRAPlugin | None:
        plugins = self.plugins.get(driver) or []
        for index, plugin in enumerate(plugins):
            if plugin.endpoint == endpoint:
                del plugins[index]
                if not plugins:
                    del self.plugins[driver]
                return plugin
        return None


class PluginWatcher:
    """Registers the DRA plugins whose sockets appear in a node's plugins_registry directory."""

    def __init__(
        self,
        root: Path,
        store: PluginStore,
        *,
        interval: float,
        retry: float,
        call_timeout: float,
        on_change: Callable[[str], None],
    ) -> None:
        self.root = root
        self.directory = resolve_within(root, kubeletapi.PLUGINS_REGISTRY_PATH)
        self.store = store
        self.interval = interval
        self.retry = retry
        self.call_timeout = call_timeout
        self.on_change = on_change
        self.sockets: dict[str, _Socket] = {}
        self._task: asyncio.Task[None] | None = None
        # Registrations accepted and refused so far (for tests and diagnostics).
        self.registrations = 0
        self.refusals: list[str] = []

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None
        for plugins in list(self.store.plugins.values()):
            for plugin in list(plugins):
                await plugin.close()
        self.store.plugins.clear()

    async def _run(self) -> None:
        while True:
            try:
                await self.scan()
            except asyncio.CancelledError:
                raise
            except Exception:  # a broken plugin must not stop the watcher
                log.exception("plugin watcher of %s failed", self.root)
            await asyncio.sleep(self.interval)

    def _seen(self) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.directory):
                if entry.name.startswith("."):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISSOCK(info.st_mode):
                        found[entry.path] = (info.st_ino, info.st_mtime_ns)
        return found

    async def scan(self) -> None:
        """One look at the directory: unregister vanished or replaced sockets, register new
        ones (and retry failed ones whose back-off has passed)."""
        found = self._seen()
        for path, gone in list(self.sockets.items()):
            if found.get(path) != gone.identity:
                del self.sockets[path]
                await self._unregister(gone)
        now = asyncio.get_running_loop().time()
        for path, identity in found.items():
            known = self.sockets.get(path)
            if known is None:
                known = self.sockets[path] = _Socket(identity)
            if known.registered is not None or now < known.next_try:
                continue
            try:
                known.registered = await self.register(Path(path))
            except RegistrationError as exc:
                known.attempts += 1
                known.last_error = str(exc)
                known.next_try = now + min(self.retry * 2 ** (known.attempts - 1), 122.0)
                self.refusals.append(str(exc))
                log.warning("%s", exc)

    async def _unregister(self, known: _Socket) -> None:
        if known.registered is None:
            return
        driver, endpoint = known.registered
        plugin = self.store.remove(driver, endpoint)
        if plugin is not None:
            await plugin.close()
        log.info("DRA plugin %s at %s unregistered", driver, endpoint)
        self.on_change(driver)

    async def register(self, socket_path: Path) -> tuple[str, str]:
        """Register the plugin behind one registration socket (RegistrationError: refused)."""
        node_path = "/" + str(socket_path.relative_to(self.root))
        try:
            check_socket_path(socket_path)
        except ValueError as exc:
            raise RegistrationError(
                f"RegisterPlugin error -- dial failed at socket {node_path}, err: {exc}"
            ) from None
        async with aio.insecure_channel(f"unix://{socket_path}") as channel:
            try:
                await asyncio.wait_for(channel.channel_ready(), DIAL_TIMEOUT)
            except TimeoutError:
                raise RegistrationError(
                    f"RegisterPlugin error -- dial failed at socket {node_path}, err: failed to "
                    f"dial socket {node_path}, err: context deadline exceeded"
                ) from None
            client = reg_grpc.RegistrationStub(channel)
            try:
                info: reg.PluginInfo = await client.GetInfo(
                    reg.InfoRequest(), timeout=GET_INFO_TIMEOUT
                )
            except aio.AioRpcError as exc:
                raise RegistrationError(
                    "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at "
                    f"socket {node_path}, err: {go_error(exc)}"
                ) from None
            if info.type != kubeletapi.DRA_PLUGIN_TYPE:
                message = (
                    f"RegisterPlugin error -- no handler registered for plugin type: {info.type} "
                    f"at socket {node_path}"
                )
                await _notify(client, False, message)
                raise RegistrationError(message)
            endpoint = info.endpoint or node_path
            services = list(info.supported_versions)
            try:
                service = choose_service(info.name, endpoint, services)
            except RegistrationError as exc:
                refusal = f"RegisterPlugin error -- plugin validation failed with err: {exc}"
                await _notify(client, False, refusal)
                raise RegistrationError(
                    f"RegisterPlugin error -- pluginHandler.ValidatePluginFunc failed ({exc})"
                ) from None
            target = resolve_within(self.root, endpoint)
            plugin = DRAPlugin(info.name, endpoint, target, service, self.call_timeout)
            try:
                self.store.add(plugin)
            except RegistrationError as exc:
                await plugin.close()
                message = f"RegisterPlugin error -- plugin registration failed with err: {exc}"
                await _notify(client, False, message)
                raise RegistrationError(message) from None
            self.registrations += 1
            log.info("DRA plugin %s registered at %s (%s)", info.name, endpoint, service)
            self.on_change(info.name)
            await _notify(client, True, "")
            return info.name, endpoint


async def _notify(client: Any, registered: bool, error: str) -> None:
    """NotifyRegistrationStatus; a plugin that does not answer is only logged."""
    try:
        await client.NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=registered, error=error),
            timeout=NOTIFY_TIMEOUT,
        )
    except aio.AioRpcError as exc:
        log.warning("NotifyRegistrationStatus failed: %s", go_error(exc))
