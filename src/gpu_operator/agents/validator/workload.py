"""The cuda and plugin workload pods, and how to read one's status into a verdict (pure).

The pods follow upstream's manifests (`cuda-workload-validation.yaml`,
`plugin-workload-validation.yaml`): `vectorAdd` in an init container, a trivial main container,
`restartPolicy: OnFailure`, the validator's service account, the validator DaemonSet's owner
references and tolerations, and image, pull policy, pull secrets and runtime class from the
validator's env. The cuda pod is pinned with `nodeName` and gets every GPU through the runtime
(`NVIDIA_VISIBLE_DEVICES=all` and the CDI annotation); the plugin pod requests one GPU resource.

Differences, on purpose: the plugin pod is pinned with node affinity instead of `nodeName`, so it
goes through the scheduler (a full node is `Insufficient nvidia.com/gpu`, not the kubelet's
`UnexpectedAdmissionError`); the containers use `terminationMessagePolicy:
FallbackToLogsOnError`, so a failing `vectorAdd` explains itself in the pod status; and a verdict
is reached at the first failure instead of after the last retry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_operator.agents.validator import components

Obj = dict[str, Any]
VALIDATOR_DS = "nvidia-operator-validator"
SERVICE_ACCOUNT = "nvidia-operator-validator"
CUDA_APP = "nvidia-cuda-validator"
PLUGIN_APP = "nvidia-device-plugin-validator"
CUDA_INIT = "cuda-validation"
PLUGIN_INIT = "plugin-validation"
WORKLOAD_PROGRAM = "vectorAdd"
CDI_ANNOTATION_PREFIX = "nvidia.cdi.k8s.io/container."
MANAGEMENT_ALL_GPUS = "management.nvidia.com/gpu=all"
DEFAULT_TOLERATIONS = ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)
FALLBACK_TO_LOGS = "FallbackToLogsOnError"
# Waiting reasons that mean the container will not run as it is (anything else is progress).
FAILING_WAITS = frozenset(
    {
        "CreateContainerError",
        "CreateContainerConfigError",
        "RunContainerError",
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
    }
)
# Pod events that mean no container of it can start (the runtime handler is missing, ...).
FAILING_EVENTS = frozenset({"FailedCreatePodSandBox"})


@dataclass(frozen=True)
class WorkloadSpec:
    """What the validator's env says about the workload pods."""

    image: str
    pull_policy: str = ""
    pull_secrets: tuple[str, ...] = ()
    runtime_class: str = ""


def _base(spec: WorkloadSpec, namespace: str, app: str, validator_ds: Obj | None, init: Obj) -> Obj:
    template = ((validator_ds or {}).get("spec") or {}).get("template") or {}
    tolerations = (template.get("spec") or {}).get("tolerations")
    owners = ((validator_ds or {}).get("metadata") or {}).get("ownerReferences") or []
    main: Obj = {
        "name": app,
        "image": spec.image,
        "command": ["nvidia-validator"],
        "args": ["--version"],
        "securityContext": {"readOnlyRootFilesystem": True},
        "terminationMessagePolicy": FALLBACK_TO_LOGS,
    }
    metadata: Obj = {"generateName": f"{app}-", "namespace": namespace, "labels": {"app": app}}
    if owners:
        metadata["ownerReferences"] = [dict(o) for o in owners]
    pod_spec: Obj = {
        "tolerations": [dict(t) for t in (tolerations or DEFAULT_TOLERATIONS)],
        "restartPolicy": "OnFailure",
        "serviceAccountName": SERVICE_ACCOUNT,
        "initContainers": [init],
        "containers": [main],
    }
    for container in (init, main):
        if spec.pull_policy:
            container["imagePullPolicy"] = spec.pull_policy
    if spec.pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in spec.pull_secrets]
    if spec.runtime_class:
        pod_spec["runtimeClassName"] = spec.runtime_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def cuda_pod(spec: WorkloadSpec, namespace: str, node: str, validator_ds: Obj | None) -> Obj:
    """The cuda workload: `vectorAdd` on every GPU the runtime injects, pinned to `node`."""
    init: Obj = {
        "name": CUDA_INIT,
        "image": spec.image,
        "command": [WORKLOAD_PROGRAM],
        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        "securityContext": {"privileged": True},
        "terminationMessagePolicy": FALLBACK_TO_LOGS,
    }
    pod = _base(spec, namespace, CUDA_APP, validator_ds, init)
    pod["metadata"]["annotations"] = {CDI_ANNOTATION_PREFIX + CUDA_INIT: MANAGEMENT_ALL_GPUS}
    pod["spec"]["nodeName"] = node
    pod["spec"]["containers"][0]["securityContext"]["privileged"] = True
    return pod


