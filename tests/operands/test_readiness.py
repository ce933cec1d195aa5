"""DaemonSet and Deployment readiness (reference §3.6) with explanations."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.operands.readiness import daemonset_readiness, termination_message

UID = "ds-uid"


def ds(
    strategy: str = "RollingUpdate", name: str = "nvidia-driver-daemonset", **status: Any
) -> dict[str, Any]:
    base = {
        "desiredNumberScheduled": 3,
        "numberUnavailable": 0,
        "updatedNumberScheduled": 3,
        "numberAvailable": 3,
        "observedGeneration": 2,
    }
    base.update(status)
    return {
        "metadata": {"name": name, "uid": UID, "generation": 2},
        "spec": {"updateStrategy": {"type": strategy}},
        "status": base,
    }


def ready_status(name: str = "main") -> dict[str, Any]:
    return {"name": name, "ready": True, "restartCount": 0, "state": {"running": {}}}


def pod(
    node: str,
    *,
    revision: str = "new",
    phase: str = "Running",
    init: list[Any] | None = None,
    containers: list[Any] | None = None,
    owner: str = UID,
    **extra: Any,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "containerStatuses": containers or [ready_status()]}
    if init is not None:
        status["initContainerStatuses"] = init
    status.update(extra)
    return {
        "metadata": {
            "name": f"p-{node}",
            "labels": {"controller-revision-hash": revision},
            "ownerReferences": [{"kind": "DaemonSet", "uid": owner}],
        },
        "spec": {"nodeName": node},
        "status": status,
    }


REVISIONS = [
    {
        "metadata": {
            "name": "nvidia-driver-daemonset-old",
            "labels": {"controller-revision-hash": "old"},
        },
        "revision": 1,
    },
    {
        "metadata": {
            "name": "nvidia-driver-daemonset-new",
            "labels": {"controller-revision-hash": "new"},
        },
        "revision": 2,
    },
    {
        "metadata": {"name": "other-ds-zzz", "labels": {"controller-revision-hash": "zzz"}},
        "revision": 9,
    },
]
CRASHING = {
    "name": "k8s-driver-manager",
    "ready": False,
    "restartCount": 4,
    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
}


def test_nothing_desired_is_ready() -> None:
    result = daemonset_readiness(ds(desiredNumberScheduled=0, numberAvailable=0), [], [])
    assert (result.ready, result.desired, result.not_ready, result.reason) == (True, 0, 0, "")


def test_rolling_update_complete_is_ready() -> None:
    assert daemonset_readiness(ds(), [], []).ready


@pytest.mark.parametrize(
    ("status", "fragment"),
    [
        ({"observedGeneration": 1}, "has not seen the latest spec"),
        ({"updatedNumberScheduled": 2}, "2/3 pods updated, 3/3 available"),
        ({"numberAvailable": 1}, "3/3 pods updated, 1/3 available"),
    ],
)
def test_rolling_update_not_done(status: dict[str, Any], fragment: str) -> None:
    result = daemonset_readiness(ds(**status), [], [])
    assert not result.ready
    assert fragment in result.reason


def test_unavailable_pods_are_explained_by_the_first_concrete_problem() -> None:
    pods = [
        pod("gpu-1"),
        pod("gpu-17", phase="Pending", init=[CRASHING], containers=[]),
        pod(
            "gpu-2",
            phase="Pending",
            init=[],
            containers=[
                {
                    "name": "main",
                    "ready": False,
                    "state": {"waiting": {"reason": "ContainerCreating"}},
                }
            ],
        ),
    ]
    result = daemonset_readiness(ds(numberUnavailable=2, numberAvailable=1), pods, [])
    assert not result.ready
    assert (result.desired, result.not_ready) == (3, 2)
    assert result.reason == (
        "nvidia-driver-daemonset: 2/3 pods not ready; "
        "gpu-17: init container k8s-driver-manager in CrashLoopBackOff (restarted 4 times)"
    )


@pytest.mark.parametrize(
    ("bad_pod", "fragment"),
    [
        (
            pod(
                "n",
                phase="Pending",
                containers=[],
                conditions=[
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/3 nodes are available",
                    }
                ],
            ),
            "n: pod not scheduled (Unschedulable: 0/3 nodes are available)",
        ),
        (
            pod(
                "n",
                phase="Pending",
                containers=[
                    {
                        "name": "main",
                        "ready": False,
                        "state": {
                            "waiting": {
                                "reason": "ImagePullBackOff",
                                "message": 'Back-off pulling image "nvcr.io/x:1"',
                            }
                        },
                    }
                ],
            ),
            'n: container main in ImagePullBackOff: Back-off pulling image "nvcr.io/x:1"',
        ),
        (
            pod(
                "n",
                containers=[
                    {"name": "main", "ready": False, "restartCount": 2, "state": {"running": {}}}
                ],
            ),
            "n: container main is not ready (restarted 2 times)",
        ),
        (
            pod(
                "n",
                phase="Pending",
                init=[
                    {
                        "name": "toolkit-validation",
                        "ready": False,
                        "state": {"terminated": {"exitCode": 1, "reason": "Error"}},
                    }
                ],
                containers=[],
            ),
            "n: init container toolkit-validation terminated with exit code 1 (Error)",
        ),
        (
            pod(
                "n",
                phase="Pending",
                init=[
                    {
                        "name": "cuda-validation",
                        "ready": False,
                        "restartCount": 3,
                        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                        "lastState": {
                            "terminated": {
                                "exitCode": 1,
                                "reason": "Error",
                                "message": "cuda: pod nvidia-cuda-validator-x7k2p failed\n",
                            }
                        },
                    }
                ],
                containers=[],
            ),
            "n: init container cuda-validation in CrashLoopBackOff: cuda: pod "
            "nvidia-cuda-validator-x7k2p failed (restarted 3 times)",
        ),
        (
            pod(
                "n",
                phase="Pending",
                init=[
                    {
                        "name": "driver-validation",
                        "ready": False,
                        "state": {
                            "terminated": {
                                "exitCode": 1,
                                "reason": "Error",
                                "message": "log line\ndriver: not ready\n\n",
                            }
                        },
                    }
                ],
                containers=[],
            ),
            "n: init container driver-validation terminated with exit code 1 (Error): "
            "driver: not ready",
        ),
        (
            pod(
                "n",
                phase="Pending",
                init=[
                    {
                        "name": "cuda-validation",
                        "ready": False,
                        "restartCount": 2,
                        "state": {"running": {}},
                        "lastState": {"terminated": {"exitCode": 1, "message": "cuda: failed"}},
                    }
                ],
                containers=[],
            ),
            "n: init container cuda-validation is retrying (restarted 2 times): cuda: failed",
        ),
    ],
)
def test_problem_descriptions(bad_pod: dict[str, Any], fragment: str) -> None:
    result = daemonset_readiness(ds(desiredNumberScheduled=1, numberUnavailable=1), [bad_pod], [])
    assert result.reason.endswith(fragment)


def test_on_delete_ready_when_every_pod_runs_the_newest_revision() -> None:
    pods = [pod("a"), pod("b"), pod("c")]
    result = daemonset_readiness(ds("OnDelete", updatedNumberScheduled=0), pods, REVISIONS)
    assert (result.ready, result.reason) == (True, "")


def test_on_delete_out_of_date_pod_is_not_ready() -> None:
    pods = [pod("a"), pod("b", revision="old"), pod("c")]
    result = daemonset_readiness(ds("OnDelete"), pods, REVISIONS)
    assert not result.ready
    assert result.not_ready == 1
    assert result.reason == (
        "nvidia-driver-daemonset: 1/3 pods not ready or not up to date; "
        "b: runs an out-of-date revision (waiting to be replaced)"
    )


def test_on_delete_ignores_pods_of_other_owners_and_needs_pods() -> None:
    pods = [pod("a", revision="old", owner="someone-else")]
    result = daemonset_readiness(ds("OnDelete"), pods, REVISIONS)
    assert not result.ready
    assert "0/3 pods exist" in result.reason


def test_on_delete_not_running_pod_is_not_ready() -> None:
    pods = [pod("a"), pod("b", phase="Pending", init=[CRASHING], containers=[]), pod("c")]
    result = daemonset_readiness(ds("OnDelete"), pods, REVISIONS)
    assert not result.ready
    assert "b: init container k8s-driver-manager in CrashLoopBackOff" in result.reason


def test_on_delete_revision_from_name_when_unlabelled() -> None:
    revisions = [{"metadata": {"name": "nvidia-driver-daemonset-new"}, "revision": 3}]
    assert daemonset_readiness(ds("OnDelete"), [pod("a"), pod("b"), pod("c")], revisions).ready


def test_a_long_termination_message_is_shortened_to_a_status_line() -> None:
    long = "cuda: " + "x" * 400
    quoted = termination_message({"message": long})
    assert len(quoted) == 300
    assert quoted.startswith("cuda: x")
    assert quoted.endswith("...")
