"""The cluster facts and upgrade views the status passes read, kept from the node cache's events
(controller/facts.py `FactsFold`, `UpgradeFold`; issue 32: walking every node several times a
pass grew the operator's CPU with nodes x passes): after any sequence of additions, replacements
and deletions they equal a full fold of the cache."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gpu_operator.api import keys
from gpu_operator.controller import clusterpolicy, facts, strip
from gpu_operator.nodes import labelling
from gpu_operator.operands import config_manager
from gpu_operator.upgrade import states

FACTS_ARGS: dict[str, Any] = {
    "namespace": "gpu-operator",
    "operator_env": {},
    "has_servicemonitor_crd": False,
    "has_prometheusrule_crd": True,
}
DRIVER_POLICY = labelling.LabelPolicy(driver=True)
UPGRADE_STATES = ("", "", "", states.UPGRADE_REQUIRED, states.DRAIN_REQUIRED,
                  states.UPGRADE_DONE, states.UPGRADE_FAILED)  # fmt: skip


def random_node(rng: random.Random, name: str) -> dict[str, Any]:
    """A stripped node (as the node cache holds it) with random facts and upgrade labels."""
    labels: dict[str, str] = {}
    if rng.random() < 0.8:
        labels[keys.GPU_PRESENT] = "true"
    if rng.random() < 0.6:
        labels["feature.node.kubernetes.io/pci-10de.present"] = "true"
    os_id, version = rng.choice((("ubuntu", "22.04"), ("ubuntu", "24.04"), ("rhel", "9.4")))
    if rng.random() < 0.9:
        labels[keys.NFD_OS_ID] = os_id
        labels[keys.NFD_OS_VERSION_ID] = version
    if rng.random() < 0.7:
        labels[keys.NFD_KERNEL_FULL] = rng.choice(("6.8.0-52-generic", "5.14.0-427"))
    if rng.random() < 0.3:
        labels[config_manager.NODE_LABEL] = rng.choice(("a100", "h100"))
    state = rng.choice(UPGRADE_STATES)
    if state:
        labels[keys.UPGRADE_STATE] = state
    if rng.random() < 0.1:
        labels[keys.UPGRADE_SKIP] = "true"
    if rng.random() < 0.4:
        labels[keys.DRIVER_OWNER] = rng.choice(("pool-a", "pool-b"))
    if rng.random() < 0.2:
        labels[keys.DEPLOY_DRIVER] = keys.DRIVER_PREINSTALLED
    annotations = {states.FAILURE: f"{name} failed"} if state == states.UPGRADE_FAILED else {}
    runtime = rng.choice(("containerd://2.1.0", "cri-o://1.31", "docker://27.0", ""))
    return strip.node({
        "metadata": {"name": name, "uid": name, "labels": labels, "annotations": annotations},
        "status": {"nodeInfo": {"containerRuntimeVersion": runtime}},
    })  # fmt: skip


@pytest.mark.parametrize("seed", range(20))
def test_the_folds_equal_a_full_fold_after_any_events(seed: int) -> None:
    rng = random.Random(seed)
    cache: dict[str, dict[str, Any]] = {}
    facts_fold, upgrade_fold, label_fold = facts.FactsFold(), facts.UpgradeFold(), facts.LabelFold()

    def event(key: str, new: dict[str, Any] | None) -> None:
        old = cache.get(key)
        if new is None:
            cache.pop(key, None)
        else:
            cache[key] = new
        if old is not None or new is not None:
            facts_fold.changed(key, old, new)
            upgrade_fold.changed(key, old, new)
            label_fold.changed(key, old, new)

    for _ in range(300):
        name = f"node-{rng.randrange(40)}"
        event(name, None if rng.random() < 0.2 else random_node(rng, name))
        full = facts.from_nodes(cache.values(), **FACTS_ARGS)
        assert facts.from_fold(facts_fold, **FACTS_ARGS) == full
        for owner, every in ((None, False), ("pool-a", False), (None, True)):
            whole = clusterpolicy.upgrade_view(
                cache.values(), owner=owner, enabled=True, every_owner=every
            )
            kept = clusterpolicy.upgrade_view(
                (), owner=owner, enabled=True, every_owner=every, fold=upgrade_fold
            )
            assert kept == whole
            assert (kept.under_way, kept.queued, kept.failed) == (
                whole.under_way, whole.queued, whole.failed,
            )  # fmt: skip
        # What the ClusterPolicy's pending-labels message and preinstalled drivers read.
        assert {k: v.nfd_gpu for k, v in label_fold.values.items()} == {
            k: labelling.has_gpu(n["metadata"]["labels"]) for k, n in cache.items()
        }
        assert sorted(v.name for v in label_fold.picked.values()) == sorted(
            k for k, n in cache.items()
            if labelling.preinstalled_conflict(n["metadata"]["labels"], DRIVER_POLICY)
        )  # fmt: skip
    assert len(facts_fold) == len(upgrade_fold) == len(label_fold) == len(cache)


def test_a_cache_filled_without_events_is_folded_whole() -> None:
    rng = random.Random(7)
    cache = {f"node-{i}": random_node(rng, f"node-{i}") for i in range(30)}
    fold = facts.FactsFold()
    fold.sync(cache)
    assert facts.from_fold(fold, **FACTS_ARGS) == facts.from_nodes(cache.values(), **FACTS_ARGS)
    upgrades = facts.UpgradeFold()
    upgrades.sync(cache)
    assert clusterpolicy.upgrade_view((), owner=None, enabled=False, fold=upgrades) == (
        clusterpolicy.upgrade_view(cache.values(), owner=None, enabled=False)
    )


def test_the_os_of_a_tie_does_not_depend_on_the_nodes_order() -> None:
    """Upstream reads the OS of "one GPU node"; with as many nodes of two OSes, the choice is
    the same whichever order the cache holds them in (the first by name)."""
    rhel = {keys.GPU_PRESENT: "true", keys.NFD_OS_ID: "rhel", keys.NFD_OS_VERSION_ID: "9.4"}
    ubuntu = {keys.GPU_PRESENT: "true", keys.NFD_OS_ID: "ubuntu", keys.NFD_OS_VERSION_ID: "24.04"}
    nodes = [
        {"metadata": {"name": "a", "labels": ubuntu}},
        {"metadata": {"name": "b", "labels": rhel}},
    ]
    one = facts.from_nodes(nodes, **FACTS_ARGS)
    other = facts.from_nodes(reversed(nodes), **FACTS_ARGS)
    assert (one.os_id, one.os_version_id) == (other.os_id, other.os_version_id) == ("rhel", "9.4")


async def test_the_operator_keeps_its_folds_from_the_node_cache_events() -> None:
    """The runtime feeds both folds from the node cache's events: an event changes the facts
    the next pass reads without any pass walking the nodes."""
    from gpu_operator.controller.runtime import NODES, Runtime, Settings

    rt = Runtime(client=None, settings=Settings(namespace="gpu-operator"))  # type: ignore[arg-type]
    rng = random.Random(3)
    node = random_node(rng, "gpu-1")
    node["metadata"]["labels"][keys.GPU_PRESENT] = "true"
    node["metadata"]["labels"][keys.UPGRADE_STATE] = states.UPGRADE_REQUIRED
    rt._dispatch(NODES, "gpu-1", None, node)
    assert rt.node_facts.gpu_nodes == 1
    assert "gpu-1" in rt.upgrade_nodes.picked
    rt._dispatch(NODES, "gpu-1", node, None)
    assert (rt.node_facts.gpu_nodes, rt.upgrade_nodes.picked) == (0, {})
