"""The coexistence detector: a cloud-managed driver, a foreign device plugin and a DRA GPU driver
are found per node from its facts alone, and each case adapts, refuses or is ignored as
configured, through the deploy labels the labeller writes."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.api import ClusterPolicy, keys
from gpu_operator.nodes import coexist, ledger
from gpu_operator.nodes.coexist import CoexistPolicy, NodeFacts, detect
from gpu_operator.nodes.labelling import LabelPolicy, plan_node

GPU = {"feature.node.kubernetes.io/pci-10de.present": "true"}
PLUGIN = keys.DEPLOY_PREFIX + "device-plugin"
GKE = coexist.GKE_DRIVER_LABEL


def served(gpus: int, **facts: Any) -> dict[str, Any]:
    """Facts of a node whose GPUs a plugin serves now (capacity and allocatable), seen that way
    for as long as the detector waits before calling it foreign."""
    return {"gpu_capacity": gpus, "gpu_allocatable": gpus,
            "unexplained_for": coexist.CONFIRM_AFTER, **facts}  # fmt: skip


def policy(**spec: Any) -> LabelPolicy:
    base: dict[str, Any] = {name: {} for name in ("operator", "daemonsets", "driver", "toolkit",
        "devicePlugin", "dcgmExporter", "dcgm", "nodeStatusExporter", "gfd")}  # fmt: skip
    base.update(spec)
    return LabelPolicy.from_policy(
        ClusterPolicy.model_validate({"metadata": {"name": "p"}, "spec": base})
    )


def test_a_plain_gpu_node_has_no_finding() -> None:
    outcome = detect(NodeFacts(GPU), CoexistPolicy())
    assert outcome.findings == []
    assert outcome.overrides == {}
    assert not outcome.refused


@pytest.mark.parametrize("value", ["default", "latest", "R535"])
def test_gke_installing_the_driver_is_a_managed_driver_treated_as_preinstalled(value: str) -> None:
    outcome = detect(NodeFacts({**GPU, GKE: value}), CoexistPolicy())
    assert [f.case for f in outcome.findings] == ["managed-driver"]
    assert f"{GKE}={value}" in outcome.findings[0].message
    assert outcome.overrides == {"driver": keys.DRIVER_PREINSTALLED}


def test_gke_with_driver_installation_disabled_is_left_to_the_operator() -> None:
    assert detect(NodeFacts({**GPU, GKE: "disabled"}), CoexistPolicy()).findings == []


def test_admin_label_rules_mark_aks_pools_that_bring_their_driver() -> None:
    rules = CoexistPolicy.from_env(
        {"COEXIST_MANAGED_DRIVER_LABELS": "kubernetes.azure.com/accelerator=nvidia"}
    )
    aks = {**GPU, "kubernetes.azure.com/accelerator": "nvidia"}
    assert [f.case for f in detect(NodeFacts(aks), rules).findings] == ["managed-driver"]
    # Without the rule an AKS node created with `--gpu-driver none` looks the same: not flagged.
    assert detect(NodeFacts(aks), CoexistPolicy()).findings == []


def test_served_gpus_before_our_plugin_are_a_foreign_plugin_that_also_implies_a_driver() -> None:
    outcome = detect(NodeFacts(GPU, **served(4)), CoexistPolicy())
    assert [f.case for f in outcome.findings] == ["foreign-device-plugin"]
    assert "advertises 4 nvidia.com/gpu (4 allocatable)" in outcome.findings[0].message
    assert "another device plugin is registered with the kubelet" in outcome.findings[0].message
    assert outcome.overrides == {"driver": keys.DRIVER_PREINSTALLED, "device-plugin": "false"}


@pytest.mark.parametrize("waited", [None, coexist.CONFIRM_AFTER * 10])
def test_capacity_without_allocatable_is_left_over_by_a_plugin_that_went_away(
    waited: float | None,
) -> None:
    # After `helm uninstall` (labels and ledger gone) the kubelet keeps our plugin's capacity
    # for its 5-minute grace period with every device unhealthy: no plugin serves them.
    facts = NodeFacts(GPU, gpu_capacity=8, gpu_allocatable=0, unexplained_for=waited)
    outcome = detect(facts, CoexistPolicy())
    assert outcome.findings == []
    assert outcome.overrides == {}
    assert outcome.wait == 0
    assert not outcome.unexplained


def test_gpus_served_while_a_pod_of_our_plugin_is_on_the_node_are_ours() -> None:
    # A reinstall while the previous release's plugin pods still terminate: no label, no
    # ledger, allocatable GPUs, and our plugin's pod on the node.
    outcome = detect(NodeFacts(GPU, **served(8), plugin_pod=True), CoexistPolicy())
    assert outcome.findings == []
    assert outcome.wait == 0
    assert not outcome.unexplained


def test_served_gpus_with_none_of_ours_in_sight_are_foreign_once_the_kubelet_had_time() -> None:
    # The kubelet may report our plugin's GPUs as allocatable for one node status period after
    # its pod is gone: the node is held, not judged, until CONFIRM_AFTER has passed.
    policy = CoexistPolicy()
    first = detect(NodeFacts(GPU, gpu_capacity=4, gpu_allocatable=4), policy)
    assert first.findings == []
    assert first.overrides == {}
    assert first.unexplained
    assert first.wait == coexist.CONFIRM_AFTER
    later = detect(NodeFacts(GPU, gpu_capacity=4, gpu_allocatable=4, unexplained_for=5.0), policy)
    assert later.wait == coexist.CONFIRM_AFTER - 5.0
    assert later.findings == []
    # The allocatable dropped meanwhile: it was ours (or gone), nothing to wait for any more.
    gone = detect(NodeFacts(GPU, gpu_capacity=4, gpu_allocatable=0, unexplained_for=5.0), policy)
    assert (gone.wait, gone.unexplained, gone.findings) == (0, False, [])
    found = detect(NodeFacts(GPU, **served(4)), policy)
    assert [f.case for f in found.findings] == ["foreign-device-plugin"]
    assert found.wait == 0
    assert found.unexplained


def test_a_foreign_plugin_confirmed_before_is_judged_at_once() -> None:
    # The node carries the detector's own `device-plugin=false`: an operator restart does not
    # hold it again (the status keeps the finding).
    facts = NodeFacts({**GPU, PLUGIN: "false"}, gpu_capacity=4, gpu_allocatable=4,
                      plugin_adapted=True)  # fmt: skip
    outcome = detect(facts, CoexistPolicy())
    assert [f.case for f in outcome.findings] == ["foreign-device-plugin"]
    assert outcome.wait == 0


def _sandbox_policy() -> LabelPolicy:
    return policy(sandboxWorkloads={"enabled": True, "defaultWorkload": "container"})


def _step(
    labels: dict[str, str], annotations: dict[str, str], facts: dict[str, Any]
) -> tuple[coexist.Outcome, dict[str, str], dict[str, str]]:
    """One labeller pass: detect, plan, and the node's labels and ledger after the write."""
    owned = ledger.read(annotations)
    outcome = detect(
        NodeFacts(
            labels, plugin_ledgered=owned.get(PLUGIN) == "true",
            plugin_adapted=owned.get(PLUGIN) == "false" and labels.get(PLUGIN) == "false",
            **facts,
        ),
        CoexistPolicy(),
    )  # fmt: skip
    if outcome.wait:
        return outcome, labels, annotations
    plan = plan_node(labels, annotations, _sandbox_policy(), coexist=outcome.overrides,
                     refuse=outcome.refused)  # fmt: skip
    new_labels = {k: v for k, v in {**labels, **plan.labels}.items() if v is not None}
    new_annotations = {
        k: v for k, v in {**annotations, **plan.annotations}.items() if v is not None
    }
    return outcome, new_labels, new_annotations


