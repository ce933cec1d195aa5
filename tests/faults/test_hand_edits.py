"""Hand edits to operand DaemonSets are restored, with an Event naming the field and who did it:
changed values of fields we render, and additions that change security (controller/drift.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from kubesim_helpers import kubectl, needs_kubectl
from operator_harness import NAMESPACE, Env, policy

EVIL = "evil.example.com/miner:latest"
EXPORTER = "nvidia-dcgm-exporter"


def exporter(env: Env) -> dict[str, Any]:
    return env.daemonsets()[EXPORTER]


def pod_spec(env: Env, name: str = EXPORTER) -> dict[str, Any]:
    spec: dict[str, Any] = env.daemonsets()[name]["spec"]["template"]["spec"]
    return spec


def reverted_events(env: Env) -> list[str]:
    return [
        str(e.get("message"))
        for e in env.sim.store.list("events", namespace=NAMESPACE)
        if e.get("reason") == "HandEditReverted"
    ]


async def start(env: Env, **spec: Any) -> None:
    env.sim.store.create(policy(**spec))
    env.start_operator()
    await env.wait_ready()


async def edit_and_expect_restore(
    env: Env, edit: list[str], restored: Callable[[], bool], *expected: str
) -> str:
    """Run a kubectl edit; the restore must follow (by itself: nothing else changes meanwhile)
    and `kubectl describe` must show a HandEditReverted Event holding every `expected` text."""
    await kubectl(env.sim, "-n", NAMESPACE, *edit)
    await env.wait(restored, "the hand edit restored")
    described = await kubectl(env.sim, "-n", NAMESPACE, "describe", f"ds/{EXPORTER}")
    assert "HandEditReverted" in described, described
    event = next(m for m in reverted_events(env) if all(t in m for t in expected))
    await env.wait_ready()
    return event


def patch_json(*ops: dict[str, Any]) -> list[str]:
    return ["patch", f"ds/{EXPORTER}", "--type", "json", "-p", json.dumps(list(ops))]


@needs_kubectl
async def test_kubectl_set_image_is_reverted_within_two_seconds(env: Env) -> None:
    await start(env)
    rendered = pod_spec(env)["containers"][0]["image"]
    container = pod_spec(env)["containers"][0]["name"]
    event = await edit_and_expect_restore(
        env,
        ["set", "image", f"ds/{EXPORTER}", f"{container}={EVIL}"],
        lambda: pod_spec(env)["containers"][0]["image"] == rendered,
        f"containers[name={container}].image", EVIL, "kubectl-set",
    )  # fmt: skip
    assert f"restored to {rendered}" in event


@needs_kubectl
async def test_host_pid_added_where_we_set_none_is_removed(env: Env) -> None:
    await start(env)
    assert "hostPID" not in pod_spec(env)
    await edit_and_expect_restore(
        env,
        patch_json({"op": "add", "path": "/spec/template/spec/hostPID", "value": True}),
        lambda: "hostPID" not in pod_spec(env),
        "spec.template.spec.hostPID was added (true), removed", "kubectl-patch",
    )  # fmt: skip


@needs_kubectl
async def test_kubectl_set_env_changed_and_added_variables_are_restored(env: Env) -> None:
    await start(env)

    def env_of() -> dict[str, Any]:
        return {e["name"]: e.get("value") for e in pod_spec(env)["containers"][0]["env"]}

    rendered = env_of()
    assert "LD_PRELOAD" not in rendered
    event = await edit_and_expect_restore(
        env,
        ["set", "env", f"ds/{EXPORTER}", "-c", EXPORTER, "LD_PRELOAD=/tmp/evil.so",
         "DCGM_EXPORTER_LISTEN=:1234"],
        lambda: env_of() == rendered,
        "env[name=LD_PRELOAD] was added", "kubectl-set",
    )  # fmt: skip
    assert "env[name=DCGM_EXPORTER_LISTEN].value was :1234, restored to :9400" in event


@needs_kubectl
async def test_kubectl_set_resources_is_restored_and_amounts_compare_by_value(env: Env) -> None:
    await start(env, dcgmExporter={"resources": {"limits": {"memory": "1024Mi"}}})

    def limits() -> Any:
        return pod_spec(env)["containers"][0].get("resources", {}).get("limits")

    # The server stores the amount in its canonical form: that is not a hand edit.
    assert limits() == {"memory": "1Gi"}
    await reconciled(env, passes=2)
    assert exporter(env)["metadata"]["generation"] == 1
    assert not reverted_events(env)
    await edit_and_expect_restore(
        env,
        ["set", "resources", f"ds/{EXPORTER}", "-c", EXPORTER, "--limits=memory=2Gi"],
        lambda: limits() == {"memory": "1Gi"},
        "resources.limits.memory was 2Gi, restored to 1024Mi",
    )  # fmt: skip


@needs_kubectl
async def test_a_removed_volume_mount_is_restored(env: Env) -> None:
    await start(env)
    mount = pod_spec(env)["containers"][0]["volumeMounts"][0]

    def mounted() -> bool:
        return mount in pod_spec(env)["containers"][0].get("volumeMounts", [])

    await edit_and_expect_restore(
        env,
        patch_json({"op": "remove", "path": "/spec/template/spec/containers/0/volumeMounts/0"}),
        mounted,
        f"volumeMounts[mountPath={mount['mountPath']}] was null",
    )  # fmt: skip


@needs_kubectl
async def test_a_security_field_added_where_we_set_none_is_removed(env: Env) -> None:
    await start(env)
    rendered = pod_spec(env)["initContainers"][0]["securityContext"]
    assert "allowPrivilegeEscalation" not in rendered
    path = "/spec/template/spec/initContainers/0/securityContext/allowPrivilegeEscalation"
    name = pod_spec(env)["initContainers"][0]["name"]
    await edit_and_expect_restore(
        env,
        patch_json({"op": "add", "path": path, "value": True}),
        lambda: pod_spec(env)["initContainers"][0]["securityContext"] == rendered,
        f"initContainers[name={name}].securityContext.allowPrivilegeEscalation was added (true), "
        "removed",
    )  # fmt: skip


@needs_kubectl
async def test_a_sidecar_with_the_host_filesystem_is_removed(env: Env) -> None:
    await start(env)
    sidecar = {
        "spec": {"template": {"spec": {
            "containers": [{"name": "miner", "image": EVIL,
                            "volumeMounts": [{"name": "host", "mountPath": "/host"}]}],
            "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
        }}}
    }  # fmt: skip

    def gone() -> bool:
        spec = pod_spec(env)
        return {c["name"] for c in spec["containers"]} == {EXPORTER} and "host" not in {
            v["name"] for v in spec["volumes"]
        }

    await edit_and_expect_restore(
        env,
        ["patch", f"ds/{EXPORTER}", "--type", "strategic", "-p", json.dumps(sidecar)],
        gone,
        "containers[name=miner] was added", "volumes[name=host] was added", "kubectl-patch",
    )  # fmt: skip


@needs_kubectl
async def test_a_restore_racing_another_change_judges_again_without_failing(env: Env) -> None:
    await start(env)
    faults = env.sim.faults
    before = faults.before
    patches: list[str] = []

    async def another_change_lands_first(verb: str, resource: str) -> None:
        # The first DaemonSet patch is kubectl's edit, the second the operator's restore: just
        # before it, someone else changes the object, so the restore's resourceVersion test fails.
        if verb == "patch" and resource == "daemonsets.apps":
            patches.append(resource)
            if len(patches) == 2:
                env.sim.store.patch(
                    "daemonsets", EXPORTER, {"metadata": {"annotations": {"other": "edit"}}},
                    namespace=NAMESPACE,
                )  # fmt: skip
        await before(verb, resource)

    faults.before = another_change_lands_first  # type: ignore[method-assign]
    await edit_and_expect_restore(
        env,
        patch_json({"op": "add", "path": "/spec/template/spec/hostPID", "value": True}),
        lambda: "hostPID" not in pod_spec(env),
        "spec.template.spec.hostPID was added (true), removed",
    )  # fmt: skip
    assert len(patches) >= 3  # the edit, the refused restore, the restore judged again
    assert exporter(env)["metadata"]["annotations"]["other"] == "edit"
    failed = [
        e for e in env.sim.store.list("events", namespace="default")
        + env.sim.store.list("events", namespace=NAMESPACE)
        if e.get("reason") == "StateFailed"
    ]  # fmt: skip
    assert not failed, [e["message"] for e in failed]


async def reconciled(env: Env, passes: int) -> None:
    """Make the operator run `passes` more reconciles (a node label change starts one)."""
    registry = env.operator.metrics.registry

    def count() -> float:
        return registry.get_sample_value("gpu_operator_reconciliation_total") or 0.0

    for _ in range(passes):
        target = count() + 1
        touch = str(time.monotonic_ns())  # a new value each time: an unchanged one starts none
        env.sim.store.patch("nodes", "gpu-1", {"metadata": {"labels": {"touch": touch}}})
        await env.wait(lambda: count() >= target, "one more reconcile")  # noqa: B023


async def test_our_own_rendering_is_never_taken_for_a_hand_edit(env: Env) -> None:
    # An empty env value is dropped by the server: the comparison must not see drift in it.
    await start(env, gfd={"env": [{"name": "EMPTY", "value": ""}]})
    versions = {n: d["metadata"]["resourceVersion"] for n, d in env.daemonsets().items()}
    await reconciled(env, passes=2)
    assert not reverted_events(env)
    generations = {n: d["metadata"]["generation"] for n, d in env.daemonsets().items()}
    assert all(generations[n] == 1 for n in versions), generations


@needs_kubectl
async def test_after_a_restore_of_every_operand_the_operator_writes_nothing_more(
    env: Env,
) -> None:
    # Every operand DaemonSet the default policy renders (with all kubesim defaulting applied)
    # is hand-edited at once; after the restore, further passes write none of them again.
    await start(env, nodeStatusExporter={"enabled": True})
    names = set(env.daemonsets())
    await kubectl(env.sim, "-n", NAMESPACE, "set", "env", "ds", "--all", "FOO=bar")

    def restored() -> bool:
        return not any(
            e.get("name") == "FOO"
            for ds in env.daemonsets().values()
            for c in ds["spec"]["template"]["spec"]["containers"]
            for e in c.get("env") or []
        )

    await env.wait(restored, "every DaemonSet restored")

    # An Event per DaemonSet (on a loaded machine a revert seen again through a lagging cache
    # may be told twice: so every DaemonSet named, not an exact count).
    def named() -> set[str]:
        return {
            str(e["involvedObject"].get("name"))
            for e in env.sim.store.list("events", namespace=NAMESPACE)
            if e.get("reason") == "HandEditReverted"
        }

    await env.wait(
        lambda: named() >= names,
        "an Event per DaemonSet",
        state=lambda: {"missing": sorted(names - named()), "events": len(reverted_events(env))},
    )
    await env.wait_ready()
    await reconciled(env, passes=1)  # the pass that sees the restored objects
    versions = {n: d["metadata"]["resourceVersion"] for n, d in env.daemonsets().items()}
    before = env.sim.stats.snapshot()
    events = len(reverted_events(env))
    await reconciled(env, passes=3)
    writes = {k: n for k, n in env.sim.stats.since(before).items() if "daemonsets" in k[1]}
    assert not writes or all(v in ("get", "list", "watch") for v, _ in writes), writes
    assert {n: d["metadata"]["resourceVersion"] for n, d in env.daemonsets().items()} == versions
    assert len(reverted_events(env)) == events
