"""Whether the driver container's driver is ready, as the MIG manager sees it without opening the
driver: the marker the driver container keeps in the validations directory while its driver is
loaded (`.driver-ctr-ready`, written by its startup probe, removed by its preStop hook). Opening
NVML to find out would hold the driver, and a held driver cannot be unloaded by its replacement.

A missing marker only means "not ready" on a node a driver container serves: the validator's
`driver-ready` says `IS_HOST_DRIVER=false` there, or this manager has seen the marker before. With
a driver on the host (`IS_HOST_DRIVER=true`, as with `driver.enabled=false`) there is never a
marker, and its absence says nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from gpu_operator.agents.mig_manager import retry

# The validator's marker once the driver is validated, with `KEY=value` lines about it.
DRIVER_VALIDATED = "driver-ready"


def host_driver(text: str) -> bool | None:
    """`IS_HOST_DRIVER` of a `driver-ready` file (None when it does not say)."""
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "IS_HOST_DRIVER":
            return value.strip().strip("\"'").lower() == "true"
    return None


class DriverMarker:
    """The ready marker in `validations_dir` (None or a missing directory: not visible here)."""

    def __init__(self, validations_dir: str | Path | None) -> None:
        self.dir = Path(validations_dir) if validations_dir else None
        self._seen = False  # a driver container has been ready here while we ran

    def _host_driver(self) -> bool | None:
        assert self.dir is not None
        try:
            return host_driver((self.dir / DRIVER_VALIDATED).read_text())
        except OSError:
            return None  # not validated (yet, or any more)

    def present(self) -> bool | None:
        """True while the marker is there; False when it is not and a driver container serves
        this node; None when this cannot be told (no directory, a driver on the host)."""
        if self.dir is None or not self.dir.is_dir():
            return None
        if (self.dir / retry.DRIVER_READY_MARKER).exists():
            self._seen = True
            return True
        host = self._host_driver()
        if host:
            return None
        if host is False or self._seen:
            return False
        return None

    async def changes(self, interval: float) -> AsyncIterator[bool | None]:
        """`present()` now, then each time it changes (checked every `interval` seconds)."""
        last: object = object()
        while True:
            now = await asyncio.to_thread(self.present)
            if now != last:
                last = now
                yield now
            await asyncio.sleep(interval)
