"""Each NVIDIADriver's upgradePolicy governs the nodes its driver runs on (upstream 26.x), with
upstream's defaults when it has none; a ClusterPolicy's spec.driver.upgradePolicy does not reach
nodes whose driver an NVIDIADriver manages."""

from __future__ import annotations

import dataclasses
from typing import Any

from upgrade_fleet import NEW, NS, OLD, T0, driver_pod, node, pool, revisions, state_after

from gpu_operator.api import keys
from gpu_operator.upgrade import actions, planner, states
from gpu_operator.upgrade.snapshot import DaemonSet, Node, Owner, Pod, Snapshot, owner_from


def nvidiadriver(name: str, upgrade_policy: dict[str, Any] | None = None) -> Owner:
    spec: dict[str, Any] = {"driverType": "gpu", "version": "580.95.05"}
    if upgrade_policy is not None:
        spec["upgradePolicy"] = upgrade_policy
    return owner_from(
        {
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "NVIDIADriver",
            "metadata": {"name": name, "uid": f"uid-nvd-{name}"},
            "spec": spec,
        }
    )


def cluster_policy(upgrade_policy: dict[str, Any]) -> Owner:
    return owner_from(
        {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "metadata": {"name": "cluster-policy", "uid": "uid-cp"},
            "spec": {
                "operator": {}, "daemonsets": {}, "toolkit": {}, "devicePlugin": {},
                "dcgmExporter": {}, "dcgm": {}, "nodeStatusExporter": {}, "gfd": {},
                "driver": {"useNvidiaDriverCRD": True, "upgradePolicy": upgrade_policy},
            },
        }
    )  # fmt: skip


def pool_of(owner: Owner) -> DaemonSet:
    base = pool(f"nvidia-gpu-driver-ubuntu22.04-{owner.name}", f"uid-ds-{owner.name}",
                **{keys.DRIVER_OWNER: owner.name})  # fmt: skip
    return dataclasses.replace(
        base,
        labels={"app.kubernetes.io/component": states.DRIVER_COMPONENT},
        owner_kind="NVIDIADriver",
        owner_name=owner.name,
        owner_uid=owner.uid,
    )


def fleet(
    sizes: dict[str, int], owners: list[Owner], state: str = states.UPGRADE_REQUIRED
) -> tuple[Snapshot, dict[str, list[str]]]:
    nodes: list[Node] = []
    pods: list[Pod] = []
    daemonsets: list[DaemonSet] = []
    revs = []
    names: dict[str, list[str]] = {}
    by_name = {o.name: o for o in owners}
    for owner_name, count in sizes.items():
        ds = pool_of(by_name[owner_name])
        daemonsets.append(ds)
        revs += revisions(ds.uid, OLD, NEW)
        names[owner_name] = [f"{owner_name}-{i}" for i in range(1, count + 1)]
        for name in names[owner_name]:
            nodes.append(node(name, state, labels={keys.DRIVER_OWNER: owner_name}))
            pods.append(driver_pod(name, OLD, uid=ds.uid))
    snap = Snapshot.build(
        now=T0, nodes=nodes, daemonsets=daemonsets, revisions=revs, pods=pods, owners=owners,
        namespace=NS,
    )  # fmt: skip
    return snap, names


def started(plan: actions.Plan, names: list[str]) -> list[str]:
    return [n for n in names if state_after(plan, n) not in (states.UPGRADE_REQUIRED, "")]


def test_every_nvidiadriver_rolls_its_own_nodes_under_its_own_limits() -> None:
    a100 = nvidiadriver("a100")  # no upgradePolicy: upstream's defaults, auto-upgrade on
    h100 = nvidiadriver("h100", {"maxParallelUpgrades": 3, "maxUnavailable": "50%"})
    snap, names = fleet({"a100": 4, "h100": 4}, [a100, h100])
    plan = planner.plan(snap)
    # a100: one at a time (maxParallelUpgrades 1, 25% of 4 = 1); h100: 50% of 4 = 2.
    assert len(started(plan, names["a100"])) == 1
    assert len(started(plan, names["h100"])) == 2
    assert plan.groups["NVIDIADriver/a100"].max_parallel == 1
    assert plan.groups["NVIDIADriver/h100"].max_unavailable == 2


def test_a_cluster_policy_upgrade_policy_does_not_govern_nvidiadriver_nodes() -> None:
    # The ClusterPolicy asks for everything at once; the NVIDIADriver (defaults) for one node.
    policy = cluster_policy({"autoUpgrade": True, "maxParallelUpgrades": 0,
                             "maxUnavailable": "100%"})  # fmt: skip
    a100 = nvidiadriver("a100")
    snap, names = fleet({"a100": 4}, [policy, a100])
    plan = planner.plan(snap)
    assert len(started(plan, names["a100"])) == 1
    assert set(plan.groups) == {"NVIDIADriver/a100"}
    # Nor does a ClusterPolicy with autoUpgrade off stop an NVIDIADriver's rollout.
    snap, names = fleet({"a100": 4}, [cluster_policy({"autoUpgrade": False}), a100])
    assert len(started(planner.plan(snap), names["a100"])) == 1


def test_an_nvidiadriver_with_auto_upgrade_off_leaves_its_nodes_alone_and_others_roll() -> None:
    l4 = nvidiadriver("l4", {"autoUpgrade": False})
    a100 = nvidiadriver("a100", {"maxParallelUpgrades": 0, "maxUnavailable": "100%"})
    snap, names = fleet({"l4": 2, "a100": 2}, [l4, a100], state=states.UPGRADE_DONE)
    plan = planner.plan(snap)
    # Upstream clears the state label from the nodes of a driver whose autoUpgrade is off.
    for name in names["l4"]:
        assert state_after(plan, name) in ("", None)
    assert plan.groups["NVIDIADriver/l4"].stopped == "autoUpgrade is off"
    for name in names["a100"]:
        assert state_after(plan, name) == states.UPGRADE_REQUIRED


def test_drain_and_pod_deletion_settings_come_from_the_nodes_own_nvidiadriver() -> None:
    drains = nvidiadriver("drains", {"drain": {"enable": True, "timeoutSeconds": 60},
                                     "podDeletion": {"timeoutSeconds": 30}})  # fmt: skip
    plain = nvidiadriver("plain")
    snap, names = fleet({"drains": 1, "plain": 1}, [drains, plain],
                        state=states.POD_DELETION_REQUIRED)  # fmt: skip
    cordoned = {n: dataclasses.replace(snap.nodes[n], unschedulable=True) for n in snap.nodes}
    snap = dataclasses.replace(snap, nodes=cordoned)
    plan = planner.plan(snap)
    # No GPU pods left: with drain enabled the node drains next, else its driver restarts.
    assert state_after(plan, names["drains"][0]) == states.DRAIN_REQUIRED
    assert state_after(plan, names["plain"][0]) == states.POD_RESTART_REQUIRED
    assert drains.policy.deletion_timeout == 30
    assert plain.policy.deletion_timeout == 300  # upstream's default podDeletion
    assert plain.policy.drain_timeout == 300
