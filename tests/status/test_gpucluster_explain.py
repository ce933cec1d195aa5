"""`gpu-operator explain policy` for a GPUCluster (status/gpucluster_explain.py, pure): the
conflict with a ClusterPolicy, the requirements, the states in NVIDIA's order, and the first state
that is not ready with its evidence and fix."""

from __future__ import annotations

import copy
from typing import Any

from gpu_operator.operands import dra_driver
from gpu_operator.status import gpucluster as gc_status
from gpu_operator.status.gpucluster_explain import ClusterSnapshot, expected, explain

T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T00:00:05Z"
NS = "gpu-operator"
STATES = list(dra_driver.STATES)
SPEC: dict[str, Any] = {
    "draDriver": {
        "repository": "nvcr.io/nvidia", "image": "dra-driver-nvidia-gpu", "version": "v0.5.0",
        "computeDomains": {"enabled": False},
    },
    "hostPaths": {"driverInstallDir": "/"},
}  # fmt: skip


def cluster(created: str = T1, ready: bool = True, reason: str = "Reconciled", message: str = "",
            spec: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "GPUCluster",
        "metadata": {"name": "gpu-cluster", "creationTimestamp": created, "uid": "gc"},
        "spec": copy.deepcopy(SPEC if spec is None else spec),
        "status": {
            "state": "ready" if ready else "notReady",
            "namespace": NS,
            "conditions": [
                {
                    "type": "Ready",
                    "status": str(ready),
                    "reason": reason,
                    "message": message or "all DRA driver objects are applied",
                }
            ],
        },
    }


def policy(created: str = T0) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy", "creationTimestamp": created},
        "spec": {},
    }


def daemonset(name: str, state: str, desired: int = 2, unavailable: int = 0) -> dict[str, Any]:
    return {
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "generation": 1,
                     "labels": {"nvidia.com/gpu-operator.state": state}},
        "spec": {"selector": {"matchLabels": {"app": name}},
                 "template": {"spec": {"nodeSelector": {dra_driver.DEPLOY_DRA_DRIVER: "true"}}}},
        "status": {"observedGeneration": 1, "desiredNumberScheduled": desired,
                   "numberUnavailable": unavailable, "updatedNumberScheduled": desired,
                   "numberAvailable": desired - unavailable},
    }  # fmt: skip


def pod(name: str, owner: str, node: str, init_failing: str | None = None) -> dict[str, Any]:
    statuses = []
    if init_failing:
        statuses = [{
            "name": init_failing, "ready": False, "restartCount": 4,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                         "message": "nvidia-smi: not found under /run/nvidia"}},
        }]  # fmt: skip
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": owner},
                     "ownerReferences": [{"kind": "DaemonSet", "name": owner,
                                          "uid": f"uid-{owner}"}]},
        "spec": {"nodeName": node},
        "status": {"phase": "Pending" if init_failing else "Running",
                   "initContainerStatuses": statuses,
                   "conditions": [{"type": "Ready", "status": str(not init_failing)}]},
    }  # fmt: skip


def ready_workloads() -> list[dict[str, Any]]:
    return [
        daemonset(dra_driver.PLUGIN_DAEMONSET, dra_driver.STATE_DRIVER),
        daemonset(dra_driver.DCGM_EXPORTER_DRA, dra_driver.STATE_DCGM_EXPORTER),
        daemonset(dra_driver.VALIDATOR, dra_driver.STATE_VALIDATION),
    ]


def snap(**kwargs: Any) -> ClusterSnapshot:
    base: dict[str, Any] = {
        "cluster": cluster(),
        "server_version": "v1.35.0",
        "node_drivers": {"a100-1": "580.95.5", "t4-1": "580"},
        "workloads": ready_workloads(),
    }
    base.update(kwargs)
    return ClusterSnapshot(**base)


def by_id(verdict: Any) -> dict[str, Any]:
    return {link.id: link for link in verdict.links}


