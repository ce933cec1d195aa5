"""NVIDIADriver node ownership: selectors and one node's labels in, its owner decision out."""

from __future__ import annotations

from gpu_operator.api import keys
from gpu_operator.nodes import labelling, ownership
from gpu_operator.nodes.labelling import LabelPolicy, OwnerLabel, plan_cleanup, plan_node
from gpu_operator.nodes.ownership import Drivers, DriverSelector, owner_of

GPU = {"feature.node.kubernetes.io/pci-10de.present": "true"}
A100 = {**GPU, keys.GPU_PRODUCT: "A100-SXM4-80GB"}
DEFAULT = DriverSelector("default", default=True)
A100_POOL = DriverSelector("a100", selector={keys.GPU_PRODUCT: "A100-SXM4-80GB"})


def test_a_node_one_driver_selects_belongs_to_it() -> None:
    decision = owner_of(A100, Drivers((DEFAULT, A100_POOL)))
    assert decision == ownership.Ownership("a100", candidates=("a100",))


def test_a_node_no_driver_selects_falls_to_the_default() -> None:
    assert owner_of(GPU, Drivers((DEFAULT, A100_POOL))).owner == "default"


def test_without_a_default_an_unselected_node_has_no_owner() -> None:
    decision = owner_of(GPU, Drivers((A100_POOL,)))
    assert decision.owner is None
    assert not decision.keep


def test_a_driver_without_selector_selects_every_gpu_node() -> None:
    everything = DriverSelector("all")
    assert owner_of(GPU, Drivers((everything,))).owner == "all"


def test_a_cpu_node_has_no_owner_even_with_a_default() -> None:
    decision = owner_of({"kubernetes.io/hostname": "cpu-1"}, Drivers((DEFAULT,)))
    assert decision.owner is None


def test_two_drivers_selecting_a_node_conflict_and_the_node_keeps_its_owner() -> None:
    other = DriverSelector("a100-b", selector={keys.GPU_PRODUCT: "A100-SXM4-80GB"})
    labels = {**A100, keys.DRIVER_OWNER: "a100"}
    decision = owner_of(labels, Drivers((DEFAULT, A100_POOL, other)))
    assert decision.conflict
    assert decision.keep
    assert decision.owner == "a100"
    assert decision.candidates == ("a100", "a100-b")


def test_a_conflicted_node_without_owner_gets_none() -> None:
    other = DriverSelector("a100-b", selector={keys.GPU_PRODUCT: "A100-SXM4-80GB"})
    decision = owner_of(A100, Drivers((DEFAULT, A100_POOL, other)))
    assert decision.owner is None
    assert decision.keep
    label = ownership.label_for(decision, Drivers((DEFAULT, A100_POOL, other)))
    assert plan_node(A100, {}, LabelPolicy(), label).labels.get(keys.DRIVER_OWNER) is None


def test_conflicts_are_listed_under_every_driver_that_selects_the_node() -> None:
    other = DriverSelector("a100-b", selector={keys.GPU_PRODUCT: "A100-SXM4-80GB"})
    drivers = Drivers((DEFAULT, A100_POOL, other))
    found = ownership.conflicts([("n1", A100), ("n2", GPU)], drivers)
    assert found == {"a100": ["n1"], "a100-b": ["n1"]}


def test_two_defaults_freeze_the_nodes_that_would_fall_to_them() -> None:
    second = DriverSelector("default-2", default=True)
    drivers = Drivers((DEFAULT, second, A100_POOL))
    unowned = owner_of({**GPU, keys.DRIVER_OWNER: "default"}, drivers)
    assert unowned.keep
    assert unowned.owner == "default"
    assert owner_of(A100, drivers).owner == "a100"  # selected nodes are unaffected
    assert set(drivers.problems()) == {"default", "default-2"}
    assert "multiple default NVIDIADrivers" in drivers.problems()["default"]


def test_an_invalid_driver_freezes_its_nodes() -> None:
    broken = DriverSelector("a100", selector={keys.GPU_PRODUCT: "A100-SXM4-80GB"}, valid=False)
    decision = owner_of({**A100, keys.DRIVER_OWNER: "a100"}, Drivers((DEFAULT, broken)))
    assert decision.keep
    assert decision.owner == "a100"
    # Its nodes are not handed to the default driver meanwhile.
    assert owner_of(A100, Drivers((DEFAULT, broken))).keep


def test_a_node_owned_by_an_unreadable_driver_keeps_its_label() -> None:
    unreadable = DriverSelector("x", valid=False)
    decision = owner_of({**GPU, keys.DRIVER_OWNER: "x"}, Drivers((DEFAULT, unreadable)))
    assert decision == ownership.Ownership("x", keep=True)


def test_owner_label_is_written_recorded_and_removed_on_cleanup() -> None:
    label = ownership.label_for(owner_of(A100, Drivers((A100_POOL,))), Drivers((A100_POOL,)))
    plan = plan_node(A100, {}, LabelPolicy(driver_crd=True), label)
    assert plan.labels[keys.DRIVER_OWNER] == "a100"
    # auto-upgrade defaults to on for NVIDIADrivers: the driver manager leaves eviction to us.
    assert plan.annotations[keys.UPGRADE_ENABLED] == "true"
    labels = {**A100, **{k: v for k, v in plan.labels.items() if v}}
    annotations = {k: v for k, v in plan.annotations.items() if v}
    cleanup = plan_cleanup(labels, annotations)
    assert cleanup.labels[keys.DRIVER_OWNER] is None


def test_keep_leaves_label_and_upgrade_annotation_alone() -> None:
    labels = {**GPU, keys.DRIVER_OWNER: "someone"}
    annotations = {keys.UPGRADE_ENABLED: "true"}
    plan = plan_node(labels, annotations, LabelPolicy(), OwnerLabel("someone", keep=True))
    assert keys.DRIVER_OWNER not in plan.labels
    assert keys.UPGRADE_ENABLED not in plan.annotations


def test_no_owner_removes_a_stale_owner_label() -> None:
    plan = plan_node({**GPU, keys.DRIVER_OWNER: "gone"}, {}, LabelPolicy(), OwnerLabel(None))
    assert plan.labels[keys.DRIVER_OWNER] is None


def test_auto_upgrade_off_means_no_upgrade_annotation() -> None:
    manual = DriverSelector("manual", default=True, auto_upgrade=False)
    label = ownership.label_for(owner_of(GPU, Drivers((manual,))), Drivers((manual,)))
    plan = plan_node(GPU, {keys.UPGRADE_ENABLED: "true"}, LabelPolicy(), label)
    assert plan.labels[keys.DRIVER_OWNER] == "manual"
    assert plan.annotations[keys.UPGRADE_ENABLED] is None


def test_without_an_owner_decision_the_policy_decides_the_annotation() -> None:
    plan = plan_node(GPU, {}, LabelPolicy(upgrade_annotation=True), OwnerLabel(None))
    assert plan.annotations[keys.UPGRADE_ENABLED] == "true"
    assert labelling.has_gpu(GPU)
