"""The coexistence detector's outside sources on kubesim, under the chart's RBAC: NFD NodeFeatures
(a node whose host already has the `nvidia` module loaded gets no driver pod, ever) and DRA
ResourceSlices (a node whose GPUs NVIDIA's DRA driver publishes gets no device plugin), and a
cluster without either API working as before, with one info line each."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_harness import GPU_LABELS, Env, policy

from gpu_operator.api import keys
from gpu_operator.controller import coexist_sources, nodelabels
from gpu_operator.nodes.coexist import CoexistPolicy
from kubesim.store import Event

ROOT = Path(__file__).resolve().parents[2]
NFD_CRDS = ROOT / "charts/gpu-operator/charts/node-feature-discovery/crds/nfd-api-crds.yaml"
NFD_NS = "node-feature-discovery"
PLUGIN = keys.DEPLOY_PREFIX + "device-plugin"
DRIVER_DS = "nvidia-driver-daemonset"


def _install_nfd(env: Env) -> None:
    for crd in yaml.safe_load_all(NFD_CRDS.read_text()):
        if crd:
            env.sim.store.create(crd)
    env.sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NFD_NS}})


def _feature(env: Env, node: str, *modules: str) -> None:
    """What nfd-worker writes for a node: its loaded modules under kernel.loadedmodule."""
    body: dict[str, Any] = {
        "apiVersion": "nfd.k8s-sigs.io/v1alpha1", "kind": "NodeFeature",
        "metadata": {"name": node, "namespace": NFD_NS,
                     "labels": {"nfd.node.kubernetes.io/node-name": node}},
        "spec": {"features": {"flags": {"kernel.loadedmodule": {
            "elements": {m: {} for m in ("ext4", "overlay", *modules)}}}}},
    }  # fmt: skip
    current = env.sim.store.get("nodefeatures.nfd.k8s-sigs.io", node, NFD_NS)
    if current is None:
        env.sim.store.create(body)
    else:
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        env.sim.store.update(body)


def _slice(env: Env, node: str, driver: str) -> None:
    env.sim.store.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0"}]},
    })  # fmt: skip


def _events(env: Env, node: str) -> list[str]:
    return [
        e.get("message", "")
        for e in env.sim.store.list("events")
        if e.get("reason") == nodelabels.COEXIST_REASON
        and (e.get("involvedObject") or {}).get("name") == node
    ]


def _ready_message(env: Env) -> str:
    status = env.policy().get("status") or {}
    ready = next(c for c in status.get("conditions") or [] if c["type"] == "Ready")
    return str(ready["message"])


@contextmanager
def _history(env: Env) -> Iterator[dict[str, list[str]]]:
    """Every driver label value and every driver pod's node, recorded as the store commits them
    (so a pod created and deleted between two looks is seen too)."""
    seen: dict[str, list[str]] = {"driver-pods": [], "driver-labels": []}

    def record(event: Event) -> None:
        obj = event.new.obj
        meta = obj.get("metadata") or {}
        if event.key == ("", "pods") and meta.get("name", "").startswith(DRIVER_DS):
            seen["driver-pods"].append(str(obj["spec"].get("nodeName")))
        elif event.key == ("", "nodes"):
            value = (meta.get("labels") or {}).get(keys.DEPLOY_DRIVER)
            seen["driver-labels"].append(f"{meta['name']}={value}")

    unsubscribe = env.sim.store.subscribe(record, keys=[("", "pods"), ("", "nodes")])
    try:
        yield seen
    finally:
        unsubscribe()


def _settled(env: Env, node: str) -> Callable[[], bool]:
    """The operator saw the node's latest NodeFeature and has nothing left to do."""

    def check() -> bool:
        informer = env.operator.runtime.caches.informers.get(coexist_sources.NODE_FEATURES)
        view = informer.get(node, NFD_NS) if informer is not None else None
        queue = env.operator.queue
        # The upgrade reconciler's periodic resync timer is always pending; node work is not.
        busy = queue._processing or len(queue) or any(k.startswith("node/") for k in queue._timers)
        return bool(view is not None and view.nvidia and not busy)

    return check


