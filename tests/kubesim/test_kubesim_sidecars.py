"""Native sidecars (init containers with `restartPolicy: Always`): they start before the next
container and keep running beside the main ones; on deletion the main containers stop first and
the sidecars after them, last one first; a finished Job's sidecars are stopped."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubesim_helpers import TEST_IMAGES
from waiting import eventually

import kubesim
from kubesim import KubeletConfig, PodContext

FAST = KubeletConfig(
    init_container_duration=0.01,
    start_delay=0.01,
    ready_delay=0.01,
    restart_delay=0.05,
    restart_delay_max=0.2,
    command_duration=0.05,
    lease_interval=None,
)


@pytest.fixture
async def sim() -> AsyncIterator[kubesim.Cluster]:
    async with kubesim.Cluster(nodes=1, kubelet=FAST, images=TEST_IMAGES) as cluster:
        yield cluster


class Journal:
    """A runner that records starts and stops (in order) and runs until stopped."""

    def __init__(self, finish: set[str] | None = None) -> None:
        self.lines: list[str] = []
        self.finish = finish or set()

    async def __call__(self, ctx: PodContext) -> int:
        self.lines.append(f"start {ctx.container_name}")
        if ctx.container_name in self.finish:
            return 0
        await ctx.stopping.wait()
        self.lines.append(f"stop {ctx.container_name}")
        return 0


def pod(name: str, restart_policy: str = "Always") -> dict[str, Any]:
    image = "example/sidecar:1"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": "node-1",
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": 5,
            "initContainers": [
                {"name": "first-sidecar", "image": image, "restartPolicy": "Always"},
                {"name": "setup", "image": image},
                {"name": "second-sidecar", "image": image, "restartPolicy": "Always"},
            ],
            "containers": [{"name": "main", "image": image}],
        },
    }


def status(sim: kubesim.Cluster, name: str) -> dict[str, Any]:
    found = sim.store.get("pods", name, "default")
    assert found is not None
    return dict(found.get("status") or {})


def condition(sim: kubesim.Cluster, name: str, ctype: str) -> str:
    for c in status(sim, name).get("conditions") or []:
        if c["type"] == ctype:
            return str(c["status"])
    return ""


async def test_sidecars_run_beside_the_main_container_and_stop_after_it(
    sim: kubesim.Cluster,
) -> None:
    journal = Journal(finish={"setup"})
    sim.register_pod_runner(journal, image="example/sidecar:1")
    sim.store.create(pod("web"))
    await eventually(
        lambda: condition(sim, "web", "Ready") == "True",
        "pod web ready",
        state=lambda: (journal.lines, status(sim, "web")),
    )
    assert journal.lines == [
        "start first-sidecar",
        "start setup",
        "start second-sidecar",
        "start main",
    ]
    assert condition(sim, "web", "Initialized") == "True"
    sidecars = {s["name"]: s for s in status(sim, "web")["initContainerStatuses"]}
    assert "running" in sidecars["first-sidecar"]["state"]
    assert sidecars["first-sidecar"]["ready"] is True

    sim.store.delete("pods", "web", "default")
    await eventually(
        lambda: sim.store.get("pods", "web", "default") is None,
        "pod web gone",
        state=lambda: journal.lines,
    )
    assert journal.lines[4:] == ["stop main", "stop second-sidecar", "stop first-sidecar"]


async def test_a_finished_pods_sidecars_are_stopped(sim: kubesim.Cluster) -> None:
    journal = Journal(finish={"setup", "main"})
    sim.register_pod_runner(journal, image="example/sidecar:1")
    sim.store.create(pod("job", restart_policy="Never"))
    await eventually(
        lambda: status(sim, "job").get("phase") == "Succeeded",
        "pod job succeeded",
        state=lambda: (journal.lines, status(sim, "job")),
    )
    assert journal.lines[-2:] == ["stop second-sidecar", "stop first-sidecar"]
