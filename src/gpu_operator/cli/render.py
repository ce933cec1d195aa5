"""`gpu-operator render`: cluster facts from a small YAML file, and every object the controller
would create for a ClusterPolicy or a GPUCluster, from the same planners the controller runs
(pure, no client)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml

from gpu_operator import __version__, api
from gpu_operator.api import keys, manifests, upstream_release
from gpu_operator.api.gpucluster import GPUCluster
from gpu_operator.controller import facts as facts_mod
from gpu_operator.controller import validate_refs
from gpu_operator.nodes import labelling
from gpu_operator.nvml import catalog
from gpu_operator.operands import dcgm_exporter, dra_driver, registry
from gpu_operator.operands.common import RenderError
from gpu_operator.operands.facts import ClusterFacts
from gpu_operator.status import gpucluster as gc_status

# The images the Helm chart pins by default (NVIDIA's release in api/upstream_release.yaml), offered
# as the operator's `*_IMAGE` fallbacks so that minimal policies (which leave images to the
# operator's environment) render as they would run. The CUDA base image (`operator.initContainer`)
# is ours: NVIDIA's chart no longer pins one.
DEFAULT_OPERATOR_ENV: dict[str, str] = {
    **upstream_release.current().operator_env(),
    "CUDA_BASE_IMAGE": "nvcr.io/nvidia/cuda:13.0.1-base-ubi9",
}
# What the chart's operator Deployment adds to that environment by default (ours, not NVIDIA's):
# its own image, so operands pointed at it run our agents with what they need
# (operands/builtin.py), and the runtime-config guard next to NVIDIA's toolkit
# (operands/container_toolkit.py).
CHART_OPERATOR_ENV: dict[str, str] = {
    "OPERATOR_IMAGE": f"ghcr.io/gpu-operator-py/gpu-operator:{__version__}",
    "RUNTIME_CONFIG_GUARD": "true",
}
RUNTIME_VERSIONS = {
    "containerd": "containerd://2.0.5",
    "crio": "cri-o://1.32.1",
    "docker": "docker://27.3.1",
}


class FactsError(ValueError):
    """A facts file that cannot be used; the message names the file and the field."""


class _Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Pool(_Strict):
    """Nodes that look alike: how many, their OS, kernel, runtime, GPU model and workload."""

    name: str = pydantic.Field(min_length=1)
    nodes: int = pydantic.Field(default=1, ge=0)
    os: str = "ubuntu"
    os_version: str = pydantic.Field(default="22.04", alias="osVersion")
    kernel: str = "6.8.0-52-generic"
    runtime: Literal["containerd", "crio", "docker"] = "containerd"
    gpu: str | None = "A100-SXM4-40GB"
    workload: Literal["container", "vm-passthrough", "vm-vgpu"] = "container"

    @pydantic.field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                catalog.model(value)
            except KeyError:
                known = ", ".join(m.key for m in catalog.models())
                raise ValueError(f"unknown GPU model {value!r}; known: {known}") from None
        return value


class FactsFile(_Strict):
    """The facts file: cluster-wide facts plus node pools (see docs/demo.md)."""

    namespace: str | None = None
    kubernetes_version: str = pydantic.Field(default="1.35.0", alias="kubernetesVersion")
    service_monitor_crd: bool = pydantic.Field(default=False, alias="serviceMonitorCRD")
    prometheus_rule_crd: bool = pydantic.Field(default=False, alias="prometheusRuleCRD")
    nfd: bool = True
    operator_env: dict[str, str] = pydantic.Field(default_factory=dict, alias="operatorEnv")
    config_maps: dict[str, list[str]] = pydantic.Field(default_factory=dict, alias="configMaps")
    pools: list[Pool] = pydantic.Field(default_factory=lambda: [Pool(name="default")])


def parse_facts(data: object, source: str = "facts") -> FactsFile:
    """Validate a parsed facts document; FactsError names the bad field."""
    if data is None:
        data = {}
    try:
        return FactsFile.model_validate(data)
    except pydantic.ValidationError as err:
        raise FactsError(f"{source}: {manifests.field_errors(err)}") from None


def load_facts(path: str | Path) -> FactsFile:
    """Read and validate a facts YAML file."""
    try:
        data = manifests.load_one(path)
    except manifests.ManifestError as err:
        raise FactsError(str(err)) from None
    return parse_facts(data, str(path))


def pool_labels(pool: Pool, *, nfd: bool = True) -> dict[str, str]:
    """The labels NFD (and the operator, for gpu.present) put on a node of this pool."""
    if not nfd:
        return {}
    labels = {
        keys.NFD_OS_ID: pool.os,
        keys.NFD_OS_VERSION_ID: pool.os_version,
        keys.NFD_KERNEL_FULL: pool.kernel,
        keys.GPU_WORKLOAD_CONFIG: pool.workload,
    }
    if pool.gpu is not None:
        labels[keys.NFD_GPU_LABELS[0]] = "true"
        labels[keys.GPU_PRESENT] = "true"
        model = catalog.model(pool.gpu)
        labels[keys.GPU_PRODUCT] = model.nvml_name.replace(" ", "-")
        labels[keys.MIG_CAPABLE] = "true" if model.mig_capable else "false"
    return labels


def _pool_nodes(facts_file: FactsFile) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = []
    for pool in facts_file.pools:
        node = {
            "metadata": {"labels": pool_labels(pool, nfd=facts_file.nfd)},
            "status": {"nodeInfo": {"containerRuntimeVersion": RUNTIME_VERSIONS[pool.runtime]}},
        }
        nodes.extend(copy.deepcopy(node) for _ in range(pool.nodes))
    return nodes


def cluster_facts(
    facts_file: FactsFile,
    namespace: str | None = None,
    config_maps: Mapping[str, Sequence[str]] | None = None,
    config_map_data: Mapping[str, Mapping[str, str]] | None = None,
) -> ClusterFacts:
    """Fold the pools into ClusterFacts exactly as the controller folds its node cache.

    `config_maps` (name -> keys, e.g. ConfigMaps found next to the policy) add to the file's, and
    `config_map_data` gives the contents of keys a renderer checks. Offline these are the only
    ConfigMaps known: one not given is unknown, not missing, and node labels are unknown."""
    known = {**{n: tuple(k) for n, k in (config_maps or {}).items()}}
    known.update({name: tuple(k) for name, k in facts_file.config_maps.items()})
    facts = facts_mod.from_nodes(
        _pool_nodes(facts_file),
        namespace=namespace or facts_file.namespace or "gpu-operator",
        operator_env={**DEFAULT_OPERATOR_ENV, **CHART_OPERATOR_ENV, **facts_file.operator_env},
        has_servicemonitor_crd=facts_file.service_monitor_crd,
        has_prometheusrule_crd=facts_file.prometheus_rule_crd,
        config_map_keys=known,
        config_map_data=config_map_data,
        kubernetes_version=facts_file.kubernetes_version,
    )
    return dataclasses.replace(facts, config_maps_complete=False, plugin_config_labels=None)


@dataclass(frozen=True)
class PoolOperands:
    """Which operands a pool's nodes get (the `nvidia.com/gpu.deploy.*` labels)."""

    pool: str
    nodes: int
    operands: tuple[str, ...]


