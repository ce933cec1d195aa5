"""The ClusterPolicy status's worst node: each node's chain verdict is walked again only when
that node, its pods or the policy's view changed (issue 32: walking every node on every status
pass made the operator's CPU grow with nodes x passes), and the answer is the one a full walk
gives."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.api import keys
from gpu_operator.controller import node_verdicts, strip
from gpu_operator.controller.node_verdicts import NodeVerdicts
from gpu_operator.operands.readiness import PodSummary
from gpu_operator.status import explain

VIEW = explain.PolicyView()
APPS = (
    explain.DRIVER_APP,
    explain.TOOLKIT_APP,
    explain.PLUGIN_APP,
    explain.VALIDATOR_APP,
)


# Labelled by the operator: a node with its operand pods running holds every link.
DEPLOYED = {
    f"{keys.DEPLOY_PREFIX}{operand}": "true"
    for operand in (
        "driver", "container-toolkit", "device-plugin", "operator-validator",
        "gpu-feature-discovery", "dcgm-exporter", "node-status-exporter", "mig-manager",
    )
}  # fmt: skip


def gpu_node(name: str, **labels: str) -> dict[str, Any]:
    """A labelled GPU node as the operator's node cache holds it (strip.node)."""
    return strip.node({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": {
            "feature.node.kubernetes.io/pci-10de.present": "true",
            keys.GPU_PRESENT: "true",
            keys.GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3",
            **DEPLOYED,
            **labels,
        }},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}, "capacity": {"nvidia.com/gpu": "8"}},
    })  # fmt: skip


def pod(node: str, app: str, problem: str | None = None) -> PodSummary:
    return PodSummary(
        name=f"{app}-{node}", node=node, owner_uids=(f"ds-{app}",), revision_hash="1",
        problem=(1, problem) if problem else None, app=app,
    )  # fmt: skip


def fleet(size: int) -> tuple[dict[str, dict[str, Any]], dict[str, PodSummary]]:
    nodes = {f"gpu-{i}": gpu_node(f"gpu-{i}") for i in range(size)}
    pods = {f"{app}-{n}": pod(n, app) for n in nodes for app in APPS}
    return nodes, pods


