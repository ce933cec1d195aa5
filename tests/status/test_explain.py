"""The node chain, state in, verdict out: a healthy node holds every link; each broken link is
named first, with its evidence and a fix; what a snapshot does not know is skipped, not guessed."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from gpu_operator.nodes import ledger
from gpu_operator.status import explain as ex
from gpu_operator.status.explain import ContainerView, NodeFacts, PodView

DEPLOY = ("driver", "container-toolkit", "device-plugin", "operator-validator")
SECURE_BOOT = "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service"
ECC = "Failed to launch vectorAdd kernel (error code uncorrectable ECC error encountered)!"


def healthy(**changes: Any) -> NodeFacts:
    labels = {
        "feature.node.kubernetes.io/pci-10de.present": "true",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/cuda.driver.major": "580",
        "nvidia.com/cuda.driver.minor": "95",
        "nvidia.com/cuda.driver.rev": "05",
        **{f"nvidia.com/gpu.deploy.{o}": "true" for o in DEPLOY},
    }
    owned = {f"nvidia.com/gpu.deploy.{o}": "true" for o in DEPLOY}
    pods = (
        PodView("nvidia-driver-daemonset-abc", "nvidia-driver-daemonset",
                containers=(ContainerView("k8s-driver-manager", init=True, state="terminated",
                                          exit_code=0),
                            ContainerView("nvidia-driver-ctr", ready=True, state="running"))),
        PodView("nvidia-container-toolkit-daemonset-x", ex.TOOLKIT_APP),
        PodView("nvidia-device-plugin-daemonset-y", ex.PLUGIN_APP),
        PodView("nvidia-operator-validator-z", ex.VALIDATOR_APP),
    )  # fmt: skip
    facts = NodeFacts(
        name="a100-1",
        labels=labels,
        annotations={ledger.ANNOTATION: json.dumps(owned)},
        capacity={"nvidia.com/gpu": "8", "cpu": "64"},
        allocatable={"nvidia.com/gpu": "8"},
        conditions=[{"type": "Ready", "status": "True"}],
        pods=pods,
        logs={},
        policy=ex.PolicyView(),
    )
    return dataclasses.replace(facts, **changes)


def with_labels(facts: NodeFacts, **labels: str | None) -> NodeFacts:
    merged = dict(facts.labels)
    for key, value in labels.items():
        key = key.replace("__", "/").replace("_", ".")
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return dataclasses.replace(facts, labels=merged)


def replace_pod(facts: NodeFacts, app: str, pod: PodView | None) -> NodeFacts:
    pods = [p for p in facts.pods if p.app != app] + ([pod] if pod else [])
    return dataclasses.replace(facts, pods=tuple(pods))


def test_a_healthy_node_holds_every_link_and_names_its_driver_and_gpus() -> None:
    verdict = ex.explain(healthy())
    assert verdict.usable, verdict.message()
    ids = [link.id for link in verdict.links]
    assert ids == [link_id for link_id, _ in ex.CHAIN]
    by_id = {link.id: link for link in verdict.links}
    assert by_id["driver"].summary == "driver loaded 580.95.05"
    assert by_id["gpu-detected"].summary == "8 x NVIDIA-A100-SXM4-40GB"
    assert by_id["allocatable"].summary == "8 GPU(s) allocatable"
    assert by_id["mig"].status == "skipped"
    assert verdict.to_dict()["failedLink"] is None


def test_a_node_without_nfd_labels_fails_first_at_nfd() -> None:
    facts = healthy(labels={"kubernetes.io/hostname": "a100-1"})
    verdict = ex.explain(facts)
    assert verdict.failed is not None
    assert verdict.failed.id == "nfd"
    assert "Node Feature Discovery" in verdict.failed.fix
    assert len(verdict.links) == 1


def test_a_cpu_node_is_not_a_gpu_node() -> None:
    facts = with_labels(healthy(), **{"feature.node.kubernetes.io/pci-10de.present": None})
    facts = dataclasses.replace(facts, has_nfd=True)
    verdict = ex.explain(facts)
    assert verdict.failed is not None
    assert verdict.failed.id == "gpu-detected"
    assert "no NVIDIA PCI device" in verdict.failed.summary


def test_a_gpu_the_operator_has_not_labelled_yet_names_the_missing_label() -> None:
    labels = {k: v for k, v in healthy().labels.items() if k != "nvidia.com/gpu.present"}
    verdict = ex.explain(healthy(labels=labels))
    assert verdict.failed is not None
    assert verdict.failed.id == "gpu-detected"
    assert "nvidia.com/gpu.present is absent" in verdict.failed.summary


def test_a_deploy_label_set_false_by_someone_else_is_named_with_who_set_it() -> None:
    facts = healthy(annotations={})
    labels = {**facts.labels, "nvidia.com/gpu.deploy.device-plugin": "false"}
    verdict = ex.explain(dataclasses.replace(facts, labels=labels))
    assert verdict.failed is not None
    assert verdict.failed.id == "deploy-labels"
    assert (
        verdict.failed.summary == "nvidia.com/gpu.deploy.device-plugin=false (set by someone else)"
    )
    assert "--overwrite" in verdict.failed.fix


def test_operands_paused_for_a_driver_install_and_vm_nodes_fail_the_deploy_labels() -> None:
    paused = {
        **healthy().labels,
        "nvidia.com/gpu.deploy.container-toolkit": "paused-for-driver-upgrade",
    }
    verdict = ex.explain(healthy(labels=paused))
    assert verdict.failed is not None
    assert verdict.failed.id == "deploy-labels"
    assert "paused" in verdict.failed.summary
    vm = {**healthy().labels, "nvidia.com/gpu.workload.config": "vm-passthrough"}
    verdict = ex.explain(healthy(labels=vm, policy=ex.PolicyView(sandbox_workloads=True)))
    assert verdict.failed is not None
    assert "vm-passthrough" in verdict.failed.summary


def test_a_preinstalled_driver_fails_the_driver_link_only_while_the_policy_installs_drivers() -> (
    None
):
    labels = {**healthy().labels, "nvidia.com/gpu.deploy.driver": "pre-installed"}
    facts = replace_pod(healthy(labels=labels), ex.DRIVER_APP, None)
    verdict = ex.explain(facts)
    assert verdict.failed is not None
    assert verdict.failed.id == "driver"
    assert "preinstalled NVIDIA driver while driver.enabled=true" in verdict.failed.summary
    assert "--gpu-driver none" in verdict.failed.fix
    assert "k8s-driver-manager" in verdict.failed.evidence[0].text
    alone = ex.explain(dataclasses.replace(facts, policy=ex.PolicyView(driver=False)))
    assert alone.usable, alone.message()


def test_a_driver_that_cannot_load_names_the_container_its_message_and_log_lines() -> None:
    driver = PodView(
        "nvidia-driver-daemonset-abc", "nvidia-driver-daemonset",
        problem=f"container nvidia-driver-ctr in CrashLoopBackOff: {SECURE_BOOT} (restarted 2)",
        containers=(ContainerView("k8s-driver-manager", init=True, state="terminated", exit_code=0),
                    ContainerView("nvidia-driver-ctr", state="waiting", reason="CrashLoopBackOff",
                                  message=SECURE_BOOT, restarts=2)),
    )  # fmt: skip
    log = "+ modprobe nvidia\n" + SECURE_BOOT + "\n"
    facts = replace_pod(healthy(), ex.DRIVER_APP, driver)
    facts = dataclasses.replace(facts, logs={(driver.name, "nvidia-driver-ctr"): log})
    verdict = ex.explain(facts)
    assert verdict.failed is not None
    assert verdict.failed.id == "driver"
    assert [link.id for link in verdict.links][-2:] == ["driver-manager", "driver"]
    assert verdict.links[-2].status == "ok"
    assert SECURE_BOOT in verdict.failed.summary
    assert ("log", f"{driver.name}/nvidia-driver-ctr", SECURE_BOOT) in [
        (e.kind, e.ref, e.text) for e in verdict.failed.evidence
    ]
    assert "Secure Boot" in verdict.failed.fix


def test_a_driver_manager_that_has_not_finished_is_named_before_the_driver() -> None:
    driver = PodView(
        "nvidia-driver-daemonset-abc", "nvidia-driver-daemonset",
        problem="init container k8s-driver-manager in CrashLoopBackOff: eviction refused",
        containers=(ContainerView("k8s-driver-manager", init=True, state="waiting"),),
    )  # fmt: skip
    verdict = ex.explain(replace_pod(healthy(), ex.DRIVER_APP, driver))
    assert verdict.failed is not None
    assert verdict.failed.id == "driver-manager"
    assert "eviction refused" in verdict.failed.summary


def test_a_missing_driver_pod_says_whether_the_daemonset_selects_the_node() -> None:
    facts = replace_pod(healthy(), ex.DRIVER_APP, None)
    ds = {"spec": {"template": {"spec": {"nodeSelector": {"nvidia.com/gpu.deploy.driver": "true",
                                                          "pool": "gpu"}}}}}  # fmt: skip
    verdict = ex.explain(dataclasses.replace(facts, daemonsets={ex.DRIVER_APP: ds}))
    assert verdict.failed is not None
    assert verdict.failed.id == "driver-manager"
    assert "lacks the DaemonSet nvidia-driver-daemonset's nodeSelector pool=gpu" in (
        verdict.failed.summary
    )
    verdict = ex.explain(dataclasses.replace(facts, daemonsets={}))
    assert verdict.failed is not None
    assert "does not exist" in verdict.failed.summary


def test_a_failing_toolkit_is_named_with_its_problem() -> None:
    problem = (
        "container nvidia-container-toolkit-ctr in CrashLoopBackOff: configuring containerd failed"
    )
    toolkit = PodView("nvidia-container-toolkit-daemonset-x", ex.TOOLKIT_APP, problem=problem)
    verdict = ex.explain(replace_pod(healthy(), ex.TOOLKIT_APP, toolkit))
    assert verdict.failed is not None
    assert verdict.failed.id == "toolkit"
    assert "configuring containerd failed" in verdict.failed.summary
    assert verdict.failed.evidence[0].kind == "pod"


def test_a_device_plugin_that_never_registered_fails_without_capacity() -> None:
    facts = healthy(capacity={"cpu": "64"}, allocatable={})
    verdict = ex.explain(facts)
    assert verdict.failed is not None
    assert verdict.failed.id == "device-plugin"
    assert "advertises no nvidia.com/gpu" in verdict.failed.summary


def test_unhealthy_devices_are_counted_and_quoted_but_the_node_stays_usable() -> None:
    plugin = "nvidia-device-plugin-daemonset-y"
    logs = {
        (
            plugin,
            "nvidia-device-plugin",
        ): "I start\nE 'nvidia.com/gpu' device marked unhealthy: GPU-1 (XID 48)\n"
    }
    verdict = ex.explain(healthy(allocatable={"nvidia.com/gpu": "7"}, logs=logs))
    assert verdict.usable
    link = next(link for link in verdict.links if link.id == "device-plugin")
    assert link.summary == "8 device(s) registered, 1 unhealthy"
    assert any("XID 48" in e.text for e in link.evidence)
    every = ex.explain(healthy(allocatable={"nvidia.com/gpu": "0"}))
    assert every.failed is not None
    assert every.failed.id == "allocatable"


def test_a_cordoned_or_not_ready_node_fails_allocatable() -> None:
    verdict = ex.explain(healthy(unschedulable=True))
    assert verdict.failed is not None
    assert verdict.failed.id == "allocatable"
    assert "cordoned" in verdict.failed.summary
    down = [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
             "message": "container runtime is down"}]  # fmt: skip
    verdict = ex.explain(healthy(conditions=down))
    assert verdict.failed is not None
    assert "container runtime is down" in verdict.failed.summary


def test_a_failing_cuda_validation_quotes_the_workload_pods_error() -> None:
    validator = PodView(
        "nvidia-operator-validator-z", ex.VALIDATOR_APP,
        problem=f"init container cuda-validation is retrying: cuda: pod failed: {ECC}",
        containers=(ContainerView("driver-validation", init=True, state="terminated", exit_code=0),
                    ContainerView("cuda-validation", init=True, state="running", message=ECC)),
    )  # fmt: skip
    workload = PodView(
        "nvidia-cuda-validator-abc", ex.CUDA_VALIDATOR_APP, phase="Failed",
        problem=f"init container cuda-validation terminated with exit code 1 (Error): {ECC}",
    )  # fmt: skip
    facts = replace_pod(healthy(), ex.VALIDATOR_APP, validator)
    facts = dataclasses.replace(facts, pods=(*facts.pods, workload))
    verdict = ex.explain(facts)
    assert verdict.failed is not None
    assert verdict.failed.id == "validator"
    assert verdict.failed.summary.startswith("cuda-validation: ")
    assert any(e.ref == "nvidia-cuda-validator-abc" for e in verdict.failed.evidence)
    assert "nvidia-smi -r" in verdict.failed.fix


def test_mig_and_upgrade_states_fail_their_links_while_no_gpu_is_known_to_serve() -> None:
    # Labels alone (no allocatable in the snapshot): a MIG change under way, an upgrade.
    labels_only = healthy(capacity=None, allocatable=None)
    busy = with_labels(labels_only, **{"nvidia.com/mig.config.state": "pending",
                                       "nvidia.com/mig.config": "all-1g.5gb"})  # fmt: skip
    verdict = ex.explain(busy)
    assert verdict.failed is not None
    assert verdict.failed.id == "mig"
    assert "all-1g.5gb is being applied (pending)" in verdict.failed.summary
    ok = ex.explain(with_labels(healthy(), **{"nvidia.com/mig.config.state": "success"}))
    assert ok.usable
    for state, words in (("upgrade-failed", "failed"), ("drain-required", "in progress")):
        verdict = ex.explain(
            with_labels(labels_only, **{"nvidia.com/gpu-driver-upgrade-state": state})
        )
        assert verdict.failed is not None
        assert verdict.failed.id == "upgrade"
        assert words in verdict.failed.summary
    assert ex.explain(
        with_labels(healthy(), **{"nvidia.com/gpu-driver-upgrade-state": "upgrade-done"})
    ).usable


def test_a_summary_only_snapshot_skips_what_it_cannot_know() -> None:
    # The status path: pods known only by their problem text, no capacity, no logs.
    facts = healthy(capacity=None, allocatable=None, conditions=None, logs=None)
    facts = dataclasses.replace(facts, pods=tuple(PodView(p.name, p.app) for p in facts.pods))
    verdict = ex.explain(facts)
    assert verdict.usable
    assert next(link for link in verdict.links if link.id == "allocatable").status == "skipped"
    toolkit = PodView(
        "tk", ex.TOOLKIT_APP, problem="init container driver-validation in Init:Error"
    )
    verdict = ex.explain(replace_pod(facts, ex.TOOLKIT_APP, toolkit))
    assert verdict.failed is not None
    assert verdict.failed.id == "toolkit"


def test_the_worst_node_is_the_one_that_fails_earliest_in_the_chain() -> None:
    good = ex.explain(healthy())
    unknown = healthy(name="b", capacity=None, allocatable=None)
    late = ex.explain(with_labels(unknown, **{"nvidia.com/mig.config.state": "pending"}))
    assert late.failed is not None
    early = ex.explain(replace_pod(healthy(name="c"), ex.DRIVER_APP, None))
    assert ex.worst([good, late, early]) == early
    assert ex.worst([good]) is None
    assert early.message().startswith("node c: driver manager failed: no driver pod on the node")


def test_pod_views_read_container_states_from_pod_objects() -> None:
    pod = {
        "metadata": {"name": "p", "labels": {"app": ex.DRIVER_APP}},
        "spec": {"containers": [{"image": "nvcr.io/nvidia/driver:580.95.05-ubuntu22.04"}]},
        "status": {"phase": "Running",
                   "initContainerStatuses": [{"name": "k8s-driver-manager", "ready": True,
                                              "state": {"terminated": {"exitCode": 0}}}],
                   "containerStatuses": [{"name": "nvidia-driver-ctr", "ready": False,
                                          "restartCount": 3,
                                          "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                          "lastState": {"terminated": {"message": SECURE_BOOT}}}]},
    }  # fmt: skip
    view = ex.pod_view(pod, "container nvidia-driver-ctr in CrashLoopBackOff")
    assert view.failing_container == "nvidia-driver-ctr"
    ctr = view.container("nvidia-driver-ctr")
    assert ctr is not None
    assert ctr.message == SECURE_BOOT
    assert ctr.restarts == 3
    manager = view.container("k8s-driver-manager")
    assert manager is not None
    assert manager.succeeded
    assert ex.policy_view({"driver": {"enabled": False}}).driver is False
    assert ex.policy_view({}).toolkit is True


def test_the_ready_message_names_the_worst_nodes_first_failing_link_only_when_not_ready() -> None:
    from gpu_operator.status import summary

    line = ex.explain(replace_pod(healthy(), ex.DRIVER_APP, None)).message()
    cluster = summary.ClusterView(worst_node=line)
    waiting = [summary.StateReport("state-driver", "notReady", "1/1 pods not ready")]
    status = summary.build(waiting, cluster, namespace="ns", now="t", generation=1)
    assert status["conditions"][0]["message"].endswith(
        "; first failing link: node a100-1: driver manager failed: no driver pod on the node"
    )
    ready = summary.build([summary.StateReport("state-driver", "ready")], cluster,
                          namespace="ns", now="t", generation=1)  # fmt: skip
    assert "first failing link" not in ready["conditions"][0]["message"]
