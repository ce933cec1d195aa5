"""The coexistence detector end to end on kubesim: a GPU node that already advertises
`nvidia.com/gpu` (another device plugin registered with its kubelet) gets neither the operator's
driver nor its device plugin, with an Event on the node and a sentence in the policy status."""

from __future__ import annotations

from operator_harness import GPU_LABELS, NAMESPACE, Env, policy

from gpu_operator.api import keys
from gpu_operator.controller import nodelabels
from gpu_operator.nodes.coexist import CoexistPolicy

PLUGIN = keys.DEPLOY_PREFIX + "device-plugin"


def _pods_on(env: Env, node: str, prefix: str) -> list[str]:
    return [
        p["metadata"]["name"]
        for p in env.sim.store.list("pods", namespace=NAMESPACE)
        if p["spec"].get("nodeName") == node and p["metadata"]["name"].startswith(prefix)
    ]


def _events(env: Env, node: str) -> list[str]:
    return [
        e.get("message", "")
        for e in env.sim.store.list("events")
        if e.get("reason") == nodelabels.COEXIST_REASON
        and (e.get("involvedObject") or {}).get("name") == node
    ]


async def test_a_node_with_a_foreign_device_plugin_keeps_it_and_is_reported(env: Env) -> None:
    env.sim.add_node("aks-1", labels=dict(GPU_LABELS), capacity={"nvidia.com/gpu": "4"})
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    labels = env.node_labels("aks-1")
    assert labels[keys.DEPLOY_DRIVER] == keys.DRIVER_PREINSTALLED
    assert labels[PLUGIN] == "false"
    assert labels[keys.DEPLOY_PREFIX + "container-toolkit"] == "true"
    # The other GPU nodes are untouched by the detector.
    assert env.node_labels("gpu-1")[PLUGIN] == "true"
    assert not _pods_on(env, "aks-1", "nvidia-device-plugin-daemonset")
    assert not _pods_on(env, "aks-1", "nvidia-driver-daemonset")
    assert _pods_on(env, "gpu-1", "nvidia-device-plugin-daemonset")
    [message] = _events(env, "aks-1")
    assert "foreign-device-plugin: the node already advertises 4 nvidia.com/gpu" in message
    ready = next(c for c in env.policy()["status"]["conditions"] if c["type"] == "Ready")
    assert "coexistence: foreign-device-plugin on 1 node(s) (aks-1): adapt" in ready["message"]
    # Reported as the detector's finding, not as a preinstalled-driver conflict.
    assert "already run a preinstalled NVIDIA driver" not in ready["message"]


async def test_refuse_keeps_every_operand_off_the_node(env: Env) -> None:
    env.sim.add_node("aks-1", labels=dict(GPU_LABELS), capacity={"nvidia.com/gpu": "4"})
    env.sim.store.create(policy())
    env.start_operator(coexist=CoexistPolicy(foreign_device_plugin="refuse"))
    await env.wait_ready()
    labels = env.node_labels("aks-1")
    assert labels[keys.GPU_PRESENT] == "true"
    assert not [k for k in labels if k.startswith(keys.DEPLOY_PREFIX)]
    assert not _pods_on(env, "aks-1", "nvidia-")
    assert "deploys nothing" in _events(env, "aks-1")[0]
