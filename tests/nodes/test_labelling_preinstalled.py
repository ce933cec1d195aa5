"""A node whose host already runs a driver: k8s-driver-manager labels it
`nvidia.com/gpu.deploy.driver=pre-installed`, and the labeller never overwrites or removes that
value, nor calls it a conflict (the ClusterPolicy status and an Event report it instead)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.api import ClusterPolicy, keys
from gpu_operator.nodes import labelling, ledger
from gpu_operator.nodes.labelling import LabelPolicy, plan_cleanup, plan_node

GPU = {"feature.node.kubernetes.io/pci-10de.present": "true"}
PREINSTALLED = {keys.DEPLOY_DRIVER: keys.DRIVER_PREINSTALLED}


def policy(**spec: Any) -> LabelPolicy:
    base: dict[str, Any] = {name: {} for name in ("operator", "daemonsets", "driver", "toolkit",
        "devicePlugin", "dcgmExporter", "dcgm", "nodeStatusExporter", "gfd")}  # fmt: skip
    base.update(spec)
    return LabelPolicy.from_policy(
        ClusterPolicy.model_validate({"metadata": {"name": "p"}, "spec": base})
    )


def test_a_new_gpu_node_with_a_preinstalled_driver_gets_every_other_deploy_label() -> None:
    plan = plan_node({**GPU, **PREINSTALLED}, {}, policy())
    assert keys.DEPLOY_DRIVER not in plan.labels
    assert plan.labels[keys.DEPLOY_PREFIX + "device-plugin"] == "true"
    assert plan.conflicts == []


def test_the_label_the_operator_wrote_is_not_taken_back_once_the_driver_manager_changed_it() -> (
    None
):
    # The operator wrote "true" (its ledger says so); the driver manager found a host driver.
    ours = ledger.encode({keys.DEPLOY_DRIVER: "true"})
    assert ours is not None
    labels = {**GPU, **PREINSTALLED, keys.GPU_PRESENT: "true"}
    plan = plan_node(labels, {ledger.ANNOTATION: ours}, policy())
    assert keys.DEPLOY_DRIVER not in plan.labels
    assert plan.conflicts == []


@pytest.mark.parametrize(
    "extra",
    [{keys.DEPLOY_OPERANDS: "false"}, {keys.GPU_WORKLOAD_CONFIG: keys.WORKLOAD_VM_PASSTHROUGH}],
)
def test_nodes_that_lose_their_operands_keep_the_preinstalled_label(extra: dict[str, str]) -> None:
    pol = policy(sandboxWorkloads={"enabled": True})
    plan = plan_node({**GPU, **PREINSTALLED, **extra}, {}, pol)
    assert keys.DEPLOY_DRIVER not in plan.labels
    assert plan.conflicts == []


def test_cleanup_after_uninstall_leaves_the_preinstalled_label() -> None:
    ours = ledger.encode({keys.DEPLOY_DRIVER: "true", keys.GPU_PRESENT: "true"})
    assert ours is not None
    plan = plan_cleanup(
        {**GPU, **PREINSTALLED, keys.GPU_PRESENT: "true"}, {ledger.ANNOTATION: ours}
    )
    assert keys.DEPLOY_DRIVER not in plan.labels
    assert plan.labels[keys.GPU_PRESENT] is None


def test_other_values_of_the_driver_label_are_still_reported_as_conflicts() -> None:
    plan = plan_node({**GPU, keys.DEPLOY_DRIVER: "false"}, {}, policy())
    assert keys.DEPLOY_DRIVER not in plan.labels
    assert any(c.startswith(keys.DEPLOY_DRIVER + "=false") for c in plan.conflicts)


@pytest.mark.parametrize(
    ("labels", "spec", "conflict"),
    [
        ({keys.GPU_PRESENT: "true", **PREINSTALLED}, {}, True),
        ({keys.GPU_PRESENT: "true", **PREINSTALLED}, {"driver": {"enabled": False}}, False),
        ({keys.GPU_PRESENT: "true", keys.DEPLOY_DRIVER: "true"}, {}, False),
        ({**PREINSTALLED}, {}, False),  # not a GPU node (any more)
    ],
)
def test_a_preinstalled_driver_conflicts_only_with_a_policy_that_installs_drivers(
    labels: dict[str, str], spec: dict[str, Any], conflict: bool
) -> None:
    assert labelling.preinstalled_conflict(labels, policy(**spec)) is conflict
    assert labelling.preinstalled_conflict(labels, None) is False
