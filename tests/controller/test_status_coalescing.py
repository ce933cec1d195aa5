"""ClusterPolicy status writes are coalesced: at most one per window, the newest always written
when the window ends even if no further event comes (status/coalesce.py)."""

from __future__ import annotations

import itertools
import time
from typing import Any

from operator_harness import NAMESPACE, Env, policy

from kubesim.store import Event

POLICIES = "clusterpolicies.nvidia.com"
EXPORTER = "nvidia-dcgm-exporter"


def status_writes(env: Env) -> list[tuple[float, dict[str, Any]]]:
    """(commit time, status) of every change to the ClusterPolicy's status from now on."""
    seen: list[tuple[float, dict[str, Any]]] = []

    def record(event: Event) -> None:
        if event.type == "MODIFIED" and event.old is not None:
            new, old = event.new.obj.get("status"), event.old.obj.get("status")
            if new != old:
                seen.append((time.monotonic(), new or {}))

    env.sim.store.subscribe(record, keys=[("nvidia.com", "clusterpolicies")])
    return seen


def flip(env: Env, value: str) -> None:
    env.sim.store.patch(
        POLICIES, "cluster-policy",
        {"spec": {"dcgmExporter": {"env": [{"name": "FLIP", "value": value}]}}},
    )  # fmt: skip


def rolled_out(env: Env, value: str) -> bool:
    """The exporter DaemonSet has FLIP=value and every pod runs that spec."""
    ds = env.sim.store.get("daemonsets", EXPORTER, NAMESPACE) or {}
    containers = ds.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or [{}]
    if {"name": "FLIP", "value": value} not in (containers[0].get("env") or []):
        return False
    status = ds.get("status") or {}
    desired = status.get("desiredNumberScheduled")
    return bool(
        status.get("observedGeneration") == ds["metadata"].get("generation")
        and desired
        and status.get("updatedNumberScheduled") == desired == status.get("numberAvailable")
    )


def ready_for_generation(env: Env) -> bool:
    current = env.policy()
    status = current.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
    return bool(
        status.get("state") == "ready"
        and ready.get("observedGeneration") == current["metadata"]["generation"]
    )


async def test_quick_edits_write_the_status_at_most_once_a_second(env: Env) -> None:
    writes = status_writes(env)
    env.sim.store.create(policy())
    env.start_operator(status_write_interval=1.0)
    await env.wait_ready()
    # Eight edits, each rolled out before the next: several windows' worth of status changes.
    for index in range(8):
        value = str(index)
        flip(env, value)
        await env.wait(lambda v=value: rolled_out(env, v), f"the exporter rolled out {value}")
    await env.wait(lambda: ready_for_generation(env), "ready for the last edit")
    times = [t for t, _ in writes]
    assert len(times) >= 2, "creating the policy alone goes notReady, then ready"
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # The operator measures the window from when its write returned; commits here come a
    # little earlier than that, never a window too early.
    assert all(gap >= 0.9 for gap in gaps), gaps
    assert writes[-1][1]["state"] == "ready"


async def test_the_newest_status_is_written_when_the_window_ends_without_another_event(
    env: Env,
) -> None:
    window = 2.0
    writes = status_writes(env)
    env.sim.store.create(policy())
    env.start_operator(status_write_interval=window)
    await env.wait_ready()
    before = len(writes)
    flip(env, "1")
    await env.wait(lambda: rolled_out(env, "1"), "the exporter rolled out")
    rolled_at = time.monotonic()
    # The two-node rollout ended inside the window opened by the ready write: its statuses
    # were deferred, and the pass queued for the window's end writes the newest one, though
    # no event comes after the rollout.
    await env.wait(lambda: ready_for_generation(env), "ready after the window")
    assert len(writes) == before + 1, [s["state"] for _, s in writes[before - 1 :]]
    previous_at, written_at = writes[before - 1][0], writes[before][0]
    assert written_at > rolled_at
    assert window - 0.1 <= written_at - previous_at <= window + 2.0, written_at - previous_at
