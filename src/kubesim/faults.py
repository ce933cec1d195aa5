"""Fault injection: error rates and latency, dropped and expired watches, restarts."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass

from kubesim import errors
from kubesim.store import Store


@dataclass
class FaultRule:
    """Fail a share of matching requests with `code`, and/or delay them by `latency` seconds."""

    verb: str | None = None
    resource: str | None = None
    error_rate: float = 0.0
    code: int = 500
    latency: float = 0.0
    remaining: int | None = None

    def matches(self, verb: str, resource: str) -> bool:
        """Whether a request is covered (resource matches with or without a subresource)."""
        if self.verb is not None and self.verb != verb:
            return False
        if self.resource is None:
            return True
        return self.resource in (resource, resource.split("/", 1)[0])


class Faults:
    """The fault switchboard of one simulated cluster."""

    def __init__(self, store: Store, seed: int | None = None) -> None:
        self._store = store
        self._random = random.Random(seed)
        self.rules: list[FaultRule] = []
        self.expire_watches = 0
        self.injected = 0
        self._node_loss: Callable[[str], None] | None = None

    def add(
        self,
        *,
        verb: str | None = None,
        resource: str | None = None,
        error_rate: float = 1.0,
        code: int = 500,
        latency: float = 0.0,
        count: int | None = None,
    ) -> FaultRule:
        """Add a rule; `count` limits how many requests it fails before it retires."""
        rule = FaultRule(verb, resource, error_rate, code, latency, count)
        self.rules.append(rule)
        return rule

    def remove(self, rule: FaultRule) -> None:
        """Retire a rule."""
        if rule in self.rules:
            self.rules.remove(rule)

    def clear(self) -> None:
        """Remove every rule and pending watch expiry."""
        self.rules.clear()
        self.expire_watches = 0

    def drop_watches(self) -> int:
        """End every open watch stream; clients must re-watch from their last resourceVersion."""
        return self._store.close_watches()

    def expire_next_watch(self, count: int = 1) -> None:
        """Make the next `count` watch requests fail with 410 Gone."""
        self.expire_watches += count

    def restart(self) -> None:
        """Simulate an API server restart: drop every watch and compact all history."""
        self._store.close_watches()
        self._store.compact()

    def snapshot(self) -> object:
        """Remember the stored state (an etcd backup) for `restore_snapshot`."""
        return self._store.snapshot()

    def restore_snapshot(self, snapshot: object) -> None:
        """Restore a snapshot, as after an etcd restore or an API server that lost its state:
        later objects are gone and resourceVersions go backwards; clients must notice."""
        self._store.restore(snapshot)  # type: ignore[arg-type]

    def lose_node(self, name: str) -> None:
        """The node stops heartbeating: NotReady, unreachable taint, its pods stop being run."""
        if self._node_loss is None:
            raise RuntimeError("node loss needs the kubelet simulator to be running")
        self._node_loss(name)

    def set_node_loss_handler(self, handler: Callable[[str], None]) -> None:
        """Wire node loss to the kubelet simulator (done by the Cluster)."""
        self._node_loss = handler

    def take_watch_expiry(self) -> bool:
        """Consume one pending forced 410, if any."""
        if self.expire_watches > 0:
            self.expire_watches -= 1
            return True
        return False

    async def before(self, verb: str, resource: str) -> None:
        """Apply matching rules: sleep for latency, maybe raise the configured error."""
        for rule in list(self.rules):
            if not rule.matches(verb, resource):
                continue
            if rule.latency > 0:
                await asyncio.sleep(rule.latency)
            if rule.error_rate > 0 and self._random.random() < rule.error_rate:
                if rule.remaining is not None:
                    rule.remaining -= 1
                    if rule.remaining <= 0:
                        self.remove(rule)
                self.injected += 1
                details = {"retryAfterSeconds": 1} if rule.code == 429 else None
                raise errors.ApiError(
                    rule.code, f"injected fault for {verb} {resource}", details=details
                )
