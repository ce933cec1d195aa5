"""must-gather's log phase: reads run concurrently but the archive is the one a sequential run
makes (order, byte limits), the deadline cuts what is still in flight and says so, and only
logs that exist are asked for."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from gpu_operator.kube import explain_read
from gpu_operator.kube import must_gather as mg
from gpu_operator.status import explain

JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJlLWJ5dGVz"


class SlowSource:
    """Log texts served after a random number of event-loop turns, so reads finish out of
    order; records how many were in flight at once."""

    def __init__(self, texts: dict[str, str], seed: int = 7, hang: frozenset[str] = frozenset()):
        self.texts = texts
        self.random = random.Random(seed)
        self.hang = hang
        self.in_flight = 0
        self.most_in_flight = 0
        self.asked: list[str] = []

    async def read(self, item: mg.LogRead) -> str:
        self.asked.append(item.path)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if item.pod in self.hang:
                await asyncio.Event().wait()  # a kubelet that never answers
            for _ in range(self.random.randrange(30)):
                await asyncio.sleep(0)  # yield to the loop: other reads overtake this one
            text = self.texts[item.path]
            if text == "boom":
                raise ConnectionError("connection reset by peer")
            return text
        finally:
            self.in_flight -= 1


def reads_and_texts(count: int, seed: int = 1) -> tuple[list[mg.LogRead], dict[str, str]]:
    rng = random.Random(seed)
    reads = [mg.LogRead(f"pod-{i:03}", "c") for i in range(count)]
    return reads, {r.path: f"{r.pod} " + "x" * rng.randrange(0, 900) + "\n" for r in reads}


async def test_logs_are_committed_in_read_order_whatever_order_they_finish_in() -> None:
    reads, texts = reads_and_texts(200)
    source = SlowSource(texts)
    logs = await mg.collect_logs(reads, source.read, parallel=16, timeout=60)
    assert source.asked != [r.path for r in reads] or source.most_in_flight > 1
    assert source.most_in_flight == 16  # concurrent, and never more than asked for
    assert [path for path, _ in logs.files] == [r.path for r in reads]
    assert [data.decode() for _, data in logs.files] == [texts[r.path] for r in reads]
    assert logs.left_out == []
    assert logs.requests == 200


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_total_log_limit_is_exact_and_picks_the_same_logs_as_a_sequential_run(
    seed: int,
) -> None:
    reads, texts = reads_and_texts(300, seed)
    total = sum(len(t) for t in texts.values()) // 3
    sequential = await mg.collect_logs(
        reads, SlowSource(texts, seed).read, parallel=1, timeout=60, total_bytes=total
    )
    concurrent = await mg.collect_logs(
        reads, SlowSource(texts, seed + 10).read, parallel=32, timeout=60, total_bytes=total
    )
    assert concurrent.files == sequential.files
    assert concurrent.left_out == sequential.left_out
    kept = sum(len(data) for _, data in concurrent.files)
    assert kept == concurrent.bytes <= total
    assert total - kept < 900  # filled up to within one log of the limit
    first_left = len(concurrent.files)
    assert concurrent.left_out == [f"{r.path}: total log limit" for r in reads[first_left:]]
    # Once the logs read exceed the budget no more reads start: a third of the bytes fit, and
    # only the reads then in flight (32) and a few more are made past that point.
    assert first_left < concurrent.requests < first_left + 50 < len(reads)


async def test_a_log_larger_than_the_per_log_limit_is_cut_without_splitting_a_character() -> None:
    reads = [mg.LogRead("p", "c")]
    logs = await mg.collect_logs(
        reads, SlowSource({"logs/p/c.log": "ab" + "é" * 100}).read, per_log_bytes=7
    )
    [(_, data)] = logs.files
    assert data == "abéé".encode()  # 6 bytes: a third é would need bytes 7 and 8
    assert logs.bytes == 6


async def test_logs_are_redacted_before_they_are_measured_and_kept() -> None:
    reads = [mg.LogRead("p", "c")]
    source = SlowSource({"logs/p/c.log": f"token={JWT}\nstarted\n"})
    logs = await mg.collect_logs(reads, source.read)
    [(_, data)] = logs.files
    assert JWT.encode() not in data
    assert data == f"token={mg.REDACTED}\nstarted\n".encode()
    assert logs.bytes == len(data)


async def test_reads_still_running_at_the_deadline_are_cancelled_and_listed() -> None:
    reads, texts = reads_and_texts(40)
    hung = frozenset({"pod-005", "pod-017"})
    source = SlowSource(texts, hang=hung)
    logs = await mg.collect_logs(reads, source.read, parallel=4, timeout=0.5)
    kept = [path for path, _ in logs.files]
    assert kept == [r.path for r in reads if r.pod not in hung]
    assert logs.left_out == ["logs/pod-005/c.log: deadline", "logs/pod-017/c.log: deadline"]
    assert source.in_flight == 0  # the hung reads were cancelled, not left running


async def test_reads_never_started_before_the_deadline_are_listed() -> None:
    reads, texts = reads_and_texts(10)
    source = SlowSource(texts, hang=frozenset(r.pod for r in reads))
    logs = await mg.collect_logs(reads, source.read, parallel=2, timeout=0.2)
    assert logs.files == []
    assert logs.left_out == [f"{r.path}: deadline" for r in reads]
    assert logs.requests == 2


async def test_a_failed_read_is_listed_and_the_others_are_kept() -> None:
    reads, texts = reads_and_texts(5)
    texts["logs/pod-002/c.log"] = "boom"
    logs = await mg.collect_logs(reads, SlowSource(texts).read, parallel=3)
    assert [p for p, _ in logs.files] == [r.path for r in reads if r.pod != "pod-002"]
    assert logs.left_out == ["logs/pod-002/c.log: read failed: connection reset by peer"]


async def test_progress_counts_every_finished_read_once_and_ends_at_the_total() -> None:
    reads, texts = reads_and_texts(50)
    seen: list[tuple[str, int, int]] = []
    await mg.collect_logs(
        reads, SlowSource(texts).read, parallel=8,
        progress=lambda what, done, total: seen.append((what, done, total)),
    )  # fmt: skip
    assert seen == [("logs", n, 50) for n in range(51)]


async def test_parallel_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="parallel must be at least 1, not 0"):
        await mg.collect_logs([], SlowSource({}).read, parallel=0)


def pod(
    name: str, *statuses: dict[str, Any], init: tuple[dict[str, Any], ...] = (), app: str = "x"
) -> Any:
    return {
        "metadata": {"name": name, "labels": {"app.kubernetes.io/component": app}},
        "status": {"initContainerStatuses": list(init), "containerStatuses": list(statuses)},
    }


def status(
    name: str, state: str, *, ready: bool = False, restarts: int = 0, code: int | None = None
) -> dict[str, Any]:
    detail = {} if code is None else {"exitCode": code}
    return {"name": name, "state": {state: detail}, "ready": ready, "restartCount": restarts}


def test_previous_logs_are_read_only_for_restarted_containers_and_troubled_ones_first() -> None:
    pods = [
        pod("b-plugin", status("plugin", "running", ready=True, restarts=2)),
        pod(
            "a-driver",
            status("nvidia-driver-ctr", "running", ready=True),
            init=(status("k8s-driver-manager", "terminated", code=0),),
        ),
        pod("c-pending", status("toolkit", "waiting")),  # never started: no log to ask for
        pod("d-crashing", status("validator", "waiting", restarts=5)),
        pod("e-failed", status("dcgm", "terminated", code=1)),
        pod("z-operator", status("gpu-operator", "running", ready=True), app="gpu-operator"),
    ]
    assert [r.path for r in mg.log_reads(pods)] == [
        "logs/z-operator/gpu-operator.log",
        "logs/b-plugin/plugin.log",
        "logs/b-plugin/plugin.previous.log",
        "logs/d-crashing/validator.log",
        "logs/d-crashing/validator.previous.log",
        "logs/e-failed/dcgm.log",
        "logs/a-driver/k8s-driver-manager.log",
        "logs/a-driver/nvidia-driver-ctr.log",
    ]


def test_events_are_capped_keeping_warnings_and_the_newest_in_listed_order() -> None:
    def event(i: int, kind: str, minute: int) -> dict[str, Any]:
        return {"metadata": {"name": f"e{i}"}, "type": kind,
                "lastTimestamp": f"2025-01-01T00:{minute:02}:00Z"}  # fmt: skip

    events = [event(0, "Normal", 50), event(1, "Warning", 1), event(2, "Normal", 10),
              event(3, "Normal", 59), event(4, "Warning", 2)]  # fmt: skip
    kept = mg.newest_events(events, limit=3)
    assert [e["metadata"]["name"] for e in kept] == ["e1", "e3", "e4"]
    assert mg.newest_events(events, limit=5) == events


def test_explain_files_name_the_startup_gate_the_operator_deployment_sets() -> None:
    taint = {"key": "startup-taint.cluster-autoscaler.kubernetes.io/gpu", "value": "true",
             "effect": "NoSchedule"}  # fmt: skip
    deployment = {"spec": {"template": {"spec": {"containers": [{"name": "gpu-operator", "env": [
        {"name": "STARTUP_TAINT", "value": f"{taint['key']}=true:NoSchedule"}]}]}}}}  # fmt: skip
    node = {"metadata": {"name": "gpu-1", "labels": {}}, "spec": {"taints": [taint]}}
    gate_taint = explain_read.startup_taint_of([{"spec": {}}, deployment])
    assert gate_taint is not None
    assert gate_taint.key == taint["key"]
    verdict = explain.explain(mg.facts_for(node, [], {}, {}, None, gate_taint)).to_dict()
    assert verdict["startupGate"], verdict
    untainted = {"metadata": {"name": "gpu-2", "labels": {}}, "spec": {}}
    verdict = explain.explain(mg.facts_for(untainted, [], {}, {}, None, gate_taint)).to_dict()
    assert verdict["startupGate"] is None
