"""The node chain's verdict per GPU node for the ClusterPolicy status, walked again only for the
nodes whose inputs changed.

The status names the GPU node furthest from usable (status/explain.py). Walking the chain for
every node on every status pass made the operator's CPU grow with nodes x passes: at 1,000 nodes
a rollout takes about a hundred passes. A verdict depends only on the node object, the operand
pods on it and the policy's view, so it is kept until one of them changes: the caches replace an
object on every change (never edit one in place), so an unchanged node is the same object, and
its pods' summaries compare equal.

A DRA node (`nvidia.com/dra-kubelet-plugin=true`) also depends on its DRA facts: its
gpu.nvidia.com ResourceSlices from the ResourceSlice cache (when resource.k8s.io/v1 is served)
and the DRA kubelet plugin's pod when it runs in the operator's namespace. They are read only
for DRA nodes, so the other nodes cost what they did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from gpu_operator.api import keys
from gpu_operator.operands.readiness import PodSummary
from gpu_operator.status import explain


class _Entry(NamedTuple):
    node: Mapping[str, Any]
    pods: tuple[PodSummary, ...]
    view: explain.PolicyView
    dra: explain.DraFacts | None
    verdict: explain.Verdict
    # (depth, node) when the node is not usable: what `explain.worst` orders failing nodes by,
    # worked out once per verdict rather than on every pass. None when usable.
    rank: tuple[int, str] | None


def pod_view(pod: PodSummary) -> explain.PodView:
    """A cached pod summary as the chain reads it (no containers: the cache keeps none)."""
    problem = pod.problem[1] if pod.problem else None
    return explain.PodView(pod.name, pod.app or "", problem, component=pod.component or "")


# A DRA node's gpu.nvidia.com ResourceSlices from the cache: None while they are not watched.
SliceSource = Callable[[str], "tuple[dict[str, Any], ...] | None"]


def dra_facts(
    pods: Iterable[PodSummary], slices: tuple[dict[str, Any], ...] | None
) -> explain.DraFacts:
    """A DRA node's DRA facts from the caches: the plugin's pod only when the operator's
    namespace has one (elsewhere the cache cannot see it: unknown, not missing); no claims."""
    plugin = tuple(pod_view(p) for p in pods if p.app == explain.DRA_PLUGIN_APP)
    return explain.DraFacts(mode="label", plugin_pods=plugin or None, slices=slices, claims=None)


def node_facts(
    node: Mapping[str, Any],
    pods: Iterable[PodSummary],
    view: explain.PolicyView,
    dra: explain.DraFacts | None = None,
) -> explain.NodeFacts:
    """One cached node's facts (no capacity, no logs: the chain skips what it cannot know)."""
    meta = node.get("metadata") or {}
    return explain.NodeFacts(
        name=str(meta.get("name")), labels=meta.get("labels") or {},
        annotations=meta.get("annotations") or {}, has_nfd=bool(node.get("nfd")),
        pods=tuple(pod_view(p) for p in pods), policy=view,
        gpu_allocatable=(node.get("status") or {}).get("gpuAllocatable"), dra=dra,
    )  # fmt: skip


class NodeVerdicts:
    """Each GPU node's verdict, remembered with the inputs it was walked from."""

    def __init__(self) -> None:
        self._memo: dict[str, _Entry] = {}

    def verdicts(
        self,
        nodes: Iterable[Mapping[str, Any]],
        pods: Iterable[PodSummary],
        view: explain.PolicyView,
        slices: SliceSource | None = None,
    ) -> list[explain.Verdict]:
        """The verdict of every node NFD-labelled as a GPU node (`nvidia.com/gpu.present`);
        forgets the nodes that are gone. `slices` gives a DRA node's ResourceSlices."""
        by_node: dict[str, list[PodSummary]] = {}
        for pod in pods:
            by_node.setdefault(pod.node, []).append(pod)
        memo = self._memo
        kept: dict[str, _Entry] = {}
        found: list[explain.Verdict] = []
        for node in nodes:
            meta = node.get("metadata") or {}
            labels = meta.get("labels") or {}
            if labels.get(keys.GPU_PRESENT) != "true":
                continue
            name = str(meta.get("name"))
            on_node = tuple(by_node.get(name, ()))
            dra = None
            if labels.get(keys.DRA_NODE) == "true":
                dra = dra_facts(on_node, slices(name) if slices is not None else None)
            entry = memo.get(name)
            if entry is None or not (
                entry.node is node
                and entry.view == view
                and entry.pods == on_node
                and entry.dra == dra
            ):
                verdict = explain.explain(node_facts(node, on_node, view, dra))
                rank = None if verdict.usable else (verdict.depth, verdict.node)
                entry = _Entry(node, on_node, view, dra, verdict, rank)
            kept[name] = entry
            found.append(entry.verdict)
        self._memo = kept
        return found

    def worst(
        self,
        nodes: Iterable[Mapping[str, Any]],
        pods: Iterable[PodSummary],
        view: explain.PolicyView,
        slices: SliceSource | None = None,
    ) -> explain.Verdict | None:
        """The failing GPU node furthest from usable (status/explain.py's `worst`: the earliest
        failing link, then by name), or None."""
        self.verdicts(nodes, pods, view, slices)
        failing = [e for e in self._memo.values() if e.rank is not None]
        return min(failing, key=lambda e: e.rank or (0, "")).verdict if failing else None
