"""The readiness gate end to end on kubesim, with the real kubectl: a GPU node registered with the
startup taint keeps GPU workloads Pending while the operator's operands (which tolerate the taint)
validate it; once the device plugin advertises GPUs and the validator pod is Ready, the operator
removes the taint, and only it, and the workload runs."""

from __future__ import annotations

import json

from kubesim_helpers import kubectl, needs_kubectl
from operator_harness import GPU_LABELS, NAMESPACE, Env, policy

from gpu_operator.controller import nodelabels
from gpu_operator.nodes import gate
from gpu_operator.nodes.gate import StartupTaint

TAINT = StartupTaint("nvidia.com/gpu-not-ready", "NoSchedule", "true")
# Another taint the node pool set: the gate must leave it alone.
OTHER = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
WORKLOAD = """
apiVersion: v1
kind: Pod
metadata: {name: cuda-job, namespace: default}
spec:
  tolerations: [{key: dedicated, operator: Exists, effect: NoSchedule}]
  containers:
    - name: main
      image: nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04
      resources: {limits: {nvidia.com/gpu: 1}}
"""


def _taints(env: Env, node: str) -> list[dict[str, str]]:
    found = env.sim.store.get("nodes", node)
    assert found is not None
    return list((found.get("spec") or {}).get("taints") or [])


def _validator_ready(env: Env, node: str) -> bool:
    for pod in env.sim.store.list("pods", namespace=NAMESPACE):
        if pod["spec"].get("nodeName") != node:
            continue
        if (pod["metadata"].get("labels") or {}).get("app") != nodelabels.VALIDATOR_APP:
            continue
        conditions = (pod.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return False


def _pod(env: Env) -> dict[str, object]:
    found = env.sim.store.get("pods", "cuda-job", namespace="default")
    assert found is not None
    return found


@needs_kubectl
async def test_a_new_gpu_node_opens_to_workloads_only_after_it_validated(env: Env) -> None:
    env.sim.add_node("new-gpu", labels=dict(GPU_LABELS), taints=[dict(TAINT.__dict__), OTHER])
    # The pool's own taint is the admin's to tolerate; the startup taint's toleration is added.
    dedicated = {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}
    env.sim.store.create(policy(daemonsets={"tolerations": [dedicated]}))
    env.start_operator(startup_taint=TAINT)
    # Operand pods tolerate the startup taint: the validator runs on the tainted node.
    await env.wait(lambda: _validator_ready(env, "new-gpu"), "validator Ready on new-gpu")
    validator = env.daemonsets()["nvidia-operator-validator"]
    tolerations = validator["spec"]["template"]["spec"]["tolerations"]
    assert tolerations == [dedicated, TAINT.toleration()]
    # No GPUs advertised yet: the workload cannot land anywhere and the taint stays.
    await kubectl(env.sim, "apply", "-f", "-", stdin=WORKLOAD)
    await env.wait(
        lambda: any(
            c.get("type") == "PodScheduled" and c.get("status") == "False"
            for c in (_pod(env).get("status") or {}).get("conditions") or []  # type: ignore[union-attr]
        ),
        "cuda-job unschedulable",
    )
    assert any(t["key"] == TAINT.key for t in _taints(env, "new-gpu"))
    # The device plugin registers: allocatable GPUs; the chain is now validated end to end.
    gpus = {"nvidia.com/gpu": "1"}
    await kubectl(
        env.sim, "patch", "node", "new-gpu", "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"capacity": gpus, "allocatable": gpus}}),
    )  # fmt: skip
    await env.wait(
        lambda: not any(t["key"] == TAINT.key for t in _taints(env, "new-gpu")),
        "startup taint removed",
    )
    assert _taints(env, "new-gpu") == [OTHER]
    await env.wait(lambda: _pod(env)["spec"].get("nodeName") == "new-gpu", "cuda-job scheduled")  # type: ignore[index, union-attr]
    described = await kubectl(env.sim, "describe", "node", "new-gpu")
    assert nodelabels.GATE_REASON in described
    assert "removed the startup taint nvidia.com/gpu-not-ready=true:NoSchedule" in described


async def test_without_the_setting_the_operator_leaves_the_taint_alone(env: Env) -> None:
    gpus = {"nvidia.com/gpu": "1"}
    env.sim.add_node(
        "new-gpu", labels=dict(GPU_LABELS), taints=[dict(TAINT.__dict__)], capacity=gpus
    )
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    assert [t["key"] for t in _taints(env, "new-gpu")] == [TAINT.key]
    # Operand pods do not tolerate a taint nobody configured.
    tolerations = env.daemonsets()["nvidia-operator-validator"]["spec"]["template"]["spec"][
        "tolerations"
    ]
    assert TAINT.toleration() not in tolerations


def _dra_slice(env: Env, node: str, devices: int) -> None:
    """The DRA kubelet plugin's ResourceSlice for the node (gpu.nvidia.com), with `devices`."""
    body = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": f"gpu-{i}"} for i in range(devices)]},
    }  # fmt: skip
    current = env.sim.store.get("resourceslices.resource.k8s.io", body["metadata"]["name"])
    if current is None:
        env.sim.store.create(body)
    else:
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        env.sim.store.update(body)


async def test_a_dra_node_opens_once_its_slices_publish_every_gpu(env: Env) -> None:
    """A DRA node (nvidia.com/dra-kubelet-plugin=true) never advertises allocatable
    nvidia.com/gpu: the gate opens once its gpu.nvidia.com ResourceSlices publish its GPUs."""
    labels = {**GPU_LABELS, "nvidia.com/dra-kubelet-plugin": "true", "nvidia.com/gpu.count": "2"}
    env.sim.add_node("dra-gpu", labels=labels, taints=[dict(TAINT.__dict__)])
    env.sim.store.create(policy())
    env.start_operator(startup_taint=TAINT)
    await env.wait(lambda: _validator_ready(env, "dra-gpu"), "validator Ready on dra-gpu")
    # The DRA plugin starts with an empty slice (the hand-over), then one GPU of two.
    _dra_slice(env, "dra-gpu", 0)
    _dra_slice(env, "dra-gpu", 1)
    await env.wait(
        lambda: "1 published" in env.operator.labels.gate_waiting()["dra-gpu"].waiting_for,
        "the gate counts the published device",
    )
    assert any(t["key"] == TAINT.key for t in _taints(env, "dra-gpu"))
    assert env.operator.labels.gate_waiting()["dra-gpu"].lacking == (gate.NO_DRA_DEVICES,)
    _dra_slice(env, "dra-gpu", 2)
    await env.wait(
        lambda: not any(t["key"] == TAINT.key for t in _taints(env, "dra-gpu")),
        "startup taint removed",
    )
    described = await kubectl(env.sim, "describe", "node", "dra-gpu")
    assert "validated (DRA devices published, validator Ready)" in described
