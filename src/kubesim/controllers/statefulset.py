"""StatefulSet controller: stable pod names and identities, ordered rollout, revisions.

Pods are `<name>-<ordinal>` with `hostname` = pod name and `subdomain` = `serviceName`.
OrderedReady creates one pod at a time, lowest ordinal first, after the previous one is Running
and Ready, and removes the highest ordinal first; Parallel does both at once. A template change
makes a ControllerRevision; RollingUpdate replaces pods from the highest ordinal down to
`partition`, one at a time, each once the others are Running and Ready. `volumeClaimTemplates`
become PersistentVolumeClaims `<template>-<name>-<ordinal>` (nothing binds them: no volumes are
provisioned in kubesim).
"""

from __future__ import annotations

import copy
from typing import Any

from kubesim import errors
from kubesim.controllers import scheduling
from kubesim.controllers.base import Controller, controlled
from kubesim.store import Event, Stored

STS_KEY = ("apps", "statefulsets")
POD_KEY = ("", "pods")
REVISION_KEY = ("apps", "controllerrevisions")
PVC_KEY = ("", "persistentvolumeclaims")
REVISION_LABEL = "controller-revision-hash"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
HASH_LABEL = "controller.kubernetes.io/hash"
COMPONENT = "statefulset-controller"


def running_and_ready(pod: dict[str, Any]) -> bool:
    """The pod runs and its Ready condition is True (the OrderedReady gate)."""
    return (pod.get("status") or {}).get("phase") == "Running" and scheduling.pod_ready(pod)


class StatefulSetController(Controller):
    """Keys are (namespace, name) of StatefulSets; pod changes requeue their owner."""

    name = COMPONENT
    resources = (STS_KEY, POD_KEY)

    def initial_keys(self) -> list[Any]:
        return self.keys_of(STS_KEY)

    def on_event(self, event: Event) -> None:
        meta = event.new.obj["metadata"]
        if event.key == STS_KEY:
            self.enqueue((meta["namespace"], meta["name"]))
        elif event.key == POD_KEY:
            for ref in meta.get("ownerReferences") or ():
                if ref.get("kind") == "StatefulSet" and ref.get("controller"):
                    self.enqueue((meta["namespace"], ref.get("name")))

    def reconcile(self, key: Any) -> None:
        namespace, name = key
        stored = self.store.peek(STS_KEY, namespace, name)
        if stored is None or stored.obj["metadata"].get("deletionTimestamp"):
            return
        _StatefulSetSync(self, stored).run()


