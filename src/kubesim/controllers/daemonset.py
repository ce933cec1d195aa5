"""DaemonSet controller: one pod per eligible node, revisions, rolling updates and full status."""

from __future__ import annotations

import copy
from typing import Any

from kubesim.controllers import scheduling
from kubesim.controllers.base import Controller
from kubesim.store import Event, Stored

DS_KEY = ("apps", "daemonsets")
POD_KEY = ("", "pods")
NODE_KEY = ("", "nodes")
REVISION_KEY = ("apps", "controllerrevisions")


class DaemonSetController(Controller):
    """Keys are (namespace, name) of DaemonSets; node changes requeue every DaemonSet."""

    name = "daemonset-controller"

    def initial_keys(self) -> list[Any]:
        return [_ident(s) for s in self.store.scan(DS_KEY)]

    def on_event(self, event: Event) -> None:
        if event.key == DS_KEY:
            self.enqueue(_ident(event.new))
        elif event.key == NODE_KEY:
            if event.type == "MODIFIED" and event.old is not None and not _placement_changed(event):
                return
            for stored in self.store.scan(DS_KEY):
                self.enqueue(_ident(stored))
        elif event.key == POD_KEY:
            for ref in event.new.obj["metadata"].get("ownerReferences") or ():
                if ref.get("kind") == "DaemonSet" and ref.get("controller"):
                    self.enqueue((event.new.obj["metadata"].get("namespace", ""), ref.get("name")))

    def reconcile(self, key: Any) -> None:
        namespace, name = key
        stored = self.store.peek(DS_KEY, namespace, name)
        if stored is None or stored.obj["metadata"].get("deletionTimestamp"):
            return
        ds = stored.obj
        uid = ds["metadata"]["uid"]
        spec = ds.get("spec") or {}
        template = spec.get("template") or {}
        pod_spec = template.get("spec") or {}
        revision_hash = scheduling.template_hash(template)
        self._ensure_revision(ds, template, revision_hash)
        pods_by_node: dict[str, list[dict[str, Any]]] = {}
        for key_, ns, pod_name in self.store.dependents(uid):
            if key_ != POD_KEY:
                continue
            found = self.store.peek(POD_KEY, ns, pod_name)
            if found is None or not scheduling.is_controlled_by(found.obj, uid):
                continue
            node_name = (found.obj.get("spec") or {}).get("nodeName", "")
            pods_by_node.setdefault(node_name, []).append(found.obj)
        min_ready = int(spec.get("minReadySeconds") or 0)
        strategy = spec.get("updateStrategy") or {}
        rolling = strategy.get("type", "RollingUpdate") == "RollingUpdate"
        pods_rt = self.rt("pods")
        desired = current = misscheduled = ready = available = updated = 0
        unavailable_nodes = 0
        old_available: list[dict[str, Any]] = []
        old_unavailable: list[dict[str, Any]] = []
        nodes = {s.obj["metadata"]["name"]: s.obj for s in self.store.scan(NODE_KEY)}
        for node_name, pods in pods_by_node.items():
            if node_name not in nodes:
                for pod in pods:
                    self._delete(pods_rt, pod)
        recheck = -1.0
        for node_name, node in nodes.items():
            should_run, should_continue = scheduling.daemon_placement(node, pod_spec)
            pods = pods_by_node.get(node_name, [])
            live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
            failed = [p for p in live if (p.get("status") or {}).get("phase") == "Failed"]
            for pod in failed:
                self._delete(pods_rt, pod)
            live = [p for p in live if p not in failed]
            if should_run:
                desired += 1
            if pods and not should_run:
                misscheduled += 1
            if not should_continue:
                for pod in live:
                    self._delete(pods_rt, pod)
                continue
            if should_run and not pods:
                self._create_pod(ds, template, node_name, revision_hash)
                unavailable_nodes += 1
                continue
            if len(live) > 1:
                live.sort(key=lambda p: p["metadata"].get("creationTimestamp", ""))
                for extra in live[1:]:
                    self._delete(pods_rt, extra)
                live = live[:1]
            if not should_run:
                continue
            if pods:
                current += 1
            if not live:
                unavailable_nodes += 1
                continue
            pod = live[0]
            is_updated = (
                pod["metadata"].get("labels", {}).get("controller-revision-hash") == revision_hash
            )
            wait = scheduling.ready_for(pod, min_ready)
            if wait >= 0:
                ready += 1
            if wait == 0:
                available += 1
            elif wait > 0:
                recheck = wait if recheck < 0 else min(recheck, wait)
            if wait != 0:
                unavailable_nodes += 1
            if is_updated:
                updated += 1
            elif wait == 0:
                old_available.append(pod)
            else:
                old_unavailable.append(pod)
        if rolling:
            rolling_spec = strategy.get("rollingUpdate") or {}
            max_unavailable = scheduling.scaled_value(
                rolling_spec.get("maxUnavailable", 1), desired, True
            )
            max_unavailable = max(max_unavailable, 1) if desired else 0
            for pod in old_unavailable:
                self._delete(pods_rt, pod)
            budget = max_unavailable - unavailable_nodes
            for pod in sorted(old_available, key=lambda p: p["metadata"]["name"]):
                if budget <= 0:
                    break
                self._delete(pods_rt, pod)
                budget -= 1
        if recheck > 0:
            self.enqueue_after(key, recheck + 0.01)
        status: dict[str, Any] = {
            "currentNumberScheduled": current,
            "desiredNumberScheduled": desired,
            "numberMisscheduled": misscheduled,
            "numberReady": ready,
            "observedGeneration": ds["metadata"].get("generation", 1),
            "updatedNumberScheduled": updated,
        }
        if available:
            status["numberAvailable"] = available
        if desired - available > 0:
            status["numberUnavailable"] = desired - available
        if "collisionCount" in (ds.get("status") or {}):
            status["collisionCount"] = ds["status"]["collisionCount"]
        if ds.get("status") != status:
            self._write_status(stored, status)

    def _write_status(self, stored: Stored, status: dict[str, Any]) -> None:
        obj = stored.copy()
        obj["status"] = status
        meta = obj["metadata"]
        self.store.replace(
            self.rt("daemonsets.apps"),
            obj,
            namespace=meta["namespace"],
            name=meta["name"],
            subresource="status",
        )

    def _delete(self, pods_rt: Any, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            return
        self.store.remove(pods_rt, meta["namespace"], meta["name"])

    def _create_pod(
        self, ds: dict[str, Any], template: dict[str, Any], node: str, revision_hash: str
    ) -> None:
        meta = ds["metadata"]
        template_meta = template.get("metadata") or {}
        spec = copy.deepcopy(template.get("spec") or {})
        spec["nodeName"] = node
        affinity = spec.setdefault("affinity", {})
        node_affinity = affinity.setdefault("nodeAffinity", {})
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        }
        spec["tolerations"] = scheduling.daemon_tolerations(spec)
        labels = dict(template_meta.get("labels") or {})
        labels["controller-revision-hash"] = revision_hash
        labels["pod-template-generation"] = str(meta.get("generation", 1))
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": f"{meta['name']}-",
                "namespace": meta["namespace"],
                "labels": labels,
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "DaemonSet",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
        }
        if template_meta.get("annotations"):
            pod["metadata"]["annotations"] = dict(template_meta["annotations"])
        self.store.insert(self.rt("pods"), pod)

    def _ensure_revision(
        self, ds: dict[str, Any], template: dict[str, Any], revision_hash: str
    ) -> None:
        meta = ds["metadata"]
        rt = self.rt("controllerrevisions.apps")
        name = f"{meta['name']}-{revision_hash}"
        revisions = [
            s.obj
            for key, ns, rev_name in self.store.dependents(meta["uid"])
            if key == REVISION_KEY and (s := self.store.peek(key, ns, rev_name)) is not None
        ]
        highest = max((int(r.get("revision", 0)) for r in revisions), default=0)
        existing = next((r for r in revisions if r["metadata"]["name"] == name), None)
        if existing is not None:
            if int(existing.get("revision", 0)) == highest:
                return
            updated = copy.deepcopy(existing)
            updated["revision"] = highest + 1
            self.store.replace(rt, updated, namespace=meta["namespace"], name=name)
            return
        data_template = copy.deepcopy(template)
        data_template["$patch"] = "replace"
        revision = {
            "apiVersion": "apps/v1",
            "kind": "ControllerRevision",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": {
                    **((template.get("metadata") or {}).get("labels") or {}),
                    "controller-revision-hash": revision_hash,
                },
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "DaemonSet",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "data": {"spec": {"template": data_template}},
            "revision": highest + 1,
        }
        if self.store.peek(REVISION_KEY, meta["namespace"], name) is None:
            self.store.insert(rt, revision)
        limit = int((ds.get("spec") or {}).get("revisionHistoryLimit", 10))
        old = sorted(revisions, key=lambda r: int(r.get("revision", 0)))
        for stale in old[: max(0, len(old) + 1 - (limit + 1))]:
            self.store.remove(rt, meta["namespace"], stale["metadata"]["name"])


def _ident(stored: Stored) -> tuple[str, str]:
    meta = stored.obj["metadata"]
    return (meta.get("namespace", ""), meta["name"])


def _placement_changed(event: Event) -> bool:
    """Whether a node change can affect daemon placement or availability."""
    assert event.old is not None
    new, old = event.new.obj, event.old.obj
    return (
        new["metadata"].get("labels") != old["metadata"].get("labels")
        or new.get("spec") != old.get("spec")
        or scheduling.node_ready(new) != scheduling.node_ready(old)
    )
