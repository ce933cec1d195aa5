"""Every ConfigMap a ClusterPolicy names is checked by the operator the same way (issue 30, items
7, 8 and 9): a missing one holds back the states that mount it, with the fix in the status and one
Warning Event, and clears when it appears; what the policy asks for that has no effect (a
device-plugin ConfigMap no node uses, a ServiceMonitor without its CRD) is said, not skipped."""

from __future__ import annotations

from typing import Any

from operator_harness import NAMESPACE, Env, policy

POLICIES = "clusterpolicies.nvidia.com"
PLUGIN_DS = "nvidia-device-plugin-daemonset"
MISSING = (
    "spec.devicePlugin.config.name: ConfigMap time-slicing-config not found in namespace "
    "gpu-operator: create ConfigMap time-slicing-config in namespace gpu-operator with key any "
    "(a device-plugin config)"
)
TIME_SLICING = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n" + (
    "      - {name: nvidia.com/gpu, replicas: 4}\n"
)


def states(env: Env) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in (env.policy().get("status") or {}).get("states") or []}


def ready_message(env: Env) -> str:
    conditions = (env.policy().get("status") or {}).get("conditions") or []
    return str(next((c["message"] for c in conditions if c["type"] == "Ready"), ""))


def events(env: Env, reason: str) -> list[dict[str, Any]]:
    found = env.sim.store.list("events", namespace="default")  # the policy is cluster-scoped
    return [
        e for e in found if e["reason"] == reason and e["involvedObject"]["kind"] == "ClusterPolicy"
    ]


def config_map(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "data": data,
    }


async def test_a_missing_device_plugin_config_map_is_named_with_the_fix_until_it_is_created(
    env: Env,
) -> None:
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    running = env.daemonsets()[PLUGIN_DS]["metadata"]["generation"]

    env.sim.store.patch(POLICIES, "cluster-policy", {"spec": {"devicePlugin": {
        "config": {"name": "time-slicing-config", "default": "any"}}}})  # fmt: skip
    await env.wait(
        lambda: states(env).get("state-device-plugin", {}).get("message") == MISSING,
        "the device-plugin state to name the missing ConfigMap",
    )
    assert states(env)["state-device-plugin"]["state"] == "notReady"
    # GFD and the MPS daemon mount the same ConfigMap: they wait too.
    assert states(env)["gpu-feature-discovery"] == {
        "name": "gpu-feature-discovery", "state": "notReady", "message": MISSING
    }  # fmt: skip
    assert env.policy()["status"]["state"] == "notReady"
    assert MISSING in ready_message(env)
    # What runs keeps running: nothing rolls out a pod that cannot mount its config.
    assert env.daemonsets()[PLUGIN_DS]["metadata"]["generation"] == running
    await env.wait(lambda: len(events(env, "ConfigMapNotFound")) == 1, "one ConfigMapNotFound")
    [event] = events(env, "ConfigMapNotFound")
    assert (event["type"], event["message"]) == ("Warning", MISSING)
    assert not events(env, "StateFailed")

    # Later passes (here: the exporter switched off) say it again in the status, not as Events.
    env.sim.store.patch(POLICIES, "cluster-policy", {"spec": {"dcgmExporter": {"enabled": False}}})
    await env.wait(
        lambda: states(env).get("state-dcgm-exporter", {}).get("state") == "disabled",
        "a later pass",
    )
    assert states(env)["state-device-plugin"]["message"] == MISSING
    assert len(events(env, "ConfigMapNotFound")) == 1

    # The user creates it: the device plugin rolls out with it, and the problem is gone.
    env.sim.store.create(config_map("time-slicing-config", {"any": TIME_SLICING}))
    await env.wait_ready()
    volumes = env.daemonsets()[PLUGIN_DS]["spec"]["template"]["spec"]["volumes"]
    mounted = {v["name"]: (v.get("configMap") or {}).get("name") for v in volumes}
    assert mounted["available-configs"] == "time-slicing-config"
    assert MISSING not in ready_message(env)
    assert len(events(env, "ConfigMapNotFound")) == 1


