"""The readiness gate planner: state in, plan out."""

from __future__ import annotations

import dataclasses

import pytest

from gpu_operator.nodes import gate
from gpu_operator.nodes.gate import GateFacts, StartupTaint

TAINT = StartupTaint.parse("nvidia.com/gpu-not-ready=true:NoSchedule")
OURS = {"key": "nvidia.com/gpu-not-ready", "value": "true", "effect": "NoSchedule"}
OTHER = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


def test_parse_reads_key_value_and_effect() -> None:
    assert StartupTaint("nvidia.com/gpu-not-ready", "NoSchedule", "true") == TAINT
    assert str(TAINT) == "nvidia.com/gpu-not-ready=true:NoSchedule"
    assert StartupTaint.parse("example.com/wait:NoExecute").value == ""


@pytest.mark.parametrize("text", ["nvidia.com/gpu-not-ready", "=x:NoSchedule", "k=v:Sometimes"])
def test_parse_rejects_bad_values_naming_the_variable(text: str) -> None:
    with pytest.raises(ValueError, match="STARTUP_TAINT"):
        StartupTaint.parse(text)


def test_unset_or_empty_env_turns_the_gate_off() -> None:
    assert StartupTaint.from_env({}) is None
    assert StartupTaint.from_env({"STARTUP_TAINT": " "}) is None
    assert StartupTaint.from_env({"STARTUP_TAINT": "a:NoSchedule"}) == StartupTaint(
        "a", "NoSchedule"
    )


def test_allocatable_counts_whole_gpus_and_mig_slices() -> None:
    assert gate.allocatable_gpus({"nvidia.com/gpu": "2", "cpu": "8"}) == 2
    assert gate.allocatable_gpus({"nvidia.com/mig-1g.10gb": "7", "nvidia.com/gpu": "0"}) == 7
    assert gate.allocatable_gpus({"nvidia.com/gpu": "lots"}) == 0
    assert gate.allocatable_gpus(None) == 0


def test_a_validated_node_loses_only_the_startup_taint() -> None:
    facts = GateFacts(taints=[OTHER, OURS], gpu_allocatable=1, validator_ready=True)
    plan = gate.plan(facts, TAINT)
    assert plan.remove
    assert plan.json_patch() == [
        {"op": "test", "path": "/spec/taints", "value": [OTHER, OURS]},
        {"op": "replace", "path": "/spec/taints", "value": [OTHER]},
    ]


def test_removing_the_only_taint_removes_the_field_as_the_server_would_store_it() -> None:
    plan = gate.plan(GateFacts(taints=[OURS], gpu_allocatable=1, validator_ready=True), TAINT)
    assert plan.json_patch() == [
        {"op": "test", "path": "/spec/taints", "value": [OURS]},
        {"op": "remove", "path": "/spec/taints"},
    ]


def test_the_taint_matches_on_key_and_effect_whatever_its_value() -> None:
    other_value = {**OURS, "value": "false"}
    plan = gate.plan(GateFacts([other_value], 1, True), TAINT)
    assert plan.remove
    assert plan.keep == ()
    same_key_other_effect = {**OURS, "effect": "NoExecute"}
    assert not gate.plan(GateFacts([same_key_other_effect], 1, True), TAINT).remove


@pytest.mark.parametrize(
    ("allocatable", "ready", "lacking"),
    [
        (0, True, "allocatable nvidia.com/gpu"),
        (2, False, "a Ready nvidia-operator-validator pod"),
        (0, False, "allocatable nvidia.com/gpu (or nvidia.com/mig-*) and a Ready"),
    ],
)
def test_a_node_not_yet_validated_keeps_the_taint(
    allocatable: int, ready: bool, lacking: str
) -> None:
    plan = gate.plan(GateFacts([OURS], allocatable, ready), TAINT)
    assert not plan.remove
    assert lacking in plan.waiting_for


def test_the_gate_never_acts_when_off_or_when_the_taint_is_gone() -> None:
    assert not gate.plan(GateFacts([OURS], 1, True), None).remove
    assert not gate.plan(GateFacts([OTHER], 1, True), TAINT).remove
    assert gate.plan(GateFacts([OTHER], 0, False), TAINT).waiting_for == ""


