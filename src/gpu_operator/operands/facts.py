"""What the renderers need to know about the cluster besides the ClusterPolicy.

The shell observes these facts (nodes, CRDs, the operator's env); the renderers only read them, so
`gpu-operator render` can feed them from flags instead. OpenShift is out of scope: there are no
SecurityContextConstraints, no Driver Toolkit (DTK) DaemonSets and no proxy/trusted-CA wiring.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from gpu_operator.api import images

Runtime = Literal["containerd", "crio", "docker"]


def _no_env() -> Mapping[str, str]:
    return MappingProxyType({})


def _no_config_maps() -> Mapping[str, tuple[str, ...]]:
    return MappingProxyType({})


def _no_config_map_data() -> Mapping[str, Mapping[str, str]]:
    return MappingProxyType({})


@dataclass(frozen=True)
class ClusterFacts:
    """Observed cluster facts; the defaults describe a one-pool Ubuntu 22.04 containerd cluster.

    Fields:
    - namespace: the operator namespace, where every namespaced operand object goes.
    - gpu_node_count: nodes with `nvidia.com/gpu.present=true` (the controller uses it to decide
      whether DaemonSets are applied at all; renderers always return them).
    - has_nfd: whether any node carries a `feature.node.kubernetes.io/` label.
    - os_id, os_version_id: NFD `system-os_release.ID` / `VERSION_ID` of one GPU node; the driver
      family of images is tagged with them. None when unknown (driver rendering then fails).
    - runtime: the container runtime of the GPU nodes (containerd wins when mixed).
    - kernels: distinct `kernel-version.full` values of GPU nodes (precompiled drivers only).
    - kubernetes_version: the API server version (`major.minor.patch`).
    - has_servicemonitor_crd, has_prometheusrule_crd: whether the prometheus-operator CRDs exist.
    - operator_env: the operator's own environment (`*_IMAGE` fallbacks for unset images).
    - config_map_keys: keys of the ConfigMaps in `namespace` that the driver mounts file by file
      (repoConfig, certConfig, kernelModuleConfig), by ConfigMap name; a referenced ConfigMap
      missing here makes the driver state fail to render, as upstream fails when it is absent.
    - config_map_data: the contents of the ConfigMap keys whose text a renderer checks (today the
      dcgm-exporter counters key), by ConfigMap name then key; absent when unknown (offline).
    - config_maps_complete: whether `config_map_keys` lists every ConfigMap of the namespace (the
      operator's cache). Offline `render` knows only the ConfigMaps it was given: one it was not
      given is unknown there, not missing (validate_refs.py says which are needed).
    - plugin_config_labels: the values of the node label `nvidia.com/device-plugin.config` on GPU
      nodes, with how many nodes carry each; None when node labels are unknown (offline).
    - startup_toleration: the toleration of the readiness gate's startup taint (STARTUP_TAINT),
      added to every operand pod so it runs on the node it validates; None when the gate is off.
    """

    namespace: str = "gpu-operator"
    gpu_node_count: int = 1
    has_nfd: bool = True
    os_id: str | None = "ubuntu"
    os_version_id: str | None = "22.04"
    runtime: Runtime = "containerd"
    kernels: tuple[str, ...] = ()
    kubernetes_version: str = "1.35.0"
    has_servicemonitor_crd: bool = False
    has_prometheusrule_crd: bool = False
    operator_env: Mapping[str, str] = field(default_factory=_no_env)
    config_map_keys: Mapping[str, tuple[str, ...]] = field(default_factory=_no_config_maps)
    config_map_data: Mapping[str, Mapping[str, str]] = field(default_factory=_no_config_map_data)
    config_maps_complete: bool = True
    plugin_config_labels: Mapping[str, int] | None = None
    startup_toleration: Mapping[str, str] | None = None

    @property
    def os_tag(self) -> str | None:
        """The driver image OS suffix (e.g. `ubuntu22.04`), or None when the OS is unknown."""
        if not self.os_id or not self.os_version_id:
            return None
        return images.os_tag(self.os_id, self.os_version_id)
