"""Operand pods tolerate the readiness gate's startup taint when the operator has one set."""

from __future__ import annotations

from types import ModuleType

import pytest
from operand_helpers import make_facts, make_policy, pod, render_ds

from gpu_operator.operands import dcgm_exporter, device_plugin, driver, operator_validation

GATE = {"key": "nvidia.com/gpu-not-ready", "operator": "Exists", "effect": "NoSchedule"}
GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.mark.parametrize("module", [driver, device_plugin, operator_validation, dcgm_exporter])
def test_every_operand_tolerates_the_startup_taint(module: ModuleType) -> None:
    ds = render_ds(module, make_policy(), make_facts(startup_toleration=GATE))
    assert pod(ds)["tolerations"] == [GPU, GATE]


def test_no_startup_toleration_when_the_gate_is_off() -> None:
    ds = render_ds(operator_validation, make_policy(), make_facts())
    assert pod(ds)["tolerations"] == [GPU]


def test_the_toleration_follows_the_policy_tolerations_and_is_not_doubled() -> None:
    mine = {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}
    ds = render_ds(
        device_plugin, make_policy(daemonsets={"tolerations": [mine]}),
        make_facts(startup_toleration=GATE),
    )  # fmt: skip
    assert pod(ds)["tolerations"] == [mine, GATE]
    everything = {"operator": "Exists"}
    ds = render_ds(
        device_plugin, make_policy(daemonsets={"tolerations": [everything]}),
        make_facts(startup_toleration=GATE),
    )  # fmt: skip
    assert pod(ds)["tolerations"] == [everything]
