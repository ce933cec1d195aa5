"""The status passes' per-node reads of the node cache (docs/reliability.md, issue 32): each node
object is read once, and a node whose object the cache replaced is read again, so the cluster
facts and the upgrade view never lag behind a change."""

from __future__ import annotations

from typing import Any

from gpu_operator.api import keys
from gpu_operator.controller import clusterpolicy, facts
from gpu_operator.upgrade import states


def node(name: str, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {keys.GPU_PRESENT: "true", **labels}},
        "status": {"nodeInfo": {"containerRuntimeVersion": "containerd://2.1.0"}},
    }


def cluster_facts(nodes: dict[str, dict[str, Any]]) -> Any:
    return facts.from_nodes(
        nodes.values(),
        namespace="gpu-operator",
        operator_env={},
        has_servicemonitor_crd=False,
        has_prometheusrule_crd=False,
        cached=True,
    )


def test_each_node_object_is_read_once_and_a_replaced_one_again() -> None:
    read: list[str] = []

    def name_of(obj: Any) -> str:
        read.append(obj["metadata"]["name"])
        return str(obj["metadata"]["name"])

    memo = facts.PerNode(name_of)
    nodes = {n: node(n) for n in ("a", "b", "c")}
    assert memo(nodes.values()) == ["a", "b", "c"]
    assert memo(nodes.values()) == ["a", "b", "c"]
    assert read == ["a", "b", "c"]
    nodes["b"] = node("b")  # the cache replaced b's object
    del nodes["c"]
    assert memo(nodes.values()) == ["a", "b"]
    assert read == ["a", "b", "c", "b"]


def test_the_cluster_facts_follow_a_replaced_node() -> None:
    nodes = {f"gpu-{i}": node(f"gpu-{i}", **{keys.NFD_KERNEL_FULL: "6.8.0"}) for i in range(3)}
    first = cluster_facts(nodes)
    assert (first.gpu_node_count, first.kernels, first.runtime) == (3, ("6.8.0",), "containerd")
    nodes["gpu-1"] = node("gpu-1", **{keys.NFD_KERNEL_FULL: "6.11.0"})
    nodes["gpu-2"] = {"metadata": {"name": "gpu-2", "labels": {}}}  # its GPU is gone
    second = cluster_facts(nodes)
    assert (second.gpu_node_count, second.kernels) == (2, ("6.11.0", "6.8.0"))
    # The same as an uncached fold of the same objects.
    plain = facts.from_nodes(
        nodes.values(),
        namespace="gpu-operator",
        operator_env={},
        has_servicemonitor_crd=False,
        has_prometheusrule_crd=False,
    )
    assert second == plain


def test_the_upgrade_view_follows_a_replaced_node() -> None:
    nodes = {
        "gpu-1": node("gpu-1", **{keys.UPGRADE_STATE: states.UPGRADE_REQUIRED}),
        "gpu-2": node("gpu-2", **{keys.UPGRADE_STATE: states.UPGRADE_DONE}),
    }

    def view() -> Any:
        return clusterpolicy.upgrade_view(nodes.values(), owner=None, enabled=True, cached=True)

    assert view().states == {"gpu-1": states.UPGRADE_REQUIRED, "gpu-2": states.UPGRADE_DONE}
    failed = node("gpu-1", **{keys.UPGRADE_STATE: states.UPGRADE_FAILED})
    failed["metadata"]["annotations"] = {states.FAILURE: "the driver pod crash-loops"}
    nodes["gpu-1"] = failed
    nodes["gpu-2"] = node("gpu-2", **{keys.UPGRADE_SKIP: "true"})
    seen = view()
    assert seen.states == {"gpu-1": states.UPGRADE_FAILED}
    assert seen.failures == {"gpu-1": "the driver pod crash-loops"}
    assert seen.skipped == frozenset({"gpu-2"})