def test_a_switch_to_vm_passthrough_and_back_never_makes_our_own_plugin_foreign() -> None:
    # Container node with our plugin serving 4 GPUs.
    labels: dict[str, str] = dict(GPU)
    annotations: dict[str, str] = {}
    outcome, labels, annotations = _step(labels, annotations, {})
    outcome, labels, annotations = _step(labels, annotations, {})
    assert labels[PLUGIN] == "true"
    outcome, labels, annotations = _step(labels, annotations, served(4, plugin_pod=True))
    assert outcome.findings == []
    # The admin switches the node to vm-passthrough: our deploy labels go...
    labels[keys.GPU_WORKLOAD_CONFIG] = keys.WORKLOAD_VM_PASSTHROUGH
    outcome, labels, annotations = _step(labels, annotations, served(4, plugin_pod=True))
    assert PLUGIN not in labels
    assert PLUGIN not in ledger.read(annotations)
    # ...our plugin's pod terminates (still serving), then goes; the kubelet keeps the capacity
    # with nothing allocatable for its grace period.
    for facts in (
        served(4, plugin_pod=True),
        {"gpu_capacity": 4, "gpu_allocatable": 0},
        {"gpu_capacity": 0, "gpu_allocatable": 0},
    ):
        outcome, labels, annotations = _step(labels, annotations, facts)
        assert (outcome.findings, outcome.wait) == ([], 0)
    # A kubelet that has not reported the pod's departure yet: held, never a finding.
    lagging = {"gpu_capacity": 4, "gpu_allocatable": 4, "unexplained_for": None}
    outcome, labels, annotations = _step(labels, annotations, lagging)
    assert outcome.findings == []
    assert outcome.wait > 0
    # And back to containers within the grace period: capacity left, nothing allocatable.
    labels[keys.GPU_WORKLOAD_CONFIG] = keys.WORKLOAD_CONTAINER
    outcome, labels, annotations = _step(labels, annotations, {"gpu_capacity": 4})
    assert outcome.findings == []
    assert labels[PLUGIN] == "true"
    assert labels[keys.DEPLOY_DRIVER] == "true"


