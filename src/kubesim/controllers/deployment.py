"""Deployment and ReplicaSet controllers (minimal but real), and a simple scheduler."""

from __future__ import annotations

import copy
from typing import Any

from kubesim.controllers import scheduling
from kubesim.controllers.base import Controller
from kubesim.store import Event, Stored, now

DEPLOY_KEY = ("apps", "deployments")
RS_KEY = ("apps", "replicasets")
POD_KEY = ("", "pods")
NODE_KEY = ("", "nodes")


def _owner_ref(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _owned(controller: Controller, owner: dict[str, Any], key: tuple[str, str]) -> list[Stored]:
    uid = owner["metadata"]["uid"]
    result = []
    for dep_key, ns, name in controller.store.dependents(uid):
        if dep_key != key:
            continue
        stored = controller.store.peek(dep_key, ns, name)
        if stored is not None and scheduling.is_controlled_by(stored.obj, uid):
            result.append(stored)
    return result


def _owner_keys(event: Event, kind: str) -> list[tuple[str, str]]:
    meta = event.new.obj["metadata"]
    return [
        (meta.get("namespace", ""), r.get("name"))
        for r in meta.get("ownerReferences") or ()
        if r.get("kind") == kind and r.get("controller")
    ]


class DeploymentController(Controller):
    """Rolls a Deployment onto a ReplicaSet per template; old ReplicaSets scale down when the new
    one is available (or first, with the Recreate strategy)."""

    name = "deployment-controller"

    def initial_keys(self) -> list[Any]:
        return [
            (s.obj["metadata"]["namespace"], s.obj["metadata"]["name"])
            for s in self.store.scan(DEPLOY_KEY)
        ]

    def on_event(self, event: Event) -> None:
        if event.key == DEPLOY_KEY:
            meta = event.new.obj["metadata"]
            self.enqueue((meta["namespace"], meta["name"]))
        elif event.key == RS_KEY:
            for key in _owner_keys(event, "Deployment"):
                self.enqueue(key)

    def reconcile(self, key: Any) -> None:
        stored = self.store.peek(DEPLOY_KEY, *key)
        if stored is None or stored.obj["metadata"].get("deletionTimestamp"):
            return
        deploy = stored.obj
        spec = deploy.get("spec") or {}
        replicas = int(spec.get("replicas", 1))
        template = copy.deepcopy(spec.get("template") or {})
        template_hash = scheduling.template_hash(template)
        owned = _owned(self, deploy, RS_KEY)
        new_rs = next(
            (
                s
                for s in owned
                if s.obj["metadata"].get("labels", {}).get("pod-template-hash") == template_hash
            ),
            None,
        )
        old = [s for s in owned if s is not new_rs]
        rs_rt = self.rt("replicasets.apps")
        recreate = (spec.get("strategy") or {}).get("type") == "Recreate"
        old_active = [
            s
            for s in old
            if int((s.obj.get("spec") or {}).get("replicas", 0)) > 0
            or int((s.obj.get("status") or {}).get("replicas", 0)) > 0
        ]
        revision = 1 + max(
            (
                int(
                    s.obj["metadata"]
                    .get("annotations", {})
                    .get("deployment.kubernetes.io/revision", 0)
                )
                for s in owned
            ),
            default=0,
        )
        if new_rs is None and not (recreate and old_active):
            labels = {
                **((template.get("metadata") or {}).get("labels") or {}),
                "pod-template-hash": template_hash,
            }
            template.setdefault("metadata", {})["labels"] = labels
            selector = copy.deepcopy(spec.get("selector") or {})
            selector.setdefault("matchLabels", {})["pod-template-hash"] = template_hash
            rs = {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": f"{deploy['metadata']['name']}-{template_hash}",
                    "namespace": key[0],
                    "labels": labels,
                    "annotations": {"deployment.kubernetes.io/revision": str(revision)},
                    "ownerReferences": [_owner_ref(deploy, "Deployment")],
                },
                "spec": {"replicas": replicas, "selector": selector, "template": template},
            }
            new_rs = self.store.insert(rs_rt, rs)
        elif new_rs is not None and int(new_rs.obj["spec"].get("replicas", 0)) != replicas:
            obj = new_rs.copy()
            obj["spec"]["replicas"] = replicas
            new_rs = self.store.replace(rs_rt, obj, namespace=key[0], name=obj["metadata"]["name"])
        new_available = int(
            ((new_rs.obj if new_rs else {}).get("status") or {}).get("availableReplicas", 0)
        )
        if recreate or new_available >= replicas:
            for rs_stored in old:
                if int(rs_stored.obj["spec"].get("replicas", 0)) != 0:
                    obj = rs_stored.copy()
                    obj["spec"]["replicas"] = 0
                    self.store.replace(rs_rt, obj, namespace=key[0], name=obj["metadata"]["name"])
        all_rs = [s.obj for s in _owned(self, deploy, RS_KEY)]
        total = sum(int((r.get("status") or {}).get("replicas", 0)) for r in all_rs)
        ready = sum(int((r.get("status") or {}).get("readyReplicas", 0)) for r in all_rs)
        available = sum(int((r.get("status") or {}).get("availableReplicas", 0)) for r in all_rs)
        updated = int(((new_rs.obj if new_rs else {}).get("status") or {}).get("replicas", 0))
        status: dict[str, Any] = {"observedGeneration": deploy["metadata"].get("generation", 1)}
        for field, value in (
            ("replicas", total),
            ("updatedReplicas", updated),
            ("readyReplicas", ready),
            ("availableReplicas", available),
            ("unavailableReplicas", max(0, replicas - available)),
        ):
            if value:
                status[field] = value
        is_available = available >= replicas
        old_conditions = {
            c.get("type"): c for c in (deploy.get("status") or {}).get("conditions") or []
        }
        conditions = []
        for ctype, ok, reason, message in (
            (
                "Available",
                is_available,
                "MinimumReplicasAvailable" if is_available else "MinimumReplicasUnavailable",
                "Deployment has minimum availability."
                if is_available
                else "Deployment does not have minimum availability.",
            ),
            (
                "Progressing",
                True,
                "NewReplicaSetAvailable" if new_available >= replicas else "ReplicaSetUpdated",
                f'ReplicaSet "{deploy["metadata"]["name"]}-{template_hash}" is progressing.',
            ),
        ):
            flag = "True" if ok else "False"
            previous = old_conditions.get(ctype)
            stamp = (
                previous["lastTransitionTime"]
                if previous and previous.get("status") == flag
                else now()
            )
            conditions.append(
                {
                    "type": ctype,
                    "status": flag,
                    "reason": reason,
                    "message": message,
                    "lastUpdateTime": previous.get("lastUpdateTime", stamp)
                    if previous and previous.get("reason") == reason
                    else now(),
                    "lastTransitionTime": stamp,
                }
            )
        status["conditions"] = conditions
        if deploy.get("status") != status:
            obj = stored.copy()
            obj["status"] = status
            self.store.replace(
                self.rt("deployments.apps"),
                obj,
                namespace=key[0],
                name=key[1],
                subresource="status",
            )


