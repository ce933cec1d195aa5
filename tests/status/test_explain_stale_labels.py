"""A label is a claim: each link of the node chain checks it against what the policy runs and what
the node really shows, flags a stale label as a warning that names both, and fails only when pods
cannot use the node's GPUs. The three nodes of issue 30 (item 4): a MIG config label the disabled
MIG manager never applied, a VM workload label on a container node serving pods, and a failed MIG
config on a node that serves 224 MIG devices while the ClusterPolicy status says ready."""

from __future__ import annotations

import dataclasses
import io
import json

from rich.console import Console
from test_explain import healthy, with_labels

from gpu_operator.cli.explain import tree
from gpu_operator.status import explain as ex
from gpu_operator.status import summary
from gpu_operator.status.explain import Link, NodeFacts, PodView, Verdict

MIG_CONFIG = "nvidia.com/mig.config"
MIG_STATE = "nvidia.com/mig.config.state"
WORKLOAD = "nvidia.com/gpu.workload.config"
UPGRADE = "nvidia.com/gpu-driver-upgrade-state"


def no_mig_manager() -> ex.PolicyView:
    return ex.PolicyView(mig_manager=False)


def link(verdict: Verdict, link_id: str) -> Link:
    return next(link for link in verdict.links if link.id == link_id)


def said(link: Link) -> list[tuple[str, str, str]]:
    return [(e.kind, e.ref, e.text) for e in link.evidence]


def a100(**changes: object) -> NodeFacts:
    """healthy() with GFD's MIG labels: MIG-capable GPUs, the single strategy, whole GPUs."""
    facts = with_labels(healthy(), **{"nvidia.com/mig.capable": "true",
                                      "nvidia.com/mig.strategy": "single"})  # fmt: skip
    return dataclasses.replace(facts, **changes)  # type: ignore[arg-type]


def as_the_operator_sees(facts: NodeFacts, gpus: int) -> NodeFacts:
    """The ClusterPolicy reconciler's snapshot of the node: labels, pods known by their problem
    only, the allocatable GPU total its cache keeps; no capacity, conditions or logs."""
    return dataclasses.replace(
        facts,
        capacity=None,
        allocatable=None,
        conditions=None,
        logs=None,
        gpu_allocatable=gpus,
        pods=tuple(PodView(p.name, p.app, p.problem) for p in facts.pods),
    )


# ----- 1: a MIG config label with the MIG manager disabled --------------------------------------


def test_a_mig_config_label_the_disabled_mig_manager_never_applied_is_stale_not_applied() -> None:
    facts = with_labels(a100(policy=no_mig_manager()), **{MIG_CONFIG: "all-1g.5gb",
                                                        MIG_STATE: "success"})  # fmt: skip
    verdict = ex.explain(facts)
    assert verdict.usable, verdict.message()
    mig = link(verdict, "mig")
    assert mig.status == "warning"
    assert mig.summary == (
        "label says nvidia.com/mig.config=all-1g.5gb but the MIG manager is disabled "
        "(migManager.enabled=false) and the GPUs show no MIG devices (whole GPUs, no MIG "
        "devices): the label is stale"
    )
    assert "applied" not in mig.summary
    assert ("resource", "allocatable", "nvidia.com/gpu: 8") in said(mig)
    assert ("label", "nvidia.com/mig.strategy", "single") in said(mig)
    assert "kubectl label node a100-1 nvidia.com/mig.config- nvidia.com/mig.config.state-" in (
        mig.fix
    )
    assert "migManager.enabled=true" in mig.fix
    shown = verdict.to_dict()
    assert shown["usable"] is True
    assert shown["warnings"] == ["mig"]
    assert shown["message"].startswith("node a100-1: usable, with a warning: MIG: label says")

    # The operator's own walk (GFD's labels instead of allocatable) says the same.
    cached = ex.explain(as_the_operator_sees(facts, gpus=8))
    assert cached.usable
    assert link(cached, "mig").status == "warning"
    assert link(cached, "mig").summary.endswith("the label is stale")
    assert ("label", "nvidia.com/gpu.count", "8") in said(link(cached, "mig"))


