"""Node labelling when a node switches between the container and VM stacks: the deploy labels
swap, and a pause left by an agent the node no longer runs does not outlive it."""

from __future__ import annotations

from test_labelling import GPU, apply, deploy, policy

from gpu_operator.api import keys
from gpu_operator.nodes.labelling import plan_node

D = keys.DEPLOY_PREFIX
SANDBOX = {"sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-vgpu"}}
VGPU_PAUSE = "paused-for-vgpu-change"
MIG_PAUSE = "paused-for-mig-change"


def _node(workload: str) -> tuple[dict[str, str], dict[str, str]]:
    return apply({**GPU, keys.GPU_WORKLOAD_CONFIG: workload}, {}, policy(**SANDBOX))


def test_a_vgpu_pause_ends_when_the_node_leaves_vm_vgpu() -> None:
    labels, annotations = _node("vm-vgpu")
    # The vGPU device manager paused the sandbox operands, then its node was switched.
    labels[D + "sandbox-device-plugin"] = VGPU_PAUSE
    labels[D + "sandbox-validator"] = VGPU_PAUSE
    labels[keys.GPU_WORKLOAD_CONFIG] = "vm-passthrough"
    labels, annotations = apply(labels, annotations, policy(**SANDBOX))
    assert labels[D + "sandbox-device-plugin"] == "true"
    assert labels[D + "sandbox-validator"] == "true"
    assert D + "vgpu-device-manager" not in labels
    assert labels[D + "vfio-manager"] == "true"


def test_a_vgpu_pause_is_kept_while_the_vgpu_device_manager_runs() -> None:
    labels, annotations = _node("vm-vgpu")
    labels[D + "sandbox-device-plugin"] = VGPU_PAUSE
    plan = plan_node(labels, annotations, policy(**SANDBOX))
    assert D + "sandbox-device-plugin" not in plan.labels
    assert plan.conflicts == []


def test_a_mig_pause_ends_when_the_node_leaves_the_container_stack() -> None:
    labels, annotations = _node("container")
    labels[keys.GPU_PRODUCT] = "NVIDIA-A100-SXM4-40GB"  # MIG capable
    labels, annotations = apply(labels, annotations, policy(**SANDBOX))
    assert labels[D + "mig-manager"] == "true"
    # A MIG change paused labels, among them one both stacks deploy; the node moves to VMs.
    labels[D + "device-plugin"] = MIG_PAUSE
    labels[D + "client"] = MIG_PAUSE
    labels[keys.GPU_WORKLOAD_CONFIG] = "vm-passthrough"
    labels, annotations = apply(labels, annotations, policy(**SANDBOX))
    assert D + "device-plugin" not in labels
    assert D + "mig-manager" not in labels
    assert labels[D + "client"] == "true"


def test_a_mig_pause_is_kept_on_a_container_node() -> None:
    labels, annotations = _node("container")
    labels[D + "device-plugin"] = MIG_PAUSE
    labels[keys.GPU_PRODUCT] = "NVIDIA-A100-SXM4-40GB"  # MIG capable: the MIG manager runs
    labels, annotations = apply(labels, annotations, policy(**SANDBOX))
    assert labels[D + "device-plugin"] == MIG_PAUSE


def test_switching_back_and_forth_ends_with_the_same_labels() -> None:
    first, annotations = _node("vm-passthrough")
    labels = {**first, keys.GPU_WORKLOAD_CONFIG: "container"}
    labels, annotations = apply(labels, annotations, policy(**SANDBOX))
    assert deploy(labels)[D + "driver"] == "true"
    labels[keys.GPU_WORKLOAD_CONFIG] = "vm-passthrough"
    labels, annotations = apply(labels, annotations, policy(**SANDBOX))
    assert deploy(labels) == deploy(first)