def test_gke_nodes_that_run_gkes_own_plugin_are_found_from_their_labels() -> None:
    gke = {**GPU, coexist.GKE_ACCELERATOR_LABEL: "nvidia-tesla-t4"}
    # Before GKE's plugin registered: nothing advertised yet, the labels say it comes.
    outcome = detect(NodeFacts(gke), CoexistPolicy())
    [finding] = outcome.findings
    assert finding.case == "foreign-device-plugin"
    assert f"{coexist.GKE_ACCELERATOR_LABEL}=nvidia-tesla-t4 without" in finding.evidence
    assert outcome.wait == 0
    # The pool opted out of GKE's plugin (as GKE's docs ask for NVIDIA's operator).
    opted_out = {**gke, coexist.GKE_NO_PLUGIN_LABEL: "true"}
    assert detect(NodeFacts(opted_out), CoexistPolicy()).findings == []
    # Once our plugin is deployed there the detector no longer judges the node.
    assert detect(NodeFacts({**gke, PLUGIN: "true"}), CoexistPolicy()).findings == []


def test_admin_label_rules_mark_pools_whose_cloud_runs_a_device_plugin() -> None:
    env = {"COEXIST_FOREIGN_DEVICE_PLUGIN_LABELS": "kubernetes.azure.com/agentpool=managed"}
    rules = CoexistPolicy.from_env(env)
    aks = {**GPU, "kubernetes.azure.com/agentpool": "managed"}
    [finding] = detect(NodeFacts(aks), rules).findings
    assert "kubernetes.azure.com/agentpool=managed" in finding.evidence
    assert detect(NodeFacts(aks), CoexistPolicy()).findings == []


def test_capacity_once_our_plugin_is_deployed_is_ours() -> None:
    labels = {**GPU, PLUGIN: "true"}
    assert detect(NodeFacts(labels, gpu_capacity=4), CoexistPolicy()).findings == []