class ReplicaSetController(Controller):
    """Keeps `replicas` pods per ReplicaSet and reports ready/available counts."""

    name = "replicaset-controller"

    def initial_keys(self) -> list[Any]:
        return [
            (s.obj["metadata"]["namespace"], s.obj["metadata"]["name"])
            for s in self.store.scan(RS_KEY)
        ]

    def on_event(self, event: Event) -> None:
        if event.key == RS_KEY:
            meta = event.new.obj["metadata"]
            self.enqueue((meta["namespace"], meta["name"]))
        elif event.key == POD_KEY:
            for key in _owner_keys(event, "ReplicaSet"):
                self.enqueue(key)

    def reconcile(self, key: Any) -> None:
        stored = self.store.peek(RS_KEY, *key)
        if stored is None or stored.obj["metadata"].get("deletionTimestamp"):
            return
        rs = stored.obj
        spec = rs.get("spec") or {}
        replicas = int(spec.get("replicas", 1))
        pods = [s.obj for s in _owned(self, rs, POD_KEY)]
        pods_rt = self.rt("pods")
        for pod in pods:
            if (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded") and not pod[
                "metadata"
            ].get("deletionTimestamp"):
                self.store.remove(pods_rt, key[0], pod["metadata"]["name"])
        live = [
            p
            for p in pods
            if not p["metadata"].get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") not in ("Failed", "Succeeded")
        ]
        template = spec.get("template") or {}
        for _ in range(replicas - len(live)):
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "generateName": f"{rs['metadata']['name']}-",
                    "namespace": key[0],
                    "labels": dict((template.get("metadata") or {}).get("labels") or {}),
                    "ownerReferences": [_owner_ref(rs, "ReplicaSet")],
                },
                "spec": copy.deepcopy(template.get("spec") or {}),
            }
            if (template.get("metadata") or {}).get("annotations"):
                pod["metadata"]["annotations"] = dict(template["metadata"]["annotations"])
            live.append(self.store.insert(pods_rt, pod).obj)
        if len(live) > replicas:
            # Delete the least useful pods first: unscheduled, then not ready, then newest.
            live.sort(
                key=lambda p: (
                    bool((p.get("spec") or {}).get("nodeName")),
                    scheduling.pod_ready(p),
                    p["metadata"].get("creationTimestamp", ""),
                )
            )
            for pod in live[: len(live) - replicas]:
                self.store.remove(pods_rt, key[0], pod["metadata"]["name"])
            live = live[len(live) - replicas :]
        min_ready = int(spec.get("minReadySeconds") or 0)
        ready = sum(1 for p in live if scheduling.pod_ready(p))
        waits = [scheduling.ready_for(p, min_ready) for p in live]
        available = sum(1 for w in waits if w == 0)
        pending = [w for w in waits if w > 0]
        if pending:
            self.enqueue_after(key, min(pending) + 0.01)
        status: dict[str, Any] = {
            "replicas": len(live),
            "observedGeneration": rs["metadata"].get("generation", 1),
        }
        if live:
            status["fullyLabeledReplicas"] = len(live)
        if ready:
            status["readyReplicas"] = ready
        if available:
            status["availableReplicas"] = available
        if rs.get("status") != status:
            obj = stored.copy()
            obj["status"] = status
            self.store.replace(
                self.rt("replicasets.apps"),
                obj,
                namespace=key[0],
                name=key[1],
                subresource="status",
            )