async def test_a_misnamed_key_names_the_key_and_holds_the_state_back(env: Env) -> None:
    env.sim.store.create(config_map("time-slicing-config", {"config.yaml": TIME_SLICING}))
    env.sim.store.create(
        policy(devicePlugin={"config": {"name": "time-slicing-config", "default": "any"}})
    )
    env.start_operator()
    wrong = (
        "spec.devicePlugin.config.default: any is not a key of ConfigMap time-slicing-config in "
        "namespace gpu-operator (its keys: config.yaml)"
    )
    await env.wait(
        lambda: wrong in states(env).get("state-device-plugin", {}).get("message", ""),
        "the state to name the key",
    )
    assert PLUGIN_DS not in env.daemonsets()
    await env.wait(lambda: len(events(env, "ConfigMapKeyMissing")) == 1, "one ConfigMapKeyMissing")


# Seed document 002: a device-plugin ConfigMap named in the policy, with no default.
SEED_CONFIG = "version: v1\nsharing:\n  timeSlicing:\n    replicas: 4\nmig:\n  strategy: mixed\n"
UNUSED = (
    "spec.devicePlugin.config.name: ConfigMap device-plugin-config is not used: "
    "spec.devicePlugin.config.default is not set and no GPU node carries the label "
    "nvidia.com/device-plugin.config, so every node gets the empty config"
)


async def test_a_device_plugin_config_no_node_uses_is_said_until_a_node_is_labelled(
    env: Env,
) -> None:
    env.sim.store.create(config_map("device-plugin-config", {"config.yaml": SEED_CONFIG}))
    env.sim.store.create(policy(devicePlugin={"config": {"name": "device-plugin-config"}}))
    env.start_operator()
    await env.wait_ready()
    await env.wait(
        lambda: UNUSED in states(env).get("state-device-plugin", {}).get("message", ""),
        "the device-plugin state to say its ConfigMap is unused",
    )
    assert states(env)["state-device-plugin"]["state"] == "ready"
    assert UNUSED in ready_message(env)
    assert "set spec.devicePlugin.config.default to one of its keys (config.yaml)" in (
        ready_message(env)
    )
    await env.wait(lambda: len(events(env, "DevicePluginConfigUnused")) == 1, "one Event")
    assert events(env, "DevicePluginConfigUnused")[0]["type"] == "Warning"

    # A node labelled with one of its keys uses it: nothing left to say.
    env.sim.store.patch("nodes", "gpu-1", {"metadata": {"labels": {
        "nvidia.com/device-plugin.config": "config.yaml"}}})  # fmt: skip
    await env.wait(lambda: UNUSED not in ready_message(env), "the note to clear")
    assert "message" not in states(env)["state-device-plugin"]


MONITOR = (
    "dcgmExporter.serviceMonitor.enabled is true{origin} but the CRD "
    "servicemonitors.monitoring.coreos.com (Prometheus Operator) is not installed: no "
    "ServiceMonitor is created"
)


async def test_a_service_monitor_asked_for_without_its_crd_is_a_warning(env: Env) -> None:
    env.sim.store.create(policy(dcgmExporter={"serviceMonitor": {"enabled": True}}))
    env.start_operator()
    await env.wait_ready()
    said = MONITOR.format(origin="")
    await env.wait(
        lambda: said in states(env).get("state-dcgm-exporter", {}).get("message", ""),
        "the exporter's state to say why there is no ServiceMonitor",
    )
    assert said in ready_message(env)
    await env.wait(lambda: len(events(env, "ServiceMonitorSkipped")) == 1, "one Event")
    assert events(env, "ServiceMonitorSkipped")[0]["type"] == "Warning"


async def test_the_charts_default_service_monitor_without_its_crd_is_a_note(env: Env) -> None:
    body = policy(dcgmExporter={"serviceMonitor": {"enabled": True, "interval": "15s"}})
    body["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "Helm"}
    env.sim.store.create(body)
    env.start_operator()
    await env.wait_ready()
    said = MONITOR.format(origin=" (the chart's default)")
    await env.wait(lambda: said in ready_message(env), "the Ready message to note it")
    await env.wait(lambda: len(events(env, "ServiceMonitorSkipped")) == 1, "one Event")
    assert events(env, "ServiceMonitorSkipped")[0]["type"] == "Normal"
