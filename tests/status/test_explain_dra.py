"""The node chain on a DRA node (issue 35, docs/dra.md): the device plugin's links give way to the
DRA driver's (its kubelet plugin's pod, the hand-over from the device plugin, the node's
ResourceSlices, schedulability, the claims allocated on the node); each one fails in turn, named
first with its evidence and fix; a node without DRA facts explains as before."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from test_explain import healthy, with_labels

from gpu_operator.api import keys
from gpu_operator.nodes import ledger
from gpu_operator.status import explain as ex
from gpu_operator.status.explain import ClaimPod, ClaimView, DraFacts, NodeFacts, PodView

PLUGIN_POD = "nvidia-dra-driver-kubelet-plugin-abc"
DEPLOY_PLUGIN = "nvidia.com/gpu.deploy.device-plugin"
BLOCKED = (
    "publishing no devices: the kubelet on node a100-1 still offers nvidia.com/gpu=8 from a "
    "device plugin; the same GPUs would be handed out twice."
)


def a_slice(devices: int = 8) -> dict[str, Any]:
    return {
        "metadata": {"name": "a100-1-gpu.nvidia.com-abcde"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "a100-1",
            "pool": {"name": "a100-1", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"gpu-{i}"} for i in range(devices)],
        },
    }


def dra_node(**changes: Any) -> NodeFacts:
    """A node moved to DRA under a ClusterPolicy: labelled, the operator's device plugin gone
    (its deploy label false, written by the operator), the DRA plugin ready, 8 GPUs published."""
    facts = with_labels(
        healthy(), **{keys.DRA_NODE.replace(".", "_"): "true", DEPLOY_PLUGIN: "false"}
    )
    owned = {**ledger.read(facts.annotations), DEPLOY_PLUGIN: "false"}
    facts = dataclasses.replace(
        facts,
        annotations={ledger.ANNOTATION: json.dumps(owned)},
        capacity={"cpu": "64"},
        allocatable={"cpu": "64"},
        pods=tuple(p for p in facts.pods if p.app != ex.PLUGIN_APP),
        dra=DraFacts(
            mode="label",
            plugin_pods=(PodView(PLUGIN_POD, ex.DRA_PLUGIN_APP),),
            slices=(a_slice(),),
            claims=(),
        ),
    )
    return dataclasses.replace(facts, **changes)


def with_dra(facts: NodeFacts, **changes: Any) -> NodeFacts:
    assert facts.dra is not None
    return dataclasses.replace(facts, dra=dataclasses.replace(facts.dra, **changes))


def failed(facts: NodeFacts) -> ex.Link:
    verdict = ex.explain(facts)
    assert verdict.failed is not None, verdict.message()
    return verdict.failed


def test_a_dra_node_is_usable_through_the_dra_chain() -> None:
    verdict = ex.explain(dra_node())
    assert verdict.usable, verdict.message()
    assert verdict.dra
    assert [link.id for link in verdict.links] == [i for i, _ in ex.DRA_CHAIN]
    by_id = {link.id: link for link in verdict.links}
    assert "device-plugin" not in by_id
    assert "allocatable" not in by_id
    assert by_id["deploy-labels"].status == "ok"
    said = {e.ref: e.text for e in by_id["deploy-labels"].evidence}
    assert "DRA serves" in said[DEPLOY_PLUGIN]
    assert by_id["dra-plugin"].summary == f"{PLUGIN_POD} ready (registered with the kubelet)"
    assert by_id["dra-slices"].summary == "8 device(s) published in 1 ResourceSlice(s)"
    assert by_id["dra-claims"].summary == "no claim allocated on the node"
    assert verdict.to_dict()["chain"] == "dra"


def test_a_device_plugin_node_keeps_its_chain() -> None:
    verdict = ex.explain(healthy())
    assert not verdict.dra
    assert verdict.chain == ex.CHAIN
    assert verdict.to_dict()["chain"] == "device-plugin"


def test_no_dra_plugin_pod_fails_first_with_the_chart_to_install() -> None:
    link = failed(with_dra(dra_node(), plugin_pods=()))
    assert link.id == "dra-plugin"
    assert f"app={ex.DRA_PLUGIN_APP}" in link.summary
    assert "kubeletPlugin.nodeSelector" in link.fix
    assert "kubelet-plugin-standin.yaml" in link.fix


def test_a_dra_plugin_pod_not_ready_fails_with_its_log() -> None:
    pod = PodView(PLUGIN_POD, ex.DRA_PLUGIN_APP, problem="container gpus is not ready")
    facts = with_dra(dra_node(), plugin_pods=(pod,))
    facts = dataclasses.replace(facts, logs={(PLUGIN_POD, "gpus"): "E: cannot load NVML\n"})
    link = failed(facts)
    assert link.id == "dra-plugin"
    assert link.summary == f"{PLUGIN_POD}: container gpus is not ready"
    assert ("log", "E: cannot load NVML") in {(e.kind, e.text) for e in link.evidence}


def test_the_device_plugin_still_serving_fails_the_hand_over() -> None:
    facts = dra_node(
        allocatable={"cpu": "64", "nvidia.com/gpu": "8"},
        logs={(PLUGIN_POD, "gpus"): BLOCKED + "\n"},
    )
    facts = with_dra(facts, slices=())
    link = failed(facts)
    assert link.id == "dra-handover"  # named before the empty slices it causes
    assert "the device plugin still serves the node (nvidia.com/gpu: 8)" in link.summary
    assert ("log", BLOCKED) in {(e.kind, e.text) for e in link.evidence}
    assert "wait for the device plugin's pod to leave" in link.fix


def test_a_device_plugin_label_set_true_by_hand_is_named_in_the_fix() -> None:
    facts = with_labels(dra_node(allocatable={"nvidia.com/gpu": "8"}), **{DEPLOY_PLUGIN: "true"})
    link = failed(facts)
    assert link.id == "dra-handover"
    assert f"{DEPLOY_PLUGIN}=false --overwrite" in link.fix


def test_gpus_withheld_for_device_plugin_pods_are_a_warning() -> None:
    line = (
        "GPU 0 (GPU-1234) withheld: held through the device plugin by default/trainer; "
        "GPU 1 (GPU-5678) withheld: held through the device plugin by default/trainer"
    )
    verdict = ex.explain(dra_node(logs={(PLUGIN_POD, "gpus"): f"W {line}\n"}))
    assert verdict.usable
    (warning,) = verdict.warnings
    assert warning.id == "dra-handover"
    assert "default/trainer" in warning.evidence[0].text


def test_no_resource_slice_fails_with_the_plugin_log() -> None:
    facts = with_dra(dra_node(logs={(PLUGIN_POD, "gpus"): "error: creating slice: forbidden\n"}),
                     slices=())  # fmt: skip
    link = failed(facts)
    assert link.id == "dra-slices"
    assert link.summary.startswith("no ResourceSlice of driver gpu.nvidia.com")
    assert ("log", "error: creating slice: forbidden") in {(e.kind, e.text) for e in link.evidence}


def test_slices_without_devices_fail() -> None:
    link = failed(with_dra(dra_node(), slices=(a_slice(0),)))
    assert link.id == "dra-slices"
    assert "ResourceSlices with no device" in link.summary


def test_a_cordoned_dra_node_fails_schedulable() -> None:
    link = failed(dra_node(unschedulable=True))
    assert link.id == "schedulable"
    assert "kubectl uncordon a100-1" in link.fix


def test_a_claim_its_pod_cannot_prepare_fails_the_claims_link() -> None:
    stuck = ClaimPod(
        "default/trainer",
        "Pending",
        "container ctr: ContainerCreating",
        ("FailedPrepareDynamicResources: prepare dynamic resources: NodePrepareResources "
         "failed for claim default/trainer-gpu: GPU-1234 is gone",),
    )  # fmt: skip
    claims = (ClaimView("default/trainer-gpu", ("gpu-0",), (stuck,)),)
    link = failed(with_dra(dra_node(), claims=claims))
    assert link.id == "dra-claims"
    assert "pod default/trainer cannot start" in link.summary
    assert "default/trainer-gpu" in link.summary
    texts = [e.text for e in link.evidence]
    assert any("GPU-1234 is gone" in t for t in texts)


def test_claims_that_run_are_counted() -> None:
    claims = (
        ClaimView("default/a", ("gpu-0",), (ClaimPod("default/a"),)),
        ClaimView(
            "default/b", ("gpu-1", "gpu-2"), (ClaimPod("default/b1"), ClaimPod("default/b2"))
        ),
    )
    verdict = ex.explain(with_dra(dra_node(), claims=claims))
    assert verdict.usable
    by_id = {link.id: link for link in verdict.links}
    assert by_id["dra-claims"].summary == (
        "2 claim(s) allocated, 3 device(s), reserved for 3 pod(s)"
    )


def test_without_the_resource_api_slices_and_claims_are_skipped() -> None:
    verdict = ex.explain(with_dra(dra_node(), slices=None, claims=None))
    assert verdict.usable
    by_id = {link.id: link for link in verdict.links}
    assert by_id["dra-slices"].status == "skipped"
    assert by_id["dra-claims"].status == "skipped"


def test_a_labelled_node_without_dra_facts_skips_rather_than_fails() -> None:
    """The status path reads no slices: a DRA node is not failed for its device plugin."""
    verdict = ex.explain(dra_node(dra=None, logs=None))
    assert verdict.usable, verdict.message()
    assert {link.id: link.status for link in verdict.links}["dra-plugin"] == "skipped"


def test_a_gpucluster_node_checks_its_own_deploy_labels_and_no_driver_pod() -> None:
    labels = {k: v for k, v in healthy().labels.items() if "gpu.deploy." not in k}
    labels["nvidia.com/gpu.deploy.dra-driver"] = "true"
    labels["nvidia.com/gpu.deploy.dra-validator"] = "true"
    facts = dra_node(labels=labels, annotations={}, pods=(), policy=None)
    facts = with_dra(facts, mode="gpucluster")
    verdict = ex.explain(facts)
    assert verdict.usable, verdict.message()
    by_id = {link.id: link for link in verdict.links}
    assert by_id["driver"].status == "skipped"
    assert by_id["toolkit"].status == "skipped"
    assert by_id["validator"].status == "skipped"
    labels.pop("nvidia.com/gpu.deploy.dra-driver")
    link = failed(dataclasses.replace(facts, labels=labels))
    assert link.id == "deploy-labels"
    assert "nvidia.com/gpu.deploy.dra-driver is not set" in link.summary


def _labelled(facts: NodeFacts, key: str, value: str) -> NodeFacts:
    return dataclasses.replace(facts, labels={**facts.labels, key: value})


def test_a_dra_node_mid_upgrade_that_still_publishes_devices_warns() -> None:
    """A DRA node serves its GPUs as ResourceSlice devices (no allocatable nvidia.com/gpu): mid
    upgrade, while it is not cordoned, it still serves them: a warning, not a failure."""
    facts = _labelled(dra_node(), keys.UPGRADE_STATE, "wait-for-jobs-required")
    verdict = ex.explain(facts)
    assert verdict.usable, verdict.message()
    link = next(link for link in verdict.links if link.id == "upgrade")
    assert link.status == "warning"
    assert "serves 8 DRA device(s) until it is cordoned" in link.summary
    assert any(e.kind == "resourceslice" for e in link.evidence)
    failed_upgrade = _labelled(dra_node(), keys.UPGRADE_STATE, "upgrade-failed")
    link = next(link for link in ex.explain(failed_upgrade).links if link.id == "upgrade")
    assert link.status == "warning"
    assert "serves 8 DRA device(s)" in link.summary
    # Nothing published: the upgrade keeps the node's GPUs from pods.
    empty = with_dra(facts, slices=(a_slice(0),))
    assert failed(empty).id == "dra-slices"


def test_the_startup_gate_on_a_dra_node_counts_slice_devices() -> None:
    """The gate's plan on a DRA node reads its published devices, not allocatable GPUs."""
    from gpu_operator.nodes.gate import StartupTaint

    taint = StartupTaint("nvidia.com/gpu-not-ready", "NoSchedule", "true")
    tainted = dataclasses.replace(
        _labelled(dra_node(), "nvidia.com/gpu.count", "8"),
        startup_taint=taint, taints=[{"key": taint.key, "value": "true", "effect": "NoSchedule"}],
    )  # fmt: skip
    link = failed(tainted)
    assert link.id == "gate"
    assert "although it validated" in link.summary
    partial = with_dra(tainted, slices=(a_slice(3),))
    link = failed(partial)
    assert link.id == "gate"
    assert "8 device(s) in its gpu.nvidia.com ResourceSlices (3 published)" in link.summary