def test_dra_slices_for_the_node_keep_the_device_plugin_off() -> None:
    outcome = detect(NodeFacts(GPU, dra_slices=("n1-gpu.nvidia.com-abc",)), CoexistPolicy())
    assert [f.case for f in outcome.findings] == ["dra-driver"]
    assert outcome.overrides == {"device-plugin": "false"}


def test_refuse_takes_the_node_out_and_ignore_only_reports() -> None:
    refuse = CoexistPolicy.from_env({"COEXIST_FOREIGN_DEVICE_PLUGIN": "refuse"})
    outcome = detect(NodeFacts(GPU, **served(1)), refuse)
    assert outcome.refused
    assert "deploys nothing" in outcome.findings[0].message
    ignore = CoexistPolicy.from_env({"COEXIST_FOREIGN_DEVICE_PLUGIN": "ignore"})
    outcome = detect(NodeFacts(GPU, **served(1)), ignore)
    assert outcome.findings
    assert outcome.overrides == {}
    assert not outcome.refused


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"COEXIST_DRA_DRIVER": "skip"}, "COEXIST_DRA_DRIVER='skip': expected one of adapt"),
        ({"COEXIST_MANAGED_DRIVER_LABELS": "a=b,=c"}, "COEXIST_MANAGED_DRIVER_LABELS: '=c'"),
        (
            {"COEXIST_FOREIGN_DEVICE_PLUGIN_LABELS": "pool="},
            "COEXIST_FOREIGN_DEVICE_PLUGIN_LABELS: 'pool='",
        ),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        CoexistPolicy.from_env(env)


def test_the_labeller_applies_an_adapt_before_any_operand_is_deployed() -> None:
    outcome = detect(NodeFacts(GPU, **served(2)), CoexistPolicy())
    plan = plan_node(GPU, {}, policy(), coexist=outcome.overrides, refuse=outcome.refused)
    assert plan.labels[keys.DEPLOY_DRIVER] == keys.DRIVER_PREINSTALLED
    assert plan.labels[PLUGIN] == "false"
    assert plan.labels[keys.DEPLOY_PREFIX + "container-toolkit"] == "true"
    assert plan.conflicts == []


def test_the_labeller_takes_every_deploy_label_off_a_refused_node() -> None:
    ours = ledger.encode({PLUGIN: "true", keys.DEPLOY_DRIVER: "true"})
    assert ours is not None
    labels = {**GPU, PLUGIN: "true", keys.DEPLOY_DRIVER: "true"}
    plan = plan_node(labels, {ledger.ANNOTATION: ours}, policy(), coexist={}, refuse=True)
    assert plan.labels[PLUGIN] is None
    assert plan.labels[keys.DEPLOY_DRIVER] is None


def test_the_detectors_own_preinstalled_label_goes_when_the_evidence_goes() -> None:
    ours = ledger.encode({keys.DEPLOY_DRIVER: keys.DRIVER_PREINSTALLED})
    assert ours is not None
    labels = {**GPU, keys.DEPLOY_DRIVER: keys.DRIVER_PREINSTALLED}
    plan = plan_node(labels, {ledger.ANNOTATION: ours}, policy(), coexist={})
    assert plan.labels[keys.DEPLOY_DRIVER] == "true"


def test_a_preinstalled_label_the_operator_wrote_is_the_detectors_even_once_unwarranted() -> None:
    # The evidence went (the foreign plugin left): the write that takes the label back is on
    # its way, and meanwhile it is not the driver manager's `PreinstalledDriver` finding.
    labels = {**GPU, keys.DEPLOY_DRIVER: keys.DRIVER_PREINSTALLED}
    ours = {keys.DEPLOY_DRIVER: keys.DRIVER_PREINSTALLED}
    assert coexist.adapted_preinstalled(labels, coexist.Outcome(), ours)
    assert not coexist.adapted_preinstalled(labels, coexist.Outcome(), {})
    assert not coexist.adapted_preinstalled(labels, coexist.Outcome(), {keys.DEPLOY_DRIVER: "true"})
    assert not coexist.adapted_preinstalled(GPU, coexist.Outcome(), ours)


