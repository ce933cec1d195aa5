"""The sandbox plugin's main loop: discover once, serve every resource, keep health current.

As upstream, the resources are discovered at start (the vGPU device manager restarts the plugin,
by pausing it, when it changes the vGPUs). Health: a device is healthy while its VFIO group node
(`/dev/vfio/<group>`; for an mdev, `/sys/bus/mdev/devices/<uuid>`) exists, checked every
`poll_interval` (upstream watches the same files with inotify). A new `kubelet.sock` (a kubelet
restart) makes every resource register again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpu_operator.agents.device_plugin.server import StartError
from gpu_operator.agents.sandbox_device_plugin import discovery
from gpu_operator.agents.sandbox_device_plugin.server import SandboxEndpoint

log = logging.getLogger("gpu_operator.agents.sandbox_device_plugin")


@dataclass
class Settings:
    root: Path
    plugin_dir: Path
    kubelet_socket: Path | None
    pci_ids: dict[int, str]
    poll_interval: float = 1.0
    retry_interval: float = 2.0


def _inode(path: Path | None) -> tuple[int, float] | None:
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_ctime)


class Manager:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.endpoints: list[SandboxEndpoint] = []
        self.serving = asyncio.Event()

    async def _start_all(self, stop: asyncio.Event) -> bool:
        """Start every endpoint, retrying until it works or `stop` (False: stopped)."""
        while not stop.is_set():
            try:
                for endpoint in self.endpoints:
                    await endpoint.start()
                return True
            except StartError as err:
                log.warning("%s; retrying in %.0fs", err, self.settings.retry_interval)
                await self._stop_all()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.settings.retry_interval)
        return False

    async def _stop_all(self) -> None:
        for endpoint in self.endpoints:
            await endpoint.stop()

    async def check_health(self) -> None:
        root = self.settings.root
        for endpoint in self.endpoints:
            for device in endpoint.resource.devices:
                healthy = (root / device.health_path).exists()
                if await endpoint.set_health([device.id], healthy):
                    state = "healthy" if healthy else "unhealthy"
                    log.warning(
                        "%s device %s is %s (%s)",
                        endpoint.resource.resource_name, device.id, state,
                        "/" + device.health_path,
                    )  # fmt: skip

    async def run(self, stop: asyncio.Event, on_serving: Callable[[], None] | None = None) -> None:
        s = self.settings
        resources = discovery.discover(s.root, s.pci_ids)
        if not resources:
            log.info("no NVIDIA devices on vfio and no vGPUs on this node: nothing to serve")
        for resource in resources:
            log.info(
                "discovered %s: %d device(s) %s",
                resource.resource_name, len(resource.devices),
                ", ".join(d.id for d in resource.devices),
            )  # fmt: skip
        self.endpoints = [
            SandboxEndpoint(
                r, root=s.root, plugin_dir=s.plugin_dir, kubelet_socket=s.kubelet_socket
            )
            for r in resources
        ]
        try:
            if not await self._start_all(stop):
                return
            kubelet = _inode(s.kubelet_socket)
            self.serving.set()
            if on_serving is not None:
                on_serving()
            while not stop.is_set():
                await self.check_health()
                now = _inode(s.kubelet_socket)
                if now is not None and now != kubelet:
                    log.info("the kubelet restarted: registering again")
                    await self._stop_all()
                    self.endpoints = [
                        SandboxEndpoint(
                            e.resource, root=s.root, plugin_dir=s.plugin_dir,
                            kubelet_socket=s.kubelet_socket,
                        )
                        for e in self.endpoints
                    ]  # fmt: skip
                    if not await self._start_all(stop):
                        return
                    kubelet = now
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), s.poll_interval)
        finally:
            await self._stop_all()
