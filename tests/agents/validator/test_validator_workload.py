"""The workload pods as upstream builds them, and reading a pod's status into one verdict."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.agents.validator import workload

SPEC = workload.WorkloadSpec(
    image="nvcr.io/nvidia/gpu-operator:v26.7.0",
    pull_policy="IfNotPresent",
    pull_secrets=("regcred",),
    runtime_class="nvidia",
)
DS: dict[str, Any] = {
    "metadata": {
        "name": "nvidia-operator-validator",
        "ownerReferences": [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "uid": "u"}],
    },
    "spec": {"template": {"spec": {"tolerations": [{"key": "a", "operator": "Exists"}]}}},
}


def test_the_cuda_pod_runs_vector_add_on_every_gpu_pinned_to_the_node() -> None:
    pod = workload.cuda_pod(SPEC, "gpu-operator", "node-1", DS)
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["generateName"] == "nvidia-cuda-validator-"
    assert meta["labels"] == {"app": "nvidia-cuda-validator"}
    assert meta["annotations"] == {
        "nvidia.cdi.k8s.io/container.cuda-validation": "management.nvidia.com/gpu=all"
    }
    assert meta["ownerReferences"] == DS["metadata"]["ownerReferences"]
    assert spec["nodeName"] == "node-1"
    assert spec["tolerations"] == [{"key": "a", "operator": "Exists"}]
    assert (spec["restartPolicy"], spec["serviceAccountName"]) == (
        "OnFailure",
        "nvidia-operator-validator",
    )
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    [init] = spec["initContainers"]
    assert (init["name"], init["command"], init["image"]) == (
        "cuda-validation",
        ["vectorAdd"],
        SPEC.image,
    )
    assert init["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert spec["containers"][0]["name"] == "nvidia-cuda-validator"


def test_the_plugin_pod_requests_one_device_and_goes_through_the_scheduler() -> None:
    pod = workload.plugin_pod(SPEC, "gpu-operator", "node-1", "nvidia.com/mig-1g.10gb", None)
    spec = pod["spec"]
    assert "nodeName" not in spec
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
    ]
    [init] = spec["initContainers"]
    assert init["resources"] == {
        "limits": {"nvidia.com/mig-1g.10gb": "1"},
        "requests": {"nvidia.com/mig-1g.10gb": "1"},
    }
    assert pod["metadata"]["labels"] == {"app": "nvidia-device-plugin-validator"}
    assert "ownerReferences" not in pod["metadata"]
    assert spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]


def _pod(phase: str = "Pending", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "status": {"phase": phase, **status}}


def _init(**fields: Any) -> dict[str, Any]:
    return {"name": "cuda-validation", **fields}


@pytest.mark.parametrize(
    ("pod", "events", "state", "detail"),
    [
        (_pod("Succeeded"), [], "succeeded", "Succeeded"),
        (
            _pod(initContainerStatuses=[_init(state={"terminated": {
                "exitCode": 1, "reason": "Error",
                "message": "[Vector addition of 50000 elements]\nFailed to allocate device "
                           "vector A (error code no CUDA-capable device is detected)!\n"}})]),
            [],
            "failed",
            "container cuda-validation (exit code 1): Failed to allocate device vector A "
            "(error code no CUDA-capable device is detected)!",
        ),
        (
            _pod(initContainerStatuses=[_init(
                state={"waiting": {"reason": "CrashLoopBackOff"}},
                lastState={"terminated": {"exitCode": 128, "reason": "StartError", "message": "x"}},
            )]),
            [],
            "failed",
            "container cuda-validation: StartError (exit code 128): x",
        ),
        (
            _pod(initContainerStatuses=[_init(state={"waiting": {
                "reason": "CreateContainerError",
                "message": "unresolvable CDI devices management.nvidia.com/gpu=all"}})]),
            [],
            "failed",
            "container cuda-validation: CreateContainerError: unresolvable CDI devices "
            "management.nvidia.com/gpu=all",
        ),
        (
            _pod(),
            [{"type": "Warning", "reason": "FailedCreatePodSandBox",
              "message": 'no runtime for "nvidia" is configured'}],
            "failed",
            'FailedCreatePodSandBox: no runtime for "nvidia" is configured',
        ),
        (
            _pod("Failed", reason="UnexpectedAdmissionError", message="Allocate failed"),
            [],
            "failed",
            "UnexpectedAdmissionError: Allocate failed",
        ),
        (
            _pod(conditions=[{"type": "PodScheduled", "status": "False",
                              "message": "0/3 nodes are available: Insufficient nvidia.com/gpu"}]),
            [],
            "running",
            "not scheduled: 0/3 nodes are available: Insufficient nvidia.com/gpu",
        ),
        (
            _pod(initContainerStatuses=[_init(state={"running": {}})]),
            [{"type": "Normal", "reason": "Pulled", "message": "ok"}],
            "running",
            "Pending (container cuda-validation running)",
        ),
        (_pod(), [], "running", "Pending"),
    ],
)  # fmt: skip
def test_pod_verdicts(
    pod: dict[str, Any], events: list[dict[str, Any]], state: str, detail: str
) -> None:
    verdict = workload.pod_verdict(pod, events)
    assert (verdict.state, verdict.detail) == (state, detail)


def test_a_pod_being_deleted_has_failed() -> None:
    pod = {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}, "status": {}}
    assert workload.pod_verdict(pod).state == "failed"