def test_a_waiting_plan_says_what_is_lacking_in_short_words() -> None:
    assert gate.plan(GateFacts([OURS], 0, False), TAINT).lacking == (
        gate.NO_GPUS,
        gate.VALIDATOR_NOT_READY,
    )
    assert gate.plan(GateFacts([OURS], 2, False), TAINT).lacking == (gate.VALIDATOR_NOT_READY,)
    assert gate.plan(GateFacts([OURS], 2, True), TAINT).lacking == ()


def test_the_waiting_summary_groups_nodes_by_what_they_lack() -> None:
    no_validator = gate.plan(GateFacts([OURS], 8, False), TAINT)
    nothing = gate.plan(GateFacts([OURS], 0, False), TAINT)
    validated = gate.plan(GateFacts([OURS], 8, True), TAINT)
    waiting = {"a100-2": no_validator, "a100-1": no_validator, "t4-1": nothing, "h100-1": validated}
    assert gate.waiting_summary(waiting) == (
        "4 node(s) wait at the startup gate: a100-1, a100-2 (validator not Ready); "
        "t4-1 (no allocatable GPUs, validator not Ready); h100-1 (validated, taint being removed)"
    )
    assert gate.waiting_summary({}) == ""


def test_the_waiting_summary_counts_the_names_it_does_not_show() -> None:
    plan = gate.plan(GateFacts([OURS], 0, True), TAINT)
    waiting = {f"node-{i:02}": plan for i in range(12)}
    assert gate.waiting_summary(waiting, shown=3) == (
        "12 node(s) wait at the startup gate: node-00, node-01, node-02 and 9 more "
        "(no allocatable GPUs)"
    )


def test_a_dra_node_opens_once_its_slices_publish_every_gpu() -> None:
    """A DRA node has no allocatable nvidia.com/gpu (the device plugin is off there): its GPUs
    count once its gpu.nvidia.com ResourceSlices publish as many devices as it has GPUs."""
    base = GateFacts(taints=[OURS], validator_ready=True, dra=True, gpus=4)
    assert gate.plan(dataclasses.replace(base, dra_devices=4), TAINT).remove
    assert gate.plan(dataclasses.replace(base, dra_devices=28), TAINT).remove  # MIG devices
    partial = gate.plan(dataclasses.replace(base, dra_devices=2), TAINT)
    assert not partial.remove
    assert partial.lacking == (gate.NO_DRA_DEVICES,)
    assert "4 device(s) in its gpu.nvidia.com ResourceSlices (2 published)" in partial.waiting_for
    unread = gate.plan(base, TAINT)  # resource.k8s.io/v1 not served: nothing publishes
    assert not unread.remove
    assert unread.lacking == (gate.NO_SLICES,)
    # The GPU count unknown (no GFD, no capacity): one published device is enough.
    unknown = dataclasses.replace(base, gpus=0)
    assert not gate.plan(dataclasses.replace(unknown, dra_devices=0), TAINT).remove
    assert gate.plan(dataclasses.replace(unknown, dra_devices=1), TAINT).remove
    # Allocatable GPUs do not open a DRA node's gate: DRA publishes nothing while they remain.
    served = dataclasses.replace(base, gpu_allocatable=4, dra_devices=0)
    assert gate.plan(served, TAINT).lacking == (gate.NO_DRA_DEVICES,)


def test_node_gpus_and_slice_devices() -> None:
    assert gate.node_gpus({"nvidia.com/gpu.count": "8"}, 0) == 8
    assert gate.node_gpus({"nvidia.com/gpu.count": "x"}, 2) == 2
    assert gate.node_gpus({}, 0) == 0
    slices = [
        {"spec": {"driver": "gpu.nvidia.com", "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}]}},
        {"spec": {"driver": "gpu.nvidia.com", "devices": [{"name": "gpu-2"}]}},
        {"spec": {"driver": "compute-domain.nvidia.com", "devices": [{"name": "channel-0"}]}},
    ]
    assert gate.slice_devices(slices) == 3