class _StatefulSetSync:
    """One pass over one StatefulSet."""

    def __init__(self, controller: StatefulSetController, stored: Stored) -> None:
        self.c = controller
        self.store = controller.store
        self.stored = stored
        self.sts = stored.obj
        self.meta = self.sts["metadata"]
        self.namespace = self.meta["namespace"]
        self.name = self.meta["name"]
        self.spec = self.sts.get("spec") or {}
        self.replicas = int(self.spec.get("replicas", 1))
        self.start = int((self.spec.get("ordinals") or {}).get("start", 0))
        self.monotonic = self.spec.get("podManagementPolicy", "OrderedReady") == "OrderedReady"
        strategy = self.spec.get("updateStrategy") or {}
        self.rolling = strategy.get("type", "RollingUpdate") == "RollingUpdate"
        self.rolling_settings = strategy.get("rollingUpdate")
        self.partition = int((self.rolling_settings or {}).get("partition", 0))

    def run(self) -> None:
        template = self.spec.get("template") or {}
        update_rev, revisions = self._ensure_revision(template)
        status = self.sts.get("status") or {}
        current_rev = status.get("currentRevision") or update_rev
        if current_rev not in revisions:
            current_rev = update_rev
        pods = self._pods()
        by_ordinal: dict[int, dict[str, Any]] = {}
        for pod in pods:
            ordinal = self._ordinal(pod)
            if ordinal is not None:
                by_ordinal[ordinal] = pod
        wanted = range(self.start, self.start + self.replicas)
        current_replicas = int(status.get("currentReplicas") or 0)
        blocked = False
        for ordinal in wanted:
            found = by_ordinal.get(ordinal)
            if found is not None and (found.get("status") or {}).get("phase") in (
                "Failed",
                "Succeeded",
            ):
                if not found["metadata"].get("deletionTimestamp"):
                    self.c.events.record(
                        self.sts,
                        "Warning",
                        "RecreatingFailedPod",
                        f"StatefulSet {self.namespace}/{self.name} is recreating failed Pod "
                        f"{found['metadata']['name']}",
                        component=COMPONENT,
                    )
                    self._delete(found)
                if self.monotonic:
                    blocked = True
                    break
                continue
            if found is None:
                # Below the partition (or, without rollingUpdate settings, among the pods
                # still on the current revision) a recreated pod keeps the current revision.
                if not self.rolling:
                    use_current = False
                elif self.rolling_settings is None:
                    use_current = ordinal < self.start + current_replicas
                else:
                    use_current = ordinal < self.start + self.partition
                rev_name = current_rev if use_current else update_rev
                by_ordinal[ordinal] = self._create(ordinal, rev_name, revisions[rev_name])
                if self.monotonic:
                    blocked = True
                    break
                continue
            if self.monotonic and (
                found["metadata"].get("deletionTimestamp") or not running_and_ready(found)
            ):
                blocked = True
                break
        if not blocked:
            condemned = sorted((o for o in by_ordinal if o not in wanted), reverse=True)
            for ordinal in condemned:
                pod = by_ordinal[ordinal]
                if pod["metadata"].get("deletionTimestamp"):
                    if self.monotonic:
                        blocked = True
                        break
                    continue
                if self.monotonic and not all(
                    running_and_ready(by_ordinal[o])
                    and not by_ordinal[o]["metadata"].get("deletionTimestamp")
                    for o in by_ordinal
                    if o != ordinal
                ):
                    blocked = True
                    break
                self._delete(pod)
                if self.monotonic:
                    blocked = True
                    break
        if not blocked and self.rolling:
            self._roll(by_ordinal, wanted, update_rev)
        self._write_status(update_rev, current_rev)

    # ----- pods ---------------------------------------------------------------------------------

    def _pods(self) -> list[dict[str, Any]]:
        return [s.obj for s in controlled(self.store, self.meta["uid"], POD_KEY)]

    def _ordinal(self, pod: dict[str, Any]) -> int | None:
        prefix, _, suffix = pod["metadata"]["name"].rpartition("-")
        if prefix != self.name or not suffix.isdigit():
            return None
        return int(suffix)

    def _roll(self, by_ordinal: dict[int, dict[str, Any]], wanted: range, update_rev: str) -> None:
        """Replace the highest out-of-date pod at or above the partition, once all are healthy."""
        live = [by_ordinal.get(o) for o in wanted]
        if any(p is None or not running_and_ready(p) for p in live):
            return
        if any(p["metadata"].get("deletionTimestamp") for p in by_ordinal.values()):
            return
        for ordinal in reversed(wanted):
            if ordinal < self.start + self.partition:
                break
            pod = by_ordinal[ordinal]
            if (pod["metadata"].get("labels") or {}).get(REVISION_LABEL) != update_rev:
                self._delete(pod)
                return

    def _create(self, ordinal: int, rev_name: str, template: dict[str, Any]) -> dict[str, Any]:
        pod_name = f"{self.name}-{ordinal}"
        template_meta = template.get("metadata") or {}
        labels = dict(template_meta.get("labels") or {})
        labels[REVISION_LABEL] = rev_name
        labels[POD_NAME_LABEL] = pod_name
        labels[POD_INDEX_LABEL] = str(ordinal)
        spec = copy.deepcopy(template.get("spec") or {})
        spec["hostname"] = pod_name
        if self.spec.get("serviceName"):
            spec["subdomain"] = self.spec["serviceName"]
        claims = self._claims(ordinal, pod_name)
        if claims:
            volumes = [v for v in spec.get("volumes") or [] if v.get("name") not in claims]
            for volume_name, claim_name in claims.items():
                volumes.append(
                    {"name": volume_name, "persistentVolumeClaim": {"claimName": claim_name}}
                )
            spec["volumes"] = volumes
        metadata: dict[str, Any] = {
            "name": pod_name,
            "namespace": self.namespace,
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "name": self.name,
                    "uid": self.meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        }
        if template_meta.get("annotations"):
            metadata["annotations"] = dict(template_meta["annotations"])
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
        try:
            created = self.store.insert(self.c.rt("pods"), pod).obj
        except errors.ApiError as exc:
            if exc.code != 409:
                raise
            # A pod of that name still terminates; the next pass recreates it.
            existing = self.store.peek(POD_KEY, self.namespace, pod_name)
            return existing.obj if existing is not None else pod
        self.c.events.record(
            self.sts,
            "Normal",
            "SuccessfulCreate",
            f"create Pod {pod_name} in StatefulSet {self.name} successful",
            component=COMPONENT,
        )
        return created

    def _claims(self, ordinal: int, pod_name: str) -> dict[str, str]:
        """Create the pod's PersistentVolumeClaims if missing; volume name -> claim name."""
        templates = self.spec.get("volumeClaimTemplates") or []
        result: dict[str, str] = {}
        if not templates:
            return result
        selector_labels = (self.spec.get("selector") or {}).get("matchLabels") or {}
        policy = self.spec.get("persistentVolumeClaimRetentionPolicy") or {}
        for claim in templates:
            claim_meta = claim.get("metadata") or {}
            volume = str(claim_meta.get("name", ""))
            claim_name = f"{volume}-{self.name}-{ordinal}"
            result[volume] = claim_name
            if self.store.peek(PVC_KEY, self.namespace, claim_name) is not None:
                continue
            metadata: dict[str, Any] = {
                "name": claim_name,
                "namespace": self.namespace,
                "labels": {**(claim_meta.get("labels") or {}), **selector_labels},
            }
            if claim_meta.get("annotations"):
                metadata["annotations"] = dict(claim_meta["annotations"])
            if policy.get("whenDeleted") == "Delete":
                metadata["ownerReferences"] = [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "StatefulSet",
                        "name": self.name,
                        "uid": self.meta["uid"],
                        "blockOwnerDeletion": True,
                    }
                ]
            claim_spec = copy.deepcopy(claim.get("spec") or {})
            claim_spec.setdefault("volumeMode", "Filesystem")
            self.store.insert(
                self.c.rt("persistentvolumeclaims"),
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": metadata,
                    "spec": claim_spec,
                    "status": {"phase": "Pending"},
                },
            )
            self.c.events.record(
                self.sts,
                "Normal",
                "SuccessfulCreate",
                f"create Claim {claim_name} Pod {pod_name} in StatefulSet {self.name} success",
                component=COMPONENT,
            )
        return result

    def _delete(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        self.c.delete_pod(self.sts, pod, f"delete Pod {name} in StatefulSet {self.name} successful")

    # ----- revisions ----------------------------------------------------------------------------

    def _ensure_revision(self, template: dict[str, Any]) -> tuple[str, dict[str, dict[str, Any]]]:
        """The update revision's name, and every revision's pod template by name."""
        rt = self.c.rt("controllerrevisions.apps")
        digest = scheduling.template_hash(template)
        rev_name = f"{self.name}-{digest}"
        owned: list[dict[str, Any]] = []
        for key, ns, name in self.store.dependents(self.meta["uid"]):
            if key != REVISION_KEY:
                continue
            found = self.store.peek(key, ns, name)
            if found is not None:
                owned.append(found.obj)
        highest = max((int(r.get("revision", 0)) for r in owned), default=0)
        existing = next((r for r in owned if r["metadata"]["name"] == rev_name), None)
        if existing is None:
            data_template = copy.deepcopy(template)
            data_template["$patch"] = "replace"
            revision: dict[str, Any] = {
                "apiVersion": "apps/v1",
                "kind": "ControllerRevision",
                "metadata": {
                    "name": rev_name,
                    "namespace": self.namespace,
                    "labels": {
                        **((template.get("metadata") or {}).get("labels") or {}),
                        HASH_LABEL: digest,
                    },
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "StatefulSet",
                            "name": self.name,
                            "uid": self.meta["uid"],
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "data": {"spec": {"template": data_template}},
                "revision": highest + 1,
            }
            owned.append(self.store.insert(rt, revision).obj)
        elif int(existing.get("revision", 0)) != highest:
            # Going back to an older template reuses its revision under the next number.
            updated = copy.deepcopy(existing)
            updated["revision"] = highest + 1
            owned = [r for r in owned if r is not existing]
            owned.append(
                self.store.replace(rt, updated, namespace=self.namespace, name=rev_name).obj
            )
        templates: dict[str, dict[str, Any]] = {}
        for entry in owned:
            data_template = copy.deepcopy(
                ((entry.get("data") or {}).get("spec") or {}).get("template") or {}
            )
            data_template.pop("$patch", None)
            templates[entry["metadata"]["name"]] = data_template
        self._prune(owned, rev_name)
        return rev_name, templates

    def _prune(self, owned: list[dict[str, Any]], update_rev: str) -> None:
        limit = int(self.spec.get("revisionHistoryLimit", 10))
        live = {update_rev, (self.sts.get("status") or {}).get("currentRevision")}
        live.update((p["metadata"].get("labels") or {}).get(REVISION_LABEL) for p in self._pods())
        history = sorted(
            (r for r in owned if r["metadata"]["name"] not in live),
            key=lambda r: int(r.get("revision", 0)),
        )
        for stale in history[: max(0, len(history) - limit)]:
            try:
                self.store.remove(
                    self.c.rt("controllerrevisions.apps"), self.namespace, stale["metadata"]["name"]
                )
            except errors.ApiError as exc:
                if exc.code != 404:
                    raise

    # ----- status -------------------------------------------------------------------------------

    def _write_status(self, update_rev: str, current_rev: str) -> None:
        pods = self._pods()
        min_ready = int(self.spec.get("minReadySeconds") or 0)
        replicas = ready = available = current = updated = 0
        recheck = -1.0
        for pod in pods:
            if (pod.get("status") or {}).get("phase"):
                replicas += 1
            if running_and_ready(pod) and not pod["metadata"].get("deletionTimestamp"):
                ready += 1
                wait = scheduling.ready_for(pod, min_ready)
                if wait == 0:
                    available += 1
                elif wait > 0:
                    recheck = wait if recheck < 0 else min(recheck, wait)
            if not pod["metadata"].get("deletionTimestamp"):
                revision = (pod["metadata"].get("labels") or {}).get(REVISION_LABEL)
                if revision == current_rev:
                    current += 1
                if revision == update_rev:
                    updated += 1
        if recheck > 0:
            self.c.enqueue_after((self.namespace, self.name), recheck + 0.01)
        if updated == self.replicas and ready == self.replicas and replicas == self.replicas:
            current_rev = update_rev
            current = updated
        old = self.sts.get("status") or {}
        status: dict[str, Any] = {
            "observedGeneration": self.meta.get("generation", 1),
            "replicas": replicas,
            "availableReplicas": available,
            "currentRevision": current_rev,
            "updateRevision": update_rev,
            "collisionCount": int(old.get("collisionCount") or 0),
        }
        for field, value in (
            ("readyReplicas", ready),
            ("currentReplicas", current),
            ("updatedReplicas", updated),
        ):
            if value:
                status[field] = value
        if old == status:
            return
        current_obj = self.store.peek(STS_KEY, self.namespace, self.name)
        if current_obj is None:
            return
        obj = current_obj.copy()
        obj["status"] = status
        self.store.replace(
            self.c.rt("statefulsets.apps"),
            obj,
            namespace=self.namespace,
            name=self.name,
            subresource="status",
        )
