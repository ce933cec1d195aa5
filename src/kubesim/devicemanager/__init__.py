"""The simulated kubelet's device manager (device-plugin API v1beta1) and pod-resources API (v1).

`DeviceManagers` keeps one `DeviceManager` per node. A node's manager starts lazily: when the
kubelet first starts a pod with a runner on that node (a device plugin is such a program), or
when asked (`Cluster.start_device_manager`); never without node filesystems, so large
simulations pay nothing for it.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from kubesim.controllers.volumes import NodeFilesystems
from kubesim.devicemanager.allocation import ContainerAllocation, DeviceSpec, Mount
from kubesim.devicemanager.manager import (
    ADMISSION_ERROR,
    AdmissionError,
    DeviceManager,
    PreStartError,
    go_rpc_error,
    is_extended_resource_name,
)
from kubesim.node_managers import NodeManagers
from kubesim.store import Store

log = logging.getLogger("kubesim.devicemanager")

__all__ = [
    "ADMISSION_ERROR",
    "AdmissionError",
    "ContainerAllocation",
    "DeviceManager",
    "DeviceManagers",
    "DeviceSpec",
    "Mount",
    "PreStartError",
    "go_rpc_error",
    "is_extended_resource_name",
]


class DeviceManagerSettings(Protocol):
    """The kubelet settings the device managers read (KubeletConfig has them)."""

    device_plugin_dial_timeout: float
    device_plugin_grace_period: float


class KubeletView(Protocol):
    """What the device managers need of the kubelet."""

    store: Store
    filesystems: NodeFilesystems | None

    @property
    def config(self) -> DeviceManagerSettings:
        """The kubelet's settings."""


class DeviceManagers(NodeManagers[DeviceManager]):
    """The device managers of all simulated nodes (each serves kubelet.sock and the
    pod-resources socket once started)."""

    needs = "device plugins need the node's /var/lib/kubelet/device-plugins"

    def __init__(self, kubelet: KubeletView) -> None:
        super().__init__(kubelet)
        self.kubelet = kubelet

    def _create(self, node: str, filesystems: NodeFilesystems) -> DeviceManager:
        config = self.kubelet.config
        manager = DeviceManager(
            node,
            filesystems.root(node),
            self.kubelet.store,
            dial_timeout=config.device_plugin_dial_timeout,
            grace_period=config.device_plugin_grace_period,
        )
        dra = getattr(self.kubelet, "dra", None)  # the kubelet's DRA managers, when it has them
        if dra is not None:
            manager.claim_source = lambda pod, container: dra.container_devices(
                node, pod, container
            )
        return manager

    async def restart(self, node: str) -> DeviceManager | None:
        """Restart the node's kubelet as far as devices go: stop serving, then start again
        from the checkpoint (registered resources read 0 until their plugins register again,
        which they do when they see the new kubelet.sock). None without node filesystems."""
        await self.forget(node)
        if self.kubelet.filesystems is None:
            return None
        return await self.ensure(node)

    async def stop_all(self) -> None:
        """Stop every node's device manager."""
        await self._forget_all()

    # ----- the kubelet's hooks ------------------------------------------------------------------

    async def admit(
        self, node: str, pod: dict[str, Any], *, start: bool
    ) -> dict[str, ContainerAllocation]:
        """Allocate the devices of a pod about to start on a node (raises AdmissionError);
        `start` starts the node's manager first (the pod runs a program that may be a
        plugin)."""
        if start and self.kubelet.filesystems is not None and node not in self._managers:
            try:
                await self.ensure(node)
            except (OSError, ValueError) as exc:
                # The pod still starts; a plugin in it will not find kubelet.sock.
                log.error("device manager of node %s did not start: %s", node, exc)
        manager = self._managers.get(node)
        if manager is None or not manager.wants_devices(pod):
            return {}
        return await manager.admit(pod)

    async def pre_start(self, node: str, uid: str, container: dict[str, Any]) -> None:
        """PreStartContainer for a container about to start (raises PreStartError)."""
        manager = self._managers.get(node)
        if manager is not None and uid in manager.pod_devices:
            await manager.pre_start(uid, container)

    def release(self, node: str, uid: str) -> None:
        """Free a pod's devices on its node."""
        manager = self._managers.get(node)
        if manager is not None:
            manager.release(uid)
