"""The simulated kubelet's DRA manager: plugin registration and DRA driver calls, per node.

`DRAManagers` keeps one `DRAManager` per node. A node's manager starts lazily, like the device
manager: when the kubelet first starts a pod with a runner on the node (a DRA driver's kubelet
plugin is such a program), when a pod with ResourceClaims reaches the node, or when asked
(`Cluster.start_dra_manager`); never without node filesystems, so large simulations pay nothing
for it. Pods without `spec.resourceClaims` never touch it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any, Protocol

from kubesim.controllers.volumes import NodeFilesystems
from kubesim.dramanager.claims import ClaimError, ClaimInfo, PreparedDevice, uses_claims
from kubesim.dramanager.manager import DRAManager, PrepareError, UnprepareError
from kubesim.node_managers import NodeManagers
from kubesim.store import Store

log = logging.getLogger("kubesim.dramanager")

__all__ = [
    "ClaimError",
    "ClaimInfo",
    "DRAManager",
    "DRAManagers",
    "PrepareError",
    "PreparedDevice",
    "UnprepareError",
    "uses_claims",
]


class DRASettings(Protocol):
    """The kubelet settings the DRA managers read (KubeletConfig has them)."""

    dra_plugin_watch_interval: float
    dra_registration_retry: float
    dra_call_timeout: float
    dra_wiping_delay: float
    dra_reconcile_period: float


class KubeletView(Protocol):
    """What the DRA managers need of the kubelet."""

    store: Store
    filesystems: NodeFilesystems | None

    @property
    def config(self) -> DRASettings:
        """The kubelet's settings."""


class DRAManagers(NodeManagers[DRAManager]):
    """The DRA managers of all simulated nodes."""

    needs = "DRA plugins need the node's /var/lib/kubelet/plugins_registry"

    def __init__(self, kubelet: KubeletView) -> None:
        super().__init__(kubelet)
        self.kubelet = kubelet
        self._reconciler: asyncio.Task[None] | None = None
        # Never-started managers of nodes without filesystems (they only refuse, with reasons).
        self._detached: dict[str, DRAManager] = {}

    def _create(self, node: str, filesystems: NodeFilesystems) -> DRAManager:
        config = self.kubelet.config
        return DRAManager(
            node,
            filesystems.root(node),
            self.kubelet.store,
            watch_interval=config.dra_plugin_watch_interval,
            registration_retry=config.dra_registration_retry,
            call_timeout=config.dra_call_timeout,
            wiping_delay=config.dra_wiping_delay,
        )

    def _started(self, manager: DRAManager) -> None:
        if self._reconciler is None and self.kubelet.config.dra_reconcile_period > 0:
            self._reconciler = asyncio.get_running_loop().create_task(self._reconcile_loop())

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.kubelet.config.dra_reconcile_period)
            for manager in list(self._managers.values()):
                try:
                    await manager.reconcile()
                except Exception:
                    log.exception("DRA reconcile of %s failed", manager.node)

    async def restart(self, node: str) -> DRAManager | None:
        """Restart the node's kubelet as far as DRA goes: plugins are forgotten and register
        again (their sockets are still there), prepared claims come back from the checkpoint,
        and the node's ResourceSlices are deleted as a starting kubelet deletes them (drivers
        publish them again once registered)."""
        await self.forget(node)
        if self.kubelet.filesystems is None:
            return None
        manager = await self.ensure(node)
        manager.wipe_slices(None)
        return manager

    async def stop_all(self) -> None:
        if self._reconciler is not None:
            self._reconciler.cancel()
            with contextlib.suppress(BaseException):
                await self._reconciler
            self._reconciler = None
        await self._forget_all()

    # ----- the kubelet's hooks ------------------------------------------------------------------

    async def prepare(self, node: str, pod: dict[str, Any]) -> None:
        """Prepare a pod's claims before its sandbox is created (raises PrepareError)."""
        if not uses_claims(pod):
            return
        manager = self._managers.get(node)
        if manager is None and self.kubelet.filesystems is not None:
            try:
                manager = await self.ensure(node)
            except (OSError, ValueError) as exc:
                log.error("DRA manager of node %s did not start: %s", node, exc)
        if manager is None:
            # No filesystems: no plugin can register, yet the pod gets the kubelet's messages
            # (a claim's own problem, or its driver not being registered) from a manager that
            # is never started and writes nothing.
            manager = self._detached.get(node)
            if manager is None:
                manager = self._detached[node] = DRAManager(node, Path("/"), self.kubelet.store)
        await manager.prepare(pod)

    def container_cdi_devices(
        self, node: str, pod: dict[str, Any], container: dict[str, Any]
    ) -> tuple[str, ...]:
        """The CDI devices of a container's claims (empty without claims)."""
        if not (container.get("resources") or {}).get("claims"):
            return ()
        manager = self._managers.get(node)
        if manager is None:
            return ()
        try:
            return manager.container_cdi_devices(pod, container)
        except ClaimError as exc:
            log.error("CDI devices of %s: %s", container.get("name"), exc)
            return ()

    def container_devices(
        self, node: str, pod: dict[str, Any], container: dict[str, Any]
    ) -> list[tuple[ClaimInfo, list[tuple[str, PreparedDevice]]]]:
        """A container's prepared claims and their devices (the pod-resources API's
        `dynamic_resources`); empty where the node's DRA manager never started."""
        manager = self._managers.get(node)
        return [] if manager is None else manager.container_devices(pod, container)

    def might_need_unprepare(self, node: str, uid: str) -> bool:
        manager = self._managers.get(node)
        return manager is not None and manager.might_need_unprepare(uid)

    async def unprepare(self, node: str, pod: dict[str, Any]) -> None:
        """Unprepare a finished or deleted pod's claims (raises UnprepareError)."""
        manager = self._managers.get(node)
        if manager is None or not uses_claims(pod):
            return
        await manager.unprepare(pod)
