"""The values a fleet needs that the chart's defaults lack: chosen where the install leaves them
unset, said with the reason, and a warning where the install sets them otherwise."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from gpu_operator.nodes import gate
from gpu_operator.nvml import machines
from gpudemo import fit, fleet, install, session

TAINT = "startup-taint.cluster-autoscaler.kubernetes.io/gpu-not-ready"
CHART_TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def _plan(name: str, asked: fit.Asked | None = None, nfd_pods: bool = True) -> fit.Fit:
    return fit.plan(
        fleet.NAMED[name],
        asked or fit.Asked(),
        nfd_pods=nfd_pods,
        chart_nfd_tolerations=CHART_TOLERATIONS,
    )


@pytest.mark.parametrize(
    ("preset", "refused"),
    [
        ("dgx-a100", ""),
        ("t4x4", ""),
        ("dgx-a100-mig-single", ""),
        ("dgx-a100-mig-mixed", "several MIG device types on one node (1g.5gb, 2g.10gb, 3g.20gb)"),
    ],
)
def test_the_single_strategy_refuses_a_node_with_several_mig_device_types(
    preset: str, refused: str
) -> None:
    assert fit.single_strategy_refuses(machines.preset(preset)) == refused


def test_the_mig_fleet_gets_the_mixed_strategy_and_says_why() -> None:
    fitted = _plan("mig")
    [choice] = fitted.choices
    assert (choice.key, choice.value) == ("mig.strategy", "mixed")
    assert "node pool mig-mixed (dgx-a100-mig-mixed) has several MIG device types" in choice.why
    assert "refuses under mig.strategy=single" in choice.why
    assert fitted.warnings == ()
    lines = fitted.lines("passed to helm install as --set/--set-json")
    assert lines[0].startswith("values for this fleet (passed to helm install as --set")
    assert lines[1].startswith("  mig.strategy=mixed: node pool mig-mixed")


def test_a_strategy_the_user_sets_wins_and_single_is_warned_about() -> None:
    assert _plan("mig", fit.Asked(mig_strategy="mixed")) == fit.Fit()
    fitted = _plan("mig", fit.Asked(mig_strategy="single"))
    assert fitted.choices == ()
    [warning] = fitted.warnings
    assert warning.startswith("mig.strategy=single (set by the install) does not fit this fleet")
    assert "use mig.strategy=mixed" in warning


def test_startup_tainted_gpu_nodes_get_the_readiness_gate_and_nfd_its_toleration() -> None:
    fitted = _plan("autoscaled")
    gate_choice, nfd_choice = fitted.choices
    assert gate_choice.key == "operator.startupTaint"
    assert gate_choice.value == f"{TAINT}=true:NoSchedule"
    assert "node pool a100 registers its nodes with taint" in gate_choice.why
    assert nfd_choice.key == "node-feature-discovery.worker.tolerations"
    assert nfd_choice.value == [
        *CHART_TOLERATIONS,
        {"key": TAINT, "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert nfd_choice.shown == (
        f"node-feature-discovery.worker.tolerations: the chart's 1 tolerations + {TAINT} "
        "(Exists, NoSchedule)"
    )
    # In-process, NFD labels the nodes directly: only the gate is needed.
    assert [c.key for c in _plan("autoscaled", nfd_pods=False).choices] == ["operator.startupTaint"]


def test_a_gate_on_another_taint_is_warned_about() -> None:
    fitted = _plan("autoscaled", fit.Asked(startup_taint="other/taint:NoSchedule"))
    assert [c.key for c in fitted.choices] == ["node-feature-discovery.worker.tolerations"]
    [warning] = fitted.warnings
    assert warning.startswith(f"taint {TAINT}=true:NoSchedule of node pool(s) a100 is neither")


def test_vm_pools_without_sandbox_workloads_are_warned_about() -> None:
    [warning] = _plan("kubevirt").warnings
    assert warning == (
        "node pool(s) passthrough, vgpu-t4, vgpu-a30 ask for VM workloads "
        "(nvidia.com/gpu.workload.config) but sandbox workloads are off "
        "(sandboxWorkloads.enabled=false): their GPUs go to containers. For VMs: --policy "
        "examples/kubevirt-vgpu.yaml"
    )
    assert _plan("kubevirt", fit.Asked(sandbox=True)) == fit.Fit()


@pytest.mark.parametrize("name", ["default", "small", "hopper", "inference", "aks-preinstalled"])
def test_fleets_of_plain_gpu_nodes_need_nothing(name: str) -> None:
    assert _plan(name) == fit.Fit()
    assert _plan(name).lines("x") == []


def test_what_values_files_and_sets_ask_for_later_ones_winning(tmp_path: Path) -> None:
    first = tmp_path / "a.yaml"
    first.write_text(
        "mig: {strategy: single}\noperator: {startupTaint: 'a/b:NoSchedule'}\n"
        "node-feature-discovery: {worker: {tolerations: [{key: x, operator: Exists}]}}\n"
    )
    second = tmp_path / "b.yaml"
    second.write_text("sandboxWorkloads: {enabled: true}\n")
    asked = fit.asked_from_values([first, second], ["mig.strategy=mixed,driver.enabled=false"])
    assert asked == fit.Asked(
        mig_strategy="mixed",
        startup_taint="a/b:NoSchedule",
        sandbox=True,
        nfd_tolerations=({"key": "x", "operator": "Exists"},),
    )
    assert fit.asked_from_values([], []) == fit.Asked()
    assert fit.asked_from_values([], [f"operator.startupTaint={TAINT}=true:NoSchedule"]) == (
        fit.Asked(startup_taint=f"{TAINT}=true:NoSchedule")
    )


def test_the_chart_in_the_checkout_names_nfds_worker_tolerations() -> None:
    tolerations = fit.chart_nfd_tolerations(install.find_chart())
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations


def test_the_built_in_policy_gets_the_fleets_values_and_a_users_policy_keeps_its_own() -> None:
    before = copy.deepcopy(session.DEFAULT_POLICY)
    applied = fit.for_in_process(session.Options(fleet=fleet.NAMED["mig"]), session.DEFAULT_POLICY)
    assert applied.options.policy["spec"]["mig"] == {"strategy": "mixed"}
    assert before == session.DEFAULT_POLICY  # the module's default stays as it was
    assert applied.lines[1].startswith("  mig.strategy=mixed: node pool mig-mixed")

    mine = copy.deepcopy(session.DEFAULT_POLICY)
    kept = fit.for_in_process(
        session.Options(fleet=fleet.NAMED["mig"], policy=mine), session.DEFAULT_POLICY
    )
    assert kept.options.policy is mine
    assert kept.lines[0].startswith("warning: mig.strategy=single (set by the install)")

    gated = fit.for_in_process(
        session.Options(fleet=fleet.NAMED["autoscaled"]), session.DEFAULT_POLICY
    )
    assert gated.options.operator_settings["startup_taint"] == gate.StartupTaint(
        TAINT, "NoSchedule", "true"
    )


def test_helm_gets_the_fleets_values_as_set_and_set_json_items() -> None:
    applied = fit.for_helm(
        session.Options(fleet=fleet.NAMED["autoscaled"], sets=["agents.builtin=true"]),
        install.find_chart(),
    )
    assert applied.options.sets == [
        "agents.builtin=true",
        f"operator.startupTaint={TAINT}=true:NoSchedule",
    ]
    [json_item] = applied.options.set_json
    assert json_item.startswith('node-feature-discovery.worker.tolerations=[{"key":')
    assert f'{{"key":"{TAINT}","operator":"Exists","effect":"NoSchedule"}}]' in json_item


def test_two_pools_share_the_gate_and_a_second_taint_is_warned_about() -> None:
    gated = {"key": TAINT, "value": "true"}
    other = {"key": "example.com/maintenance", "effect": "NoExecute"}
    fleet_ = fleet.parse(
        {
            "pools": [
                {"name": "a", "machine": "t4x4", "taints": [gated]},
                {"name": "b", "machine": "l4x8", "taints": [gated]},
                {"name": "c", "machine": "t4x4", "taints": [other]},
            ]
        },
        "tainted.yaml",
    )
    fitted = fit.plan(fleet_, fit.Asked(), nfd_pods=False)
    [choice] = fitted.choices
    assert choice.why.startswith("node pools a, b register their nodes with taint")
    [warning] = fitted.warnings
    assert warning.startswith("taint example.com/maintenance:NoExecute of node pool(s) c")
    assert "add a toleration to daemonsets.tolerations" in warning
