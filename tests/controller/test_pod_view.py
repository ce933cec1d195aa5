"""The operator's one pod cache (issue 32): every namespace's pods are listed, watched, decoded and
converted once; the status side reads the operator namespace's pods through a view of that cache
(runtime.PODS), the upgrade planner the cache itself (runtime.ALL_PODS)."""

from __future__ import annotations

import random
from typing import Any

from operator_harness import NAMESPACE, Env, policy

from gpu_operator.controller import clusterpolicy, runtime, strip
from gpu_operator.kube import resources
from gpu_operator.kube.cache import Informer
from gpu_operator.operands import readiness
from gpu_operator.upgrade import snapshot

NAMESPACES = (NAMESPACE, "default", "team-a", "gpu-operator-extra")
APPS = ("nvidia-driver-daemonset", "nvidia-operator-validator", "web", None)


def pod(rng: random.Random, namespace: str, name: str) -> dict[str, Any]:
    labels = {"app": app} if (app := rng.choice(APPS)) else {}
    ready = rng.random() < 0.5
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "labels": labels,
            "ownerReferences": [{"kind": "DaemonSet", "uid": "ds-1", "controller": True}],
        },
        "spec": {
            "nodeName": f"node-{rng.randrange(5)}",
            "containers": [{"name": "c", "image": f"img:{rng.randrange(3)}"}],
        },
        "status": {
            "phase": rng.choice(("Running", "Pending")),
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": "c", "ready": ready, "restartCount": rng.randrange(3)}],
        },
    }


def test_view_and_upgrade_side_see_the_same_pods_after_random_events() -> None:
    events: list[tuple[str, str, Any, Any]] = []
    caches = runtime.Caches(
        None,  # type: ignore[arg-type]  # no I/O: events are fed by hand
        NAMESPACE,
        lambda cache, key, old, new: events.append((cache, key, old, new)),
    )
    every = caches.add(
        runtime.ALL_PODS, resources.POD, namespace=resources.ALL_NAMESPACES,
        transform=strip.pod_record(NAMESPACE),
    )  # fmt: skip
    view = caches.add_view(runtime.PODS, runtime.ALL_PODS, strip.pod_summary)
    assert caches[runtime.PODS] is view
    assert runtime.PODS in caches
    # What the status side had before: a cache of its own of the operator namespace's pods.
    own = Informer(None, resources.POD, namespace=NAMESPACE, transform=strip.pod)  # type: ignore[arg-type]
    own_events: list[tuple[str, Any, Any]] = []
    own.on_change = lambda key, old, new: own_events.append((key, old, new))

    rng = random.Random(32)
    live: dict[str, dict[str, Any]] = {}
    for step in range(3000):
        roll = rng.random()
        if roll < 0.5 or not live:
            namespace = rng.choice(NAMESPACES)
            obj = pod(rng, namespace, f"p{rng.randrange(60)}")
            key = f"{namespace}/{obj['metadata']['name']}"
            live[key] = obj
            every._set(obj)
            if namespace == NAMESPACE:
                own._set(obj)
        else:
            key = rng.choice(sorted(live))
            obj = live.pop(key)
            every._delete(obj)
            if obj["metadata"]["namespace"] == NAMESPACE:
                own._delete(obj)
        if step % 500 == 0 or step == 2999:
            # The upgrade side holds every pod; the view exactly the operator namespace's, as
            # summaries, in the order a cache of its own holds them.
            assert set(every.objects) == set(live)
            assert all(isinstance(p, snapshot.Pod) for p in every.objects.values())
            assert list(view.objects.items()) == list(own.objects.items())
            expected = {
                k: readiness.summarize(o)
                for k, o in live.items()
                if o["metadata"]["namespace"] == NAMESPACE
            }
            assert view.objects == expected
            for k, record in every.objects.items():
                assert record == snapshot.pod_from(live[k])
                assert record.summary == expected.get(k)

    # The view's events are the ones a cache of its own sent, and no pod of another namespace
    # ever reaches the status side.
    seen = [(key, old, new) for cache, key, old, new in events if cache == runtime.PODS]
    assert seen == own_events
    assert seen  # the random walk did touch the operator namespace
    assert all(key.startswith(f"{NAMESPACE}/") for key, _, _ in seen)
    upgrade_side = [key for cache, key, _, _ in events if cache == runtime.ALL_PODS]
    assert {key.split("/")[0] for key in upgrade_side} == set(NAMESPACES)


def test_a_failing_handler_does_not_leave_the_view_behind() -> None:
    def failing(cache: str, key: str, old: Any, new: Any) -> None:
        raise RuntimeError("boom")

    caches = runtime.Caches(None, NAMESPACE, failing)  # type: ignore[arg-type]
    every = caches.add(
        runtime.ALL_PODS, resources.POD, namespace=resources.ALL_NAMESPACES,
        transform=strip.pod_record(NAMESPACE),
    )  # fmt: skip
    view = caches.add_view(runtime.PODS, runtime.ALL_PODS, strip.pod_summary)
    every._set(pod(random.Random(1), NAMESPACE, "p"))
    assert list(view.objects) == [f"{NAMESPACE}/p"]


async def test_the_operator_lists_and_watches_pods_once(env: Env) -> None:
    env.sim.store.create(policy())
    env.sim.store.create(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "default"},
         "spec": {"containers": [{"name": "web", "image": "web:1"}]}}
    )  # fmt: skip
    operator = env.start_operator()
    await env.wait_ready()
    caches = operator.runtime.caches
    pod_caches = [
        name for name, i in caches.informers.items()
        if i.resource is resources.POD and i.labels is None
    ]  # fmt: skip
    assert pod_caches == [runtime.ALL_PODS]
    assert caches[runtime.PODS].synced.is_set()
    every = caches.informers[runtime.ALL_PODS].objects
    mine = {k: p.summary for k, p in every.items() if p.namespace == NAMESPACE}
    assert mine  # the operand pods reached the status side, and only they
    assert caches[runtime.PODS].objects == mine
    assert "default/web" in every
    assert "default/web" not in caches[runtime.PODS].objects


def test_pods_by_owner_from_events_equals_grouping_the_whole_cache() -> None:
    """The status pass's per-owner index, kept from the pod view's events, gives what
    `index_by_owner` over the whole cache gives, in the same order (the first problem pod a
    message names depends on it), through adds, replacements, deletions and owner changes."""
    rng = random.Random(7)
    cache = Informer(None, resources.POD, namespace=NAMESPACE, transform=strip.pod)  # type: ignore[arg-type]
    index = clusterpolicy.PodsByOwner()
    cache.on_change = index.changed
    owners = ("ds-a", "ds-b", "ds-c")
    revisions = [
        {"metadata": {"name": f"r{i}", "ownerReferences": [{"uid": rng.choice(owners)}]}}
        for i in range(6)
    ]
    for step in range(2000):
        name = f"p{rng.randrange(40)}"
        if rng.random() < 0.25:
            cache._delete({"metadata": {"name": name, "namespace": NAMESPACE}})
        else:
            obj = pod(rng, NAMESPACE, name)
            obj["metadata"]["ownerReferences"] = [
                {"kind": "DaemonSet", "uid": rng.choice(owners), "controller": True}
            ]
            cache._set(obj)
        if step % 50 == 0:
            if index.stale or index.held() != len(cache.objects):
                index.reset(cache.objects)
            expected = clusterpolicy.index_by_owner(cache.objects.values(), revisions)
            got = index.with_revisions(revisions)
            assert dict(got) == expected
            assert got.get("ds-none", ([], [])) == ([], [])
