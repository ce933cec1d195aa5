"""Termination messages: what a container writes to its terminationMessagePath, or with
`FallbackToLogsOnError` the tail of its log, is its `state.terminated.message` (then
`lastState` after a restart), shown by `kubectl describe`."""

from __future__ import annotations

from typing import Any

from kubesim_helpers import kubectl, needs_kubectl
from waiting import DEADLINE, eventually

import kubesim
from kubesim import PodContext, termination


def _pod(name: str, image: str, *, restart: str = "Never", policy: str | None = None) -> Any:
    container: dict[str, Any] = {"name": "main", "image": image}
    if policy is not None:
        container["terminationMessagePolicy"] = policy
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"restartPolicy": restart, "containers": [container]},
    }


def _status(sim: kubesim.Cluster, name: str) -> dict[str, Any]:
    pod = sim.store.get("pods", name, "default") or {}
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return dict(statuses[0])


async def _terminated(sim: kubesim.Cluster, name: str) -> dict[str, Any]:
    await eventually(
        lambda: "terminated" in (_status(sim, name).get("state") or {}),
        f"the container of {name} terminated",
        state=lambda: _status(sim, name),
    )
    return dict(_status(sim, name)["state"]["terminated"])


async def _failing_with_message(ctx: PodContext) -> int:
    ctx.log("checking the driver")
    ctx.write_termination_message("driver: not loaded")
    return 1


async def _failing_quietly(ctx: PodContext) -> int:
    for i in range(100):
        ctx.log(f"line {i}")
    return 2


async def _succeeding_quietly(ctx: PodContext) -> int:
    ctx.log("all good")
    return 0


@needs_kubectl
async def test_the_written_message_is_the_terminated_message_and_describe_shows_it(
    sim: kubesim.Cluster,
) -> None:
    sim.register_pod_runner(_failing_with_message, image="example/msg")
    sim.store.create(_pod("msg", "example/msg"))
    terminated = await _terminated(sim, "msg")
    assert (terminated["exitCode"], terminated["message"]) == (1, "driver: not loaded")
    described = await kubectl(sim, "describe", "pod", "msg")
    assert "Message:      driver: not loaded" in described


async def test_a_restarted_container_keeps_its_message_in_last_state(
    sim: kubesim.Cluster,
) -> None:
    sim.register_pod_runner(_failing_with_message, image="example/again")
    sim.store.create(_pod("again", "example/again", restart="Always"))

    def restarted() -> bool:
        return bool(_status(sim, "again").get("lastState", {}).get("terminated"))

    await sim.wait_for(restarted, DEADLINE)
    last = _status(sim, "again")["lastState"]["terminated"]
    assert last["message"] == "driver: not loaded"


async def test_fallback_to_logs_uses_the_last_80_lines_of_a_failed_container(
    sim: kubesim.Cluster,
) -> None:
    sim.register_pod_runner(_failing_quietly, image="example/quiet")
    sim.store.create(_pod("quiet", "example/quiet", policy="FallbackToLogsOnError"))
    message = (await _terminated(sim, "quiet"))["message"]
    lines = message.splitlines()
    assert len(lines) == 80
    assert (lines[0], lines[-1]) == ("line 20", "line 99")


async def test_the_file_policy_reports_no_message_when_nothing_was_written(
    sim: kubesim.Cluster,
) -> None:
    sim.register_pod_runner(_failing_quietly, image="example/file")
    sim.store.create(_pod("file", "example/file"))
    assert "message" not in await _terminated(sim, "file")


async def test_fallback_to_logs_leaves_a_successful_container_without_message(
    sim: kubesim.Cluster,
) -> None:
    sim.register_pod_runner(_succeeding_quietly, image="example/ok")
    sim.store.create(_pod("ok", "example/ok", policy="FallbackToLogsOnError"))
    assert "message" not in await _terminated(sim, "ok")


def test_a_written_message_keeps_its_last_4_kib() -> None:
    text = "x" * 5000 + "the end"
    message = termination.message("File", text, 1, "")
    assert len(message.encode()) == 4096
    assert message.endswith("the end")


def test_the_log_fallback_keeps_its_last_2_kib() -> None:
    log = "".join(f"{'y' * 99}\n" for _ in range(50)) + "failed: reason\n"
    message = termination.message("FallbackToLogsOnError", None, 3, log)
    assert len(message.encode()) == 2048
    assert message.endswith("failed: reason\n")


def test_a_written_message_wins_over_the_log() -> None:
    assert termination.message("FallbackToLogsOnError", "mine", 1, "log line\n") == "mine"
