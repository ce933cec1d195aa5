"""`gpu-operator images`: every image a ClusterPolicy or a GPUCluster (or the chart) would pull,
for mirroring.

No image logic of its own: the operand images come from `render` (the controller's planners),
the operator's and NFD's from the chart's own objects, so the list cannot drift from what runs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_operator import __version__, api
from gpu_operator.api import validation
from gpu_operator.api.gpucluster import GPUCluster
from gpu_operator.api.images import ImageError
from gpu_operator.cli import render
from gpu_operator.nodes import ownership
from gpu_operator.operands import nvidiadriver
from gpu_operator.operands.common import RenderError

# The chart's default operator image (`operator.repository/image`, version = appVersion): what a
# policy-only listing names, since the operator's image is not part of a ClusterPolicy.
OPERATOR_IMAGE = f"ghcr.io/gpu-operator-py/gpu-operator:{__version__}"

_POD_OWNERS = {"DaemonSet", "Deployment", "StatefulSet", "ReplicaSet", "Job"}


class ImageListError(ValueError):
    """Input the image list cannot be built from; the message names the file and the field."""


@dataclass
class ImageList:
    """Images and, for each, what pulls it (`state-driver: DaemonSet nvidia-driver-daemonset`)."""

    used_by: dict[str, set[str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def add(self, image: str, user: str) -> None:
        self.used_by.setdefault(image, set()).add(user)

    @property
    def images(self) -> list[str]:
        return sorted(self.used_by)

    def to_json(self) -> dict[str, Any]:
        return {
            "images": [
                {"image": image, "usedBy": sorted(self.used_by[image])} for image in self.images
            ]
        }


def pod_spec_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod spec of a Pod, a workload's template or a CronJob's job template."""
    kind = obj.get("kind")
    spec = obj.get("spec") or {}
    if kind == "Pod":
        return spec
    if kind == "CronJob":
        spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    elif kind not in _POD_OWNERS:
        return None
    template = spec.get("template") or {}
    pod = template.get("spec")
    return pod if isinstance(pod, Mapping) else None


def object_images(obj: Mapping[str, Any], *, env: bool = True) -> list[tuple[str, str]]:
    """(image, container) pairs of one object: every container and init container, plus (with
    `env`) values named `*_IMAGE` (the validator starts workload pods from `VALIDATOR_IMAGE`)."""
    pod = pod_spec_of(obj)
    if pod is None:
        return []
    found: list[tuple[str, str]] = []
    for section in ("initContainers", "containers", "ephemeralContainers"):
        for container in pod.get(section) or []:
            name = str(container.get("name") or "?")
            if container.get("image"):
                found.append((str(container["image"]), name))
            for item in container.get("env") or [] if env else []:
                value = item.get("value")
                if str(item.get("name", "")).endswith("_IMAGE") and value and " " not in value:
                    found.append((str(value), f"{name} env {item['name']}"))
    return found


def add_objects(
    out: ImageList, objects: Iterable[Mapping[str, Any]], source: str, *, env: bool = True
) -> None:
    for obj in objects:
        meta = obj.get("metadata") or {}
        for image, where in object_images(obj, env=env):
            out.add(image, f"{source}: {obj.get('kind')} {meta.get('name')} ({where})")


def both_kinds_message(policy: Mapping[str, Any], cluster: Mapping[str, Any]) -> str:
    """What to say when the input holds a ClusterPolicy and a GPUCluster."""

    def name(doc: Mapping[str, Any]) -> str:
        return str((doc.get("metadata") or {}).get("name") or "?")

    return (
        f"the input has both ClusterPolicy {name(policy)} and GPUCluster {name(cluster)}, and a "
        "cluster runs one or the other (the operator refuses the one created later): give only "
        "the one the cluster should run"
    )


def _checked_cluster(doc: Mapping[str, Any], label: str) -> GPUCluster:
    result = validation.check_document(dict(doc))
    if not result.ok or not isinstance(result.obj, GPUCluster):
        problems = "; ".join(str(p) for p in result.errors) or "not a GPUCluster"
        raise ImageListError(f"{label}: {result.ref}: {problems}")
    return result.obj


def _checked_policy(doc: Mapping[str, Any], label: str) -> api.ClusterPolicy:
    result = validation.check_document(dict(doc))
    if not result.ok or not isinstance(result.obj, api.ClusterPolicy):
        problems = "; ".join(str(p) for p in result.errors) or "not a ClusterPolicy"
        raise ImageListError(f"{label}: {result.ref}: {problems}")
    return result.obj


