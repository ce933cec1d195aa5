"""The operator checks the exporter's counters ConfigMap: a missing key (as every ConfigMap a
policy names, validate_refs.py), a bad line or an unknown field is reported in the ClusterPolicy
status and an Event, and the running exporter is kept."""

from __future__ import annotations

from typing import Any

from operator_harness import NAMESPACE, Env, policy

CM = "dcgm-exporter-config"
SEED_CSV = (
    "# GPU utilization\n"
    "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization\n"
    "# Memory usage\n"
    "DCGM_FI_DEV_FB_USED, gauge, GPU memory used\n"
    "DCGM_FI_DEV_FB_FREE, gauge, GPU memory free\n"
)
EXPORTER_DS = "nvidia-dcgm-exporter"


def config_map(key: str, text: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CM, "namespace": NAMESPACE},
        "data": {key: text},
    }


def exporter_state(env: Env) -> dict[str, Any]:
    states = (env.policy().get("status") or {}).get("states") or []
    return next((s for s in states if s["name"] == "state-dcgm-exporter"), {})


def failure_events(env: Env, reason: str = "StateFailed") -> list[str]:
    events = env.sim.store.list("events", namespace="default")  # the policy is cluster-scoped
    return [
        e["message"]
        for e in events
        if e["reason"] == reason and e["involvedObject"]["kind"] == "ClusterPolicy"
    ]


async def test_a_misnamed_key_then_a_bad_line_are_reported_and_the_exporter_is_kept(
    env: Env,
) -> None:
    env.sim.store.create(config_map("metrics.csv", SEED_CSV))
    # Only the exporter's state matters here; the device plugin (whose RBAC is in flux) is off.
    env.sim.store.create(
        policy(dcgmExporter={"config": {"name": CM}}, devicePlugin={"enabled": False})
    )
    env.start_operator()
    # The exporter waits for the key it reads, with the fix.
    await env.wait(lambda: exporter_state(env).get("state") == "notReady", "the exporter waiting")
    status = env.policy()["status"]
    assert status["state"] == "notReady"
    message = exporter_state(env)["message"]
    assert message == (
        f"spec.dcgmExporter.config.name: ConfigMap {CM} in namespace {NAMESPACE} has no key "
        "dcgm-metrics.csv (its keys: metrics.csv): the DCGM exporter reads key dcgm-metrics.csv "
        "only: rename key metrics.csv to dcgm-metrics.csv"
    )
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert message in ready["message"]
    missing = "ConfigMapKeyMissing"
    await env.wait(lambda: len(failure_events(env, missing)) == 1, "one ConfigMapKeyMissing")
    assert failure_events(env, missing) == [message]
    assert EXPORTER_DS not in env.daemonsets()

    # The user renames the key: the exporter is deployed, reading exactly that key.
    fixed = config_map("dcgm-metrics.csv", SEED_CSV)
    current = env.sim.store.get("configmaps", CM, NAMESPACE)
    assert current is not None
    env.sim.store.update({**fixed, "metadata": current["metadata"]})
    await env.wait_ready()
    volume = next(
        v
        for v in env.daemonsets()[EXPORTER_DS]["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "metrics-config"
    )
    assert volume["configMap"]["items"] == [{"key": "dcgm-metrics.csv", "path": "dcgm-metrics.csv"}]
    generation = env.daemonsets()[EXPORTER_DS]["metadata"]["generation"]

    # A typo on line 6: reported with the line; the running exporter DaemonSet stays as it was.
    broken = SEED_CSV + "DCGM_FI_DEV_GPU_TEMPERATURE, gauge, temperature\n"
    current = env.sim.store.get("configmaps", CM, NAMESPACE)
    assert current is not None
    env.sim.store.update(
        {**config_map("dcgm-metrics.csv", broken), "metadata": current["metadata"]}
    )
    await env.wait(lambda: exporter_state(env).get("state") == "failed", "exporter failed again")
    message = exporter_state(env)["message"]
    assert "key dcgm-metrics.csv: line 6: unknown DCGM field 'DCGM_FI_DEV_GPU_TEMPERATURE'" in (
        message
    )
    await env.wait(lambda: len(failure_events(env)) == 1, "a StateFailed event")
    assert any("line 6" in m for m in failure_events(env))
    assert env.daemonsets()[EXPORTER_DS]["metadata"]["generation"] == generation
