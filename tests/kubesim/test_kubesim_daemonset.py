"""The incremental DaemonSet controller: work per event, surge rollouts, failed pods, revisions,
time-sliced passes; Endpoints truncation at scale; and a kubectl rollout session."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubesim_helpers import TEST_IMAGES, daemonset, instant, kubectl, needs_kubectl
from waiting import DEADLINE, eventually

import kubesim
from kubesim import defaults
from kubesim.controllers import daemonset as ds_module
from kubesim.controllers.daemonset import DaemonSetController

NODES = 30


@pytest.fixture
async def fleet() -> AsyncIterator[kubesim.Cluster]:
    """A cluster of NODES nodes with an instant kubelet."""
    async with kubesim.Cluster(
        images=TEST_IMAGES, nodes=NODES, kubelet=instant(), node_filesystems=False
    ) as sim:
        yield sim


def controller(sim: kubesim.Cluster) -> DaemonSetController:
    found = sim.controllers["daemonset"]
    assert isinstance(found, DaemonSetController)
    return found


def pods_of(sim: kubesim.Cluster, app: str) -> list[dict[str, Any]]:
    return sim.store.list("pods", "default", label_selector=f"app={app}")


def live_pods(sim: kubesim.Cluster, app: str) -> list[dict[str, Any]]:
    return [p for p in pods_of(sim, app) if not p["metadata"].get("deletionTimestamp")]


def status(sim: kubesim.Cluster, name: str) -> dict[str, Any]:
    return dict((sim.store.get("daemonsets", name, "default") or {}).get("status") or {})


def label(sim: kubesim.Cluster, node: str, value: str | None) -> None:
    sim.store.patch("nodes", node, {"metadata": {"labels": {"pool": value}}})


def synced_nodes(sim: kubesim.Cluster, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the node of every per-node sync from now on."""
    ctl = controller(sim)
    seen: list[str] = []
    original = ctl._sync_node

    def spy(ds: dict[str, Any], state: Any, node: str) -> None:
        seen.append(node)
        original(ds, state, node)

    monkeypatch.setattr(ctl, "_sync_node", spy)
    return seen


async def settled_available(sim: kubesim.Cluster, name: str, count: int) -> None:
    await eventually(
        lambda: (
            status(sim, name).get("numberAvailable", 0) == count
            and status(sim, name).get("desiredNumberScheduled") == count
        ),
        f"{name} available on {count} nodes",
        state=lambda: status(sim, name),
    )
    await sim.settle(timeout=DEADLINE)


# ----- work per event -----------------------------------------------------------------------


