"""Watch-fed caches: list once, then watch from the list's resourceVersion, relist only on 410.

Objects are stored after a transform that keeps only what the planners read, which is what keeps
the operator's memory flat at thousands of nodes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from lightkube import ApiError, AsyncClient

log = logging.getLogger(__name__)

# A transform may return any value (a smaller dict, a summary tuple): keys come from the raw object.
Transform = Callable[[dict[str, Any]], Any]
Handler = Callable[[str, Any, Any], None]


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


def _plain(obj: Any) -> dict[str, Any]:
    data: dict[str, Any] = obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
    return data


class Informer:
    """A cache of one resource (optionally filtered), kept current by a watch.

    `on_change(key, old, new)` is called for every change; `old` is None for additions and `new`
    is None for deletions.
    """

    def __init__(
        self,
        client: AsyncClient,
        resource: Any,
        *,
        namespace: str | None = None,
        labels: dict[str, Any] | None = None,
        transform: Transform | None = None,
        on_change: Handler | None = None,
        watch_timeout: int = 300,
    ) -> None:
        self.client = client
        self.resource = resource
        self.namespace = namespace
        self.labels = labels
        self.transform = transform or (lambda obj: obj)
        self.on_change = on_change
        self.watch_timeout = watch_timeout
        self.objects: dict[str, Any] = {}
        self.synced = asyncio.Event()
        self.relists = 0
        self._stopping = False

    @property
    def kind(self) -> str:
        return str(self.resource._api_info.resource.kind)

    def get(self, name: str, namespace: str | None = None) -> Any:
        return self.objects.get(f"{namespace}/{name}" if namespace else name)

    def _emit(self, key: str, old: Any, new: Any) -> None:
        if self.on_change is not None:
            try:
                self.on_change(key, old, new)
            except Exception:
                log.exception("event handler failed for %s %s", self.kind, key)

    def _set(self, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        stripped = self.transform(obj)
        old = self.objects.get(key)
        self.objects[key] = stripped
        self._emit(key, old, stripped)

    def _delete(self, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        old = self.objects.pop(key, None)
        if old is not None:
            self._emit(key, old, None)

    async def _list(self) -> str:
        kwargs: dict[str, Any] = {"labels": self.labels}
        if self.namespace is not None:
            kwargs["namespace"] = self.namespace
        listing = self.client.list(self.resource, **kwargs)
        seen: set[str] = set()
        async for item in listing:
            obj = _plain(item)
            seen.add(object_key(obj))
            self._set(obj)
        for key in [k for k in self.objects if k not in seen]:
            self._emit(key, self.objects.pop(key), None)
        self.synced.set()
        return str(listing.resourceVersion)

    async def run(self) -> None:
        """List and watch until cancelled; transient errors back off and resume the watch."""
        version: str | None = None
        delay = 0.2
        while not self._stopping:
            try:
                if version is None:
                    version = await self._list()
                    self.relists += 1
                kwargs: dict[str, Any] = {
                    "labels": self.labels,
                    "resource_version": version,
                    "server_timeout": self.watch_timeout,
                }
                if self.namespace is not None:
                    kwargs["namespace"] = self.namespace
                async for event, item in self.client.watch(self.resource, **kwargs):
                    obj = _plain(item)
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if event == "DELETED":
                        self._delete(obj)
                    elif event in ("ADDED", "MODIFIED"):
                        self._set(obj)
                    delay = 0.2
            except asyncio.CancelledError:
                raise
            except ApiError as err:
                if err.status.code == 410:
                    log.info("%s watch expired (410 Gone); relisting", self.kind)
                    version = None
                    continue
                log.warning("%s watch failed: %s; retrying in %.1fs", self.kind, err, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            except Exception as err:
                log.warning("%s watch interrupted: %s; retrying in %.1fs", self.kind, err, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def stop(self) -> None:
        self._stopping = True
