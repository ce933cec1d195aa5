"""The node protocol as pure decisions: state values, which deploy labels to pause and how to
restore them, which pods must leave the node first, and the label/annotation patches.

Pausing: upstream rewrites every GPU-client deploy label that is not `false` to
`paused-for-mig-change` and afterwards sets everything that is not `false` to `true`, so an absent
label or another pause (a driver upgrade's) comes back as `true`. Here only labels that are `true`
are paused, and only labels still holding our pause value are restored: an absent label stays
absent, a `false` (or any value a human set meanwhile) stays as it is, and a pause left behind by a
crashed run is restored by the next one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpu_operator.api import keys

STATE_PENDING = "pending"
STATE_REBOOTING = "rebooting"
STATE_SUCCESS = "success"
STATE_FAILED = "failed"
STATES = (STATE_PENDING, STATE_REBOOTING, STATE_SUCCESS, STATE_FAILED)
PAUSED = "paused-for-mig-change"
STATE_MESSAGE_ANNOTATION = keys.MIG_CONFIG_STATE_MESSAGE
# The GPU clients upstream pauses, as deploy-label suffixes.
GPU_CLIENT_OPERANDS = (
    "device-plugin",
    "gpu-feature-discovery",
    "dcgm-exporter",
    "dcgm",
    "nvsm",
    "client",
)
# Their pods (app label) in the operator's namespace, waited for until they have left the node.
GPU_CLIENT_APPS = (
    "nvidia-device-plugin-daemonset",
    "gpu-feature-discovery",
    "nvidia-dcgm-exporter",
    "nvidia-dcgm",
)
CLIENT_SELECTOR_KEY = keys.DEPLOY_PREFIX + "client"
# Validator pods deleted before the change (they hold GPUs) and after it (to re-validate).
VALIDATOR_APPS_BEFORE = ("nvidia-cuda-validator", "nvidia-device-plugin-validator")
VALIDATOR_APPS_AFTER = ("nvidia-operator-validator",)


def deploy_key(operand: str) -> str:
    return keys.DEPLOY_PREFIX + operand


def pause_patch(labels: Mapping[str, str]) -> dict[str, str]:
    """The deploy labels to set to `paused-for-mig-change`: the GPU clients that are `true`."""
    return {
        deploy_key(op): PAUSED for op in GPU_CLIENT_OPERANDS if labels.get(deploy_key(op)) == "true"
    }


def restore_patch(labels: Mapping[str, str]) -> dict[str, str]:
    """The deploy labels to set back to `true`: those still holding our pause value."""
    return {key: "true" for key, value in labels.items() if _is_deploy(key) and value == PAUSED}


def _is_deploy(key: str) -> bool:
    return key.startswith(keys.DEPLOY_PREFIX) and key != keys.DEPLOY_OPERANDS


@dataclass(frozen=True)
class PodRef:
    """What the protocol needs to know about a pod on this node."""

    namespace: str
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    daemonset: bool = False


def is_gpu_client(pod: PodRef, clients_namespace: str) -> bool:
    """A GPU-client operand pod, or any DaemonSet pod selecting on the `client` deploy label."""
    if pod.namespace == clients_namespace and pod.labels.get("app") in GPU_CLIENT_APPS:
        return True
    return pod.daemonset and CLIENT_SELECTOR_KEY in pod.node_selector


def waiting_for(pods: Sequence[PodRef], clients_namespace: str) -> list[PodRef]:
    """The GPU-client pods still on the node."""
    return [p for p in pods if is_gpu_client(p, clients_namespace)]


def validators(pods: Sequence[PodRef], clients_namespace: str, apps: Sequence[str]) -> list[PodRef]:
    """Validator pods (by app label) in the operator's namespace."""
    return [p for p in pods if p.namespace == clients_namespace and p.labels.get("app") in apps]


def state_patch(state: str, message: str | None = None) -> dict[str, object]:
    """A merge patch setting the state label and its message annotation (None removes it)."""
    return {
        "metadata": {
            "labels": {keys.MIG_CONFIG_STATE: state},
            "annotations": {STATE_MESSAGE_ANNOTATION: message},
        }
    }


def wanted_config(value: str | None) -> str | None:
    """The config a label value asks for; empty values are ignored, as upstream ignores them."""
    value = (value or "").strip()
    return value or None
