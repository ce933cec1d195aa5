"""Objects the operator writes only in some clusters or policies: ServiceMonitors once the
prometheus-operator CRDs exist, and the RuntimeClasses that go away with NRI injection. Run under
the chart's RBAC, so each grant for them is shown to be needed (and sufficient)."""

from __future__ import annotations

from typing import Any

from operator_harness import NAMESPACE, Env, policy

from gpu_operator.api import keys

MONITORING = "monitoring.coreos.com"
POLICIES = "clusterpolicies.nvidia.com"


def _crd(kind: str, plural: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{MONITORING}"},
        "spec": {
            "group": MONITORING,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(),
                      "listKind": f"{kind}List"},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }],
        },
    }  # fmt: skip


def _names(env: Env, plural: str) -> set[str]:
    return {
        o["metadata"]["name"]
        for o in env.sim.store.list(f"{plural}.{MONITORING}", namespace=NAMESPACE)
    }


def _exporter_monitor(env: Env) -> dict[str, Any] | None:
    found: dict[str, Any] | None = env.sim.store.get(
        f"servicemonitors.{MONITORING}", "nvidia-dcgm-exporter", namespace=NAMESPACE
    )
    return found


async def test_service_monitors_follow_the_policy_once_their_crd_exists(env: Env) -> None:
    env.sim.store.create(_crd("ServiceMonitor", "servicemonitors"))
    env.sim.store.create(_crd("PrometheusRule", "prometheusrules"))
    env.sim.store.create(policy(dcgmExporter={"serviceMonitor": {"enabled": True}}))
    env.start_operator()
    await env.wait_ready()
    await env.wait(
        lambda: {"gpu-operator", "nvidia-dcgm-exporter"} <= _names(env, "servicemonitors"),
        "the operator's and the exporter's ServiceMonitors",
    )
    # An edit of the monitor's settings is applied to the live object.
    env.sim.store.patch(POLICIES, "cluster-policy", {"spec": {"dcgmExporter": {
        "serviceMonitor": {"enabled": True, "interval": "15s"}}}})  # fmt: skip

    def interval() -> str | None:
        monitor = _exporter_monitor(env) or {}
        endpoints = (monitor.get("spec") or {}).get("endpoints") or [{}]
        value: str | None = endpoints[0].get("interval")
        return value

    await env.wait(lambda: interval() == "15s", "the new scrape interval on the ServiceMonitor")
    # A PrometheusRule the policy owns but no state renders (NVIDIA's operator leaves one on
    # OpenShift) is pruned like any other object the policy no longer wants.
    owner = env.policy()["metadata"]
    env.sim.store.create({
        "apiVersion": f"{MONITORING}/v1", "kind": "PrometheusRule",
        "metadata": {
            "name": "gpu-operator-alerts", "namespace": NAMESPACE,
            "labels": {keys.OPERATOR_STATE_LABEL: "state-operator-metrics"},
            "ownerReferences": [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
                                 "name": owner["name"], "uid": owner["uid"], "controller": True}],
        },
        "spec": {"groups": []},
    })  # fmt: skip
    await env.wait(
        lambda: "gpu-operator-alerts" not in _names(env, "prometheusrules"),
        "the unrendered PrometheusRule pruned",
    )
    # Turning the exporter's monitor off deletes it; the operator's own stays.
    env.sim.store.patch(POLICIES, "cluster-policy", {"spec": {"dcgmExporter": {
        "serviceMonitor": {"enabled": False}}}})  # fmt: skip
    await env.wait(
        lambda: _names(env, "servicemonitors") == {"gpu-operator"},
        "the exporter's ServiceMonitor deleted",
    )


async def test_runtime_classes_go_away_with_nri_injection(env: Env) -> None:
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()

    def runtime_classes() -> set[str]:
        return {o["metadata"]["name"] for o in env.sim.store.list("runtimeclasses.node.k8s.io")}

    assert {"nvidia", "nvidia-cdi", "nvidia-legacy"} <= runtime_classes()
    env.sim.store.patch(POLICIES, "cluster-policy",
                        {"spec": {"cdi": {"enabled": True, "nriPluginEnabled": True}}})  # fmt: skip
    await env.wait(
        lambda: not runtime_classes() & {"nvidia", "nvidia-cdi", "nvidia-legacy"},
        "the RuntimeClasses deleted (NRI injects GPUs without them)",
    )