@pytest.fixture
def nfd_env(env: Env) -> Env:
    """The harness cluster with NFD's CRDs and a NodeFeature per node (no nvidia loaded)."""
    _install_nfd(env)
    for node in ("gpu-1", "gpu-2", "cpu-1"):
        _feature(env, node)
    return env


async def test_a_preinstalled_driver_seen_by_nfd_keeps_every_driver_pod_off_the_node(
    nfd_env: Env,
) -> None:
    env = nfd_env
    env.sim.add_node("aks-1", labels=dict(GPU_LABELS))
    _feature(env, "aks-1", "nvidia", "nvidia_uvm", "nvidia_modeset")
    env.sim.store.create(policy())
    with _history(env) as seen:
        env.start_operator()
        await env.wait_ready()
    labels = env.node_labels("aks-1")
    assert labels[keys.DEPLOY_DRIVER] == keys.DRIVER_PREINSTALLED
    # The rest of the chain runs on the host's driver.
    assert labels[PLUGIN] == "true"
    assert labels[keys.DEPLOY_PREFIX + "container-toolkit"] == "true"
    assert "aks-1" not in seen["driver-pods"]
    assert "aks-1=true" not in seen["driver-labels"]
    assert env.node_labels("gpu-1")[keys.DEPLOY_DRIVER] == "true"
    assert "gpu-1" in seen["driver-pods"]
    [message] = _events(env, "aks-1")
    assert message.startswith(
        f"managed-driver: NFD saw the kernel module nvidia loaded (NodeFeature {NFD_NS}/aks-1, "
        "kernel.loadedmodule) although the operator never deployed its driver here"
    ), message
    assert "coexistence: managed-driver on 1 node(s) (aks-1): adapt" in _ready_message(env)
    assert "already run a preinstalled NVIDIA driver" not in _ready_message(env)


async def test_our_own_driver_loading_the_module_is_never_judged_foreign_even_after_a_restart(
    nfd_env: Env,
) -> None:
    env = nfd_env
    env.sim.store.create(policy())
    first = env.start_operator()
    await env.wait_ready()
    assert env.node_labels("gpu-1")[keys.DEPLOY_DRIVER] == "true"
    # The operator's driver pod loads the module; NFD's next pass publishes it.
    _feature(env, "gpu-1", "nvidia", "nvidia_uvm")
    await env.wait(_settled(env, "gpu-1"), "the operator saw gpu-1's new NodeFeature")
    assert env.node_labels("gpu-1")[keys.DEPLOY_DRIVER] == "true"
    await env.stop_operator(first)
    env.operators.remove(first)
    env.tasks.pop(0)
    with _history(env) as seen:
        env.start_operator()
        await env.wait(_settled(env, "gpu-1"), "the restarted operator settled")
    assert [v for v in seen["driver-labels"] if v.startswith("gpu-1=")] in ([], ["gpu-1=true"])
    assert env.node_labels("gpu-1")[keys.DEPLOY_DRIVER] == "true"
    assert _events(env, "gpu-1") == []
    assert "coexistence" not in _ready_message(env)


async def test_a_gpu_label_that_arrives_before_its_nodefeature_waits_for_it(nfd_env: Env) -> None:
    env = nfd_env
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    with _history(env) as seen:
        # nfd-master's GPU label reaches the operator first; the NodeFeature follows.
        env.sim.add_node("aks-2", labels=dict(GPU_LABELS))
        await env.wait(
            lambda: "aks-2" in env.operator.coexist_sources.waiting_since,
            "the labeller holding aks-2 for its NodeFeature",
        )
        _feature(env, "aks-2", "nvidia")
        await env.wait(
            lambda: env.node_labels("aks-2").get(keys.DEPLOY_DRIVER) == keys.DRIVER_PREINSTALLED,
            "aks-2 labelled pre-installed",
        )
    assert "aks-2" not in seen["driver-pods"]
    assert "aks-2=true" not in seen["driver-labels"]