def test_the_driver_managers_preinstalled_label_stays_whatever_the_detector_says() -> None:
    labels = {**GPU, keys.DEPLOY_DRIVER: keys.DRIVER_PREINSTALLED}
    plan = plan_node(labels, {}, policy(), coexist={})
    assert keys.DEPLOY_DRIVER not in plan.labels


def test_a_loaded_nvidia_module_before_the_operator_deployed_a_driver_is_a_managed_driver() -> None:
    outcome = detect(NodeFacts(GPU, driver_loaded="NodeFeature nfd/aks-1"), CoexistPolicy())
    assert [f.case for f in outcome.findings] == ["managed-driver"]
    assert "NFD saw the kernel module nvidia loaded (NodeFeature nfd/aks-1" in (
        outcome.findings[0].message
    )
    assert outcome.overrides == {"driver": keys.DRIVER_PREINSTALLED}


def test_a_loaded_module_on_a_node_with_the_operators_driver_is_its_own() -> None:
    facts = NodeFacts(GPU, driver_loaded="NodeFeature nfd/gpu-1", driver_ledgered=True)
    assert detect(facts, CoexistPolicy()).findings == []


def test_label_rule_and_nfd_evidence_make_one_finding_with_both() -> None:
    facts = NodeFacts({**GPU, GKE: "latest"}, driver_loaded="NodeFeature nfd/gke-1")
    [finding] = detect(facts, CoexistPolicy()).findings
    assert f"{GKE}=latest" in finding.evidence
    assert "NodeFeature nfd/gke-1" in finding.evidence


@pytest.mark.parametrize(
    ("features", "loaded"),
    [
        ({"flags": {"kernel.loadedmodule": {"elements": {"nvidia": {}, "ext4": {}}}}}, True),
        ({"flags": {"kernel.loadedmodule": {"elements": {"nvidia_uvm": {}}}}}, False),
        ({"flags": {"kernel.loadedmodule": {"elements": None}}}, False),
        ({"attributes": {}}, False),
        ({"flags": "garbage"}, False),
    ],
)
def test_nvidia_is_loaded_only_when_nfd_lists_the_nvidia_module(
    features: dict[str, Any], loaded: bool
) -> None:
    assert coexist.nvidia_loaded(features) is loaded


def test_the_detectors_own_false_goes_back_to_true_when_the_evidence_goes() -> None:
    ours = ledger.encode({PLUGIN: "false"})
    assert ours is not None
    labels = {**GPU, PLUGIN: "false"}
    assert plan_node(labels, {ledger.ANNOTATION: ours}, policy(), coexist={}).labels[PLUGIN] == (
        "true"
    )
    # A human's `false` (not in the ledger) stays.
    assert PLUGIN not in plan_node(labels, {}, policy(), coexist={}).labels


def test_summary_groups_nodes_per_case_and_action() -> None:
    found = coexist.Finding("foreign-device-plugin", "adapt", "x")
    text = coexist.summary({f"n{i}": [found] for i in range(5)})
    assert text.startswith("coexistence: foreign-device-plugin on 5 node(s) (n0, n1, n2 and 2")
    assert coexist.summary({}) == ""


@pytest.mark.parametrize("value", ["paused-for-driver-upgrade", "custom_paused-for-driver-upgrade"])
def test_a_device_plugin_paused_for_a_driver_install_is_still_ours(value: str) -> None:
    # During a driver (re)install the driver manager pauses the plugin; the node's capacity stays.
    labels = {**GPU, keys.DEPLOY_PREFIX + "device-plugin": value}
    outcome = detect(NodeFacts(labels, gpu_capacity=8), CoexistPolicy())
    assert outcome.findings == []
    assert outcome.overrides == {}
