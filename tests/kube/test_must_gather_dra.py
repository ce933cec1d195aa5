"""must-gather's per-node explain on a DRA node (nvidia.com/dra-kubelet-plugin=true): the DRA
kubelet plugin's pods and the ResourceSlices, listed once for all nodes, feed the DRA links
rather than leaving them skipped."""

from __future__ import annotations

from typing import Any

from gpu_operator.api import keys
from gpu_operator.kube import must_gather as mg
from gpu_operator.status import explain


def plugin_pod(node: str, ready: bool) -> dict[str, Any]:
    return {
        "metadata": {"name": f"dra-plugin-{node}", "namespace": "nvidia-dra-driver-gpu",
                     "labels": {"app": explain.DRA_PLUGIN_APP}},
        "spec": {"nodeName": node, "containers": [{"name": "gpus", "image": "dra:1"}]},
        "status": {"phase": "Running",
                   "conditions": [{"type": "Ready", "status": str(ready)}],
                   "containerStatuses": [{"name": "gpus", "ready": ready,
                                          "state": {"running": {}}}]},
    }  # fmt: skip


def a_slice(node: str, devices: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node}-gpu.nvidia.com"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node},
                 "devices": [{"name": f"gpu-{i}"} for i in range(devices)]},
    }  # fmt: skip


def dra_node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {keys.GPU_PRESENT: "true", keys.DRA_NODE: "true"}},
        "status": {"allocatable": {"cpu": "8"}, "capacity": {"cpu": "8"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip


def links(facts: explain.NodeFacts) -> dict[str, explain.Link]:
    """The DRA links on the node's facts, each judged on its own (the bare node here would
    stop the walk at its NFD labels)."""
    found = {}
    for check in (explain._dra_plugin, explain._dra_handover, explain._dra_slices):
        try:
            link = check(facts)
        except explain._Stop as stop:
            link = stop.link
        found[link.id] = link
    return found


def test_dra_links_read_the_lists_read_once() -> None:
    pods = [plugin_pod("a", True), plugin_pod("b", False)]
    dra = mg.dra_facts_by_node(["a", "b", "c"], pods, [a_slice("a", 4), a_slice("b", 2)])
    facts = mg.facts_for(dra_node("a"), [], {}, {}, None, None, dra["a"])
    found = links(facts)
    assert found["dra-plugin"].status == "ok"
    assert found["dra-slices"].summary == "4 device(s) published in 1 ResourceSlice(s)"
    assert found["dra-handover"].status == "ok"
    found = links(mg.facts_for(dra_node("b"), [], {}, {}, None, None, dra["b"]))
    assert found["dra-plugin"].status == "failed"
    found = links(mg.facts_for(dra_node("c"), [], {}, {}, None, None, dra["c"]))
    assert found["dra-plugin"].status == "failed"
    assert "no DRA kubelet plugin pod" in found["dra-plugin"].summary


def test_without_the_resource_api_slices_are_skipped_not_failed() -> None:
    dra = mg.dra_facts_by_node(["a"], [plugin_pod("a", True)], None)
    found = links(mg.facts_for(dra_node("a"), [], {}, {}, None, None, dra["a"]))
    assert found["dra-slices"].status == "skipped"