@dataclass
class Rendered:
    """What `render` prints: objects in apply order, notes per state, and pool placement."""

    objects: list[dict[str, Any]] = field(default_factory=list)
    # (state name, "disabled" | "failed" | "skipped", message)
    notes: list[tuple[str, str, str]] = field(default_factory=list)
    # What the operator would say that holds nothing back (e.g. a ConfigMap that was not given).
    warnings: list[str] = field(default_factory=list)
    sections: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    pools: list[PoolOperands] = field(default_factory=list)

    @property
    def failed(self) -> list[str]:
        return [name for name, kind, _ in self.notes if kind == "failed"]


def render(
    policy: api.ClusterPolicy,
    facts_file: FactsFile,
    namespace: str | None = None,
    config_maps: Mapping[str, Sequence[str]] | None = None,
    config_map_data: Mapping[str, Mapping[str, str]] | None = None,
) -> Rendered:
    """Every object the controller would apply for `policy` on a cluster with these facts.

    The ConfigMaps the policy names are checked as the controller checks them (validate_refs):
    a given one that lacks a key fails the states that mount it, as the controller holds them
    back; one that was not given is a warning, and its states are rendered."""
    facts = cluster_facts(facts_file, namespace, config_maps, config_map_data)
    refs = validate_refs.check_facts(policy, facts)
    blocked = refs.blocked
    out = Rendered(warnings=[finding.message for finding in refs.notes])
    for state in registry.render_all(policy, facts):
        if state.enabled and state.name in blocked:
            kind = "failed" if facts.gpu_node_count else "skipped"
            out.notes.append((state.name, kind, f"{state.name}: {blocked[state.name]}"))
            continue
        if state.error is not None:
            # The controller's rule: facts such as the OS come from GPU nodes, so without any a
            # render failure is not an error yet.
            kind = "failed" if facts.gpu_node_count else "skipped"
            out.notes.append((state.name, kind, state.error))
            continue
        if not state.enabled:
            out.notes.append((state.name, "disabled", ""))
            continue
        kept = []
        for obj in state.objects:
            # The controller's rule: without GPU nodes no DaemonSet is applied.
            if obj.get("kind") == "DaemonSet" and facts.gpu_node_count == 0:
                name = obj["metadata"]["name"]
                out.notes.append((state.name, "skipped", f"DaemonSet {name}: no GPU nodes"))
                continue
            kept.append(obj)
        out.sections.append((state.name, kept))
        out.objects.extend(kept)
    label_policy = labelling.LabelPolicy.from_policy(policy)
    for pool in facts_file.pools:
        labels = pool_labels(pool, nfd=facts_file.nfd)
        operands = (
            labelling.deploy_operands(labels, label_policy) if labelling.has_gpu(labels) else ()
        )
        out.pools.append(PoolOperands(pool.name, pool.nodes, tuple(operands)))
    return out