def test_a_ready_gpucluster_lists_its_states_in_nvidias_order() -> None:
    spec = copy.deepcopy(SPEC)
    spec["dcgmExporter"] = {"enabled": True}
    verdict = explain(snap(cluster=cluster(spec=spec)))
    assert verdict.ok
    assert verdict.failed is None
    ids = [link.id for link in verdict.links]
    assert ids == ["conflict", "kubernetes", "driver", "cdi", "spec", *STATES]
    links = by_id(verdict)
    assert links[dra_driver.STATE_DRIVER].status == "ok"
    assert "nvidia-dra-driver-kubelet-plugin: 2/2 ready" in links[dra_driver.STATE_DRIVER].summary
    assert links[dra_driver.STATE_DCGM].status == "skipped"  # dcgm.enabled unset: off here
    assert links[dra_driver.STATE_DCGM_EXPORTER].status == "ok"
    assert links[dra_driver.STATE_VALIDATION].status == "ok"
    assert links["kubernetes"].summary == "v1.35.0 (>= 1.34.2)"
    assert links["driver"].status == "ok"
    assert "2 node(s)" in links["driver"].summary
    assert verdict.to_dict()["failedLink"] is None
    assert verdict.to_dict()["kind"] == "GPUCluster"


def test_the_first_state_not_ready_carries_the_evidence_and_the_fix() -> None:
    workloads = ready_workloads()
    workloads[0] = daemonset(dra_driver.PLUGIN_DAEMONSET, dra_driver.STATE_DRIVER, unavailable=1)
    workloads[2] = daemonset(dra_driver.VALIDATOR, dra_driver.STATE_VALIDATION, unavailable=1)
    bad = pod("plugin-x", dra_driver.PLUGIN_DAEMONSET, "t4-1", init_failing="driver-validation")
    good = pod("plugin-y", dra_driver.PLUGIN_DAEMONSET, "a100-1")
    logs = {("plugin-x", "driver-validation"): "starting\nerror: nvidia-smi not found\n"}
    events = [{"type": "Warning", "reason": "BackOff", "message": "restarting failed container",
               "involvedObject": {"kind": "Pod", "name": "plugin-x"}}]  # fmt: skip
    verdict = explain(snap(
        cluster=cluster(ready=False, reason="OperandNotReady", message="waiting"),
        workloads=workloads, pods=[bad, good], logs=logs, events=events,
    ))  # fmt: skip
    failed = verdict.failed
    assert failed is not None
    assert failed.id == dra_driver.STATE_DRIVER
    assert "1/2 pods not ready" in failed.summary
    kinds = {(e.kind, e.ref) for e in failed.evidence}
    assert ("pod", "plugin-x") in kinds
    assert ("pod", "plugin-y") not in kinds  # a healthy pod is no evidence
    texts = " | ".join(e.text for e in failed.evidence)
    assert "t4-1" in texts
    assert "driver-validation" in texts
    assert "error: nvidia-smi not found" in texts  # the telling log line
    assert "BackOff: restarting failed container" in texts
    assert "driver-validation" in failed.fix
    assert "kubectl -n gpu-operator describe pod" in failed.fix
    # The validator, which waits on the plugin, is listed failing, without evidence.
    validation = by_id(verdict)[dra_driver.STATE_VALIDATION]
    assert validation.status == "failed"
    assert not validation.evidence
    assert not validation.fix
    assert not verdict.ok
    assert verdict.to_dict()["failedLink"] == dra_driver.STATE_DRIVER


def test_a_state_whose_workload_is_missing_or_selects_no_node_fails() -> None:
    verdict = explain(snap(workloads=ready_workloads()[:1]))
    failed = verdict.failed
    assert failed is not None
    assert failed.id == dra_driver.STATE_VALIDATION
    assert failed.summary == "DaemonSet nvidia-dra-validator not created yet"
    workloads = ready_workloads()
    workloads[0] = daemonset(dra_driver.PLUGIN_DAEMONSET, dra_driver.STATE_DRIVER, desired=0)
    failed = explain(snap(workloads=workloads)).failed
    assert failed is not None
    assert failed.id == dra_driver.STATE_DRIVER
    assert "no node selected (nodeSelector nvidia.com/gpu.deploy.dra-driver=true)" in failed.summary
    assert "NFD" in failed.fix


