"""The operator on kubesim, as a replacement for NVIDIA's: DaemonSets whose immutable selector
differs are replaced (with an Event) instead of failing forever, and a settled node carries
`nvidia.com/gpu-driver-upgrade-state=upgrade-done` as upstream's upgrade controller leaves it."""

from __future__ import annotations

from typing import Any

from kubesim_helpers import kubectl, needs_kubectl
from operator_harness import NAMESPACE, Env, policy

from gpu_operator.api import keys
from gpu_operator.operands import common


def older_validator() -> dict[str, Any]:
    """The validator DaemonSet as our operator wrote it before selectors matched upstream's: it
    selects on `app` only, which the current selector (app + part-of) cannot update in place."""
    labels = {"app": "nvidia-operator-validator", common.PART_OF_LABEL: common.PART_OF_VALUE}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": "nvidia-operator-validator",
            "namespace": NAMESPACE,
            "labels": {**labels, keys.OPERATOR_STATE_LABEL: "state-operator-validation"},
        },
        "spec": {
            "selector": {"matchLabels": {"app": "nvidia-operator-validator"}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.deploy.operator-validator": "true"},
                    "containers": [{"name": "old", "image": "registry.local/validator:old"}],
                },
            },
        },
    }


def selector_events(env: Env) -> list[dict[str, Any]]:
    return [
        e
        for e in env.sim.store.list("events", namespace=NAMESPACE)
        if e["reason"] == "SelectorChanged"
    ]


@needs_kubectl
async def test_a_daemonset_with_another_selector_is_replaced_with_an_event(env: Env) -> None:
    env.sim.store.create(older_validator())
    old_uid = env.daemonsets()["nvidia-operator-validator"]["metadata"]["uid"]
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    live = env.daemonsets()["nvidia-operator-validator"]
    assert live["metadata"]["uid"] != old_uid
    assert live["spec"]["selector"]["matchLabels"] == {
        "app": "nvidia-operator-validator",
        common.PART_OF_LABEL: common.PART_OF_OPERATOR,
    }
    [event] = selector_events(env)
    assert event["involvedObject"]["name"] == "nvidia-operator-validator"
    assert "a selector cannot be updated" in event["message"]
    # The old pods (part-of nvidia-gpu) do not match the new selector: they were replaced.
    assert "its pods are replaced" in event["message"]
    # What a user sees.
    described = await kubectl(env.sim, "-n", NAMESPACE, "describe", "ds/nvidia-operator-validator")
    assert "SelectorChanged" in described
    assert "app.kubernetes.io/part-of=gpu-operator" in described


async def test_settled_gpu_nodes_are_labelled_upgrade_done(env: Env) -> None:
    # NVIDIA's chart renders autoUpgrade: true into the ClusterPolicy.
    driver = {
        "repository": "nvcr.io/nvidia",
        "image": "driver",
        "version": "580.95.05",
        "upgradePolicy": {"autoUpgrade": True},
    }
    env.sim.store.create(policy(driver=driver))
    env.start_operator()
    await env.wait_ready()
    await env.wait(
        lambda: all(
            env.node_labels(n).get(keys.UPGRADE_STATE) == "upgrade-done" for n in ("gpu-1", "gpu-2")
        ),
        "GPU nodes labelled upgrade-done",
    )
    assert keys.UPGRADE_STATE not in env.node_labels("cpu-1")