def test_mig_labels_that_match_what_the_gpus_show_are_not_flagged() -> None:
    # The MIG manager disabled, the GPUs partitioned as the label says (GFD's mixed labels).
    parted = with_labels(
        a100(policy=no_mig_manager(), allocatable={"nvidia.com/mig-1g.5gb": "56"},
             capacity={"nvidia.com/mig-1g.5gb": "56"}),
        **{MIG_CONFIG: "all-1g.5gb", MIG_STATE: "success", "nvidia.com/mig.strategy": "mixed"},
    )  # fmt: skip
    verdict = ex.explain(parted)
    assert verdict.usable
    assert not verdict.warnings
    mig = link(verdict, "mig")
    assert mig.status == "skipped"
    assert mig.summary == (
        "nvidia.com/mig.config=all-1g.5gb is not acted on (the MIG manager is disabled "
        "(migManager.enabled=false)); the GPUs show 56 x nvidia.com/mig-1g.5gb"
    )
    # The operator's default label on whole GPUs, the MIG manager disabled later: no warning.
    plain = with_labels(a100(policy=no_mig_manager()), **{MIG_CONFIG: "all-disabled",
                                                        MIG_STATE: "success"})  # fmt: skip
    assert link(ex.explain(plain), "mig").status == "skipped"
    # all-disabled while the GPUs show MIG devices, and nothing that would turn MIG off.
    stuck = with_labels(parted, **{MIG_CONFIG: "all-disabled"})
    mig = link(ex.explain(stuck), "mig")
    assert mig.status == "warning"
    assert "nothing turns MIG off" in mig.summary


def test_with_the_mig_manager_running_a_success_is_checked_against_the_gpus() -> None:
    applied = with_labels(
        a100(allocatable={"nvidia.com/gpu": "56"}, capacity={"nvidia.com/gpu": "56"}),
        **{MIG_CONFIG: "all-1g.5gb", MIG_STATE: "success",
           "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"},
    )  # fmt: skip
    mig = link(ex.explain(applied), "mig")
    assert mig.status == "ok"
    assert mig.summary == (
        "MIG config all-1g.5gb applied (56 x nvidia.com/gpu (NVIDIA-A100-SXM4-40GB-MIG-1g.5gb))"
    )
    # A config that covers none of the node's GPUs changes nothing and still reports success.
    uncovered = with_labels(a100(), **{MIG_CONFIG: "all-1g.10gb", MIG_STATE: "success"})
    verdict = ex.explain(uncovered)
    assert verdict.usable
    assert link(verdict, "mig").status == "warning"
    assert "the GPUs show no MIG devices" in link(verdict, "mig").summary
    # Non-MIG GPUs (GFD: mig.capable=false): a hand-set config there is not acted on.
    t4 = with_labels(a100(), **{"nvidia.com/mig.capable": "false", MIG_CONFIG: "all-1g.5gb",
                                MIG_STATE: "failed"})  # fmt: skip
    mig = link(ex.explain(t4), "mig")
    assert mig.status == "warning"
    assert "the GPUs are not MIG-capable (nvidia.com/mig.capable=false)" in mig.summary


# ----- 2: a VM workload label while sandbox workloads are off ----------------------------------


def test_a_vm_workload_label_has_no_effect_without_sandbox_workloads_on_a_node_serving_pods() -> (
    None
):
    gpus = {"nvidia.com/gpu": "32"}
    facts = with_labels(
        healthy(allocatable=gpus, capacity=gpus, gpu_pods={"ml/train-0": 8, "ml/train-1": 8}),
        **{WORKLOAD: "vm-passthrough"},
    )
    verdict = ex.explain(facts)
    assert verdict.usable, verdict.message()
    deploy = link(verdict, "deploy-labels")
    assert deploy.status == "warning"
    assert deploy.summary == (
        "label says nvidia.com/gpu.workload.config=vm-passthrough but sandboxWorkloads.enabled="
        "false: the label has no effect and the node is a container node (allocatable "
        "nvidia.com/gpu: 32, 16 in use by 2 pod(s))"
    )
    assert ("pod", "ml/train-0", "holds 8 GPU resource(s)") in said(deploy)
    assert "kubectl label node a100-1 nvidia.com/gpu.workload.config-" in deploy.fix
    assert link(verdict, "allocatable").summary == "32 GPU(s) allocatable, 16 in use by 2 pod(s)"
    # A ClusterPolicy without sandboxWorkloads (off unless set) reads the same.
    policy = ex.policy_view({"driver": {"enabled": True}})
    assert policy.sandbox_workloads is False
    assert ex.explain(dataclasses.replace(facts, policy=policy)).usable

    # With sandbox workloads on, the label does give the GPUs to VMs.
    on = ex.policy_view({"sandboxWorkloads": {"enabled": True}})
    verdict = ex.explain(dataclasses.replace(facts, policy=on))
    assert verdict.failed is not None
    assert verdict.failed.id == "deploy-labels"
    assert verdict.failed.summary == (
        "the node runs vm-passthrough workloads (nvidia.com/gpu.workload.config=vm-passthrough, "
        "sandboxWorkloads.enabled=true): its GPUs go to VMs, not pods"
    )
    assert any("being removed" in e.text for e in verdict.failed.evidence)