class Scheduler(Controller):
    """Binds unscheduled pods to the eligible node with the fewest pods."""

    name = "scheduler"

    def initial_keys(self) -> list[Any]:
        return [
            (s.obj["metadata"]["namespace"], s.obj["metadata"]["name"])
            for s in self.store.scan(POD_KEY)
            if not (s.obj.get("spec") or {}).get("nodeName")
        ]

    def on_event(self, event: Event) -> None:
        if event.key == POD_KEY:
            pod = event.new.obj
            if event.type != "DELETED" and not (pod.get("spec") or {}).get("nodeName"):
                self.enqueue((pod["metadata"]["namespace"], pod["metadata"]["name"]))
        elif event.key == NODE_KEY and event.type != "DELETED":
            for key in self.initial_keys():
                self.enqueue(key)

    def reconcile(self, key: Any) -> None:
        stored = self.store.peek(POD_KEY, *key)
        if stored is None:
            return
        pod = stored.obj
        spec = pod.get("spec") or {}
        if spec.get("nodeName") or pod["metadata"].get("deletionTimestamp"):
            return
        if spec.get("schedulerName", "default-scheduler") != "default-scheduler":
            return
        counts: dict[str, int] = {}
        for other in self.store.scan(POD_KEY):
            node = (other.obj.get("spec") or {}).get("nodeName")
            if node:
                counts[node] = counts.get(node, 0) + 1
        candidates = [
            s.obj["metadata"]["name"]
            for s in self.store.scan(NODE_KEY)
            if scheduling.schedulable(s.obj, spec)
        ]
        rt = self.rt("pods")
        if not candidates:
            obj = stored.copy()
            status = obj.setdefault("status", {})
            conditions = [
                c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"
            ]
            conditions.append(
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": f"0/{len(self.store.bucket(NODE_KEY))} nodes are available.",
                    "lastProbeTime": None,
                    "lastTransitionTime": now(),
                }
            )
            previous = [
                c
                for c in (pod.get("status") or {}).get("conditions") or []
                if c.get("type") == "PodScheduled"
            ]
            if (
                previous
                and previous[0].get("status") == "False"
                and previous[0].get("message") == conditions[-1]["message"]
            ):
                return
            status["conditions"] = conditions
            self.store.replace(rt, obj, namespace=key[0], name=key[1], subresource="status")
            return
        node = min(candidates, key=lambda n: (counts.get(n, 0), n))
        obj = stored.copy()
        obj["spec"]["nodeName"] = node
        self.store.replace(rt, obj, namespace=key[0], name=key[1])
