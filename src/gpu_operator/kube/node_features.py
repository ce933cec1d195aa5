"""API-server sinks for GPU feature discovery: the NFD NodeFeature object and direct node labels.

The only GFD code that talks to Kubernetes (import rule: only `gpu_operator.kube` uses lightkube).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lightkube import AsyncClient, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

FIELD_MANAGER = "gpu-feature-discovery"
NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"
# Node annotation listing the label keys GFD set directly, so stale ones can be removed later.
OWNED_LABELS_ANNOTATION = "nvidia.com/gfd.labels"

NodeFeature = create_namespaced_resource(
    "nfd.k8s-sigs.io", "v1alpha1", "NodeFeature", "nodefeatures"
)


def node_feature_name(node: str) -> str:
    return f"nvidia-features-for-{node}"


def client(kubeconfig: str | Path | None = None) -> AsyncClient:
    """A client from a kubeconfig file, or from the in-cluster service account / $KUBECONFIG."""
    if kubeconfig is not None:
        return AsyncClient(KubeConfig.from_file(str(kubeconfig)), field_manager=FIELD_MANAGER)
    return AsyncClient(field_manager=FIELD_MANAGER)


async def owner_references(api: AsyncClient, namespace: str, pod_name: str) -> list[OwnerReference]:
    """The agent's DaemonSet (as controller) and its Pod, so the object goes away with them."""
    pod = await api.get(Pod, pod_name, namespace=namespace)
    meta = pod.metadata
    if meta is None or meta.name is None or meta.uid is None:
        raise ValueError(f"pod {namespace}/{pod_name} has no name or uid")
    refs = [
        OwnerReference(
            apiVersion=o.apiVersion, kind=o.kind, name=o.name, uid=o.uid, controller=True
        )
        for o in meta.ownerReferences or []
        if o.kind == "DaemonSet"
    ]
    refs.append(OwnerReference(apiVersion="v1", kind="Pod", name=meta.name, uid=meta.uid))
    return refs


@dataclass
class NodeFeatureWriter:
    """Creates or updates `nvidia-features-for-<node>`; unchanged labels cause no write."""

    api: AsyncClient
    node: str
    namespace: str
    owners: Sequence[OwnerReference] = ()

    async def write(self, labels: Mapping[str, str]) -> None:
        name = node_feature_name(self.node)
        try:
            current = await self.api.get(NodeFeature, name, namespace=self.namespace)
        except ApiError as err:
            if err.status.code != 404:
                raise
            current = None
        if current is None:
            obj = NodeFeature(
                metadata=ObjectMeta(
                    name=name,
                    namespace=self.namespace,
                    labels={NODE_NAME_LABEL: self.node},
                    ownerReferences=list(self.owners) or None,
                ),
                spec={"labels": dict(labels)},
            )
            await self.api.create(obj)
            return
        spec = current.get("spec") or {}
        if spec.get("labels") == dict(labels):
            return
        current["spec"] = {**spec, "labels": dict(labels)}
        await self.api.replace(current)

    async def remove(self) -> None:
        # Upstream leaves the object to garbage collection through its owner references.
        return None


@dataclass
class NodeLabelWriter:
    """Sets GFD labels on the Node itself and removes the ones it set before but no longer has."""

    api: AsyncClient
    node: str

    async def _owned(self) -> set[str]:
        node = await self.api.get(Node, self.node)
        annotations = (node.metadata.annotations if node.metadata else None) or {}
        raw = annotations.get(OWNED_LABELS_ANNOTATION, "")
        return {k for k in raw.split(",") if k}

    async def _patch(self, labels: Mapping[str, str | None], owned: set[str]) -> None:
        patch = {
            "metadata": {
                "labels": dict(labels),
                "annotations": {OWNED_LABELS_ANNOTATION: ",".join(sorted(owned)) or None},
            }
        }
        await self.api.patch(Node, self.node, patch, patch_type=PatchType.MERGE)

    async def write(self, labels: Mapping[str, str]) -> None:
        stale = await self._owned() - set(labels)
        update: dict[str, str | None] = dict.fromkeys(stale)
        update.update(labels)
        await self._patch(update, set(labels))

    async def remove(self) -> None:
        owned = await self._owned()
        if owned:
            await self._patch(dict.fromkeys(owned), set())
