"""The coexistence detector end to end on kubesim: a GPU node that already serves
`nvidia.com/gpu` (another device plugin registered with its kubelet) gets neither the operator's
driver nor its device plugin, with an Event on the node and a sentence in the policy status;
capacity a plugin left behind (nothing allocatable), or GPUs our own plugin's pod serves, never
count as another plugin."""

from __future__ import annotations

from operator_harness import GPU_LABELS, NAMESPACE, Env, policy

from gpu_operator.api import keys
from gpu_operator.controller import nodelabels
from gpu_operator.nodes.coexist import CoexistPolicy

PLUGIN = keys.DEPLOY_PREFIX + "device-plugin"
GPU = "nvidia.com/gpu"
# The detector waits this long before GPUs served with none of our plugin in sight count as
# another plugin's (coexist.CONFIRM_AFTER, 20 s by default): short where a test wants the
# finding, long where the kubelet's late report must end the wait first.
QUICK = CoexistPolicy(confirm_after=0.5)
PATIENT = CoexistPolicy(confirm_after=600.0)
OLD_PLUGIN = "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"


def _pods_on(env: Env, node: str, prefix: str) -> list[str]:
    return [
        p["metadata"]["name"]
        for p in env.sim.store.list("pods", namespace=NAMESPACE)
        if p["spec"].get("nodeName") == node and p["metadata"]["name"].startswith(prefix)
    ]


def _events(env: Env, node: str, reason: str = nodelabels.COEXIST_REASON) -> list[str]:
    return [
        e.get("message", "")
        for e in env.sim.store.list("events")
        if e.get("reason") == reason and (e.get("involvedObject") or {}).get("name") == node
    ]


def _ready_message(env: Env) -> str:
    status = env.policy().get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
    return str(ready.get("message") or "")


def _set_gpus(env: Env, node: str, capacity: int, allocatable: int) -> None:
    """What the kubelet writes when a plugin's devices change (or the plugin goes away)."""
    env.sim.store.patch(
        "nodes", node,
        {"status": {"capacity": {GPU: str(capacity)}, "allocatable": {GPU: str(allocatable)}}},
        status=True,
    )  # fmt: skip


async def test_a_node_with_a_foreign_device_plugin_keeps_it_and_is_reported(env: Env) -> None:
    env.sim.add_node("aks-1", labels=dict(GPU_LABELS), capacity={"nvidia.com/gpu": "4"})
    env.sim.store.create(policy())
    env.start_operator(coexist=QUICK)
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
    assert "foreign-device-plugin: the node advertises 4 nvidia.com/gpu (4 allocatable)" in message
    ready = next(c for c in env.policy()["status"]["conditions"] if c["type"] == "Ready")
    assert "coexistence: foreign-device-plugin on 1 node(s) (aks-1): adapt" in ready["message"]
    # Reported as the detector's finding, not as a preinstalled-driver conflict.
    assert "already run a preinstalled NVIDIA driver" not in ready["message"]


async def test_refuse_keeps_every_operand_off_the_node(env: Env) -> None:
    env.sim.add_node("aks-1", labels=dict(GPU_LABELS), capacity={"nvidia.com/gpu": "4"})
    env.sim.store.create(policy())
    env.start_operator(coexist=CoexistPolicy(foreign_device_plugin="refuse", confirm_after=0.5))
    await env.wait_ready()
    labels = env.node_labels("aks-1")
    assert labels[keys.GPU_PRESENT] == "true"
    assert not [k for k in labels if k.startswith(keys.DEPLOY_PREFIX)]
    assert not _pods_on(env, "aks-1", "nvidia-")
    assert "deploys nothing" in _events(env, "aks-1")[0]


async def test_capacity_a_plugin_left_behind_is_not_another_plugin(env: Env) -> None:
    # What the kubelet shows for 5 minutes after `helm uninstall` took our plugin away (the
    # ledger and our labels gone with it): capacity, every device unhealthy, nothing allocatable.
    env.sim.add_node("gpu-3", labels=dict(GPU_LABELS))
    _set_gpus(env, "gpu-3", 8, 0)
    env.sim.store.create(policy())
    env.start_operator()  # the default wait: nothing here may make the node wait for it
    await env.wait_ready()
    labels = env.node_labels("gpu-3")
    assert labels[PLUGIN] == "true"
    assert labels[keys.DEPLOY_DRIVER] == "true"
    assert _pods_on(env, "gpu-3", "nvidia-device-plugin-daemonset")
    assert not _events(env, "gpu-3")
    assert not _events(env, "gpu-3", nodelabels.PREINSTALLED_REASON)
    assert "coexistence" not in _ready_message(env)


