"""The operator process's collector tuning (controller/gc_tuning.py, issue 32): once the first
lists are cached their objects are frozen out of the collector's walks, the young threshold is
raised, the survivors of later full collections are frozen too, and cycles stay collectable."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_operator.controller import gc_tuning, main


class _Cycle:
    """A reference cycle (only the cyclic collector frees it)."""

    def __init__(self) -> None:
        self.me: Any = self


@pytest.fixture
def tuning() -> Iterator[gc_tuning.GcTuning]:
    assert gc.get_freeze_count() == 0, "something else left objects frozen"
    before = gc.get_threshold()
    clock = [0.0]
    tuned = gc_tuning.GcTuning(refresh_seconds=100.0, clock=lambda: clock[0])
    tuned.clock = clock  # type: ignore[attr-defined]
    try:
        yield tuned
    finally:
        tuned.uninstall()
        assert gc.get_threshold() == before
        assert gc.get_freeze_count() == 0


def test_engages_once_the_caches_are_listed(tuning: gc_tuning.GcTuning) -> None:
    # A cache of many small, long-lived objects (what the node and pod caches hold).
    cache = {f"node-{i}": {"metadata": {"name": f"node-{i}", "labels": {}}} for i in range(5000)}
    tuning.install()
    assert gc.get_threshold()[0] == gc_tuning.YOUNG_THRESHOLD
    assert gc.get_freeze_count() == 0  # nothing frozen before the lists are in
    ready = asyncio.Event()

    async def start() -> None:
        keep = asyncio.create_task(tuning.keep(ready, poll=3600))
        await asyncio.sleep(0)
        assert gc.get_freeze_count() == 0
        ready.set()
        for _ in range(3):
            await asyncio.sleep(0)
        keep.cancel()

    asyncio.run(start())
    # The cache's dicts (three per entry) are frozen: no collection walks them again.
    assert gc.get_freeze_count() >= 3 * len(cache)
    assert tuning.freezes == 1


def test_objects_allocated_later_are_still_collected(tuning: gc_tuning.GcTuning) -> None:
    tuning.install()
    tuning.settle()
    cycle = _Cycle()
    gone = weakref.ref(cycle)
    del cycle
    gc.collect()
    assert gone() is None


def test_survivors_of_a_full_collection_are_frozen(tuning: gc_tuning.GcTuning) -> None:
    tuning.install()
    tuning.settle()
    frozen = gc.get_freeze_count()
    grown = [[i] for i in range(20_000)]  # the caches grow during a rollout (tracked lists)
    gc.collect()
    assert tuning.freezes == 2
    assert gc.get_freeze_count() >= frozen + len(grown)


def test_refresh_collects_cycles_that_died_frozen(tuning: gc_tuning.GcTuning) -> None:
    # The trade-off: a frozen cycle that becomes garbage waits for the next refresh.
    tuning.install()
    cycle = _Cycle()
    gone = weakref.ref(cycle)
    tuning.settle()  # alive now: frozen
    del cycle
    gc.collect()
    assert gone() is not None
    assert not tuning.refresh()  # not due yet
    tuning.clock[0] += 100.0  # type: ignore[attr-defined]
    assert tuning.refresh()
    assert gone() is None
    assert gc.get_freeze_count() > 0  # frozen again


def test_uninstall_restores_the_collector(tuning: gc_tuning.GcTuning) -> None:
    before = gc.get_threshold()
    tuning.install()
    tuning.install()  # once only
    assert gc.callbacks.count(tuning._collected) == 1
    tuning.settle()
    tuning.uninstall()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
    assert tuning._collected not in gc.callbacks


class _FakeOperator:
    """What `main.run` reads of the operator; its caches "list" at once."""

    def __init__(self, client: object, settings: object) -> None:
        self.runtime = object()
        self.metrics = type("M", (), {"registry": None})()
        self.ready = asyncio.Event()
        self.cache = [[i] for i in range(5000)]

    async def run(self) -> None:
        self.ready.set()
        await asyncio.Event().wait()


class _FakeClient:
    async def close(self) -> None:
        return None


class _FakeListener:
    async def aclose(self) -> None:
        return None


def test_the_controller_command_tunes_its_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpu-operator controller` (controller/main.py `run`) tunes the collector once its caches
    are listed, and leaves it as it was when it stops."""
    assert gc.get_freeze_count() == 0
    before = gc.get_threshold()

    async def serve(*args: object, **kwargs: object) -> _FakeListener:
        return _FakeListener()

    monkeypatch.setattr(main, "Operator", _FakeOperator)
    monkeypatch.setattr(main.kube_client, "connect", lambda kubeconfig: _FakeClient())
    monkeypatch.setattr(main.endpoints, "serve", serve)
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        task = asyncio.create_task(main.run(
            kubeconfig=None, namespace="gpu-operator", leader_elect=False,
            metrics_address="127.0.0.1:0", health_address="127.0.0.1:0", environ={},
        ))  # fmt: skip
        for _ in range(200):
            await asyncio.sleep(0.01)
            if gc.get_freeze_count() > 0:
                break
        seen["frozen"] = gc.get_freeze_count()
        seen["threshold"] = gc.get_threshold()
        task.cancel()
        await task

    asyncio.run(scenario())
    assert seen["frozen"] >= 5000
    assert seen["threshold"][0] == gc_tuning.YOUNG_THRESHOLD
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
