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
    """What one node's verdict was walked from, and its rank; not the verdict itself: a verdict
    holds every link walked with its evidence (about 2 KB a node: 40 MB at 20,000 nodes while
    they all fail during a rollout), and the status needs only the worst one's, walked again
    from these same inputs when it is asked for (`NodeVerdicts.worst`)."""

    node: Mapping[str, Any]
    pods: tuple[PodSummary, ...]
    view: explain.PolicyView
    dra: explain.DraFacts | None
    # (depth, node) when the node is not usable: what `explain.worst` orders failing nodes by,
    # worked out once per verdict rather than on every pass. None when usable.
    rank: tuple[int, str] | None

    def walk(self) -> explain.Verdict:
        """The node's verdict (the chain is pure: the same inputs give the same verdict)."""
        return explain.explain(node_facts(self.node, self.pods, self.view, self.dra))


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


class PodsByNode:
    """The operand pods per node, kept from the pod cache's events (key, old, new), with the
    nodes whose pods changed since the last pass (`dirty`).

    A pass then groups only those nodes' pods instead of all of them (35,000 pods at 5,000
    nodes, every pass). Each node's pods come in the pod cache's own order (the order keys
    entered it: a replaced pod keeps its place, a pod deleted and added again goes last), so
    a node's pods are exactly what grouping the whole cache gives.
    """

    def __init__(self) -> None:
        self._seq: dict[str, int] = {}
        self._next = 0
        self._by_node: dict[str, dict[str, PodSummary]] = {}
        self.dirty: set[str] = set()

    def __len__(self) -> int:
        return len(self._seq)

    def changed(self, key: str, old: PodSummary | None, new: PodSummary | None) -> None:
        """One pod cache event: added (old None), replaced, or deleted (new None)."""
        if new is None:
            self._seq.pop(key, None)
        elif key not in self._seq:
            self._seq[key] = self._next
            self._next += 1
        if old is not None:
            held = self._by_node.get(old.node)
            if held is not None and held.pop(key, None) is not None and not held:
                del self._by_node[old.node]
            self.dirty.add(old.node)
        if new is not None:
            self._by_node.setdefault(new.node, {})[key] = new
            self.dirty.add(new.node)

    def reset(self, pods: Mapping[str, PodSummary]) -> None:
        """Rebuild from the whole cache (in its order); every node counts as changed."""
        self.dirty |= set(self._by_node)
        self._seq, self._next, self._by_node = {}, 0, {}
        for key, pod in pods.items():
            self.changed(key, None, pod)

    def on(self, node: str) -> tuple[PodSummary, ...]:
        """The node's pods, in the cache's order."""
        held = self._by_node.get(node)
        if not held:
            return ()
        seq = self._seq
        return tuple(pod for _, pod in sorted(held.items(), key=lambda item: seq[item[0]]))


class NodeVerdicts:
    """Each GPU node's verdict rank, remembered with the inputs it was walked from.

    Pods come either as a whole (`refresh(nodes, pods, ...)`: grouped by node on every call) or
    from `self.pods`, fed with the pod cache's events (`pods=None`): then a pass looks at the
    pods of the nodes whose pods changed since the last pass only. Only the worst node's
    verdict is kept (walked again when the worst node or its inputs change).
    """

    def __init__(self) -> None:
        self._memo: dict[str, _Entry] = {}
        self.pods = PodsByNode()
        # The worst entry of the last `worst` and its verdict.
        self._worst: tuple[_Entry, explain.Verdict] | None = None
        # The view of the last `refresh`: every entry it kept was walked with it.
        self._view: explain.PolicyView | None = None

    def refresh(
        self,
        nodes: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
        pods: Iterable[PodSummary] | None,
        view: explain.PolicyView,
        slices: SliceSource | None = None,
    ) -> None:
        """Walk again every node NFD-labelled as a GPU node (`nvidia.com/gpu.present`) whose
        inputs changed; forget the nodes that are gone. `slices` gives a DRA node's
        ResourceSlices; `pods` None reads the pods from `self.pods` (its events). `nodes` may
        be the node cache itself (name -> node): an unchanged node is then recognized by its
        key and object alone, without reading its labels."""
        grouped: dict[str, list[PodSummary]] | None = None
        if pods is not None:
            grouped = {}
            for pod in pods:
                grouped.setdefault(pod.node, []).append(pod)
        index = self.pods
        dirty = index.dirty
        memo = self._memo
        kept: dict[str, _Entry] = {}
        # Every kept entry was walked with the last view: one comparison stands for all.
        same_view = self._view == view
        by_key = nodes.items() if isinstance(nodes, Mapping) else ((None, n) for n in nodes)
        quick = grouped is None and same_view
        for key, node in by_key:
            if quick and key is not None:
                entry = memo.get(key)
                # The same object walked before (so the same labels: a GPU node, not a DRA
                # one), its pods unchanged.
                if (
                    entry is not None
                    and entry.node is node
                    and entry.dra is None
                    and key not in dirty
                ):
                    kept[key] = entry
                    continue
            meta = node.get("metadata") or {}
            labels = meta.get("labels") or {}
            if labels.get(keys.GPU_PRESENT) != "true":
                continue
            name = str(meta.get("name"))
            entry = memo.get(name)
            dra_node = labels.get(keys.DRA_NODE) == "true"
            if (
                grouped is None
                and entry is not None
                and entry.node is node
                and entry.view == view
                and name not in dirty
                and not dra_node
            ):
                kept[name] = entry  # neither the node nor its pods changed
                continue
            on_node = tuple(grouped.get(name, ())) if grouped is not None else index.on(name)
            dra = None
            if dra_node:
                dra = dra_facts(on_node, slices(name) if slices is not None else None)
            if entry is None or not (
                entry.node is node
                and entry.view == view
                and entry.pods == on_node
                and entry.dra == dra
            ):
                fresh = _Entry(node, on_node, view, dra, None)
                verdict = fresh.walk()
                rank = None if verdict.usable else (verdict.depth, verdict.node)
                entry = fresh._replace(rank=rank)
            kept[name] = entry
        if grouped is None:
            dirty.clear()
        self._memo = kept
        self._view = view

    def verdicts(
        self,
        nodes: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
        pods: Iterable[PodSummary] | None,
        view: explain.PolicyView,
        slices: SliceSource | None = None,
    ) -> list[explain.Verdict]:
        """Every GPU node's verdict after `refresh` (each walked again from its kept inputs:
        for `gpu-operator explain`-style reads and tests, not for the status passes)."""
        self.refresh(nodes, pods, view, slices)
        return [entry.walk() for entry in self._memo.values()]

    def worst(
        self,
        nodes: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
        pods: Iterable[PodSummary] | None,
        view: explain.PolicyView,
        slices: SliceSource | None = None,
    ) -> explain.Verdict | None:
        """The failing GPU node furthest from usable (status/explain.py's `worst`: the earliest
        failing link, then by name), or None."""
        self.refresh(nodes, pods, view, slices)
        failing = [e for e in self._memo.values() if e.rank is not None]
        if not failing:
            self._worst = None
            return None
        entry = min(failing, key=lambda e: e.rank or (0, ""))
        if self._worst is None or self._worst[0] is not entry:
            self._worst = (entry, entry.walk())
        return self._worst[1]
