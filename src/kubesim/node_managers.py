"""What the kubelet's per-node device managers share (`devicemanager` for device plugins,
`dramanager` for DRA plugins): one manager per node, started on first use (concurrent callers
wait for the same start), stopped when the node goes or its kubelet restarts; and the pods bound
to a node as its kubelet sees them."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from kubesim import selectors
from kubesim.controllers.volumes import NodeFilesystems
from kubesim.store import Store


class Manager(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class HasFilesystems(Protocol):
    @property
    def filesystems(self) -> NodeFilesystems | None: ...


M = TypeVar("M", bound=Manager)


def node_pods(store: Store, node: str, *, active_only: bool = False) -> list[dict[str, Any]]:
    """The pods bound to `node` (active: not Succeeded or Failed)."""
    rt = store.registry.resolve("pods")
    result = []
    for stored in store.select(
        rt,
        None,
        selectors.EVERYTHING,
        selectors.parse_field_selector(f"spec.nodeName={node}"),
    ):
        phase = (stored.obj.get("status") or {}).get("phase")
        if active_only and phase in ("Succeeded", "Failed"):
            continue
        result.append(stored.obj)
    return result


class NodeManagers(Generic[M]):
    """One manager per node. A subclass builds a node's manager (`_create`), may act once it
    has started (`_started`) and names what its plugins need of the node's filesystem
    (`needs`, for the error without node filesystems)."""

    needs: ClassVar[str]

    def __init__(self, kubelet: HasFilesystems) -> None:
        self._kubelet_files = kubelet
        self._managers: dict[str, M] = {}
        self._starting: dict[str, asyncio.Task[M]] = {}

    def get(self, node: str) -> M | None:
        """The node's running manager, if it has been started."""
        return self._managers.get(node)

    async def ensure(self, node: str) -> M:
        """The node's manager, started if it was not yet (RuntimeError without node
        filesystems)."""
        manager = self._managers.get(node)
        if manager is not None:
            return manager
        filesystems = self._kubelet_files.filesystems
        if filesystems is None:
            raise RuntimeError(
                "no node filesystems (the cluster is not running or has node_filesystems=False):"
                f" {self.needs}"
            )
        task = self._starting.get(node)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._start(node, filesystems))
            self._starting[node] = task
        return await asyncio.shield(task)

    def _create(self, node: str, filesystems: NodeFilesystems) -> M:
        raise NotImplementedError

    def _started(self, manager: M) -> None:
        """Called once a node's manager has started."""

    async def _start(self, node: str, filesystems: NodeFilesystems) -> M:
        manager = self._create(node, filesystems)
        try:
            await manager.start()
            self._managers[node] = manager
        finally:
            self._starting.pop(node, None)
        self._started(manager)
        return manager

    async def forget(self, node: str) -> None:
        """Stop a node's manager (node deleted or kubelet restarting)."""
        task = self._starting.get(node)
        if task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(task)
        manager = self._managers.pop(node, None)
        if manager is not None:
            await manager.stop()

    async def _forget_all(self) -> None:
        for node in list(self._starting) + list(self._managers):
            await self.forget(node)
