"""GetPreferredAllocation: which of the available devices the kubelet should pick.

Pure. Whole GPUs are chosen topology-aware (upstream's best-effort policy: the partition of all
available GPUs into sets of the requested size with the highest total link score, then its best
set); replicas and MIG devices greedily by how many replicas each physical GPU already serves.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from gpu_operator.agents.device_plugin.devices import Resource, physical_id
from gpu_operator.agents.device_plugin.facts import Link
from gpu_operator.nvml.protocol import TopologyLevel

# Link scores of upstream's allocator: closer PCIe ancestors score more; each NVLink scores 100.
LEVEL_SCORES: dict[TopologyLevel, int] = {
    TopologyLevel.SYSTEM: 10,
    TopologyLevel.NODE: 20,
    TopologyLevel.HOSTBRIDGE: 30,
    TopologyLevel.MULTIPLE: 40,
    TopologyLevel.SINGLE: 50,
    TopologyLevel.INTERNAL: 60,
}
NVLINK_SCORE = 100
# Beyond this many partitions the exhaustive search is too slow for Python (16 GPUs taken two at a
# time have 2 million): pick the best single set instead.
MAX_PARTITIONS = 50_000

Links = Mapping[tuple[int, int], Link]


class PreferenceError(ValueError):
    """The request cannot be satisfied from the available devices."""


def pair_score(links: Links, a: int, b: int) -> int:
    """How well two GPUs talk to each other (0 for unknown pairs)."""
    link = links.get((a, b))
    if link is None or a == b:
        return 0
    score = LEVEL_SCORES.get(link.level, 0) if link.level is not None else 0
    return score + NVLINK_SCORE * link.nvlinks


def set_score(links: Links, gpus: Sequence[int | None]) -> int:
    """The sum of the pair scores of a set (padding slots score nothing)."""
    real = [g for g in gpus if g is not None]
    return sum(pair_score(links, a, b) for a, b in itertools.combinations(real, 2))


def _partitions(
    devices: list[int | None], size: int, padding: int
) -> Iterator[list[tuple[int | None, ...]]]:
    # Each set starts with the first remaining device, so no partition is produced twice; sets
    # must hold all of the padding or none of it, so padding never splits a real allocation.
    if len(devices) == size:
        yield [tuple(devices)]
        return
    first, rest = devices[0], devices[1:]
    for others in itertools.combinations(range(len(rest)), size - 1):
        chosen = (first, *(rest[i] for i in others))
        pads = sum(1 for g in chosen if g is None)
        if pads not in (0, padding):
            continue
        remaining = [g for i, g in enumerate(rest) if i not in others]
        for tail in _partitions(remaining, size, padding):
            yield [chosen, *tail]


def _partition_count(n: int, size: int) -> int:
    groups = n // size
    count: int = math.factorial(n) // (math.factorial(size) ** groups * math.factorial(groups))
    return count


def aligned(
    links: Links, available: Sequence[int], required: Sequence[int], size: int
) -> list[int]:
    """Upstream's best-effort policy over GPU indices; empty when it cannot satisfy the request."""
    if size <= 0 or len(available) < size or len(required) > size:
        return []
    need = set(required)
    if size == 1:
        return [required[0]] if required else [available[0]]
    padded: list[int | None] = list(available)
    while len(padded) % size:
        padded.append(None)
    padding = len(padded) - len(available)
    if _partition_count(len(padded), size) > MAX_PARTITIONS:
        return _best_set(links, available, required, size)
    best: list[tuple[int | None, ...]] | None = None
    best_score = 0
    for partition in _partitions(padded, size, padding):
        if not any(need <= set(s) and None not in s for s in partition):
            continue
        score = sum(set_score(links, s) for s in partition)
        if best is None or score > best_score:
            best, best_score = partition, score
    if best is None:
        return []
    candidates = [s for s in best if need <= set(s) and None not in s]
    chosen = max(candidates, key=lambda s: set_score(links, s))  # first of equals wins
    return [g for g in chosen if g is not None]


def _best_set(
    links: Links, available: Sequence[int], required: Sequence[int], size: int
) -> list[int]:
    need = list(required)
    others = [g for g in available if g not in set(need)]
    best: tuple[int, ...] | None = None
    for extra in itertools.combinations(others, size - len(need)):
        candidate = (*need, *extra)
        if best is None or set_score(links, candidate) > set_score(links, best):
            best = candidate
    return list(best or ())


@dataclass
class _Gpu:
    total: int
    free: int
    picked: int
    replicas: list[str]


def greedy(
    resource: Resource,
    available: Sequence[str],
    required: Sequence[str],
    size: int,
    policy: str = "distributed",
) -> list[str]:
    """Required IDs plus picks from the physical GPU serving the fewest (`distributed`) or most
    (`packed`) allocated replicas; ties go to the GPU this call has taken least from."""
    known = resource.by_id()
    required_set = set(required)
    candidates = [i for i in dict.fromkeys(available) if i in known and i not in required_set]
    needed = size - len(required)
    if len(candidates) < needed:
        raise PreferenceError("not enough available devices to satisfy allocation")
    gpus: dict[str, _Gpu] = {}
    for c in candidates:
        state = gpus.setdefault(physical_id(c), _Gpu(0, 0, 0, []))
        state.free += 1
        state.replicas.append(c)
    for d in resource.devices:
        if physical_id(d.id) in gpus:
            gpus[physical_id(d.id)].total += 1
    for r in required:
        if physical_id(r) in gpus:
            gpus[physical_id(r)].picked += 1
    key: Callable[[_Gpu], tuple[int, int]]
    if policy == "packed":
        key = lambda g: (-(g.total - g.free), g.picked)  # noqa: E731
    else:
        key = lambda g: (g.total - g.free, g.picked)  # noqa: E731
    picks: list[str] = []
    for _ in range(needed):
        state = min((g for g in gpus.values() if g.replicas), key=key)
        picks.append(state.replicas.pop(0))
        state.free -= 1
        state.picked += 1
    return [*required, *picks]


def preferred_allocation(
    resource: Resource,
    available: Sequence[str],
    required: Sequence[str],
    size: int,
    links: Links,
    policy: str = "distributed",
) -> list[str]:
    """The device IDs to prefer for one container (PreferenceError when too few are free)."""
    known = resource.by_id()
    for i in (*available, *required):
        if i not in known:
            raise PreferenceError(f"unknown device: {i}")
    devices = [known[i] for i in available]
    if devices and all(not d.is_mig and not d.is_replica for d in devices):
        index = {known[i].gpu: i for i in available}
        chosen = aligned(
            links, [known[i].gpu for i in available], [known[i].gpu for i in required], size
        )
        return [index[g] for g in chosen]
    return greedy(resource, available, required, size, policy)
