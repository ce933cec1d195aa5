"""Hand edits to operand DaemonSets are restored, with an Event naming the field and who did it."""

from __future__ import annotations

import time

from kubesim_helpers import kubectl, needs_kubectl
from operator_harness import NAMESPACE, Env, policy

EVIL = "evil.example.com/miner:latest"


def exporter_image(env: Env) -> str:
    ds = env.daemonsets()["nvidia-dcgm-exporter"]
    return str(ds["spec"]["template"]["spec"]["containers"][0]["image"])


@needs_kubectl
async def test_kubectl_set_image_is_reverted_within_two_seconds(env: Env) -> None:
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    rendered = exporter_image(env)
    ds = env.daemonsets()["nvidia-dcgm-exporter"]
    container = ds["spec"]["template"]["spec"]["containers"][0]["name"]
    await kubectl(
        env.sim, "-n", NAMESPACE, "set", "image", "ds/nvidia-dcgm-exporter", f"{container}={EVIL}"
    )
    edited = time.monotonic()
    assert exporter_image(env) == EVIL
    await env.wait(lambda: exporter_image(env) == rendered, "image restored", timeout=5)
    assert time.monotonic() - edited < 2.0
    described = await kubectl(env.sim, "-n", NAMESPACE, "describe", "ds/nvidia-dcgm-exporter")
    assert "HandEditReverted" in described, described
    assert "kubectl-set" in described, described
    assert f"containers[name={container}].image" in described, described
    assert EVIL in described, described
    await env.wait_ready()


async def test_our_own_rendering_is_never_taken_for_a_hand_edit(env: Env) -> None:
    # An empty env value is dropped by the server: the comparison must not see drift in it.
    spec = {"gfd": {"env": [{"name": "EMPTY", "value": ""}]}}
    env.sim.store.create(policy(**spec))
    env.start_operator()
    await env.wait_ready()
    versions = {n: d["metadata"]["resourceVersion"] for n, d in env.daemonsets().items()}
    env.sim.store.patch("nodes", "gpu-1", {"metadata": {"labels": {"touch": "1"}}})
    await env.wait_ready()
    reverted = [
        e for e in env.sim.store.list("events", namespace=NAMESPACE)
        if e.get("reason") == "HandEditReverted"
    ]  # fmt: skip
    assert not reverted, [e["message"] for e in reverted]
    generations = {n: d["metadata"]["generation"] for n, d in env.daemonsets().items()}
    assert all(generations[n] == 1 for n in versions), generations
