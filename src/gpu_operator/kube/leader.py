"""Lease-based leader election (coordination.k8s.io/v1), compatible with client-go's protocol."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from lightkube import ApiError, AsyncClient

from gpu_operator.kube import resources

log = logging.getLogger(__name__)

# Upstream's leader-election ID, so the two operators never lead at the same time.
LEASE_NAME = "53822513.nvidia.com"


def _now() -> datetime:
    return datetime.now(UTC)


def _format(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: str | None) -> datetime | None:
    if not value:
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(value, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


class LeaderElector:
    """Acquires and renews a Lease; `is_leader` is set while this process holds it."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        namespace: str,
        identity: str,
        name: str = LEASE_NAME,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], datetime] = _now,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.identity = identity
        self.name = name
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.clock = clock
        self.is_leader = asyncio.Event()
        self.lost = asyncio.Event()
        # The Lease as this process last read or wrote it, and when (client-go's observed
        # record). While it names this process and is younger than its duration, a renewal is
        # one PUT of it (its resourceVersion makes a changed Lease a conflict); a conflict or
        # any error falls back to GET + PUT.
        self._observed: dict[str, Any] | None = None
        self._observed_at: datetime | None = None

    def _spec(self, previous: dict[str, Any] | None) -> dict[str, Any]:
        now = _format(self.clock())
        transitions = int((previous or {}).get("leaseTransitions") or 0)
        holder = (previous or {}).get("holderIdentity")
        acquired = (previous or {}).get("acquireTime") if holder == self.identity else now
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_duration),
            "acquireTime": acquired or now,
            "renewTime": now,
            "leaseTransitions": transitions if holder == self.identity else transitions + 1,
        }

    def _observe(self, lease: dict[str, Any] | None) -> None:
        self._observed = lease
        self._observed_at = self.clock() if lease is not None else None

    def holds_fresh_lease(self) -> bool:
        """Whether the Lease this process last saw names it and has not expired since."""
        if self._observed is None or self._observed_at is None:
            return False
        spec = self._observed.get("spec") or {}
        if spec.get("holderIdentity") != self.identity:
            return False
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        return self.clock() < self._observed_at + timedelta(seconds=duration)

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this process holds the lease afterwards.

        Holding a fresh lease, this is one PUT of the cached Lease (client-go's fast path);
        otherwise, or when that PUT fails, a GET and then a PUT or a create."""
        if self.holds_fresh_lease() and self._observed is not None:
            lease = dict(self._observed)
            lease["spec"] = self._spec(self._observed.get("spec") or {})
            try:
                self._observe(dict(await self.client.replace(resources.LEASE(lease))))
                return True
            except Exception as err:  # a conflict (someone wrote it) or a failed request
                log.info("lease renewal without a read failed (%s); reading the lease", err)
                self._observe(None)
        return await self._read_and_renew()

    async def _read_and_renew(self) -> bool:
        try:
            lease = dict(
                await self.client.get(resources.LEASE, self.name, namespace=self.namespace)
            )
        except ApiError as err:
            if err.status.code != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(None),
            }
            try:
                self._observe(dict(await self.client.create(resources.LEASE(body))))
            except ApiError as create_err:
                if create_err.status.code == 409:
                    return False
                raise
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = _parse(spec.get("renewTime"))
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        expired = renewed is None or self.clock() > renewed + timedelta(seconds=duration)
        if holder and holder != self.identity and not expired:
            return False
        lease["spec"] = self._spec(spec)
        try:
            self._observe(dict(await self.client.replace(resources.LEASE(lease))))
        except ApiError as err:
            if err.status.code == 409:  # someone else won the race
                return False
            raise
        return True

    async def run(self) -> None:
        """Campaign until elected, then renew; on losing the lease set `lost` and return."""
        while not self.is_leader.is_set():
            try:
                if await self.try_acquire_or_renew():
                    log.info("became leader (lease %s/%s)", self.namespace, self.name)
                    self.is_leader.set()
                    break
            except Exception as err:
                log.warning("leader election attempt failed: %s", err)
            await asyncio.sleep(self.retry_period)
        last_renew = self.clock()
        while True:
            await asyncio.sleep(self.retry_period)
            try:
                if await self.try_acquire_or_renew():
                    last_renew = self.clock()
                    continue
            except Exception as err:
                log.warning("lease renewal failed: %s", err)
            if (self.clock() - last_renew).total_seconds() > self.renew_deadline:
                log.error("lost leadership of lease %s/%s", self.namespace, self.name)
                self.is_leader.clear()
                self.lost.set()
                return

    async def release(self) -> None:
        """Give the lease up on shutdown so a standby takes over at once."""
        if not self.is_leader.is_set():
            return
        try:
            lease = dict(
                await self.client.get(resources.LEASE, self.name, namespace=self.namespace)
            )
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            spec.update({"holderIdentity": None, "leaseDurationSeconds": 1})
            await self.client.replace(resources.LEASE(lease))
            log.info("released lease %s/%s", self.namespace, self.name)
        except Exception as err:
            log.warning("could not release the lease: %s", err)
        finally:
            self.is_leader.clear()
            self._observe(None)
