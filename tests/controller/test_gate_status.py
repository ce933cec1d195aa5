"""The ClusterPolicy status names the GPU nodes waiting at the readiness gate, from the caches, as
information: the policy stays ready while a node waits (autoscaled nodes arrive all the time), and
the sentence goes once the operator removed the node's startup taint."""

from __future__ import annotations

import json

from kubesim_helpers import kubectl, needs_kubectl
from operator_harness import GPU_LABELS, Env, policy

from gpu_operator.nodes.gate import StartupTaint

TAINT = StartupTaint("nvidia.com/gpu-not-ready", "NoSchedule", "true")


def _ready_message(env: Env) -> str:
    status = env.policy().get("status") or {}
    return next(
        (c["message"] for c in status.get("conditions") or [] if c.get("type") == "Ready"), ""
    )


@needs_kubectl
async def test_the_status_names_nodes_at_the_gate_without_making_the_policy_not_ready(
    env: Env,
) -> None:
    env.sim.add_node("new-gpu", labels=dict(GPU_LABELS), taints=[dict(TAINT.__dict__)])
    env.sim.store.create(policy())
    env.start_operator(startup_taint=TAINT)
    # Every operand runs (they tolerate the taint) but no GPU is advertised yet.
    waiting = "1 node(s) wait at the startup gate: new-gpu (no allocatable GPUs)"
    await env.wait(lambda: waiting in _ready_message(env), "the status to name new-gpu")
    await env.wait_ready()
    assert env.policy()["status"]["state"] == "ready"

    gpus = {"nvidia.com/gpu": "1"}
    await kubectl(
        env.sim, "patch", "node", "new-gpu", "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"capacity": gpus, "allocatable": gpus}}),
    )  # fmt: skip
    await env.wait(
        lambda: "startup gate" not in _ready_message(env) and env.sim.store.get(
            "nodes", "new-gpu")["spec"].get("taints") in (None, []),  # type: ignore[index]
        "the taint removed and the sentence gone",
    )  # fmt: skip
    assert env.policy()["status"]["state"] == "ready"