# The name a GPUCluster-wide note goes under (the reconciler holds every state back at once).
GPU_CLUSTER_NOTE = "GPUCluster"


def render_cluster(
    cluster: GPUCluster, facts_file: FactsFile, namespace: str | None = None
) -> Rendered:
    """Every object the GPUCluster reconciler would apply for `cluster` on these facts.

    As the reconciler: a blocking requirement (Kubernetes older than the DRA driver needs; the
    facts' kubernetesVersion) or a render error applies nothing (a "failed" note); the
    DaemonSets are applied even before a GPU node exists; each GPU node gets the DRA deploy
    labels (its pool lists them). Node drivers and CDI are unknown offline: not checked."""
    facts = cluster_facts(facts_file, namespace)
    reqs = gc_status.requirements(facts_file.kubernetes_version, {}, ())
    out = Rendered(warnings=list(reqs.warnings))
    for pool in facts_file.pools:
        labels = pool_labels(pool, nfd=facts_file.nfd)
        patch = dra_driver.node_label_patch(labels, True) or {}
        operands = tuple(
            label.removeprefix(keys.DEPLOY_PREFIX)
            for label in dra_driver.DEPLOY_LABELS
            if patch.get(label) == "true"
        )
        out.pools.append(PoolOperands(pool.name, pool.nodes, operands))
    if reqs.blocking:
        out.notes.append((GPU_CLUSTER_NOTE, "failed", "; ".join(reqs.blocking)))
        return out
    try:
        rendered = dra_driver.render(cluster, facts)
    except (RenderError, pydantic.ValidationError) as err:
        out.notes.append((GPU_CLUSTER_NOTE, "failed", f"cannot render the DRA driver: {err}"))
        return out
    out.warnings += rendered.notes
    for state, objects in rendered.states:
        if not objects:
            out.notes.append((state, "disabled", ""))
            continue
        out.sections.append((state, list(objects)))
        out.objects.extend(objects)
    return out


def to_yaml(rendered: Rendered, header: Sequence[str] = ()) -> str:
    """Multi-document YAML with a comment per state (disabled and failed ones included) and per
    warning (a file kept in Git says what was not checked)."""
    lines = [f"# {line}" for line in header]
    lines += [f"# warning: {warning}" for warning in rendered.warnings]
    for pool in rendered.pools:
        where = ", ".join(pool.operands) or "nothing (no GPU)"
        lines.append(f"# pool {pool.pool} ({pool.nodes} node(s)): {where}")
    for name, kind, message in rendered.notes:
        lines.append(f"# {name}: {kind}" + (f": {message}" if message else ""))
    chunks = ["\n".join(lines) + "\n"] if lines else []
    for name, objects in rendered.sections:
        for obj in objects:
            meta = obj.get("metadata") or {}
            chunks.append(
                f"---\n# {name}: {obj.get('kind')} {meta.get('name')}\n"
                + yaml.safe_dump(obj, sort_keys=False, width=100)
            )
    return "".join(chunks)


def to_list(rendered: Rendered) -> dict[str, Any]:
    """A `v1 List` holding every object (the JSON output)."""
    return {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": rendered.objects}


@dataclass
class GivenConfigMaps:
    """The ConfigMaps among the input documents that the operator would read (those in its
    namespace, or with none set), and a warning for each it would not."""

    keys: dict[str, list[str]] = field(default_factory=dict)
    data: dict[str, dict[str, str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def given_config_maps(
    documents: Sequence[Mapping[str, Any]], namespace: str | None = None
) -> GivenConfigMaps:
    """Keys (the driver mounts them file by file) and the checked contents (the exporter's
    counters) of the ConfigMaps among the input documents."""
    target = namespace or "gpu-operator"
    out = GivenConfigMaps()
    for doc in documents:
        meta = doc.get("metadata")
        if doc.get("kind") != "ConfigMap" or not isinstance(meta, dict):
            continue
        name = str(meta.get("name"))
        where = meta.get("namespace")
        if where and where != target:
            out.warnings.append(
                f"ConfigMap {name} is in namespace {where}, not in the operator's namespace "
                f"{target}: the operator does not read it (left out)"
            )
            continue
        out.keys[name] = validate_refs.config_map_keys(doc)
        data = doc.get("data")
        text = data.get(dcgm_exporter.METRICS_KEY) if isinstance(data, dict) else None
        if isinstance(text, str):
            out.data[name] = {dcgm_exporter.METRICS_KEY: text}
    return out


def config_map_keys(documents: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Keys of the ConfigMaps among the input documents (the driver mounts them file by file)."""
    return given_config_maps(documents).keys
