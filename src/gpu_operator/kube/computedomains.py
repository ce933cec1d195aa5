"""API access of the compute-domain controller and the compute-domain kubelet plugin: the
domains, their channel devices' slices, the daemon pods, node labels, cliques and Events (the
only compute-domain code that talks to the API server)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.types import PatchType

from gpu_operator.api import computedomain as cdapi
from gpu_operator.kube import resources, writer

Obj = dict[str, Any]

COMPUTE_DOMAIN = resources.resource(cdapi.API_VERSION, cdapi.KIND)
CLIQUE = resources.resource(cdapi.API_VERSION, cdapi.CLIQUE_KIND)
SLICE = resources.resource("resource.k8s.io/v1", "ResourceSlice")
TEMPLATE = resources.resource("resource.k8s.io/v1", "ResourceClaimTemplate")
CLAIM = resources.resource("resource.k8s.io/v1", "ResourceClaim")


def _plain(obj: Any) -> Obj:
    return dict(obj)


class ComputeDomainApi:
    def __init__(self, client: AsyncClient, namespace: str, component: str) -> None:
        self.client = client
        self.namespace = namespace
        self.writer = writer.Writer(client, namespace=namespace, component=component)

    # ----- reads ----------------------------------------------------------------------------

    async def domains(self) -> list[Obj]:
        return [
            _plain(o)
            async for o in self.client.list(COMPUTE_DOMAIN, namespace=resources.ALL_NAMESPACES)
        ]

    async def domain(self, namespace: str, name: str) -> Obj | None:
        try:
            return _plain(await self.client.get(COMPUTE_DOMAIN, name, namespace=namespace))
        except ApiError as err:
            if err.status.code == 404:
                return None
            raise

    async def domain_by_uid(self, uid: str) -> Obj | None:
        return next((d for d in await self.domains() if d["metadata"].get("uid") == uid), None)

    async def channel_nodes(self) -> dict[str, str]:
        """node -> clique of every node whose compute-domain slice offers channel 0."""
        found: dict[str, str] = {}
        async for s in self.client.list(SLICE, fields={"spec.driver": cdapi.DRIVER}):
            spec = dict(s).get("spec") or {}
            for device in spec.get("devices") or []:
                attrs = device.get("attributes") or {}
                if (attrs.get("type") or {}).get("string") != "channel":
                    continue
                clique = (attrs.get("cliqueID") or {}).get("string") or ""
                found[str(spec.get("nodeName") or "")] = clique
        return found

    async def labelled_nodes(self, uid: str) -> list[str]:
        return [
            str(n["metadata"]["name"])
            async for n in self.client.list(resources.NODE, labels={cdapi.DOMAIN_LABEL: uid})
        ]

    async def daemon_pods(self, uid: str) -> list[Obj]:
        return [
            _plain(p)
            async for p in self.client.list(
                resources.POD, namespace=self.namespace, labels={cdapi.DOMAIN_LABEL: uid}
            )
        ]

    async def template(self, namespace: str, name: str) -> Obj | None:
        try:
            return _plain(await self.client.get(TEMPLATE, name, namespace=namespace))
        except ApiError as err:
            if err.status.code == 404:
                return None
            raise

    async def claim(self, namespace: str, name: str) -> Obj | None:
        try:
            return _plain(await self.client.get(CLAIM, name, namespace=namespace))
        except ApiError as err:
            if err.status.code == 404:
                return None
            raise

    async def events(self, namespace: str, name: str) -> list[Obj]:
        return [
            _plain(e)
            async for e in self.client.list(
                resources.EVENT,
                namespace=namespace,
                fields={"involvedObject.name": name, "involvedObject.kind": cdapi.KIND},
            )
        ]

    # ----- writes ---------------------------------------------------------------------------

    async def apply(self, obj: Obj) -> None:
        await self.writer.apply(obj)

    async def create_if_absent(self, obj: Obj) -> None:
        """Create (templates are immutable: an existing one is left as it is)."""
        try:
            await self.client.create(resources.wrap(obj))
        except ApiError as err:
            if err.status.code != 409:
                raise

    async def set_status(self, domain: Mapping[str, Any], status: Obj) -> None:
        meta = domain["metadata"]
        await self.client.patch(
            COMPUTE_DOMAIN.Status, meta["name"], {"status": status},
            namespace=meta["namespace"], patch_type=PatchType.MERGE,
        )  # fmt: skip

    async def set_finalizers(self, domain: Mapping[str, Any], finalizers: list[str]) -> None:
        meta = domain["metadata"]
        body = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
        await self.client.patch(
            COMPUTE_DOMAIN, meta["name"], body, namespace=meta["namespace"],
            patch_type=PatchType.MERGE,
        )  # fmt: skip

    async def event(self, domain: Mapping[str, Any], type_: str, reason: str, msg: str) -> None:
        involved = {
            "apiVersion": cdapi.API_VERSION,
            "kind": cdapi.KIND,
            "metadata": domain["metadata"],
        }
        await self.writer.event(involved, reason=reason, message=msg, type_=type_)

    async def delete_for(self, uid: str, workload_ns: str, template: str) -> None:
        """Delete what was made for domain `uid` (absent objects are fine)."""
        name = f"computedomain-daemon-{uid}"
        targets: list[tuple[Any, str, str]] = [
            (resources.DAEMONSET, name, self.namespace),
            (TEMPLATE, name, self.namespace),
        ]
        live = await self.template(workload_ns, template) if template else None
        if (
            live is not None
            and (live["metadata"].get("labels") or {}).get(cdapi.DOMAIN_LABEL) == uid
        ):
            targets.append((TEMPLATE, template, workload_ns))
        async for c in self.client.list(
            CLIQUE, namespace=self.namespace, labels={cdapi.DOMAIN_LABEL: uid}
        ):
            targets.append((CLIQUE, str(dict(c)["metadata"]["name"]), self.namespace))
        for kind, obj_name, ns in targets:
            try:
                await self.client.delete(kind, obj_name, namespace=ns)
            except ApiError as err:
                if err.status.code != 404:
                    raise
        for node in await self.labelled_nodes(uid):
            await self.set_node_label(node, uid, present=False)

    async def annotate_pod(self, name: str, annotations: Mapping[str, str | None]) -> None:
        """Set (None: remove) annotations on a pod in the driver's namespace (a daemon's own)."""
        await self.client.patch(
            resources.POD, name, {"metadata": {"annotations": dict(annotations)}},
            namespace=self.namespace, patch_type=PatchType.MERGE,
        )  # fmt: skip

    async def set_node_label(self, node: str, uid: str, *, present: bool) -> str | None:
        """Label (or unlabel) `node` for domain `uid`; returns the other domain's UID when the node
        is labelled for another one (and changes nothing)."""
        live = _plain(await self.client.get(resources.NODE, node))
        current = (live["metadata"].get("labels") or {}).get(cdapi.DOMAIN_LABEL)
        if present:
            if current == uid:
                return None
            if current:
                return str(current)
            value: str | None = uid
        else:
            if current != uid:
                return None
            value = None
        await self.client.patch(
            resources.NODE, node, {"metadata": {"labels": {cdapi.DOMAIN_LABEL: value}}},
            patch_type=PatchType.MERGE,
        )  # fmt: skip
        return None