async def test_ignore_lets_the_driver_manager_find_the_host_driver(nfd_env: Env) -> None:
    env = nfd_env
    env.sim.add_node("aks-1", labels=dict(GPU_LABELS))
    _feature(env, "aks-1", "nvidia")
    env.sim.store.create(policy())
    env.start_operator(coexist=CoexistPolicy(managed_driver="ignore"))
    await env.wait(lambda: bool(_events(env, "aks-1")), "the finding reported")
    assert "ignored (COEXIST_* says so)" in _events(env, "aks-1")[0]
    await env.wait(
        lambda: env.node_labels("aks-1").get(keys.DEPLOY_DRIVER) == "true",
        "the driver deployed on aks-1 anyway",
    )


async def test_refuse_deploys_nothing_on_a_node_with_a_foreign_driver(nfd_env: Env) -> None:
    env = nfd_env
    env.sim.add_node("aks-1", labels=dict(GPU_LABELS))
    _feature(env, "aks-1", "nvidia")
    env.sim.store.create(policy())
    env.start_operator(coexist=CoexistPolicy(managed_driver="refuse"))
    await env.wait_ready()
    labels = env.node_labels("aks-1")
    assert labels[keys.GPU_PRESENT] == "true"
    assert not [k for k in labels if k.startswith(keys.DEPLOY_PREFIX)]
    assert "deploys nothing" in _events(env, "aks-1")[0]


async def test_dra_slices_of_nvidias_driver_keep_the_device_plugin_off_their_node(env: Env) -> None:
    _slice(env, "gpu-2", "gpu.nvidia.com")
    _slice(env, "gpu-1", "gpu.example.com")  # another vendor's DRA driver is no conflict
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    assert env.node_labels("gpu-2")[PLUGIN] == "false"
    assert env.node_labels("gpu-2")[keys.DEPLOY_DRIVER] == "true"
    assert env.node_labels("gpu-1")[PLUGIN] == "true"
    [message] = _events(env, "gpu-2")
    assert "dra-driver: ResourceSlice(s) of the DRA driver gpu.nvidia.com" in message
    assert "gpu-2-gpu.nvidia.com" in message
    assert "coexistence: dra-driver on 1 node(s) (gpu-2): adapt" in _ready_message(env)
    # The DRA driver goes away: the device plugin comes back.
    env.sim.store.delete("resourceslices.resource.k8s.io", "gpu-2-gpu.nvidia.com")
    await env.wait(
        lambda: env.node_labels("gpu-2")[PLUGIN] == "true", "the device plugin back on gpu-2"
    )


async def test_without_nfd_or_dra_apis_the_operator_works_as_before_and_says_so_once(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    # A cluster before Kubernetes 1.34 serves no resource.k8s.io/v1, and this one has no NFD.
    registry = env.sim.store.registry
    registry._by_gvr.pop(("resource.k8s.io", "v1", "resourceslices"))
    registry.generation += 1
    caplog.set_level(logging.INFO, logger="gpu_operator")
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    assert env.node_labels("gpu-1")[PLUGIN] == "true"
    lines = [r for r in caplog.records if r.name == coexist_sources.__name__]
    assert [r.levelname for r in lines] == ["INFO"], [r.getMessage() for r in lines]
    assert "does not serve ResourceSlices (resource.k8s.io/v1)" in lines[0].getMessage()
    noisy = [
        r.getMessage() for r in caplog.records
        if r.levelno >= logging.WARNING and ("ResourceSlice" in r.getMessage()
                                             or "NodeFeature" in r.getMessage())
    ]  # fmt: skip
    assert noisy == []
