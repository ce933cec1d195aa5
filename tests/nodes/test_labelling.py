"""Node labelling: deploy label sets per workload config, ownership, cleanup (reference §4)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.api import ClusterPolicy, keys
from gpu_operator.nodes import ledger
from gpu_operator.nodes.labelling import LabelPolicy, has_nfd, mig_capable, plan_cleanup, plan_node

GPU = {"feature.node.kubernetes.io/pci-10de.present": "true"}
D = keys.DEPLOY_PREFIX
CONTAINER_SET = {
    D + op: "true"
    for op in ("driver", "gpu-feature-discovery", "container-toolkit", "device-plugin", "dcgm",
               "dcgm-exporter", "node-status-exporter", "operator-validator", "client")
}  # fmt: skip


def policy(**spec: Any) -> LabelPolicy:
    base: dict[str, Any] = {name: {} for name in ("operator", "daemonsets", "driver", "toolkit",
        "devicePlugin", "dcgmExporter", "dcgm", "nodeStatusExporter", "gfd")}  # fmt: skip
    base.update(spec)
    return LabelPolicy.from_policy(
        ClusterPolicy.model_validate({"metadata": {"name": "p"}, "spec": base})
    )


def apply(
    labels: dict[str, str], annotations: dict[str, str], pol: LabelPolicy
) -> tuple[dict[str, str], dict[str, str]]:
    plan = plan_node(labels, annotations, pol)
    new_labels = {**labels, **{k: v for k, v in plan.labels.items() if v is not None}}
    for key in [k for k, v in plan.labels.items() if v is None]:
        new_labels.pop(key)
    new_ann = {**annotations, **{k: v for k, v in plan.annotations.items() if v is not None}}
    for key in [k for k, v in plan.annotations.items() if v is None]:
        new_ann.pop(key)
    return new_labels, new_ann


def deploy(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k.startswith(D)}


@pytest.mark.parametrize("pci_label", keys.NFD_GPU_LABELS)
def test_gpu_node_gets_present_and_container_set(pci_label: str) -> None:
    labels, annotations = apply({pci_label: "true"}, {}, policy())
    assert labels[keys.GPU_PRESENT] == "true"
    assert deploy(labels) == CONTAINER_SET
    assert ledger.read(annotations)[keys.GPU_PRESENT] == "true"


def test_cpu_node_is_untouched() -> None:
    plan = plan_node({"kubernetes.io/hostname": "cpu-1"}, {}, policy())
    assert plan.empty


def test_mig_capable_node_gets_mig_manager_and_default_config() -> None:
    labels, _ = apply({**GPU, keys.MIG_CAPABLE: "true"}, {}, policy())
    assert labels[D + "mig-manager"] == "true"
    assert labels[keys.MIG_CONFIG] == "all-disabled"


def test_an_empty_mig_config_gets_the_default_as_upstream() -> None:
    labels, _ = apply({**GPU, keys.MIG_CAPABLE: "true", keys.MIG_CONFIG: ""}, {}, policy())
    assert labels[keys.MIG_CONFIG] == "all-disabled"


def test_existing_mig_config_is_kept() -> None:
    labels, _ = apply(
        {**GPU, keys.MIG_CAPABLE: "true", keys.MIG_CONFIG: "all-1g.10gb"}, {}, policy()
    )
    assert labels[keys.MIG_CONFIG] == "all-1g.10gb"


def test_no_mig_config_when_mig_manager_disabled() -> None:
    labels, _ = apply({**GPU, keys.MIG_CAPABLE: "true"}, {}, policy(migManager={"enabled": False}))
    assert keys.MIG_CONFIG not in labels


@pytest.mark.parametrize(
    ("labels", "capable"),
    [({keys.MIG_CAPABLE: "true"}, True), ({keys.MIG_CAPABLE: "false"}, False),
     ({keys.GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3"}, True), ({keys.GPU_PRODUCT: "Tesla-T4"}, False),
     ({keys.GPU_PRODUCT: "NVIDIA-A30", keys.VGPU_HOST_DRIVER_VERSION: "550"}, False)],
)  # fmt: skip
def test_mig_capability(labels: dict[str, str], capable: bool) -> None:
    assert mig_capable(labels) is capable


SANDBOX = {"sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-passthrough"}}


@pytest.mark.parametrize(
    ("spec", "node_config", "expected"),
    [
        (SANDBOX, None, {"sandbox-device-plugin", "sandbox-validator", "vfio-manager",
                         "kata-manager", "cc-manager", "client"}),
        (SANDBOX, "vm-vgpu", {"sandbox-device-plugin", "vgpu-manager", "vgpu-device-manager",
                              "sandbox-validator", "cc-manager", "client"}),
        (SANDBOX, "container", {k.removeprefix(D) for k in CONTAINER_SET}),
        (SANDBOX, "bogus", {"sandbox-device-plugin", "sandbox-validator", "vfio-manager",
                            "kata-manager", "cc-manager", "client"}),
        ({"sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-passthrough",
                               "mode": "kata"}}, None,
         {"kata-sandbox-device-plugin", "sandbox-validator", "vfio-manager", "kata-manager",
          "cc-manager", "client"}),
        ({}, "vm-vgpu", {k.removeprefix(D) for k in CONTAINER_SET}),
    ],
)  # fmt: skip
def test_deploy_set_per_workload_config(
    spec: dict[str, Any], node_config: str | None, expected: set[str]
) -> None:
    node = dict(GPU)
    if node_config:
        node[keys.GPU_WORKLOAD_CONFIG] = node_config
    labels, _ = apply(node, {}, policy(**spec))
    assert {k.removeprefix(D) for k in deploy(labels)} == expected


def test_switching_workload_config_swaps_only_our_labels() -> None:
    labels, annotations = apply(dict(GPU), {}, policy(**SANDBOX))
    labels[keys.GPU_WORKLOAD_CONFIG] = "container"
    labels, annotations = apply(labels, annotations, policy(**SANDBOX))
    assert deploy(labels) == CONTAINER_SET


def test_operands_false_removes_deploy_labels_and_true_restores() -> None:
    labels, annotations = apply(dict(GPU), {}, policy())
    labels[keys.DEPLOY_OPERANDS] = "false"
    labels, annotations = apply(labels, annotations, policy())
    assert deploy(labels) == {keys.DEPLOY_OPERANDS: "false"}
    labels[keys.DEPLOY_OPERANDS] = "true"
    labels, annotations = apply(labels, annotations, policy())
    assert deploy(labels) == {**CONTAINER_SET, keys.DEPLOY_OPERANDS: "true"}


def test_pause_values_from_the_driver_manager_are_kept_silently() -> None:
    labels, annotations = apply(dict(GPU), {}, policy())
    labels[D + "device-plugin"] = "paused-for-driver-upgrade"
    plan = plan_node(labels, annotations, policy())
    assert D + "device-plugin" not in plan.labels
    assert plan.conflicts == []


def test_human_value_is_never_overwritten_and_is_reported() -> None:
    plan = plan_node({**GPU, D + "dcgm-exporter": "false"}, {}, policy())
    assert D + "dcgm-exporter" not in plan.labels
    assert plan.conflicts == [
        "nvidia.com/gpu.deploy.dcgm-exporter=false was not set by the operator; left as is "
        "(wanted true)"
    ]


def test_human_label_outside_the_set_is_not_removed() -> None:
    plan = plan_node({**GPU, D + "vfio-manager": "true"}, {}, policy())
    assert D + "vfio-manager" not in plan.labels
    assert any("vfio-manager=true was not set by the operator" in c for c in plan.conflicts)


def test_losing_the_gpu_removes_our_labels() -> None:
    labels, annotations = apply(dict(GPU), {}, policy())
    del labels["feature.node.kubernetes.io/pci-10de.present"]
    labels, annotations = apply(labels, annotations, policy())
    assert labels == {keys.GPU_PRESENT: "false"}
    assert ledger.read(annotations) == {keys.GPU_PRESENT: "false"}


def test_gpu_present_is_ours_even_when_an_earlier_operator_wrote_it() -> None:
    labels, _ = apply({keys.GPU_PRESENT: "true", D + "driver": "true"}, {}, policy())
    assert labels[keys.GPU_PRESENT] == "false"
    assert labels[D + "driver"] == "true"  # not ours: reported, left in place


def test_converged_node_needs_no_write() -> None:
    labels, annotations = apply({**GPU, keys.MIG_CAPABLE: "true"}, {}, policy())
    assert plan_node(labels, annotations, policy()).empty


def test_one_merge_patch_per_node() -> None:
    plan = plan_node(dict(GPU), {}, policy())
    patch = plan.merge_patch()
    assert set(patch) == {"metadata"}
    assert set(patch["metadata"]) == {"labels", "annotations"}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("driver", "sandbox", "expected"),
    [({"upgradePolicy": {"autoUpgrade": True}}, False, "true"),
     ({"upgradePolicy": {"autoUpgrade": False}}, False, None),
     ({}, False, None),
     ({"upgradePolicy": {"autoUpgrade": True}, "enabled": False}, False, None),
     ({"upgradePolicy": {"autoUpgrade": True}}, True, None)],
)  # fmt: skip
def test_upgrade_enabled_annotation(
    driver: dict[str, Any], sandbox: bool, expected: str | None
) -> None:
    spec: dict[str, Any] = {"driver": driver}
    if sandbox:
        spec["sandboxWorkloads"] = {"enabled": True}
    _, annotations = apply(dict(GPU), {}, policy(**spec))
    assert annotations.get(keys.UPGRADE_ENABLED) == expected


def test_cleanup_leaves_the_node_as_found() -> None:
    original = {**GPU, keys.MIG_CAPABLE: "true", D + "dcgm-exporter": "false", "team": "ml"}
    labels, annotations = apply(
        dict(original), {}, policy(driver={"upgradePolicy": {"autoUpgrade": True}})
    )
    assert labels != original
    plan = plan_cleanup(labels, annotations)
    for key, value in plan.labels.items():
        assert value is None
        labels.pop(key)
    assert labels == original
    assert plan.annotations == {ledger.ANNOTATION: None, keys.UPGRADE_ENABLED: None}


def test_cleanup_keeps_a_label_a_human_changed() -> None:
    labels, annotations = apply({**GPU, keys.MIG_CAPABLE: "true"}, {}, policy())
    labels[keys.MIG_CONFIG] = "all-balanced"
    plan = plan_cleanup(labels, annotations)
    assert keys.MIG_CONFIG not in plan.labels


def test_mangled_ledger_owns_nothing() -> None:
    assert ledger.read({ledger.ANNOTATION: "{not json"}) == {}
    assert ledger.read({ledger.ANNOTATION: "[1]"}) == {}


def test_has_nfd() -> None:
    assert has_nfd({"feature.node.kubernetes.io/kernel-version.full": "6.8"})
    assert not has_nfd({"kubernetes.io/os": "linux"})