def _add_drivers(
    out: ImageList,
    documents: Sequence[Mapping[str, Any]],
    policy: api.ClusterPolicy,
    facts_file: render.FactsFile,
    label: str,
) -> None:
    """NVIDIADriver objects: one DaemonSet per pool as the NVIDIADriver controller renders it
    (precompiled drivers: one image tag per kernel of the facts' pools)."""
    given = render.given_config_maps(documents, facts_file.namespace)
    facts = render.cluster_facts(facts_file, config_maps=given.keys, config_map_data=given.data)
    nodes = [
        (f"{pool.name}-{i}", render.pool_labels(pool, nfd=facts_file.nfd))
        for pool in facts_file.pools
        for i in range(pool.nodes)
    ]
    items = []
    for doc in documents:
        if doc.get("kind") != "NVIDIADriver":
            continue
        meta = {"uid": "image-list", **(doc.get("metadata") or {})}
        item = nvidiadriver.DriverInput.from_object({**doc, "metadata": meta})
        if not item.valid or item.spec is None:
            raise ImageListError(f"{label}: NVIDIADriver {item.name}: {'; '.join(item.problems)}")
        items.append(item)
    drivers = nvidiadriver.drivers_of(items)
    # The node labelling controller's ownership rule decides which driver each pool's nodes get.
    owners = {name: ownership.owner_of(labels, drivers).owner for name, labels in nodes}
    for item in items:
        assert item.spec is not None
        mine = [(name, labels) for name, labels in nodes if owners[name] == item.name]
        pools, _ = nvidiadriver.pools_of(mine, precompiled=bool(item.spec.usePrecompiled))
        for pool in pools:
            try:
                ds = nvidiadriver.render_pool(item, pool, policy, facts)
            except (RenderError, ImageError) as exc:
                out.warnings.append(f"NVIDIADriver {item.name} pool {pool.label}: {exc}")
                continue
            add_objects(out, [ds], f"NVIDIADriver {item.name}")


def from_documents(
    documents: Sequence[Mapping[str, Any]],
    facts_file: render.FactsFile,
    *,
    label: str,
    operator_image: str | None = OPERATOR_IMAGE,
    namespace: str | None = None,
) -> ImageList:
    """The images of a ClusterPolicy (and any NVIDIADriver next to it) on these facts, plus the
    workloads among the documents themselves (the chart's operator, NFD, hook Jobs)."""
    out = ImageList()
    policies = [d for d in documents if d.get("kind") == "ClusterPolicy"]
    clusters = [d for d in documents if d.get("kind") == "GPUCluster"]
    if policies and clusters:
        raise ImageListError(f"{label}: {both_kinds_message(policies[0], clusters[0])}")
    if not policies and not clusters:
        raise ImageListError(f"{label}: no ClusterPolicy or GPUCluster found in the input")
    if operator_image:
        out.add(operator_image, "operator")
    # The operator's own `*_IMAGE` env are fallbacks, pulled only by the operands that use them
    # (render resolves those); the chart's containers themselves are pulled.
    add_objects(out, documents, "chart", env=False)
    if clusters:
        _add_cluster(out, documents, _checked_cluster(clusters[0], label), facts_file, namespace)
        return out
    policy = _checked_policy(policies[0], label)
    given = render.given_config_maps(documents, namespace or facts_file.namespace)
    rendered = render.render(policy, facts_file, namespace, given.keys, given.data)
    out.warnings += [*given.warnings, *rendered.warnings]
    for state, kind, message in rendered.notes:
        if kind in ("failed", "skipped") and message:
            out.warnings.append(f"{state}: {kind}: {message}")
    for state, objects in rendered.sections:
        add_objects(out, objects, state)
    _add_drivers(out, documents, policy, facts_file, label)
    return out


def _add_cluster(
    out: ImageList,
    documents: Sequence[Mapping[str, Any]],
    cluster: GPUCluster,
    facts_file: render.FactsFile,
    namespace: str | None,
) -> None:
    """The DRA stack's images (the GPUCluster reconciler's objects). NVIDIADrivers deploy nothing
    without a ClusterPolicy: said, not listed."""
    rendered = render.render_cluster(cluster, facts_file, namespace)
    out.warnings += rendered.warnings
    for state, kind, message in rendered.notes:
        if kind in ("failed", "skipped") and message:
            out.warnings.append(f"{state}: {kind}: {message}")
    for state, objects in rendered.sections:
        add_objects(out, objects, state)
    for doc in documents:
        if doc.get("kind") == "NVIDIADriver":
            name = (doc.get("metadata") or {}).get("name")
            out.warnings.append(
                f"NVIDIADriver {name}: not listed: the NVIDIADriver controller deploys nothing "
                "without a ClusterPolicy"
            )


def operator_env(documents: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The `*_IMAGE` fallbacks the chart gives the operator (its Deployment's env), and its
    RUNTIME_CONFIG_GUARD (whether the toolkit pods run the guard, which pulls our image)."""
    env: dict[str, str] = {}
    for doc in documents:
        if doc.get("kind") != "Deployment":
            continue
        pod = pod_spec_of(doc) or {}
        for container in pod.get("containers") or []:
            if "controller" not in (container.get("command") or []):
                continue
            for item in container.get("env") or []:
                name = str(item.get("name", ""))
                if (name.endswith("_IMAGE") or name == "RUNTIME_CONFIG_GUARD") and item.get(
                    "value"
                ):
                    env[str(item["name"])] = str(item["value"])
    return env