def full_walk(
    nodes: dict[str, dict[str, Any]], pods: dict[str, PodSummary], view: explain.PolicyView
) -> list[explain.Verdict]:
    """What a walk over every node gives (the status before the memo)."""
    verdicts = []
    for node in nodes.values():
        if (node["metadata"]["labels"] or {}).get(keys.GPU_PRESENT) != "true":
            continue
        name = node["metadata"]["name"]
        on_node = [p for p in pods.values() if p.node == name]
        verdicts.append(explain.explain(node_verdicts.node_facts(node, on_node, view)))
    return verdicts


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The nodes the chain is walked for, in order."""
    seen: list[str] = []
    real = explain.explain

    def counting(facts: explain.NodeFacts) -> explain.Verdict:
        seen.append(facts.name)
        return real(facts)

    monkeypatch.setattr(explain, "explain", counting)
    return seen


def test_a_status_pass_over_unchanged_nodes_walks_no_chain(walks: list[str]) -> None:
    nodes, pods = fleet(50)
    memo = NodeVerdicts()
    memo.refresh(nodes.values(), pods.values(), VIEW)
    assert len(walks) == 50
    walks.clear()
    for _ in range(3):
        assert memo.worst(nodes.values(), pods.values(), VIEW) is None
    assert walks == []


def test_only_the_node_that_changed_or_whose_pods_changed_is_walked_again(
    walks: list[str],
) -> None:
    nodes, pods = fleet(20)
    memo = NodeVerdicts()
    memo.refresh(nodes.values(), pods.values(), VIEW)
    walks.clear()
    # The node cache replaces a changed node with a new object.
    nodes["gpu-3"] = gpu_node("gpu-3", **{keys.DEPLOY_DRIVER: "false"})
    # A pod summary changed on another node.
    key = f"{explain.PLUGIN_APP}-gpu-7"
    pods[key] = pod("gpu-7", explain.PLUGIN_APP, "container nvidia-device-plugin: CrashLoopBackOff")
    # A pod gone from a third.
    del pods[f"{explain.TOOLKIT_APP}-gpu-11"]
    memo.refresh(nodes.values(), pods.values(), VIEW)
    assert sorted(walks) == ["gpu-11", "gpu-3", "gpu-7"]


def test_a_new_policy_view_walks_every_node_again(walks: list[str]) -> None:
    nodes, pods = fleet(10)
    memo = NodeVerdicts()
    memo.refresh(nodes.values(), pods.values(), VIEW)
    walks.clear()
    memo.refresh(nodes.values(), pods.values(), explain.PolicyView(driver=False))
    assert len(walks) == 10


def test_the_memo_answers_what_a_full_walk_answers_as_the_fleet_changes() -> None:
    nodes, pods = fleet(12)
    memo = NodeVerdicts()
    steps = [
        lambda: pods.update({f"{explain.DRIVER_APP}-gpu-2": pod(
            "gpu-2", explain.DRIVER_APP, "container nvidia-driver-ctr: CrashLoopBackOff")}),
        lambda: nodes.update({"gpu-5": gpu_node(
            "gpu-5", **{keys.UPGRADE_STATE: "drain-required"})}),
        lambda: pods.pop(f"{explain.VALIDATOR_APP}-gpu-9"),
        lambda: nodes.pop("gpu-2"),
        lambda: nodes.update({"gpu-5": gpu_node("gpu-5")}),
    ]  # fmt: skip
    worst_seen = []
    for step in [lambda: None, *steps]:
        step()
        got = memo.verdicts(nodes.values(), pods.values(), VIEW)
        assert got == full_walk(nodes, pods, VIEW)
        worst = memo.worst(nodes.values(), pods.values(), VIEW)
        assert worst == explain.worst(got)
        worst_seen.append(worst.node if worst is not None else None)
    # Healthy; then the crashing driver, which stays the worst while gpu-5 upgrades and gpu-9
    # loses its validator (the driver link comes first in the chain); with gpu-2 gone, gpu-9's
    # validator comes before gpu-5's upgrade, and gpu-9 stays once gpu-5 is done.
    assert worst_seen == [None, "gpu-2", "gpu-2", "gpu-2", "gpu-9", "gpu-9"]


def test_nodes_that_are_gone_or_no_gpu_nodes_are_forgotten() -> None:
    nodes, pods = fleet(5)
    memo = NodeVerdicts()
    memo.verdicts(nodes.values(), pods.values(), VIEW)
    del nodes["gpu-1"]
    nodes["gpu-2"] = strip.node({"metadata": {"name": "gpu-2", "labels": {}}})
    assert [v.node for v in memo.verdicts(nodes.values(), pods.values(), VIEW)] == [
        "gpu-0", "gpu-3", "gpu-4",
    ]  # fmt: skip
    assert sorted(memo._memo) == ["gpu-0", "gpu-3", "gpu-4"]


def _dra_slice(node: str, devices: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node}-gpu.nvidia.com"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node},
                 "devices": [{} for _ in range(devices)]},
    }  # fmt: skip


def test_a_dra_node_is_judged_on_the_cached_slices(walks: list[str]) -> None:
    """A DRA node's verdict reads its ResourceSlices from the cache (not skipped links); only
    DRA nodes ask for slices, and a slice change walks that node again."""
    dra_labels = {keys.DRA_NODE: "true", f"{keys.DEPLOY_PREFIX}device-plugin": "false"}
    nodes = {
        "gpu-0": gpu_node("gpu-0"),
        "dra-0": strip.node({
            "metadata": {"name": "dra-0", "labels": {
                "feature.node.kubernetes.io/pci-10de.present": "true", keys.GPU_PRESENT: "true",
                keys.GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3", **DEPLOYED, **dra_labels}},
            "status": {"capacity": {"cpu": "64"}},
        }),
    }  # fmt: skip
    pods = [pod(n, app) for n in nodes for app in APPS if app != explain.PLUGIN_APP or n == "gpu-0"]
    published = {"dra-0": (_dra_slice("dra-0", 0),)}
    asked: list[str] = []

    def slices(name: str) -> tuple[dict[str, Any], ...] | None:
        asked.append(name)
        return published.get(name, ())

    memo = NodeVerdicts()
    by_node = {v.node: v for v in memo.verdicts(nodes.values(), pods, VIEW, slices)}
    assert asked == ["dra-0"]
    assert by_node["gpu-0"].usable
    verdict = by_node["dra-0"]
    assert verdict.dra
    assert verdict.failed is not None
    assert verdict.failed.id == "dra-slices"
    assert "ResourceSlices with no device" in verdict.failed.summary
    # The plugin's pod is not in the operator's namespace here: unknown, so skipped.
    links = {link.id: link for link in verdict.links}
    assert links["dra-plugin"].status == "skipped"
    assert links["dra-handover"].status == "ok"  # no GPUs left from a device plugin
    walks.clear()
    published["dra-0"] = (_dra_slice("dra-0", 8),)
    memo.refresh(nodes.values(), pods, VIEW, slices)
    assert walks == ["dra-0"]
    by_node = {v.node: v for v in memo.verdicts(nodes.values(), pods, VIEW, slices)}
    assert by_node["dra-0"].usable, by_node["dra-0"].message()
    links = {link.id: link for link in by_node["dra-0"].links}
    assert links["dra-slices"].summary == "8 device(s) published in 1 ResourceSlice(s)"
    # A DRA plugin pod in the operator's namespace that is not ready fails its link.
    broken = pod("dra-0", explain.DRA_PLUGIN_APP, "container gpus not ready")
    verdict = memo.verdicts(nodes.values(), [*pods, broken], VIEW, slices)[1]
    assert verdict.failed is not None
    assert verdict.failed.id == "dra-plugin"


class _PodCache:
    """A pod cache as kube/cache.py's Informer keeps one (a replaced pod keeps its place, a new
    or re-added one goes last), telling `NodeVerdicts.pods` of every change as its watch does."""

    def __init__(self, memo: NodeVerdicts) -> None:
        self.objects: dict[str, PodSummary] = {}
        self.memo = memo

    def set(self, key: str, pod: PodSummary) -> None:
        old = self.objects.get(key)
        self.objects[key] = pod
        self.memo.pods.changed(key, old, pod)

    def delete(self, key: str) -> None:
        old = self.objects.pop(key, None)
        if old is not None:
            self.memo.pods.changed(key, old, None)


@pytest.mark.parametrize("by_cache", [False, True])
def test_event_fed_passes_answer_what_a_full_walk_answers_on_random_changes(
    by_cache: bool,
) -> None:
    """Random pod and node changes (problems come and go, pods are scheduled, deleted, added
    again; nodes change labels, leave and come back; the policy's view changes now and then):
    after each batch the incremental pass, which regroups only the nodes whose pods changed,
    gives exactly a full walk's verdicts. `by_cache`: the pass is given the node cache itself
    (name -> node), as the ClusterPolicy reconciler does, and skips unchanged nodes by key."""
    import random

    rng = random.Random(32)
    views = (VIEW, VIEW, VIEW, explain.PolicyView(driver=False))
    nodes, start = fleet(30)
    memo = NodeVerdicts()
    cache = _PodCache(memo)
    for key, summary in start.items():
        cache.set(key, summary)
    names = list(nodes)
    problems = [None, "container x in CrashLoopBackOff", "pod Pending", "terminating"]
    for _ in range(60):
        for _ in range(rng.randint(1, 8)):
            roll = rng.random()
            node = rng.choice(names)
            app = rng.choice(APPS)
            key = f"{app}-{node}" if rng.random() < 0.8 else f"{app}-{node}-extra"
            if roll < 0.45:  # a pod appears or changes (maybe not scheduled yet)
                where = "" if rng.random() < 0.1 else node
                summary = pod(where or node, app, rng.choice(problems))._replace(node=where)
                cache.set(key, summary)
            elif roll < 0.6 and key in cache.objects:  # scheduled onto its node
                cache.set(key, cache.objects[key]._replace(node=node))
            elif roll < 0.75:
                cache.delete(key)
            elif roll < 0.85:  # the node object changes
                labels = {keys.DEPLOY_DRIVER: "false"} if rng.random() < 0.5 else {}
                nodes[node] = gpu_node(node, **labels)
            elif roll < 0.92:
                nodes.pop(node, None)
            else:
                nodes[node] = gpu_node(node)
        view = rng.choice(views)
        source = nodes if by_cache else nodes.values()
        got = memo.verdicts(source, None, view)
        assert got == full_walk(nodes, cache.objects, view)
        assert memo.worst(source, None, view) == explain.worst(got)
        assert not memo.pods.dirty


def test_event_fed_pass_walks_only_the_nodes_whose_pods_changed(walks: list[str]) -> None:
    nodes, start = fleet(20)
    memo = NodeVerdicts()
    cache = _PodCache(memo)
    for key, summary in start.items():
        cache.set(key, summary)
    memo.refresh(nodes.values(), None, VIEW)
    walks.clear()
    cache.set(f"{explain.PLUGIN_APP}-gpu-7", pod("gpu-7", explain.PLUGIN_APP, "crashing"))
    cache.delete(f"{explain.TOOLKIT_APP}-gpu-11")
    # Replaced by an equal summary: grouped again, not walked again.
    cache.set(f"{explain.DRIVER_APP}-gpu-2", pod("gpu-2", explain.DRIVER_APP))
    memo.refresh(nodes.values(), None, VIEW)
    assert sorted(walks) == ["gpu-11", "gpu-7"]
    walks.clear()
    memo.refresh(nodes.values(), None, VIEW)
    assert walks == []


def test_the_memo_keeps_no_verdict_per_node_only_the_worst_one(walks: list[str]) -> None:
    """While a fleet rolls out every node fails: keeping each node's verdict (its links and
    evidence, about 2 KB) cost 40 MB at 20,000 nodes (issue 32). The memo keeps each node's
    inputs and rank; the worst node's verdict is walked again once, when the worst changes."""
    nodes, pods = fleet(30)
    pods = {k: p for k, p in pods.items() if p.app != explain.VALIDATOR_APP}  # all failing
    memo = NodeVerdicts()
    worst = memo.worst(nodes.values(), pods.values(), VIEW)
    assert len(walks) == 31  # each node once, and the worst once more
    assert worst == explain.worst(full_walk(nodes, pods, VIEW))
    kept = [field for entry in memo._memo.values() for field in entry]
    assert not [f for f in kept if isinstance(f, explain.Verdict)]
    walks.clear()
    assert memo.worst(nodes.values(), pods.values(), VIEW) is worst
    assert walks == []
    del nodes["gpu-0"]  # the worst (by name) leaves: the next one's verdict is walked
    worst = memo.worst(nodes.values(), pods.values(), VIEW)
    assert walks == ["gpu-1"]
    assert worst == explain.worst(full_walk(nodes, pods, VIEW))


def test_the_pod_index_keeps_the_caches_order_of_a_nodes_pods() -> None:
    """Two pods of one app on a node (an old one terminating beside its replacement): the chain
    reads them in the cache's order, so the index gives them in that order."""
    memo = NodeVerdicts()
    cache = _PodCache(memo)
    old = pod("gpu-0", explain.DRIVER_APP, "terminating")
    new = pod("gpu-0", explain.DRIVER_APP)._replace(name="driver-new", node="")
    cache.set("old", old)
    cache.set("new", new)
    cache.set("new", new._replace(node="gpu-0"))  # scheduled: keeps its place after `old`
    assert [p.name for p in memo.pods.on("gpu-0")] == [old.name, "driver-new"]
    cache.delete("old")
    cache.set("old", old)  # added again: last
    assert [p.name for p in memo.pods.on("gpu-0")] == ["driver-new", old.name]
    memo.pods.reset(cache.objects)
    assert [p.name for p in memo.pods.on("gpu-0")] == ["driver-new", old.name]
    assert len(memo.pods) == 2