def test_with_sandbox_workloads_the_default_workload_and_bad_labels_are_read_as_the_operator() -> (
    None
):
    vgpu = ex.policy_view({"sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-vgpu"}})
    verdict = ex.explain(healthy(policy=vgpu))
    assert verdict.failed is not None
    assert "sandboxWorkloads.defaultWorkload=vm-vgpu" in verdict.failed.summary
    container = ex.policy_view({"sandboxWorkloads": {"enabled": True}})
    typo = with_labels(healthy(policy=container), **{WORKLOAD: "vm-passthru"})
    verdict = ex.explain(typo)
    assert verdict.usable
    deploy = link(verdict, "deploy-labels")
    assert deploy.status == "warning"
    assert deploy.summary == (
        "nvidia.com/gpu.workload.config=vm-passthru is not a workload config (container, "
        "vm-passthrough, vm-vgpu): the operator uses sandboxWorkloads.defaultWorkload=container"
    )


# ----- 3: a failed MIG config on a node serving its GPUs ----------------------------------------


def hgx(**changes: object) -> NodeFacts:
    """32 H100 80GB GPUs as 224 1g.10gb MIG devices; the MIG manager's last change failed."""
    devices = {"nvidia.com/mig-1g.10gb": "224"}
    facts = with_labels(
        healthy(allocatable=devices, capacity=devices),
        **{"nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": "mixed",
           "nvidia.com/gpu.count": "32", MIG_CONFIG: "all-1g.10gb", MIG_STATE: "failed"},
    )  # fmt: skip
    message = "nvml: GPU 3: In use by another client (a driver upgrade restarted the driver)"
    annotations = {**facts.annotations, "nvidia.com/mig.config.state.message": message}
    return dataclasses.replace(facts, annotations=annotations, **changes)  # type: ignore[arg-type]


def test_a_failed_mig_config_on_a_node_serving_224_gpus_is_a_warning_and_agrees_with_status() -> (
    None
):
    verdict = ex.explain(hgx())
    assert verdict.usable, verdict.message()
    mig = link(verdict, "mig")
    assert mig.status == "warning"
    assert mig.summary == (
        "applying MIG config all-1g.10gb failed: the GPUs keep their previous layout (224 x "
        "nvidia.com/mig-1g.10gb), 224 GPU resource(s) allocatable; pods can use them, but the "
        "MIG layout is not the one asked for"
    )
    assert any(e.kind == "annotation" and "In use by another client" in e.text
               for e in mig.evidence)  # fmt: skip
    assert "nvidia-mig-manager" in mig.fix
    # The status counts the node ready: explain does not call it unusable, and the policy's
    # Ready message names no failing link.
    assert ex.worst([verdict]) is None
    status = summary.build(
        [summary.StateReport("state-mig-manager", "ready")],
        summary.ClusterView(worst_node=""),
        namespace="gpu-operator",
        now="t",
        generation=1,
    )
    assert status["state"] == "ready"
    # ... and the operator's own walk, from its cache, agrees.
    cached = ex.explain(as_the_operator_sees(hgx(), gpus=224))
    assert cached.usable, cached.message()
    assert link(cached, "mig").status == "warning"


