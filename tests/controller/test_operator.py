"""The operator end to end on kubesim over real HTTP (reference §3-§4, issue 5 §7)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml
from operator_harness import NAMESPACE, Env, gpu_node, policy
from waiting import DEADLINE

from gpu_operator.api import keys
from gpu_operator.nodes import ledger

ROOT = Path(__file__).resolve().parents[2]
HELM = ROOT / ".tools" / "bin" / "helm"
CHART = ROOT / "charts" / "gpu-operator"

CORE_DAEMONSETS = {
    "nvidia-driver-daemonset",
    "nvidia-container-toolkit-daemonset",
    "nvidia-operator-validator",
    "nvidia-device-plugin-daemonset",
    "nvidia-dcgm-exporter",
    "gpu-feature-discovery",
}


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


async def test_install_converges_to_ready_with_labels(env: Env) -> None:
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    assert set(env.daemonsets()) >= CORE_DAEMONSETS
    status = env.policy()["status"]
    assert status["namespace"] == NAMESPACE
    assert conditions(status)["Ready"]["reason"] == "Reconciled"
    states = {s["name"]: s["state"] for s in status["states"]}
    assert states["state-driver"] == "ready"
    assert states["state-dcgm"] == "disabled"
    gpu = env.node_labels("gpu-2")
    assert gpu[keys.GPU_PRESENT] == "true"
    assert gpu[keys.DEPLOY_PREFIX + "driver"] == "true"
    assert gpu[keys.DEPLOY_PREFIX + "mig-manager"] == "true"
    assert gpu[keys.MIG_CONFIG] == "all-disabled"
    assert keys.GPU_PRESENT not in env.node_labels("cpu-1")
    for ds in env.daemonsets().values():
        refs = ds["metadata"]["ownerReferences"]
        assert refs[0]["kind"] == "ClusterPolicy"
        assert ds["metadata"]["annotations"][keys.LAST_APPLIED_HASH]


async def test_disable_and_reenable_an_operand(env: Env) -> None:
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    env.sim.store.patch(
        "clusterpolicies.nvidia.com", "cluster-policy", {"spec": {"gfd": {"enabled": False}}}
    )
    await env.wait(lambda: "gpu-feature-discovery" not in env.daemonsets(), "GFD removed")
    await env.wait_ready()
    env.sim.store.patch(
        "clusterpolicies.nvidia.com", "cluster-policy", {"spec": {"gfd": {"enabled": True}}}
    )
    await env.wait(lambda: "gpu-feature-discovery" in env.daemonsets(), "GFD back")
    await env.wait_ready()


async def test_env_change_writes_only_the_affected_daemonset(env: Env) -> None:
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    before = {n: d["metadata"]["resourceVersion"] for n, d in env.daemonsets().items()}
    generations = {n: d["metadata"]["generation"] for n, d in env.daemonsets().items()}
    env.sim.store.patch(
        "clusterpolicies.nvidia.com",
        "cluster-policy",
        {"spec": {"devicePlugin": {"env": [{"name": "LOG_LEVEL", "value": "debug"}]}}},
    )

    def plugin_updated() -> bool:
        ds = env.daemonsets()["nvidia-device-plugin-daemonset"]
        return bool(ds["metadata"]["generation"] > generations["nvidia-device-plugin-daemonset"])

    await env.wait(plugin_updated, "device plugin DaemonSet updated")
    await env.wait_ready()
    changed = {
        n for n, d in env.daemonsets().items() if d["metadata"]["generation"] != generations[n]
    }
    # The MPS control daemon runs the device-plugin image with the device plugin's env (upstream).
    assert changed == {"nvidia-device-plugin-daemonset", "nvidia-device-plugin-mps-control-daemon"}
    container = env.daemonsets()["nvidia-device-plugin-daemonset"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert {"name": "LOG_LEVEL", "value": "debug"} in container["env"]
    assert before  # the snapshot was taken


async def test_steady_state_makes_no_writes(env: Env) -> None:
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    await env.sim.settle(timeout=DEADLINE)
    rv = env.sim.store.resource_version
    env.operator.queue.add("policy")
    for name in ("gpu-1", "gpu-2", "cpu-1"):
        env.operator.queue.add(f"node/{name}")
    await env.wait(lambda: len(env.operator.queue) == 0, "queue drained")
    await env.sim.settle(timeout=DEADLINE)
    changed = [
        o
        for o in env.sim.store.list("daemonsets", namespace=NAMESPACE)
        if int(o["metadata"]["resourceVersion"]) > rv
    ]
    assert changed == []
    nodes_changed = [
        n for n in env.sim.store.list("nodes") if int(n["metadata"]["resourceVersion"]) > rv
    ]
    assert nodes_changed == []


async def test_operands_false_and_back(env: Env) -> None:
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    env.sim.store.patch("nodes", "gpu-1", {"metadata": {"labels": {keys.DEPLOY_OPERANDS: "false"}}})
    await env.wait(
        lambda: (
            not any(
                k.startswith(keys.DEPLOY_PREFIX) and k != keys.DEPLOY_OPERANDS
                for k in env.node_labels("gpu-1")
            )
        ),
        "deploy labels removed",
    )
    env.sim.store.patch("nodes", "gpu-1", {"metadata": {"labels": {keys.DEPLOY_OPERANDS: "true"}}})
    await env.wait(
        lambda: env.node_labels("gpu-1").get(keys.DEPLOY_PREFIX + "driver") == "true",
        "deploy labels back",
    )


async def test_new_gpu_node_is_labelled_and_removed_nfd_label_unlabels(env: Env) -> None:
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    gpu_node(env.sim, "gpu-3")
    await env.wait(lambda: env.node_labels("gpu-3").get(keys.GPU_PRESENT) == "true", "gpu-3")
    env.sim.store.patch(
        "nodes",
        "gpu-3",
        {"metadata": {"labels": {"feature.node.kubernetes.io/pci-10de.present": None}}},
    )
    await env.wait(lambda: env.node_labels("gpu-3").get(keys.GPU_PRESENT) == "false", "unlabelled")
    assert not any(k.startswith(keys.DEPLOY_PREFIX) for k in env.node_labels("gpu-3"))


async def test_human_deploy_label_is_not_overwritten(env: Env) -> None:
    env.sim.store.patch(
        "nodes", "gpu-1", {"metadata": {"labels": {keys.DEPLOY_PREFIX + "dcgm-exporter": "false"}}}
    )
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    assert env.node_labels("gpu-1")[keys.DEPLOY_PREFIX + "dcgm-exporter"] == "false"
    events = env.sim.store.list("events", namespace="default")  # about a Node: in `default`
    assert any(e["reason"] == "LabelLeftAlone" for e in events)
    message = conditions(env.policy()["status"])["Ready"]["message"]
    assert "set by someone else" in message


async def test_two_policies_the_older_wins(env: Env) -> None:
    env.sim.store.create(policy())
    second = policy()
    second["metadata"]["name"] = "second"
    env.sim.store.create(second)
    env.start_operator()
    await env.wait_ready()
    await env.wait(
        lambda: (env.policy("second").get("status") or {}).get("state") == "ignored", "ignored"
    )


async def test_malformed_policy_gets_a_condition_and_changes_nothing(env: Env) -> None:
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    before = {n: d["metadata"]["resourceVersion"] for n, d in env.daemonsets().items()}
    env.sim.store.patch(
        "clusterpolicies.nvidia.com",
        "cluster-policy",
        {"spec": {"driver": {"upgradePolicy": {"maxUnavailable": "lots"}}}},
    )

    def invalid() -> bool:
        status = env.policy().get("status") or {}
        error = conditions(status).get("Error") or {}
        return bool(error.get("reason") == "InvalidSpec")

    await env.wait(invalid, "InvalidSpec condition")
    message = conditions(env.policy()["status"])["Error"]["message"]
    assert "spec.driver.upgradePolicy.maxUnavailable" in message
    assert {n: d["metadata"]["resourceVersion"] for n, d in env.daemonsets().items()} == before


async def test_deleting_the_policy_cleans_objects_and_labels(env: Env) -> None:
    env.sim.store.patch("nodes", "gpu-1", {"metadata": {"labels": {"team": "ml"}}})
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    env.sim.store.delete("clusterpolicies.nvidia.com", "cluster-policy")
    await env.wait(lambda: not env.daemonsets(), "operand DaemonSets garbage-collected")

    def clean() -> bool:
        labels = env.node_labels("gpu-1")
        return keys.GPU_PRESENT not in labels and not any(
            k.startswith(keys.DEPLOY_PREFIX) for k in labels
        )

    await env.wait(clean, "operator labels removed")
    node = env.sim.store.get("nodes", "gpu-1")
    assert node is not None
    assert ledger.ANNOTATION not in (node["metadata"].get("annotations") or {})
    assert env.node_labels("gpu-1")["team"] == "ml"


async def test_no_gpu_nodes_is_ready_without_daemonsets(env: Env) -> None:
    env.sim.remove_node("gpu-1")
    env.sim.remove_node("gpu-2")
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    assert conditions(env.policy()["status"])["Ready"]["reason"] == "NoGPUNodes"
    assert not env.daemonsets()


async def test_leader_election_one_active_and_failover(env: Env) -> None:
    env.sim.store.create(policy())
    first = env.start_operator(leader_elect=True, identity="a")
    await env.wait_ready()
    second = env.start_operator(leader_elect=True, identity="b")
    await env.wait(second.ready.is_set, "standby caches synced")
    assert first.elector is not None
    assert second.elector is not None
    assert first.elector.is_leader.is_set()
    assert not second.elector.is_leader.is_set()
    await env.stop_operator(first)
    await env.wait(second.elector.is_leader.is_set, "standby took over")
    env.sim.store.patch(
        "clusterpolicies.nvidia.com", "cluster-policy", {"spec": {"gfd": {"enabled": False}}}
    )
    await env.wait(lambda: "gpu-feature-discovery" not in env.daemonsets(), "new leader acts")


def chart_objects_in(namespace: str, *sets: str) -> list[dict[str, Any]]:
    """The objects `helm template` renders into `namespace` with `sets` (empty without helm)."""
    if not HELM.exists():
        return []
    args = [str(HELM), "template", "gpu-operator", str(CHART), "-n", NAMESPACE]
    for item in sets:
        args += ["--set", item]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True)
    return [
        doc
        for doc in yaml.safe_load_all(proc.stdout)
        if doc and doc["metadata"].get("namespace") == namespace
    ]


async def test_leader_lease_lives_in_the_leader_elect_namespace(env: Env) -> None:
    # --leader-elect-namespace (upstream's flag): the Lease goes there, under the Role the chart
    # renders there for operator.leaderElection.namespace; the operands stay in the namespace.
    rbac = chart_objects_in("kube-system", "operator.leaderElection.namespace=kube-system")
    assert [o["kind"] for o in rbac] == ([] if not HELM.exists() else ["Role", "RoleBinding"])
    for obj in rbac:
        env.sim.store.create(obj)
    env.sim.store.create(policy())
    operator = env.start_operator(leader_elect=True, identity="a", leader_namespace="kube-system")
    await env.wait(lambda: operator.elector is not None and operator.elector.is_leader.is_set(),
                   "leader in kube-system")  # fmt: skip
    lease = env.sim.store.get("leases", "53822513.nvidia.com", namespace="kube-system")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "a"
    assert env.sim.store.get("leases", "53822513.nvidia.com", namespace=NAMESPACE) is None
    await env.wait(lambda: "gpu-feature-discovery" in env.daemonsets(), "the leader acts")


async def test_restart_mid_reconcile_converges_without_duplicates(env: Env) -> None:
    env.sim.store.create(policy())
    first = env.start_operator()
    await env.wait(lambda: len(env.daemonsets()) >= 1, "some DaemonSets written")
    await env.stop_operator(first)
    env.start_operator()
    await env.wait_ready()
    names = [d["metadata"]["name"] for d in env.sim.store.list("daemonsets", namespace=NAMESPACE)]
    assert len(names) == len(set(names))


async def test_node_workload_config_change(env: Env) -> None:
    env.sim.store.create(policy(sandboxWorkloads={"enabled": True, "defaultWorkload": "container"}))
    env.start_operator()
    await env.wait_ready()
    assert env.node_labels("gpu-1")[keys.DEPLOY_PREFIX + "driver"] == "true"
    env.sim.store.patch(
        "nodes", "gpu-1", {"metadata": {"labels": {keys.GPU_WORKLOAD_CONFIG: "vm-passthrough"}}}
    )

    def passthrough() -> bool:
        labels = env.node_labels("gpu-1")
        return (
            labels.get(keys.DEPLOY_PREFIX + "vfio-manager") == "true"
            and keys.DEPLOY_PREFIX + "driver" not in labels
        )

    await env.wait(passthrough, "gpu-1 switched to vm-passthrough labels")
    assert env.node_labels("gpu-2")[keys.DEPLOY_PREFIX + "driver"] == "true"


async def test_removed_node_leaves_nothing_pending(env: Env) -> None:
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    env.sim.remove_node("gpu-2")
    await env.wait(lambda: "gpu-2" not in env.operator.nodes.objects, "node gone from cache")
    await env.wait(lambda: not env.operator.pending_nodes, "no node left pending")
    await env.wait_ready()
    assert env.operator.cluster_facts().gpu_node_count == 1


async def test_api_faults_converge_without_duplicates_or_leftovers(env: Env) -> None:
    faults = env.sim.faults
    faults.add(verb="patch", resource="daemonsets.apps", error_rate=0.5, code=500, count=6)
    faults.add(verb="patch", resource="nodes", error_rate=0.5, code=409, count=4)
    faults.add(verb="patch", resource="clusterpolicies.nvidia.com/status", code=503, count=2)
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait(lambda: len(env.daemonsets()) >= 3, "some DaemonSets written")
    faults.expire_next_watch(3)
    faults.drop_watches()
    await env.wait_ready()
    assert faults.injected > 0
    names = [d["metadata"]["name"] for d in env.sim.store.list("daemonsets", namespace=NAMESPACE)]
    assert len(names) == len(set(names))
    env.sim.store.patch(
        "clusterpolicies.nvidia.com",
        "cluster-policy",
        {"spec": {"dcgmExporter": {"enabled": False}}},
    )
    faults.restart()
    await env.wait(lambda: "nvidia-dcgm-exporter" not in env.daemonsets(), "exporter pruned")
    await env.wait_ready()
    services = {s["metadata"]["name"] for s in env.sim.store.list("services", namespace=NAMESPACE)}
    assert "nvidia-dcgm-exporter" not in services


async def test_driver_crd_mode_orphans_the_driver_daemonset(env: Env) -> None:
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    driver_pods = [
        p["metadata"]["name"]
        for p in env.sim.store.list("pods", namespace=NAMESPACE)
        if p["metadata"]["name"].startswith("nvidia-driver-daemonset")
    ]
    assert driver_pods
    env.sim.store.patch(
        "clusterpolicies.nvidia.com",
        "cluster-policy",
        {"spec": {"driver": {"useNvidiaDriverCRD": True}}},
    )
    await env.wait(lambda: "nvidia-driver-daemonset" not in env.daemonsets(), "driver DS gone")
    await env.sim.settle(timeout=DEADLINE)
    remaining = {p["metadata"]["name"] for p in env.sim.store.list("pods", namespace=NAMESPACE)}
    assert set(driver_pods) <= remaining  # orphaned, not deleted: the upgrade flow replaces them
    await env.wait(
        lambda: (
            {s["name"]: s["state"] for s in env.policy()["status"]["states"]}["state-driver"]
            == "disabled"
        ),
        "driver state disabled",
    )


async def test_outdated_crd_schema_is_refused_with_a_condition(env: Env) -> None:
    env.sim.store.patch(
        "customresourcedefinitions.apiextensions.k8s.io",
        "clusterpolicies.nvidia.com",
        {"metadata": {"annotations": {"nvidia.com/gpu-operator-crd-version": None}}},
    )
    env.sim.store.create(policy())
    env.start_operator()

    def refused() -> bool:
        error = conditions(env.policy().get("status") or {}).get("Error") or {}
        return bool(error.get("reason") == "CRDSchemaOutdated")

    await env.wait(refused, "CRDSchemaOutdated condition")
    assert "gpu-operator crds --apply" in conditions(env.policy()["status"])["Error"]["message"]
    assert not env.daemonsets()
    events = env.sim.store.list("events", namespace="default")  # about the ClusterPolicy
    assert any(e["reason"] == "CRDSchemaOutdated" for e in events)


async def test_psa_labels_the_operator_namespace(env: Env) -> None:
    env.sim.store.create(policy(psa={"enabled": True}))
    env.start_operator()
    await env.wait_ready()
    namespace = env.sim.store.get("namespaces", NAMESPACE)
    assert namespace is not None
    labels = namespace["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "privileged"


async def test_driver_mounts_a_user_configmap_key_by_key(env: Env) -> None:
    env.sim.store.create({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "repo-config", "namespace": NAMESPACE},
        "data": {"custom.list": "deb http://mirror.local/ubuntu jammy main"},
    })  # fmt: skip
    env.sim.store.create(policy(driver={
        **policy()["spec"]["driver"], "repoConfig": {"configMapName": "repo-config"},
    }))  # fmt: skip
    env.start_operator()
    await env.wait_ready()
    volumes = env.daemonsets()["nvidia-driver-daemonset"]["spec"]["template"]["spec"]["volumes"]
    repo = [v for v in volumes if (v.get("configMap") or {}).get("name") == "repo-config"]
    assert repo, volumes
    assert env.sim.store.get("configmaps", "repo-config", NAMESPACE) is not None  # never pruned
