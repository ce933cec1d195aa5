"""Cluster facts for the renderers, folded from the node cache."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

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
) -> ClusterFacts:
    """Facts from every node: GPU count, NFD presence, OS of one GPU node, runtime, kernels, and
    the device-plugin config labels of GPU nodes."""
    gpu_nodes = 0
    plugin_configs: Counter[str] = Counter()
    nfd = False
    os_seen: Counter[tuple[str, str]] = Counter()
    runtimes: set[str] = set()
    kernels: set[str] = set()
    for node in nodes:
        labels = (node.get("metadata") or {}).get("labels") or {}
        # Stripped nodes carry the NFD verdict; full node objects are checked directly.
        nfd = nfd or bool(node.get("nfd")) or labelling.has_nfd(labels)
        if labels.get(keys.GPU_PRESENT) != "true":
            continue
        gpu_nodes += 1
        os_id, version = labels.get(keys.NFD_OS_ID), labels.get(keys.NFD_OS_VERSION_ID)
        if os_id and version:
            os_seen[(os_id, version)] += 1
        node_runtime = runtime_of(node)
        if node_runtime:
            runtimes.add(node_runtime)
        if labels.get(keys.NFD_KERNEL_FULL):
            kernels.add(labels[keys.NFD_KERNEL_FULL])
        if labels.get(config_manager.NODE_LABEL):
            plugin_configs[labels[config_manager.NODE_LABEL]] += 1
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