def test_a_gpucluster_newer_than_the_clusterpolicy_is_refused_and_says_what_to_delete() -> None:
    refused = cluster(ready=False, reason=gc_status.CONFLICT_REASON, message="refused: ...")
    verdict = explain(snap(cluster=refused, policies=[policy(T0)], workloads=[]))
    failed = verdict.failed
    assert failed is not None
    assert failed.id == "conflict"
    assert "ClusterPolicy cluster-policy" in failed.summary
    assert "kubectl delete clusterpolicy cluster-policy" in failed.fix
    assert "kubectl delete gpucluster gpu-cluster" in failed.fix
    refs = {e.ref: e.text for e in failed.evidence}
    assert refs == {"GPUCluster/gpu-cluster": "refused", "ClusterPolicy/cluster-policy": "runs"}
    for state in STATES:  # nothing of it is applied: no state is judged
        link = by_id(verdict)[state]
        assert (link.status, link.summary) == ("skipped", "not applied (the GPUCluster is refused)")


def test_a_running_gpucluster_warns_about_the_refused_newer_clusterpolicy() -> None:
    verdict = explain(snap(cluster=cluster(created=T0), policies=[policy(T1)]))
    link = by_id(verdict)["conflict"]
    assert link.status == "warning"
    assert "ClusterPolicy cluster-policy is refused" in link.summary
    assert link.fix == "kubectl delete clusterpolicy cluster-policy (this GPUCluster keeps running)"
    assert verdict.ok  # the GPUCluster itself runs
    assert verdict.to_dict()["warnings"] == ["conflict"]


def test_the_requirements_kubernetes_version_driver_branch_and_cdi() -> None:
    old = explain(snap(
        cluster=cluster(ready=False, reason=gc_status.PREREQUISITE_NOT_MET, message="too old"),
        server_version="v1.33.4",
    ))  # fmt: skip
    failed = old.failed
    assert failed is not None
    assert failed.id == "kubernetes"
    assert "older than 1.34.2" in failed.summary
    assert "1.34.2 or newer" in failed.fix
    assert by_id(old)[dra_driver.STATE_DRIVER].status == "skipped"

    verdict = explain(snap(node_drivers={"t4-1": "550.54.15", "a100-1": "580.95.5"},
                           cdi_disabled=["t4-1"]))  # fmt: skip
    driver, cdi = by_id(verdict)["driver"], by_id(verdict)["cdi"]
    assert driver.status == "warning"
    assert "t4-1 (550)" in driver.summary
    assert [e.ref for e in driver.evidence] == ["t4-1"]
    assert cdi.status == "warning"
    assert "CDI disabled" in cdi.summary
    assert "nvidia-ctk runtime configure" in cdi.fix
    assert verdict.ok  # warnings, as the operator reports them

    unknown = explain(snap(node_drivers={}, server_version=None))
    assert by_id(unknown)["driver"].status == "skipped"
    assert by_id(unknown)["kubernetes"].status == "skipped"


def test_an_operator_that_stopped_before_applying_is_the_failing_link() -> None:
    stopped = cluster(ready=False, reason="ReconcileFailed",
                      message="cannot render the DRA driver: no image")  # fmt: skip
    failed = explain(snap(cluster=stopped)).failed
    assert failed is not None
    assert failed.id == "spec"
    assert failed.summary == "cannot render the DRA driver: no image"
    bad = cluster(spec={"draDriver": {"computeDomains": {"enabled": "sometimes"}}})
    failed = explain(snap(cluster=bad)).failed
    assert failed is not None
    assert failed.id == "spec"
    assert failed.summary.startswith("invalid spec: ")
    assert "computeDomains" in failed.summary


def test_expected_workloads_follow_the_spec() -> None:
    from gpu_operator.api.gpucluster import GPUClusterSpec

    spec = GPUClusterSpec.model_validate({"draDriver": {}, "dcgm": {"enabled": True}})
    got = dict(expected(spec))
    assert got[dra_driver.STATE_DRIVER] == [
        ("DaemonSet", dra_driver.PLUGIN_DAEMONSET), ("Deployment", dra_driver.CONTROLLER),
    ]  # compute domains default on  # fmt: skip
    assert got[dra_driver.STATE_DCGM] == [("DaemonSet", dra_driver.DCGM_DRA)]
    assert got[dra_driver.STATE_DCGM_EXPORTER] == []
