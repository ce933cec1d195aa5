"""Request counters by verb and resource, for asserting what a client did."""

from __future__ import annotations

from collections import Counter

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


class Stats:
    """Counts every API request by (verb, resource); resource reads `nodes`, `daemonsets.apps`,
    `pods/status`, `pods/eviction`."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()

    def record(self, verb: str, resource: str) -> None:
        """Count one request."""
        self.counts[(verb, resource)] += 1

    def count(self, verb: str | None = None, resource: str | None = None) -> int:
        """Requests matching a verb and/or resource (None matches all)."""
        return sum(
            n
            for (v, r), n in self.counts.items()
            if (verb is None or v == verb) and (resource is None or r == resource)
        )

    def writes(self, resource: str | None = None) -> int:
        """Mutating requests (create, update, patch, delete, deletecollection)."""
        return sum(
            n
            for (v, r), n in self.counts.items()
            if v in WRITE_VERBS and (resource is None or r == resource)
        )

    def snapshot(self) -> dict[tuple[str, str], int]:
        """A copy of all counters."""
        return dict(self.counts)

    def since(self, before: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
        """Counters that grew since a snapshot, with the increase."""
        return {k: n - before.get(k, 0) for k, n in self.counts.items() if n > before.get(k, 0)}

    def reset(self) -> None:
        """Zero all counters."""
        self.counts.clear()