async def test_labelling_one_node_creates_one_pod_and_syncs_only_that_node(
    fleet: kubesim.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = fleet
    sim.store.create(daemonset("agent", nodeSelector={"pool": "gpu"}))
    await sim.wait_for(lambda: "observedGeneration" in status(sim, "agent"), DEADLINE)
    await sim.settle(timeout=DEADLINE)
    walks = controller(sim).full_walks
    seen = synced_nodes(sim, monkeypatch)
    label(sim, "node-7", "gpu")
    await settled_available(sim, "agent", 1)
    assert [p["spec"]["nodeName"] for p in pods_of(sim, "agent")] == ["node-7"]
    # The label change and the pod turning ready: node-7 only, never a walk over the fleet.
    assert set(seen) == {"node-7"}
    assert len(seen) <= 3
    assert controller(sim).full_walks == walks


async def test_daemon_pods_share_the_defaulted_prototype_and_are_not_defaulted_per_pod(
    fleet: kubesim.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    defaulted: list[int] = []
    original = defaults.pod_spec_defaults

    def spy(spec: dict[str, Any]) -> None:
        defaulted.append(id(spec))
        original(spec)

    monkeypatch.setattr(defaults, "pod_spec_defaults", spy)
    fleet.store.create(daemonset("agent", hostNetwork=True))
    await settled_available(fleet, "agent", NODES)
    # The DaemonSet's template and the prototype's dry run, not once per node's pod.
    assert len(defaulted) < NODES // 3
    pod = pods_of(fleet, "agent")[0]
    spec = pod["spec"]
    assert spec["dnsPolicy"] == "ClusterFirst"
    assert spec["containers"][0]["terminationMessagePolicy"] == "File"
    assert pod["status"]["qosClass"] == "BestEffort"


async def test_unlabelling_a_node_deletes_only_its_pod(fleet: kubesim.Cluster) -> None:
    sim = fleet
    for node in ("node-1", "node-2", "node-3"):
        label(sim, node, "gpu")
    sim.store.create(daemonset("agent", nodeSelector={"pool": "gpu"}))
    await settled_available(sim, "agent", 3)
    versions = {
        p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in pods_of(sim, "agent")
    }
    gone = next(
        p["metadata"]["name"] for p in pods_of(sim, "agent") if p["spec"]["nodeName"] == "node-2"
    )
    label(sim, "node-2", None)
    await sim.wait_for(lambda: len(pods_of(sim, "agent")) == 2, DEADLINE, "pod on node-2 removed")
    await sim.settle(timeout=DEADLINE)
    left = {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in pods_of(sim, "agent")}
    assert left == {name: rv for name, rv in versions.items() if name != gone}
    assert status(sim, "agent")["desiredNumberScheduled"] == 2
    reasons = [
        e["message"]
        for e in sim.store.list("events", "default")
        if e["involvedObject"]["name"] == "agent" and e["reason"] == "SuccessfulDelete"
    ]
    assert reasons == [f"Deleted pod: {gone}"]


async def test_a_pod_event_resyncs_only_the_node_of_that_pod(
    fleet: kubesim.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = fleet
    sim.store.create(daemonset("agent"))
    await settled_available(sim, "agent", NODES)
    victim = next(p for p in pods_of(sim, "agent") if p["spec"]["nodeName"] == "node-12")
    others = {
        p["metadata"]["name"]: p["metadata"]["resourceVersion"]
        for p in pods_of(sim, "agent")
        if p["metadata"]["name"] != victim["metadata"]["name"]
    }
    seen = synced_nodes(sim, monkeypatch)
    sim.store.delete("pods", victim["metadata"]["name"], "default", grace=0)
    await sim.wait_for(
        lambda: any(p["spec"]["nodeName"] == "node-12" for p in pods_of(sim, "agent")),
        DEADLINE,
        "replacement on node-12",
    )
    await settled_available(sim, "agent", NODES)
    assert set(seen) == {"node-12"}
    untouched = {
        p["metadata"]["name"]: p["metadata"]["resourceVersion"]
        for p in pods_of(sim, "agent")
        if p["spec"]["nodeName"] != "node-12"
    }
    assert untouched == others


async def test_only_a_spec_change_walks_every_node(fleet: kubesim.Cluster) -> None:
    sim = fleet
    sim.store.create(daemonset("agent"))
    await settled_available(sim, "agent", NODES)
    ctl = controller(sim)
    walks, syncs = ctl.full_walks, ctl.node_syncs
    sim.add_node("late")
    sim.store.patch("daemonsets", "agent", {"metadata": {"labels": {"team": "a"}}}, "default")
    await settled_available(sim, "agent", NODES + 1)
    assert ctl.full_walks == walks
    assert ctl.node_syncs - syncs <= 3
    sim.store.patch("daemonsets", "agent", {"spec": {"minReadySeconds": 0, "template": {
        "metadata": {"annotations": {"rev": "2"}}}}}, "default")  # fmt: skip
    await sim.wait_for(lambda: status(sim, "agent").get("observedGeneration") == 2, DEADLINE)
    assert ctl.full_walks == walks + 1


# ----- passes, status, rollouts --------------------------------------------------------------


async def test_a_pass_cut_into_slices_publishes_only_complete_totals(
    fleet: kubesim.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = fleet
    # One node per turn of the event loop: the pass spans many reconciles.
    monkeypatch.setattr(ds_module, "SLICE_SECONDS", 0.0)
    ctl = controller(sim)
    calls = 0
    original = ctl.reconcile

    def counting(key: Any) -> None:
        nonlocal calls
        calls += 1
        original(key)

    monkeypatch.setattr(ctl, "reconcile", counting)
    desired_seen: set[int] = set()

    def record() -> bool:
        desired_seen.add(status(sim, "agent").get("desiredNumberScheduled", 0))
        return status(sim, "agent").get("numberAvailable") == NODES

    sim.store.create(daemonset("agent"))
    await sim.wait_for(record, DEADLINE, "agent everywhere")
    assert calls >= NODES
    assert desired_seen <= {0, NODES}
    assert len(pods_of(sim, "agent")) == NODES


async def test_surge_rollout_adds_new_pods_before_removing_old_ones(
    fleet: kubesim.Cluster,
) -> None:
    sim = fleet
    manifest = daemonset("agent")
    manifest["spec"]["updateStrategy"] = {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 2, "maxUnavailable": 0},
    }
    sim.store.create(manifest)
    await settled_available(sim, "agent", NODES)
    old_hash = pods_of(sim, "agent")[0]["metadata"]["labels"]["controller-revision-hash"]
    sim.kubelet.config.instant = False
    sim.kubelet.config.ready_delay = 0.02
    most_pods, least_available = 0, NODES

    def observe(_event: object = None) -> None:
        # On every write (the store calls this synchronously), so no state goes unseen.
        nonlocal most_pods, least_available
        most_pods = max(most_pods, len(live_pods(sim, "agent")))
        least_available = min(least_available, status(sim, "agent").get("numberAvailable", 0))

    def done() -> bool:
        return status(sim, "agent").get("updatedNumberScheduled") == NODES and all(
            p["metadata"]["labels"]["controller-revision-hash"] != old_hash
            for p in pods_of(sim, "agent")
        )

    unsubscribe = sim.store.subscribe(observe, keys=[("", "pods"), ("apps", "daemonsets")])
    try:
        image = {"spec": {"template": {"spec": {"containers": [
            {"name": "main", "image": "example/agent:2"}]}}}}  # fmt: skip
        sim.store.patch("daemonsets", "agent", image, "default")
        await eventually(done, "surge rollout", state=lambda: status(sim, "agent"))
    finally:
        unsubscribe()
    assert most_pods == NODES + 2
    assert least_available == NODES


async def test_failed_daemon_pod_is_replaced_with_a_warning(fleet: kubesim.Cluster) -> None:
    sim = fleet
    sim.store.create(daemonset("agent", nodeSelector={"kubernetes.io/hostname": "node-3"}))
    await settled_available(sim, "agent", 1)
    failed = pods_of(sim, "agent")[0]
    failed["status"]["phase"] = "Failed"
    sim.store.update(failed, status=True)
    name = failed["metadata"]["name"]
    await sim.wait_for(
        lambda: [p["metadata"]["name"] for p in live_pods(sim, "agent")] not in ([], [name]),
        DEADLINE,
        "replacement pod",
    )
    warnings = [
        e["message"]
        for e in sim.store.list("events", "default")
        if e["reason"] == "FailedDaemonPod"
    ]
    assert warnings == [
        f"Found failed daemon pod default/{name} on node node-3, will try to kill it"
    ]


async def test_old_revisions_beyond_the_limit_go_unless_a_pod_still_runs_them(
    fleet: kubesim.Cluster,
) -> None:
    sim = fleet
    manifest = daemonset("agent", nodeSelector={"kubernetes.io/hostname": "node-1"})
    manifest["spec"]["updateStrategy"] = {"type": "OnDelete"}
    manifest["spec"]["revisionHistoryLimit"] = 1
    sim.store.create(manifest)
    await settled_available(sim, "agent", 1)
    first = pods_of(sim, "agent")[0]["metadata"]["labels"]["controller-revision-hash"]
    for tag in ("2", "3"):
        image = {"spec": {"template": {"spec": {"containers": [
            {"name": "main", "image": f"example/agent:{tag}"}]}}}}  # fmt: skip
        sim.store.patch("daemonsets", "agent", image, "default")
        await sim.settle(timeout=DEADLINE)
    hashes = {
        r["metadata"]["labels"]["controller-revision-hash"]: r["revision"]
        for r in sim.store.list("controllerrevisions", "default")
    }
    # OnDelete keeps the first pod: its revision stays; the unused middle one goes.
    assert len(hashes) == 2
    assert first in hashes
    assert sorted(hashes.values()) == [1, 3]


# ----- Endpoints at scale -------------------------------------------------------------------


async def test_endpoints_hold_at_most_1000_addresses_and_say_so() -> None:
    async with kubesim.Cluster(
        images=TEST_IMAGES, nodes=1, kubelet=instant(), node_filesystems=False, events=False
    ) as sim:
        sim.store.create({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "big", "namespace": "default"},
            "spec": {"selector": {"app": "big"}, "ports": [{"port": 80}]},
        })  # fmt: skip
        for index in range(1002):
            sim.store.create({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"big-{index}", "namespace": "default",
                             "labels": {"app": "big"}},
                "spec": {"nodeName": "node-1",
                         "containers": [{"name": "c", "image": "example/big:1"}]},
            })  # fmt: skip

        def addresses() -> int:
            endpoints = sim.store.get("endpoints", "big", "default") or {}
            return sum(len(s.get("addresses") or ()) for s in endpoints.get("subsets") or ())

        def sliced() -> int:
            found = sim.store.list("endpointslices", "default", "kubernetes.io/service-name=big")
            return sum(len(s.get("endpoints") or ()) for s in found)

        await sim.wait_for(lambda: addresses() == 1000 and sliced() == 1002, DEADLINE, "endpoints")
        annotations = sim.store.get("endpoints", "big", "default")["metadata"]["annotations"]
        assert annotations["endpoints.kubernetes.io/over-capacity"] == "truncated"
        for index in range(3):
            sim.store.delete("pods", f"big-{index}", "default", grace=0)
        await sim.wait_for(lambda: sliced() == 999, DEADLINE, "slices shrink")
        await sim.wait_for(lambda: addresses() == 999, DEADLINE, "endpoints shrink")
        annotations = sim.store.get("endpoints", "big", "default")["metadata"]["annotations"]
        assert "endpoints.kubernetes.io/over-capacity" not in annotations


@needs_kubectl
async def test_a_recreated_daemonset_adopts_the_pods_an_orphan_delete_left(
    fleet: kubesim.Cluster,
) -> None:
    sim = fleet
    manifest = json.dumps(daemonset("agent"))
    await kubectl(sim, "apply", "-f", "-", stdin=manifest)
    await kubectl(sim, "rollout", "status", "ds/agent", "--timeout=60s")
    before = {p["metadata"]["uid"] for p in live_pods(sim, "agent")}
    assert len(before) == NODES

    await kubectl(sim, "delete", "ds/agent", "--cascade=orphan")
    await sim.wait_for(
        lambda: all(not p["metadata"].get("ownerReferences") for p in live_pods(sim, "agent")),
        message="pods orphaned",
        timeout=DEADLINE,
    )
    await kubectl(sim, "apply", "-f", "-", stdin=manifest)
    await kubectl(sim, "rollout", "status", "ds/agent", "--timeout=60s")

    uid = sim.store.get("daemonsets", "agent", "default")["metadata"]["uid"]
    after = live_pods(sim, "agent")
    assert {p["metadata"]["uid"] for p in after} == before  # none deleted, none created
    assert all(p["metadata"]["ownerReferences"][0]["uid"] == uid for p in after)


# ----- kubectl ------------------------------------------------------------------------------


@needs_kubectl
async def test_kubectl_rolls_a_surging_daemonset_out_and_back(fleet: kubesim.Cluster) -> None:
    sim = fleet
    manifest = daemonset("agent")
    manifest["spec"]["updateStrategy"] = {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": "10%", "maxUnavailable": 0},
    }
    await kubectl(sim, "apply", "-f", "-", stdin=json.dumps(manifest))
    assert "successfully rolled out" in await kubectl(
        sim, "rollout", "status", "ds/agent", "--timeout=60s"
    )
    await kubectl(sim, "set", "image", "ds/agent", "main=example/agent:2")
    assert "successfully rolled out" in await kubectl(
        sim, "rollout", "status", "ds/agent", "--timeout=60s"
    )
    history = await kubectl(sim, "rollout", "history", "ds/agent")
    assert [line.split()[0] for line in history.splitlines()[2:] if line.strip()] == ["1", "2"]
    await kubectl(sim, "rollout", "undo", "ds/agent")
    assert "successfully rolled out" in await kubectl(
        sim, "rollout", "status", "ds/agent", "--timeout=60s"
    )
    images = {p["spec"]["containers"][0]["image"] for p in live_pods(sim, "agent")}
    assert images == {"example/agent:1"}
    assert len(live_pods(sim, "agent")) == NODES
