"""The GPUCluster reconciler: the DRA driver's states, node deploy labels, status and Events.

One work key, `gpucluster`: there is one GPUCluster per cluster (`gpu-cluster`, a rule of the CRD).
A pass, in order:

1. exclusivity with the ClusterPolicy (status/gpucluster.py): when both exist the newer is
   refused; a refused GPUCluster applies nothing (what it applied before stays until it is
   deleted: its objects carry its owner reference, the garbage collector removes them);
2. the spec's semantic checks (api/validation.py) and the requirements (Kubernetes >= 1.34.2 from
   the server version, a 580+ driver where a node's driver is known, CDI enabled in the toolkit);
3. render (operands/dra_driver.py) and apply every object in order by server-side apply, each
   owned by the GPUCluster; objects a previous spec wanted and this one does not are deleted;
4. the namespace label that allows the adminAccess claims (validator, DCGM, exporter), and the
   node labels `nvidia.com/gpu.deploy.dra-driver` / `dra-validator` / `dcgm-dra` /
   `dcgm-exporter-dra` on GPU nodes the DaemonSets select (all four, as upstream);
5. status `state` / `namespace` / Ready+Error conditions like a ClusterPolicy's: ready when the
   kubelet-plugin, DCGM, exporter and validator DaemonSets and the controller Deployment are.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from gpu_operator import api
from gpu_operator.api import gpucluster as gc_api
from gpu_operator.api import keys
from gpu_operator.controller import clusterpolicy as cp
from gpu_operator.controller import runtime, strip
from gpu_operator.controller import upgrade as upgrade_cache
from gpu_operator.controller.runtime import Reconciler, Request, Runtime, Watch, owned_name
from gpu_operator.kube import resources
from gpu_operator.kube.writer import content_hash, needs_write
from gpu_operator.operands import dra_driver, readiness
from gpu_operator.operands.common import RenderError
from gpu_operator.operands.dra_driver import node_label_patch
from gpu_operator.status import conditions
from gpu_operator.status import gpucluster as gc_status

log = logging.getLogger(__name__)

# Pod phases after which a pod holds no claim (a terminating pod still does).
_ENDED = ("Succeeded", "Failed")

KEY = "gpucluster"
DEPLOYMENTS = "gpucluster-deployments"
DAEMONSETS = owned_name("apps/v1", "DaemonSet")
# Node labels telling the driver branch (GPU feature discovery's), read where present.
DRIVER_MAJOR_LABELS = ("nvidia.com/cuda.driver-version.major", "nvidia.com/cuda.driver.major")
# Set on a node where the toolkit runs with CDI off (ours writes it; absent: unknown).
CDI_LABEL = "nvidia.com/cdi.enabled"

ServerVersion = Callable[[], "asyncio.Future[str | None] | Any"]
# Kinds only the DRA driver renders, cached (by the state label) once a GPUCluster is applied:
# resource.k8s.io/v1 and the admission API need not be served before then. A watch event on one
# brings a pass, so a hand deletion is repaired at once, as for the other operand objects.
DRA_KINDS = (
    ("resource.k8s.io/v1", "DeviceClass"),
    ("resource.k8s.io/v1", "ResourceClaimTemplate"),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"),
)
# The shared operand caches (runtime.OWNED_KINDS) the DRA driver also writes to.
SHARED_KINDS = tuple((v, k) for v, k in runtime.OWNED_KINDS if (v, k) != ("apps/v1", "DaemonSet"))


def _created(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("creationTimestamp") or "")


def the_cluster(objects: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The GPUCluster in charge: the oldest one not being deleted (the CRD allows only one)."""
    live = [o for o in objects if not (o.get("metadata") or {}).get("deletionTimestamp")]
    return min(live, key=lambda o: (_created(o), str(o["metadata"].get("name")))) if live else None


def conflict_of(rt: Runtime) -> gc_status.Conflict | None:
    """The GPUCluster / ClusterPolicy conflict from the shared caches (the ClusterPolicy
    reconciler asks too)."""
    if runtime.GPU_CLUSTERS not in rt.caches:
        return None
    cluster = the_cluster(rt.caches[runtime.GPU_CLUSTERS].objects.values())
    return gc_status.conflict(cluster, rt.caches[runtime.POLICIES].objects.values())