def test_a_failed_mig_config_that_left_nothing_allocatable_names_the_mig_manager() -> None:
    verdict = ex.explain(hgx(allocatable={"nvidia.com/mig-1g.10gb": "0"}))
    assert verdict.failed is not None
    assert verdict.failed.id == "allocatable"
    assert verdict.failed.summary == (
        "allocatable has no nvidia.com/gpu or nvidia.com/mig-*: the MIG manager's change to "
        "all-1g.10gb is failed"
    )
    assert any("In use by another client" in e.text for e in verdict.failed.evidence)
    cached = ex.explain(as_the_operator_sees(hgx(), gpus=0))
    assert cached.failed is not None
    assert cached.failed.id == "mig"
    assert "no GPU allocatable" in cached.failed.summary


# ----- the other links that read labels ---------------------------------------------------------


def test_an_upgrade_label_is_judged_by_the_policy_and_by_whether_the_node_still_serves() -> None:
    serving = with_labels(healthy(), **{UPGRADE: "drain-required"})
    verdict = ex.explain(serving)
    assert verdict.usable
    assert link(verdict, "upgrade").status == "warning"
    assert "serves 8 GPU resource(s) until it is cordoned" in link(verdict, "upgrade").summary
    cordoned = ex.explain(dataclasses.replace(serving, unschedulable=True))
    assert cordoned.failed is not None
    assert cordoned.failed.summary == (
        "the node is cordoned (by the driver upgrade (drain-required)): no new pod lands here"
    )
    stale = with_labels(healthy(policy=ex.PolicyView(driver=False)), **{UPGRADE: "upgrade-failed"})
    stale = dataclasses.replace(stale, pods=tuple(p for p in stale.pods if p.app != ex.DRIVER_APP))
    verdict = ex.explain(stale)
    assert verdict.usable, verdict.message()
    assert link(verdict, "upgrade").summary == (
        "label says nvidia.com/gpu-driver-upgrade-state=upgrade-failed but driver.enabled=false: "
        "no driver upgrade runs here; the label is stale"
    )


def test_a_paused_deploy_label_names_who_paused_it_and_whether_anything_restores_it() -> None:
    paused = with_labels(healthy(), **{"nvidia.com/gpu.deploy.device-plugin":
                                       "paused-for-mig-change"})  # fmt: skip
    verdict = ex.explain(paused)
    assert verdict.failed is not None
    assert verdict.failed.summary == (
        "nvidia.com/gpu.deploy.device-plugin=paused-for-mig-change: paused while the MIG manager "
        "repartitions the GPUs"
    )
    orphan = ex.explain(dataclasses.replace(paused, policy=no_mig_manager()))
    assert orphan.failed is not None
    assert "the MIG manager is disabled (migManager.enabled=false): nothing restores it" in (
        orphan.failed.summary
    )
    assert orphan.failed.fix == (
        "kubectl label node a100-1 nvidia.com/gpu.deploy.device-plugin=true --overwrite"
    )


def test_the_pods_holding_gpus_are_counted_as_the_scheduler_counts_them() -> None:
    pod = {
        "spec": {
            "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}}],
            "containers": [
                {"resources": {"limits": {"nvidia.com/gpu": 2, "cpu": "1"}}},
                {"resources": {"limits": {"nvidia.com/mig-1g.5gb": "1"}}},
                {},
            ],
        }
    }
    assert ex.gpu_requests(pod) == 4
    pod["spec"]["initContainers"] = []
    assert ex.gpu_requests(pod) == 3
    assert ex.gpu_requests({"spec": {"containers": [{"name": "cpu-only"}]}}) == 0


def test_the_tree_marks_warnings_and_shows_their_evidence_and_fix() -> None:
    verdict = ex.explain(hgx())
    out = io.StringIO()
    Console(file=out, width=250, color_system=None).print(tree(verdict))
    text = out.getvalue()
    assert "node a100-1: usable, 1 warning" in text
    assert "! MIG: applying MIG config all-1g.10gb failed" in text
    assert "annotation nvidia.com/mig.config.state.message: nvml: GPU 3" in text
    assert "fix: read nvidia.com/mig.config.state.message" in text
    assert json.loads(json.dumps(verdict.to_dict()))["warnings"] == ["mig"]
