"""Cluster facts for the renderers, folded from the node cache."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, NamedTuple, TypeVar

from gpu_operator.api import keys
from gpu_operator.nodes import labelling
from gpu_operator.operands import config_manager
from gpu_operator.operands.facts import ClusterFacts, Runtime


def runtime_of(node: Mapping[str, Any]) -> Runtime | None:
    version = str(
        ((node.get("status") or {}).get("nodeInfo") or {}).get("containerRuntimeVersion", "")
    )
    for runtime in ("containerd", "cri-o", "docker"):
        if version.startswith(runtime):
            return "crio" if runtime == "cri-o" else runtime  # type: ignore[return-value]
    return None


T = TypeVar("T")


class PerNode(Generic[T]):
    """`read(node)` for each node, computed once per node object: the node cache replaces a
    node's object on every change and never edits one in place, so an object seen by the last
    call gives what it gave then. Only the last call's objects are kept (each checked by
    identity: an id reused by a new object is not taken for the old one), so a pass over 5,000
    nodes of which a few changed reads only those few."""

    def __init__(self, read: Callable[[Mapping[str, Any]], T]) -> None:
        self._read = read
        self._seen: dict[int, tuple[Mapping[str, Any], T]] = {}

    def __call__(self, nodes: Iterable[Mapping[str, Any]]) -> list[T]:
        seen = self._seen
        kept: dict[int, tuple[Mapping[str, Any], T]] = {}
        out: list[T] = []
        for node in nodes:
            key = id(node)
            hit = seen.get(key)
            if hit is None or hit[0] is not node:
                hit = (node, self._read(node))
            kept[key] = hit
            out.append(hit[1])
        self._seen = kept
        return out


class _NodeFacts(NamedTuple):
    """What one node adds to the cluster facts."""

    nfd: bool
    gpu: bool
    os: tuple[str, str] | None
    runtime: Runtime | None
    kernel: str | None
    plugin_config: str | None


def _node_facts(node: Mapping[str, Any]) -> _NodeFacts:
    labels = (node.get("metadata") or {}).get("labels") or {}
    # Stripped nodes carry the NFD verdict; full node objects are checked directly.
    nfd = bool(node.get("nfd")) or labelling.has_nfd(labels)
    if labels.get(keys.GPU_PRESENT) != "true":
        return _NodeFacts(nfd, False, None, None, None, None)
    os_id, version = labels.get(keys.NFD_OS_ID), labels.get(keys.NFD_OS_VERSION_ID)
    return _NodeFacts(
        nfd,
        True,
        (os_id, version) if os_id and version else None,
        runtime_of(node),
        labels.get(keys.NFD_KERNEL_FULL) or None,
        labels.get(config_manager.NODE_LABEL) or None,
    )


# The operator's status passes fold every node of its node cache, many times a minute.
_node_facts_of = PerNode(_node_facts)


def from_nodes(
    nodes: Iterable[Mapping[str, Any]],
    *,
    namespace: str,
    operator_env: Mapping[str, str],
    has_servicemonitor_crd: bool,
    has_prometheusrule_crd: bool,
    config_map_keys: Mapping[str, tuple[str, ...]] | None = None,
    kubernetes_version: str = "1.35.0",
    config_map_data: Mapping[str, Mapping[str, str]] | None = None,
    startup_toleration: Mapping[str, str] | None = None,
    cached: bool = False,
) -> ClusterFacts:
    """Facts from every node: GPU count, NFD presence, OS of one GPU node, runtime, kernels, and
    the device-plugin config labels of GPU nodes. `cached`: the nodes are a node cache's
    objects, replaced on change and never edited in place (`PerNode`): each is read once."""
    gpu_nodes = 0
    plugin_configs: Counter[str] = Counter()
    nfd = False
    os_seen: Counter[tuple[str, str]] = Counter()
    runtimes: set[str] = set()
    kernels: set[str] = set()
    for node in _node_facts_of(nodes) if cached else map(_node_facts, nodes):
        nfd = nfd or node.nfd
        if not node.gpu:
            continue
        gpu_nodes += 1
        if node.os is not None:
            os_seen[node.os] += 1
        if node.runtime:
            runtimes.add(node.runtime)
        if node.kernel:
            kernels.add(node.kernel)
        if node.plugin_config:
            plugin_configs[node.plugin_config] += 1
    # Upstream reads the OS of "one GPU node"; the most common one is the stable choice.
    os_id, os_version = os_seen.most_common(1)[0][0] if os_seen else (None, None)
    runtime: Runtime = "containerd"
    if "containerd" not in runtimes and runtimes:
        runtime = "crio" if "crio" in runtimes else "docker"
    return ClusterFacts(
        namespace=namespace,
        gpu_node_count=gpu_nodes,
        has_nfd=nfd,
        os_id=os_id,
        os_version_id=os_version,
        runtime=runtime,
        kernels=tuple(sorted(kernels)),
        kubernetes_version=kubernetes_version,
        has_servicemonitor_crd=has_servicemonitor_crd,
        has_prometheusrule_crd=has_prometheusrule_crd,
        operator_env=dict(operator_env),
        config_map_keys=dict(config_map_keys or {}),
        config_map_data=dict(config_map_data or {}),
        startup_toleration=startup_toleration,
        plugin_config_labels=dict(plugin_configs),
    )