def _same_spec(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    return bool(
        old.get("spec") == new.get("spec")
        and (old.get("metadata") or {}).get("deletionTimestamp")
        == (new.get("metadata") or {}).get("deletionTimestamp")
    )


def _owned_by_cluster(obj: Mapping[str, Any] | None) -> bool:
    refs = (obj or {}).get("metadata", {}).get("ownerReferences") or []
    return any(r.get("kind") == gc_api.KIND for r in refs)


class GPUClusterReconciler(Reconciler):
    """Renders, applies and reports for the GPUCluster; refused next to an older ClusterPolicy."""

    prefix = KEY

    def __init__(self, rt: Runtime, server_version: Callable[[], Any] | None = None) -> None:
        self.rt = rt
        self.caches = rt.caches
        self.namespace = rt.settings.namespace
        self.clusters = rt.caches[runtime.GPU_CLUSTERS]
        self.deployments = rt.caches.add(
            DEPLOYMENTS, resources.DEPLOYMENT, namespace=self.namespace,
            labels={keys.OPERATOR_STATE_LABEL: None}, transform=strip.owned,
        )  # fmt: skip
        # An async callable answering the API server's gitVersion (None: unknown).
        self._server_version = server_version
        self._version: str | None = None
        self._version_read = False
        # Objects of kinds no cache holds: what we last wrote, by reference (content hash).
        self._written: dict[tuple[str, str, str, str], str] = {}
        # What we applied last, to delete what a new spec no longer wants.
        self._applied: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self._reported: dict[str, str] = {}
        self._labelled_ns = False
        # Nodes keeping the DRA driver's label only for pods holding its claims.
        self._kept: set[str] = set()
        self._watching_pods = False
        self._debounced = (Request(KEY, rt.settings.status_debounce),)
        # The DRA_KINDS caches, by (apiVersion, kind), once added.
        self._dra_caches: dict[tuple[str, str], Any] = {}

    # ----- events ------------------------------------------------------------------------------

    def watches(self) -> list[Watch]:
        return [
            Watch(runtime.GPU_CLUSTERS, self._on_cluster),
            Watch(runtime.POLICIES, self._on_policy),
            Watch(runtime.NODES, self._on_node),
            Watch(runtime.PODS, self._on_status),
            Watch(DAEMONSETS, self._on_status),
            Watch(DEPLOYMENTS, self._on_status),
            *(
                Watch(owned_name(v, k), self._on_owned)
                for v, k in SHARED_KINDS
                if owned_name(v, k) in self.caches
            ),
        ]

    def initial(self) -> list[Request]:
        return [Request(KEY)]

    def _on_cluster(self, key: str, old: Any, new: Any) -> list[Request]:
        if old is not None and new is not None and _same_spec(old, new):
            return []  # our own status writes
        return [Request(KEY)]

    def _on_policy(self, key: str, old: Any, new: Any) -> list[Request]:
        if old is not None and new is not None and _same_spec(old, new):
            # The ClusterPolicy's status: only our Conflict condition on it matters.
            return list(self._debounced) if self.clusters.objects else []
        return [Request(KEY)]

    def _on_node(self, key: str, old: Any, new: Any) -> tuple[Request, ...]:
        if old is not None and new is not None:
            before = (old.get("metadata") or {}).get("labels")
            after = (new.get("metadata") or {}).get("labels")
            if before == after:
                return ()
        return self._debounced if self.clusters.objects or self._applied else ()

    def _on_claim_pod(self, key: str, old: Any, new: Any) -> tuple[Request, ...]:
        """A pod on a node that keeps the DRA driver only for its claim pods changed or went."""
        if not self._kept or old == new:
            return ()
        nodes = {getattr(p, "node", None) for p in (old, new) if p is not None}
        return self._debounced if nodes & self._kept else ()

    def _on_status(self, key: str, old: Any, new: Any) -> tuple[Request, ...]:
        return self._debounced if old != new and self.clusters.objects else ()

    def _on_owned(self, key: str, old: Any, new: Any) -> list[Request]:
        """An object of ours changed or went away (a hand edit or deletion): put it back."""
        if old == new or not (_owned_by_cluster(old) or _owned_by_cluster(new)):
            return []
        return [Request(KEY)] if self.clusters.objects else []

    async def _watch_dra_kinds(self) -> None:
        """Cache the DRA-only kinds (module docstring), once; wait until they are listed."""
        if self._dra_caches:
            return
        for api_version, kind in DRA_KINDS:
            info = resources.kind_of(api_version, kind)
            name = f"{KEY}:{owned_name(api_version, kind)}"
            informer = self.caches.add(
                name, resources.resource(api_version, kind),
                namespace=self.namespace if info.namespaced else None,
                labels={keys.OPERATOR_STATE_LABEL: None}, transform=strip.owned,
            )  # fmt: skip
            self.rt.watch(name, self._on_owned)
            self._dra_caches[(api_version, kind)] = informer
        await asyncio.gather(*(i.synced.wait() for i in self._dra_caches.values()))

    # ----- reconcile ---------------------------------------------------------------------------

    async def reconcile(self, key: str) -> None:
        obj = the_cluster(self.clusters.objects.values())
        if obj is None:
            await self._label_nodes(False)
            self._applied.clear()
            self._written.clear()
            await self._clear_policy_conflict()
            return
        clash = gc_status.conflict(obj, self.caches[runtime.POLICIES].objects.values())
        if clash is not None and clash.refused_kind == "GPUCluster":
            await self._refused(obj, clash)
            return
        await self._policy_conflict(clash)
        checked = api.check_document(obj)
        if not checked.ok or not isinstance(checked.obj, gc_api.GPUCluster):
            problems = "; ".join(str(p) for p in checked.errors)
            await self._finish(
                obj, gc_status.Report(False, conditions.INVALID_SPEC, f"invalid spec: {problems}")
            )
            await self._say(obj, conditions.INVALID_SPEC, f"invalid spec: {problems}")
            return
        cluster = checked.obj
        reqs = gc_status.requirements(
            await self._read_version(), self._driver_majors(), self._cdi_disabled()
        )
        if reqs.blocking:
            message = "; ".join(reqs.blocking)
            await self._finish(
                obj, gc_status.Report(False, gc_status.PREREQUISITE_NOT_MET, message)
            )
            await self._say(obj, gc_status.PREREQUISITE_NOT_MET, message)
            return
        try:
            rendered = dra_driver.render(cluster, cp.cluster_facts(self.rt))
        except (RenderError, ValidationError) as err:
            message = f"cannot render the DRA driver: {err}"
            await self._finish(obj, gc_status.Report(False, conditions.RECONCILE_FAILED, message))
            await self._say(obj, conditions.RECONCILE_FAILED, message)
            return
        await self._watch_dra_kinds()
        if not self._labelled_ns:
            await self.rt.writer.patch_namespace_labels(
                self.namespace, {dra_driver.ADMIN_ACCESS_LABEL: "true", **cp.PSA_LABELS}
            )
            self._labelled_ns = True
        owner = {
            "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
            "name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True,
        }  # fmt: skip
        failures: list[str] = []
        desired: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        for state, objs in rendered.states:
            for item in objs:
                item["metadata"]["ownerReferences"] = [owner]
                desired[cp.ref(item)] = item
            # In order within a state; one state at a time (the DaemonSets after their RBAC).
            for item in objs:
                try:
                    await self._apply(item)
                except Exception as err:
                    failures.append(f"{state}: {item['kind']} {item['metadata']['name']}: {err}")
        for ref_, old in list(self._applied.items()):
            if ref_ not in desired:
                log.info("deleting %s %s (the GPUCluster no longer wants it)", ref_[1], ref_[3])
                await self.rt.writer.delete(old)
                self._written.pop(ref_, None)
        self._applied = desired
        await self._label_nodes(True)
        report = self._report(rendered, failures, reqs)
        if clash is not None:  # this GPUCluster runs; the newer ClusterPolicy is refused
            report = dataclasses.replace(report, conflict=clash.winner_message)
        await self._finish(obj, report)
        if failures:
            await self._say(obj, conditions.RECONCILE_FAILED, report.message)
        elif reqs.warnings or rendered.notes:
            await self._say(
                obj, "RequirementsWarning", "; ".join([*reqs.warnings, *rendered.notes])
            )
        elif report.ready:
            await self._say(obj, conditions.RECONCILED, "", type_="Normal")

    def _cache_of(self, obj: Mapping[str, Any]) -> Any:
        """The cache holding objects of this one's kind, None for a kind no cache holds."""
        api_version, kind = str(obj["apiVersion"]), str(obj["kind"])
        if kind == "Deployment":
            return self.deployments
        return self._dra_caches.get((api_version, kind)) or self.caches.owned(api_version, kind)

    async def _apply(self, obj: dict[str, Any]) -> None:
        cache = self._cache_of(obj)
        if cache is not None:
            meta = obj["metadata"]
            live = cache.get(meta["name"], meta.get("namespace"))
            if needs_write(obj, live):
                await self.rt.write(obj)
            return
        digest = content_hash(obj)
        if self._written.get(cp.ref(obj)) != digest:
            await self.rt.write(obj)
            self._written[cp.ref(obj)] = digest

    def _report(
        self, rendered: dra_driver.Rendered, failures: list[str], reqs: gc_status.Requirements
    ) -> gc_status.Report:
        if failures:
            return gc_status.Report(False, conditions.RECONCILE_FAILED, "; ".join(failures))
        waiting: list[str] = []
        by_owner = cp.index_by_owner(
            self.caches[runtime.PODS].objects.values(),
            self.caches[runtime.REVISIONS].objects.values(),
        )
        for obj in rendered.objects():
            kind, name = obj["kind"], obj["metadata"]["name"]
            if kind == "DaemonSet":
                live = self.caches.live(obj)
                if live is None:
                    waiting.append(f"DaemonSet {name} not created yet")
                    continue
                pods, revisions = by_owner.get(str(live["metadata"].get("uid")), ([], []))
                verdict = readiness.daemonset_readiness(live, pods, revisions)
                if not verdict.ready:
                    waiting.append(f"DaemonSet {name}: {verdict.reason}")
                elif verdict.desired == 0:
                    waiting.append(f"DaemonSet {name}: no GPU node selected yet")
            elif kind == "Deployment":
                live = self.deployments.get(name, self.namespace)
                if live is None:
                    waiting.append(f"Deployment {name} not created yet")
                    continue
                status = live.get("status") or {}
                want = int((live.get("spec") or {}).get("replicas") or 1)
                fresh = int(status.get("observedGeneration") or 0) >= int(
                    live["metadata"].get("generation") or 0
                )
                if not fresh or int(status.get("availableReplicas") or 0) < want:
                    waiting.append(
                        f"Deployment {name}: {int(status.get('availableReplicas') or 0)}/{want} "
                        "available"
                    )
        notes = [*reqs.warnings, *rendered.notes]
        if waiting:
            return gc_status.Report(
                False, conditions.OPERAND_NOT_READY, "; ".join([*waiting, *notes])
            )
        message = "all DRA driver objects are applied and ready"
        if notes:
            message += "; " + "; ".join(notes)
        return gc_status.Report(True, conditions.RECONCILED, message)

    # ----- exclusivity -------------------------------------------------------------------------

    async def _refused(self, obj: dict[str, Any], clash: gc_status.Conflict) -> None:
        """Nothing of the GPUCluster is applied; both objects say so."""
        await self._finish(
            obj, gc_status.Report(False, gc_status.CONFLICT_REASON, clash.refused_message)
        )
        await self._say(obj, gc_status.CONFLICT_REASON, clash.refused_message)
        await self._policy_conflict(clash)

    async def _policy_conflict(self, clash: gc_status.Conflict | None) -> None:
        """The winner ClusterPolicy's `Conflict` condition (and an Event once), or its removal.
        A refused ClusterPolicy is the ClusterPolicy reconciler's to report."""
        for policy in list(self.caches[runtime.POLICIES].objects.values()):
            name = policy["metadata"]["name"]
            message = None
            if clash is not None and clash.winner_kind == "ClusterPolicy" and clash.winner == name:
                message = clash.winner_message
            previous = (policy.get("status") or {}).get("conditions") or []
            had = any(c.get("type") == gc_status.CONFLICT_CONDITION for c in previous)
            if message is None and not had:
                continue
            wanted = gc_status.with_conflict(
                previous, message, cp.now(), (policy.get("metadata") or {}).get("generation")
            )
            if wanted != previous:
                await self.rt.writer.patch_status(
                    resources.CLUSTER_POLICY, name, {"conditions": wanted}
                )
            if message is not None:
                await self._say(policy, gc_status.CONFLICT_REASON, message, key=f"cp/{name}")

    async def _clear_policy_conflict(self) -> None:
        await self._policy_conflict(None)

    # ----- nodes, facts ------------------------------------------------------------------------

    def _claim_nodes(self) -> set[str]:
        """Nodes where pods still hold gpu.nvidia.com claims (the upgrade controller's caches
        of all pods and claims, shared: no second copy of every pod)."""
        pods = self.caches.informers.get(upgrade_cache.CACHE_PODS)
        if pods is None:
            return set()
        if not self._watching_pods:
            self.rt.watch(upgrade_cache.CACHE_PODS, self._on_claim_pod)
            self._watching_pods = True
        claims = self.caches.informers.get(upgrade_cache.CACHE_CLAIMS)
        return gc_status.nodes_holding_gpu_claims(
            (
                gc_status.ClaimPod(p.node or "", p.namespace, p.claims, p.phase in _ENDED)
                for p in pods.objects.values()
            ),
            {c.key: c.gpu for c in claims.objects.values()} if claims is not None else None,
        )

    async def _label_nodes(self, wanted: bool) -> None:
        holding = self._claim_nodes()
        self._kept = set()
        for name, node in list(self.caches[runtime.NODES].objects.items()):
            labels = (node.get("metadata") or {}).get("labels") or {}
            if not wanted and not any(k in labels for k in dra_driver.DEPLOY_LABELS):
                continue
            patch = node_label_patch(labels, wanted, name in holding)
            if (
                name in holding
                and dra_driver.DEPLOY_DRA_DRIVER in labels
                and (patch is None or dra_driver.DEPLOY_DRA_DRIVER not in patch)
                and not (wanted and dra_driver.is_gpu_node(labels))
            ):
                self._kept.add(name)
                log.info(
                    "node %s keeps %s: pods there still hold %s claims",
                    name, dra_driver.DEPLOY_DRA_DRIVER, "gpu.nvidia.com",
                )  # fmt: skip
            if patch is not None:
                await self.rt.writer.patch_node(name, {"metadata": {"labels": patch}})

    def _driver_majors(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for name, node in self.caches[runtime.NODES].objects.items():
            labels = (node.get("metadata") or {}).get("labels") or {}
            for label in DRIVER_MAJOR_LABELS:
                value = labels.get(label)
                if value and value.isdigit():
                    found[name] = int(value)
                    break
        return found

    def _cdi_disabled(self) -> list[str]:
        return sorted(
            name
            for name, node in self.caches[runtime.NODES].objects.items()
            if ((node.get("metadata") or {}).get("labels") or {}).get(CDI_LABEL) == "false"
        )

    async def _read_version(self) -> str | None:
        if self._server_version is None or self._version_read:
            return self._version
        try:
            self._version = await self._server_version()
            self._version_read = True
        except Exception as err:
            log.warning("cannot read the API server version: %s", err)
        return self._version

    # ----- status, events ----------------------------------------------------------------------

    async def _finish(self, obj: dict[str, Any], report: gc_status.Report) -> None:
        status = gc_status.build(
            report, namespace=self.namespace, now=cp.now(),
            generation=(obj.get("metadata") or {}).get("generation"), previous=obj.get("status"),
        )  # fmt: skip
        if _status_differs(obj.get("status") or {}, status):
            await self.rt.writer.patch_status(
                resources.GPU_CLUSTER, obj["metadata"]["name"], status
            )

    async def _say(
        self, obj: dict[str, Any], reason: str, message: str, *, type_: str = "Warning",
        key: str | None = None,
    ) -> None:  # fmt: skip
        """An Event when what the object should say changed (never twice the same)."""
        slot = key or f"gc/{obj['metadata']['name']}"
        text = f"{reason}: {message}"
        if self._reported.get(slot) == text:
            return
        self._reported[slot] = text
        if type_ == "Normal" and not message:
            message = "the DRA driver is deployed and ready"
        await self.rt.writer.event(obj, reason=reason, type_=type_, message=message)


def _status_differs(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    def strip_times(status: Mapping[str, Any]) -> Any:
        return (
            status.get("state"),
            status.get("namespace"),
            [
                {k: v for k, v in c.items() if k != "lastTransitionTime"}
                for c in status.get("conditions") or []
            ],
        )

    return bool(strip_times(before) != strip_times(after))


__all__ = ["GPUClusterReconciler", "conflict_of", "node_label_patch", "the_cluster"]
