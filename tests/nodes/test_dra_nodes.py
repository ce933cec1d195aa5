"""Per-node DRA under a ClusterPolicy: `nvidia.com/dra-kubelet-plugin=true` moves a node to DRA.
The labeller keeps the operator's device plugin off there (and back on when the label goes); the
coexistence detector expects DRA slices on such a node and still flags a device plugin serving
the same GPUs beside them."""

from __future__ import annotations

from typing import Any

from gpu_operator.api import ClusterPolicy, keys
from gpu_operator.nodes import ledger
from gpu_operator.nodes.coexist import CoexistPolicy, NodeFacts, detect
from gpu_operator.nodes.labelling import LabelPolicy, dra_node, plan_node

GPU = {"feature.node.kubernetes.io/pci-10de.present": "true"}
DRA = {**GPU, keys.DRA_NODE: "true"}
PLUGIN = keys.DEPLOY_PREFIX + "device-plugin"
SLICES = ("n1-gpu.nvidia.com",)


def policy() -> LabelPolicy:
    spec: dict[str, Any] = {name: {} for name in ("operator", "daemonsets", "driver", "toolkit",
        "devicePlugin", "dcgmExporter", "dcgm", "nodeStatusExporter", "gfd")}  # fmt: skip
    return LabelPolicy.from_policy(
        ClusterPolicy.model_validate({"metadata": {"name": "p"}, "spec": spec})
    )


def apply(labels: dict[str, str], annotations: dict[str, str], **kw: Any) -> None:
    plan = plan_node(labels, annotations, policy(), **kw)
    for key, value in plan.labels.items():
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value
    for key, value in plan.annotations.items():
        if value is None:
            annotations.pop(key, None)
        else:
            annotations[key] = value


def test_only_true_makes_a_dra_node() -> None:
    assert dra_node(DRA)
    assert not dra_node(GPU)
    assert not dra_node({**GPU, keys.DRA_NODE: "false"})


def test_a_dra_node_gets_no_device_plugin_and_keeps_the_rest_of_its_chain() -> None:
    plan = plan_node(DRA, {}, policy())
    assert plan.labels[PLUGIN] == "false"
    for op in ("driver", "container-toolkit", "gpu-feature-discovery", "dcgm-exporter"):
        assert plan.labels[keys.DEPLOY_PREFIX + op] == "true"
    assert plan.conflicts == []


def test_moving_a_node_to_dra_and_back_flips_only_the_device_plugin() -> None:
    labels, annotations = dict(GPU), {}
    apply(labels, annotations)
    assert labels[PLUGIN] == "true"
    before = dict(labels)
    labels[keys.DRA_NODE] = "true"
    apply(labels, annotations, coexist={})
    assert labels[PLUGIN] == "false"
    assert ledger.read(annotations)[PLUGIN] == "false"  # the operator's own value
    assert {k: v for k, v in labels.items() if k not in (PLUGIN, keys.DRA_NODE)} == {
        k: v for k, v in before.items() if k != PLUGIN
    }
    del labels[keys.DRA_NODE]
    # Back, with or without the detector running.
    apply(labels, annotations)
    assert labels[PLUGIN] == "true"


def test_a_humans_false_stays_when_a_node_leaves_dra() -> None:
    labels = {**GPU, PLUGIN: "false"}
    plan = plan_node(labels, {}, policy())
    assert PLUGIN not in plan.labels


def test_a_humans_true_on_a_dra_node_is_reported_not_overwritten() -> None:
    plan = plan_node({**DRA, PLUGIN: "true"}, {}, policy())
    assert PLUGIN not in plan.labels
    assert any(PLUGIN in c for c in plan.conflicts)


def test_dra_slices_on_a_dra_node_are_expected() -> None:
    facts = NodeFacts({**DRA, PLUGIN: "false"}, dra_slices=SLICES)
    outcome = detect(facts, CoexistPolicy())
    assert outcome.findings == []


def test_our_plugin_winding_down_on_a_new_dra_node_is_not_a_finding() -> None:
    facts = NodeFacts(
        {**DRA, PLUGIN: "false"}, gpu_capacity=4, gpu_allocatable=4, dra_slices=SLICES,
        plugin_pod=True,
    )  # fmt: skip
    assert detect(facts, CoexistPolicy()).findings == []


def test_a_device_plugin_beside_the_dra_plugin_on_a_dra_node_is_flagged() -> None:
    facts = NodeFacts(
        {**DRA, PLUGIN: "true"}, gpu_capacity=4, gpu_allocatable=4, dra_slices=SLICES,
        plugin_pod=True,
    )  # fmt: skip
    outcome = detect(facts, CoexistPolicy())
    assert [f.case for f in outcome.findings] == ["dra-driver"]
    assert "both would hand out the same GPU" in outcome.findings[0].message
    assert outcome.overrides == {"device-plugin": "false"}


def test_dra_slices_on_a_node_not_moved_to_dra_name_the_label() -> None:
    outcome = detect(NodeFacts(GPU, dra_slices=SLICES), CoexistPolicy())
    assert [f.case for f in outcome.findings] == ["dra-driver"]
    assert f"{keys.DRA_NODE}=true" in outcome.findings[0].message