def plugin_pod(
    spec: WorkloadSpec, namespace: str, node: str, resource: str, validator_ds: Obj | None
) -> Obj:
    """The plugin workload: `vectorAdd` on one `resource` device the device plugin allocates,
    scheduled onto `node`."""
    limits = {resource: "1"}
    init: Obj = {
        "name": PLUGIN_INIT,
        "image": spec.image,
        "command": [WORKLOAD_PROGRAM],
        "resources": {"limits": dict(limits), "requests": dict(limits)},
        "securityContext": {"allowPrivilegeEscalation": False},
        "terminationMessagePolicy": FALLBACK_TO_LOGS,
    }
    pod = _base(spec, namespace, PLUGIN_APP, validator_ds, init)
    pod["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = False
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
        }
    }
    return pod


@dataclass(frozen=True)
class Verdict:
    """Where a workload pod stands: `succeeded`, `failed` (with why) or `running` (with what it
    is doing, for the log and for a timeout's message)."""

    state: str
    detail: str

    @property
    def done(self) -> bool:
        return self.state != "running"


def _terminated_failure(name: str, terminated: Mapping[str, Any]) -> str:
    code = terminated.get("exitCode")
    reason = str(terminated.get("reason") or "Error")
    message = components.output_tail(str(terminated.get("message") or ""))
    # "Error" says nothing the exit code does not; other reasons (StartError, ...) do.
    text = f"container {name}" if reason == "Error" else f"container {name}: {reason}"
    text += f" (exit code {code})"
    return f"{text}: {message}" if message else text


def _container_failure(status: Mapping[str, Any]) -> str | None:
    name = status.get("name", "?")
    state = status.get("state") or {}
    waiting = state.get("waiting") or {}
    if waiting.get("reason") in FAILING_WAITS:
        message = components.output_tail(str(waiting.get("message") or ""))
        text = f"container {name}: {waiting['reason']}"
        return f"{text}: {message}" if message else text
    for terminated in (state.get("terminated"), (status.get("lastState") or {}).get("terminated")):
        if terminated and int(terminated.get("exitCode") or 0) != 0:
            return _terminated_failure(name, terminated)
    return None


def _progress(pod: Mapping[str, Any]) -> str:
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            message = condition.get("message") or condition.get("reason") or "unschedulable"
            return f"not scheduled: {message}"
    phase = str(status.get("phase") or "Pending")
    for kind in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(kind) or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") not in (None, "PodInitializing"):
                return f"{phase} (container {container.get('name')}: {waiting['reason']})"
            if "running" in (container.get("state") or {}):
                return f"{phase} (container {container.get('name')} running)"
    return phase


def pod_verdict(pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]] = ()) -> Verdict:
    """Read a workload pod (and its Events) into a verdict."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return Verdict("failed", "the pod is being deleted")
    phase = status.get("phase")
    if phase == "Succeeded":
        return Verdict("succeeded", "Succeeded")
    for kind in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(kind) or []:
            failure = _container_failure(container)
            if failure is not None:
                return Verdict("failed", failure)
    if phase == "Failed":
        reason = status.get("reason") or "Failed"
        message = status.get("message")
        return Verdict("failed", f"{reason}: {message}" if message else str(reason))
    for event in events:
        if event.get("type") == "Warning" and event.get("reason") in FAILING_EVENTS:
            return Verdict("failed", f"{event['reason']}: {event.get('message', '')}".rstrip(": "))
    return Verdict("running", _progress(pod))
