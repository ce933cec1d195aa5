"""The kubelet pod-resources client: who holds which device, refreshed in the background.

Upstream dials the kubelet on every scrape and fails the scrape when `List` fails (a pod-dense
node's answer exceeds gRPC's 4 MiB default: HTTP 500, dcgm-exporter#509). Here a task lists on
its own period with a raised receive limit and a timeout; a failure is logged (once per distinct
error) and the last good answer stays in use, so a scrape never waits on, or fails because of,
the kubelet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable

import grpc
import grpc.aio

from gpu_operator.agents.dcgm_exporter.attribution import Allocation
from kubeletapi.podresources.v1 import api_pb2, api_pb2_grpc

log = logging.getLogger("gpu_operator.agents.dcgm_exporter")

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# 4 MiB (gRPC's default) is a few thousand containers; allow far more before giving up.
MAX_RECEIVE_BYTES = 256 * 1024 * 1024
LIST_TIMEOUT = 10.0

Lister = Callable[[], Awaitable[list[Allocation]]]


def allocations(response: api_pb2.ListPodResourcesResponse) -> list[Allocation]:
    """Flatten a `List` answer into one Allocation per (container, resource, device id)."""
    out: list[Allocation] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                for device_id in devices.device_ids:
                    out.append(
                        Allocation(
                            pod.namespace,
                            pod.name,
                            container.name,
                            devices.resource_name,
                            device_id,
                        )
                    )
    return out


class Client:
    """One channel to the kubelet's pod-resources socket (gRPC reconnects by itself)."""

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        *,
        timeout: float = LIST_TIMEOUT,
        max_receive_bytes: int = MAX_RECEIVE_BYTES,
    ) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._options = [("grpc.max_receive_message_length", max_receive_bytes)]
        self._channel: grpc.aio.Channel | None = None

    async def list(self) -> list[Allocation]:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix://{self.socket_path}", options=self._options
            )
        stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        response = await stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout)
        return allocations(response)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


class PodMapper:
    """Keeps the latest allocations; `run` refreshes them every `interval` seconds."""

    def __init__(
        self,
        lister: Lister,
        *,
        interval: float = 5.0,
        socket_path: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.lister = lister
        self._close = close
        self.interval = interval
        self.socket_path = socket_path
        self.clock = clock
        self.current: tuple[Allocation, ...] = ()
        self.refreshed_at: float | None = None
        self.last_error: str | None = None
        self.refreshed = asyncio.Event()

    async def refresh(self) -> bool:
        """List once; on failure keep the last answer and log why (returns whether it worked)."""
        if self.socket_path is not None and not os.path.exists(self.socket_path):
            self._failed(f"no pod-resources socket at {self.socket_path}; pods are not attributed")
            return False
        try:
            found = await self.lister()
        except grpc.aio.AioRpcError as err:
            self._failed(f"pod-resources List failed: {err.code().name}: {err.details()}")
            return False
        except (OSError, TimeoutError) as err:
            self._failed(f"pod-resources List failed: {err}")
            return False
        if self.last_error is not None:
            log.info("pod-resources List works again (%d device allocations)", len(found))
        self.current = tuple(found)
        self.refreshed_at = self.clock()
        self.last_error = None
        self.refreshed.set()
        return True

    def _failed(self, message: str) -> None:
        if message != self.last_error:
            kept = f"; keeping the last {len(self.current)} allocations" if self.current else ""
            log.warning("%s%s", message, kept)
        self.last_error = message
        self.refreshed.set()  # "tried": the first collection need not wait any longer

    async def close(self) -> None:
        """Close the kubelet connection (when the mapper owns one)."""
        if self._close is not None:
            await self._close()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.refresh()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
