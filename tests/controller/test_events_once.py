"""Events the ClusterPolicy reconciler records are told once (issue 30, item 6): a pass retried
after a rejected write, or run again before its own write came back from the watch, finds the
same thing and must not record it again. Counted as `kubectl get events` shows them (the sum of
the matching Events' counts)."""

from __future__ import annotations

import json

from kubesim_helpers import kubectl, needs_kubectl
from operator_harness import NAMESPACE, Env, policy

from gpu_operator.status import conditions
from kubesim.store import Event

EXPORTER = "nvidia-dcgm-exporter"
EVIL = "evil.example.com/miner:latest"


async def told(env: Env, namespace: str, reason: str) -> int:
    out = await kubectl(
        env.sim, "get", "events", "-n", namespace, "--field-selector", f"reason={reason}",
        "-o", "json",
    )  # fmt: skip
    return sum(int(e.get("count") or 1) for e in json.loads(out)["items"])


def image(env: Env) -> str:
    ds = env.sim.store.get("daemonsets", EXPORTER, namespace=NAMESPACE)
    assert ds is not None
    return str(ds["spec"]["template"]["spec"]["containers"][0]["image"])


@needs_kubectl
async def test_a_hand_edit_whose_restore_is_retried_is_told_once(env: Env) -> None:
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    rendered = image(env)
    ds = env.sim.store.get("daemonsets", EXPORTER, namespace=NAMESPACE)
    assert ds is not None
    container = ds["spec"]["template"]["spec"]["containers"][0]["name"]
    # The first two writes restoring it fail (the API server is briefly unavailable): the pass
    # is retried and finds the same edit each time.
    armed: list[bool] = []

    def refuse_restores(event: Event) -> None:
        containers = event.new.obj["spec"]["template"]["spec"]["containers"]
        if not armed and containers[0]["image"] == EVIL:
            armed.append(True)
            env.sim.faults.add(verb="patch", resource="daemonsets.apps", code=503, count=2)

    stop = env.sim.store.subscribe(refuse_restores, keys=[("apps", "daemonsets")])
    try:
        await kubectl(env.sim, "-n", NAMESPACE, "set", "image", f"ds/{EXPORTER}",
                      f"{container}={EVIL}")  # fmt: skip
        await env.wait(lambda: image(env) == rendered, "the hand edit restored")
    finally:
        stop()
    assert env.sim.faults.injected >= 2
    await env.wait_ready()
    assert await told(env, NAMESPACE, "HandEditReverted") == 1


@needs_kubectl
async def test_outdated_crds_are_told_once_while_the_status_write_is_retried(env: Env) -> None:
    env.sim.store.patch(
        "customresourcedefinitions.apiextensions.k8s.io",
        "clusterpolicies.nvidia.com",
        {"metadata": {"annotations": {"nvidia.com/gpu-operator-crd-version": None}}},
    )
    env.sim.faults.add(
        verb="patch", resource="clusterpolicies.nvidia.com/status", code=503, count=3
    )
    env.sim.store.create(policy())
    env.start_operator()

    def refused() -> bool:
        found = (env.policy().get("status") or {}).get("conditions") or []
        return any(c.get("reason") == conditions.CRD_OUTDATED for c in found)

    await env.wait(refused, "the CRDSchemaOutdated condition, after the refused writes")
    assert env.sim.faults.injected >= 3
    assert await told(env, "default", conditions.CRD_OUTDATED) == 1
