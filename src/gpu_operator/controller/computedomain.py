"""The compute-domain controller: one reconciler for ComputeDomains on the shared runtime
(controller/runtime.py), run by `gpu-operator agent compute-domain-controller` (NVIDIA's
`compute-domain-controller` entry point, its own Deployment).

Watch-driven, as the operator's other reconcilers: caches of the ComputeDomains, their IMEX
DaemonSets and daemon pods, the ResourceClaimTemplates, the ComputeDomainCliques, the nodes
labelled for a domain and the compute-domain driver's ResourceSlices feed one work key per domain
(`computedomain/<namespace>/<name>`). A reconcile reads the domain's facts from the caches, asks
the planner (status/computedomain.py) and does what it says: the workload and daemon
ResourceClaimTemplates, the IMEX DaemonSet, the cliques, the status and the Events (each warning
once while it lasts). A domain being deleted loses its objects and node labels, then its
finalizer. Nothing polls: a daemon's readiness or report changes its pod, a new channel device
changes a slice, and each of those events queues the domains it concerns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from gpu_operator.api import computedomain as cdapi
from gpu_operator.controller import runtime
from gpu_operator.kube import resources
from gpu_operator.kube.client import AsyncClient
from gpu_operator.kube.computedomains import (
    CLIQUE,
    COMPUTE_DOMAIN,
    SLICE,
    TEMPLATE,
    ComputeDomainApi,
)
from gpu_operator.status import computedomain as planner

log = logging.getLogger("gpu_operator.compute_domain_controller")

PREFIX = "computedomain"
# The reconciler's caches (names on the shared runtime).
DOMAINS = "cd-domains"
DAEMONSETS = "cd-daemonsets"
DAEMON_PODS = "cd-daemon-pods"
TEMPLATES = "cd-templates"
CLIQUES = "cd-cliques"
NODES = "cd-nodes"
SLICES = "cd-slices"


def daemon_pod(pod: Mapping[str, Any]) -> planner.DaemonPod:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return planner.DaemonPod(
        name=str(meta.get("name") or ""),
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
        ip=str(status.get("podIP") or ""),
        ready=ready,
        problems=str((meta.get("annotations") or {}).get(planner.PROBLEMS_ANNOTATION) or ""),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def channel_nodes(slices: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """node -> clique of every node whose compute-domain slice offers a channel."""
    found: dict[str, str] = {}
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != cdapi.DRIVER:
            continue
        for device in spec.get("devices") or []:
            attrs = device.get("attributes") or {}
            if (attrs.get("type") or {}).get("string") != "channel":
                continue
            found[str(spec.get("nodeName") or "")] = (attrs.get("cliqueID") or {}).get(
                "string"
            ) or ""
    return found


def _template_name(domain: Mapping[str, Any]) -> str:
    channel = (domain.get("spec") or {}).get("channel") or {}
    return str((channel.get("resourceClaimTemplate") or {}).get("name") or "")


def domain_key(namespace: str, name: str) -> str:
    return f"{PREFIX}/{namespace}/{name}"


class ComputeDomainReconciler(runtime.Reconciler):
    """ComputeDomains, one work key each (`computedomain/<namespace>/<name>`)."""

    prefix = PREFIX

    def __init__(self, rt: runtime.Runtime, api: ComputeDomainApi, image: str) -> None:
        self.rt = rt
        self.api = api
        self.image = image
        every = resources.ALL_NAMESPACES
        has_domain = {cdapi.DOMAIN_LABEL: None}
        ns = api.namespace
        caches = rt.caches
        caches.add(DOMAINS, COMPUTE_DOMAIN, namespace=every)
        caches.add(DAEMONSETS, resources.DAEMONSET, namespace=ns, labels=has_domain)
        caches.add(DAEMON_PODS, resources.POD, namespace=ns, labels=has_domain)
        # Every template (not only ours): one of another owner under a domain's template name is
        # a conflict the user must hear about.
        caches.add(TEMPLATES, TEMPLATE, namespace=every)
        caches.add(CLIQUES, CLIQUE, namespace=ns, labels=has_domain)
        caches.add(NODES, resources.NODE, labels=has_domain)
        caches.add(SLICES, SLICE)
        # Domain UID -> work key, from the domain cache's events (the other kinds name the UID).
        self._keys: dict[str, str] = {}
        # Warnings recorded per domain UID, so each is one Event while it lasts.
        self._recorded: dict[str, set[tuple[str, str]]] = {}
        self.reconciles = 0

    # ----- watches ---------------------------------------------------------------------------

    def watches(self) -> list[runtime.Watch]:
        return [
            runtime.Watch(DOMAINS, self._on_domain),
            runtime.Watch(DAEMONSETS, self._on_labelled),
            runtime.Watch(DAEMON_PODS, self._on_labelled),
            runtime.Watch(CLIQUES, self._on_labelled),
            runtime.Watch(NODES, self._on_labelled),
            runtime.Watch(TEMPLATES, self._on_template),
            runtime.Watch(SLICES, self._on_slice),
        ]

    def initial(self) -> list[runtime.Request]:
        return [runtime.Request(k) for k in sorted(set(self._keys.values()))]

    def _on_domain(self, key: str, old: Any, new: Any) -> list[runtime.Request]:
        obj = new if new is not None else old
        meta = obj.get("metadata") or {}
        work = domain_key(str(meta.get("namespace")), str(meta.get("name")))
        uid = str(meta.get("uid") or "")
        if new is None:
            self._keys.pop(uid, None)
            self._recorded.pop(uid, None)
            return []
        self._keys[uid] = work
        return [runtime.Request(work)]

    def _on_labelled(self, key: str, old: Any, new: Any) -> list[runtime.Request]:
        uids = {
            ((o.get("metadata") or {}).get("labels") or {}).get(cdapi.DOMAIN_LABEL)
            for o in (old, new)
            if o is not None
        }
        return [runtime.Request(self._keys[u]) for u in uids if u in self._keys]

    def _on_template(self, key: str, old: Any, new: Any) -> list[runtime.Request]:
        obj = new if new is not None else old
        meta = obj.get("metadata") or {}
        ns, name = meta.get("namespace"), meta.get("name")
        found = self._on_labelled(key, old, new)
        for domain in self.rt.caches[DOMAINS].objects.values():
            dmeta = domain.get("metadata") or {}
            if dmeta.get("namespace") == ns and _template_name(domain) == name:
                found.append(runtime.Request(domain_key(str(ns), str(dmeta.get("name")))))
        return found

    def _on_slice(self, key: str, old: Any, new: Any) -> list[runtime.Request]:
        obj = new if new is not None else old
        if (obj.get("spec") or {}).get("driver") != cdapi.DRIVER:
            return []
        # A node's channel or clique came or went: every domain's clique choice may change.
        return [runtime.Request(k) for k in sorted(set(self._keys.values()))]

    # ----- reconcile -------------------------------------------------------------------------

    async def reconcile(self, key: str) -> None:
        _, ns, name = key.split("/", 2)
        caches = self.rt.caches
        domain = caches[DOMAINS].get(name, ns)
        if domain is None:
            return
        self.reconciles += 1
        meta = domain["metadata"]
        uid = str(meta.get("uid"))
        template_name = _template_name(domain)
        finalizers = list(meta.get("finalizers") or [])
        if meta.get("deletionTimestamp"):
            if cdapi.FINALIZER in finalizers:
                await self.api.delete_for(uid, ns, template_name)
                finalizers.remove(cdapi.FINALIZER)
                await self.api.set_finalizers(domain, finalizers)
                log.info("ComputeDomain %s/%s: cleaned up", ns, name)
            return
        if cdapi.FINALIZER not in finalizers:
            await self.api.set_finalizers(domain, [*finalizers, cdapi.FINALIZER])
        template = caches[TEMPLATES].get(template_name, ns) if template_name else None
        if template is not None:
            owner = (template["metadata"].get("labels") or {}).get(cdapi.DOMAIN_LABEL)
            if owner != uid:
                await self._warn(
                    domain, "TemplateConflict",
                    f"ResourceClaimTemplate {ns}/{template_name} exists and is not this "
                    "ComputeDomain's: rename spec.channel.resourceClaimTemplate.name or delete "
                    "that template",
                )  # fmt: skip
                return
        pods = [
            p
            for p in caches[DAEMON_PODS].objects.values()
            if (p["metadata"].get("labels") or {}).get(cdapi.DOMAIN_LABEL) == uid
        ]
        labelled = [
            str(n["metadata"]["name"])
            for n in caches[NODES].objects.values()
            if (n["metadata"].get("labels") or {}).get(cdapi.DOMAIN_LABEL) == uid
        ]
        facts = planner.Facts(
            domain=domain,
            namespace=self.api.namespace,
            image=self.image,
            channel_nodes=channel_nodes(caches[SLICES].objects.values()),
            labelled_nodes=sorted(labelled),
            daemons=[daemon_pod(p) for p in pods],
            template_exists=template is not None,
            template_clique=(
                (template["metadata"].get("annotations") or {}).get(cdapi.NODE_CLIQUE_LABEL)
                if template is not None
                else None
            ),
        )
        plan = planner.plan(facts)
        for obj in plan.apply:
            if obj["kind"] == "ResourceClaimTemplate":
                if self._cached(obj) is None:
                    await self.api.create_if_absent(obj)
            else:
                await self.api.apply(obj)
        if dict(domain.get("status") or {}) != plan.status:
            status = {"status": plan.status["status"], "nodes": plan.status.get("nodes")}
            await self.api.set_status(domain, status)
        seen = self._recorded.setdefault(uid, set())
        now = {(e.reason, e.message) for e in plan.events if e.type == "Warning"}
        for event in plan.events:
            if event.type == "Warning" and (event.reason, event.message) in seen:
                continue
            await self.api.event(domain, event.type, event.reason, event.message)
        seen.clear()
        seen.update(now)

    def _cached(self, obj: Mapping[str, Any]) -> Any:
        meta = obj.get("metadata") or {}
        return self.rt.caches[TEMPLATES].get(str(meta.get("name")), meta.get("namespace"))

    async def _warn(self, domain: Mapping[str, Any], reason: str, message: str) -> None:
        uid = str(domain["metadata"].get("uid"))
        seen = self._recorded.setdefault(uid, set())
        if (reason, message) not in seen:
            seen.add((reason, message))
            await self.api.event(domain, "Warning", reason, message)
            log.warning("%s: %s", reason, message)


def build(
    client: AsyncClient, namespace: str, image: str, *, component: str = "compute-domain-controller"
) -> tuple[runtime.Runtime, ComputeDomainReconciler]:
    """A runtime with the compute-domain reconciler registered (the agent's whole controller)."""
    rt = runtime.Runtime(client, runtime.Settings(namespace=namespace, identity=component))
    reconciler = ComputeDomainReconciler(rt, ComputeDomainApi(client, namespace, component), image)
    rt.register(reconciler)
    return rt, reconciler


async def serve(
    client: AsyncClient, namespace: str, image: str, stop: asyncio.Event, *,
    ready: asyncio.Event | None = None,
) -> None:  # fmt: skip
    """Run the controller until `stop` is set; `ready` is set once its caches have synced."""
    rt, _ = build(client, namespace, image)
    task = asyncio.create_task(rt.run())
    waiter = asyncio.create_task(stop.wait())
    synced = asyncio.create_task(rt.ready.wait())
    try:
        if ready is not None:
            await asyncio.wait({synced, task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if rt.ready.is_set():
                ready.set()
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # the runtime failed: raise it
    finally:
        for t in (task, waiter, synced):
            t.cancel()
        for t in (task, waiter, synced):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