async def test_a_finding_leaves_the_status_as_soon_as_the_other_plugin_stops_serving(
    env: Env,
) -> None:
    env.sim.add_node("aks-1", labels=dict(GPU_LABELS), capacity={GPU: "4"})
    env.sim.store.create(policy())
    env.start_operator(coexist=QUICK)
    await env.wait(
        lambda: (
            "foreign-device-plugin" in _ready_message(env)
            and env.node_labels("aks-1").get(keys.DEPLOY_DRIVER) == keys.DRIVER_PREINSTALLED
        ),
        "the finding, and the driver treated as pre-installed",
    )
    # The other plugin is removed: the kubelet marks its devices unhealthy and keeps the
    # capacity for its grace period. The finding goes now, not 5 minutes later.
    _set_gpus(env, "aks-1", 4, 0)

    def taken_back() -> bool:
        labels = env.node_labels("aks-1")
        return (
            "coexistence" not in _ready_message(env)
            and labels.get(PLUGIN) == "true"
            and labels.get(keys.DEPLOY_DRIVER) == "true"
        )

    await env.wait(taken_back, "the finding gone and the detector's labels taken back")
    _set_gpus(env, "aks-1", 0, 0)  # the grace period ends
    await env.wait_ready()
    await env.wait(
        lambda: bool(_pods_on(env, "aks-1", "nvidia-device-plugin-daemonset")),
        "our device plugin on aks-1",
    )
    # The detector's own `pre-installed`, taken back, was never the driver manager's finding.
    assert not _events(env, "aks-1", nodelabels.PREINSTALLED_REASON)
    assert len(_events(env, "aks-1")) == 1


async def test_our_plugin_leaving_a_node_is_not_another_plugin_while_the_kubelet_lags(
    env: Env,
) -> None:
    # A switch to a VM workload takes our plugin off the node. Its pod is ours while it
    # terminates; once it is gone the kubelet may still report its GPUs as allocatable for a
    # node status period: the node is held, and the kubelet's report ends the wait.
    env.sim.store.create(policy(sandboxWorkloads={"enabled": True, "defaultWorkload": "container"}))
    env.start_operator(coexist=PATIENT)
    await env.wait_ready()
    assert _pods_on(env, "gpu-1", "nvidia-device-plugin-daemonset")
    _set_gpus(env, "gpu-1", 4, 4)  # our plugin serves the node's GPUs
    env.sim.store.patch(
        "nodes", "gpu-1",
        {"metadata": {"labels": {keys.GPU_WORKLOAD_CONFIG: keys.WORKLOAD_VM_PASSTHROUGH}}},
    )  # fmt: skip
    await env.wait(
        lambda: (
            PLUGIN not in env.node_labels("gpu-1")
            and not _pods_on(env, "gpu-1", "nvidia-device-plugin-daemonset")
        ),
        "our plugin's label and pod gone from gpu-1",
    )
    await env.wait(
        lambda: "gpu-1" in env.operator.labels._unexplained_since, "gpu-1 held, not judged"
    )
    assert not _events(env, "gpu-1")
    _set_gpus(env, "gpu-1", 4, 0)  # the kubelet reports the plugin gone
    await env.wait(
        lambda: "gpu-1" not in env.operator.labels._unexplained_since, "gpu-1 judged again"
    )
    await env.wait_ready()
    assert not _events(env, "gpu-1")
    assert "coexistence" not in _ready_message(env)


async def test_gpus_a_previous_releases_plugin_pod_still_serves_are_ours(env: Env) -> None:
    # A reinstall while the last release's device plugin pod still terminates on a node: the
    # uninstall took the labels and the ledger, the kubelet still counts the GPUs allocatable,
    # and the pod (ours by its app label, in our namespace) is the evidence. The node is
    # labelled at once, not held and never judged foreign.
    env.sim.add_node("gpu-3", labels=dict(GPU_LABELS), capacity={GPU: "8"})
    env.sim.store.create({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "nvidia-device-plugin-daemonset-old", "namespace": NAMESPACE,
                     "labels": {"app": nodelabels.PLUGIN_APP},
                     "finalizers": ["example.com/keep-terminating"]},
        "spec": {"nodeName": "gpu-3", "containers": [{"name": "plugin", "image": OLD_PLUGIN}]},
    })  # fmt: skip
    env.sim.store.delete("pods", "nvidia-device-plugin-daemonset-old", NAMESPACE)
    env.sim.store.create(policy())
    env.start_operator(coexist=PATIENT)
    await env.wait_ready()
    labels = env.node_labels("gpu-3")
    assert labels[PLUGIN] == "true"
    assert labels[keys.DEPLOY_DRIVER] == "true"
    assert "gpu-3" not in env.operator.labels._unexplained_since
    assert not _events(env, "gpu-3")
    assert "coexistence" not in _ready_message(env)
