"""The resource claim controller (kube-controller-manager's, Kubernetes 1.35).

- For each pod entry naming a ResourceClaimTemplate it creates a claim from the template:
  `generateName` `<pod>-<entry>-`, the template's labels and annotations, the annotation
  `resource.kubernetes.io/pod-claim-name: <entry>`, and an owner reference to the pod
  (controller, blocking deletion); then it records `{name, resourceClaimName}` in the pod's
  `status.resourceClaimStatuses`. A claim it made earlier (found by owner and annotation) is
  reused, so a lost status write never creates a second claim.
- It drops `status.reservedFor` entries of pods that are gone or finished.
- A claim reserved for no one any more is deallocated: `status.allocation` is cleared and the
  scheduler's `resource.kubernetes.io/delete-protection` finalizer removed.
- A generated claim goes when its pod is gone or finished (the garbage collector would delete
  it with the pod too, through the owner reference).
"""

from __future__ import annotations

import copy
from typing import Any

from kubesim import errors
from kubesim.controllers.base import Controller
from kubesim.controllers.scheduler_dra import CLAIM_KEY, DELETE_PROTECTION
from kubesim.store import Event

POD_KEY = ("", "pods")
TEMPLATE_KEY = ("resource.k8s.io", "resourceclaimtemplates")
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
TERMINAL = ("Succeeded", "Failed")
NAME = "resource-claim-controller"


def generate_name(pod: str, entry: str) -> str:
    """The generateName of a claim for a pod entry (each part shortened as upstream does)."""
    if len(pod) + len(entry) > 57:
        pod, entry = pod[:29], entry[:28]
    return f"{pod}-{entry}-"


def claim_from_template(
    pod: dict[str, Any], entry: str, template: dict[str, Any]
) -> dict[str, Any]:
    """The ResourceClaim the controller creates for one pod entry (a pure function)."""
    meta = pod["metadata"]
    template_meta = (template.get("spec") or {}).get("metadata") or {}
    annotations = dict(template_meta.get("annotations") or {})
    annotations[POD_CLAIM_ANNOTATION] = entry
    claim_meta: dict[str, Any] = {
        "generateName": generate_name(meta["name"], entry),
        "namespace": meta.get("namespace", ""),
        "annotations": annotations,
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "uid": meta.get("uid", ""),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if template_meta.get("labels"):
        claim_meta["labels"] = dict(template_meta["labels"])
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": claim_meta,
        "spec": copy.deepcopy((template.get("spec") or {}).get("spec") or {}),
    }


class ResourceClaimController(Controller):
    """Claims from templates, reservations of gone pods, deallocation of unused claims."""

    name = NAME
    resources = (POD_KEY, CLAIM_KEY)

    def initial_keys(self) -> list[Any]:
        keys: list[Any] = []
        for stored in self.store.scan(POD_KEY):
            if (stored.obj.get("spec") or {}).get("resourceClaims"):
                meta = stored.obj["metadata"]
                keys.append(("pod", meta["namespace"], meta["name"]))
        for stored in self.store.scan(CLAIM_KEY):
            meta = stored.obj["metadata"]
            keys.append(("claim", meta["namespace"], meta["name"]))
        return keys

    def on_event(self, event: Event) -> None:
        meta = event.new.obj["metadata"]
        if event.key == CLAIM_KEY:
            self.enqueue(("claim", meta.get("namespace", ""), meta["name"]))
            return
        pod = event.new.obj
        old_claims = (event.old.obj.get("spec") or {}).get("resourceClaims") if event.old else None
        if not (pod.get("spec") or {}).get("resourceClaims") and not old_claims:
            return
        self.enqueue(("pod", meta.get("namespace", ""), meta["name"]))
        # Claims reserved for or made for this pod may need work when it goes.
        gone = event.type == "DELETED" or (pod.get("status") or {}).get("phase") in TERMINAL
        if gone:
            for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
                if status.get("resourceClaimName"):
                    self.enqueue(("claim", meta.get("namespace", ""), status["resourceClaimName"]))
            for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
                if entry.get("resourceClaimName"):
                    self.enqueue(("claim", meta.get("namespace", ""), entry["resourceClaimName"]))

    def reconcile(self, key: Any) -> None:
        kind, namespace, name = key
        if kind == "pod":
            self._pod(namespace, name)
        else:
            self._claim(namespace, name)

    # ----- pods --------------------------------------------------------------------------------

    def _pod(self, namespace: str, name: str) -> None:
        stored = self.store.peek(POD_KEY, namespace, name)
        if stored is None:
            return
        pod = stored.obj
        if (
            pod["metadata"].get("deletionTimestamp")
            or (pod.get("status") or {}).get("phase") in TERMINAL
        ):
            return
        statuses = list((pod.get("status") or {}).get("resourceClaimStatuses") or [])
        known = {s.get("name") for s in statuses}
        added = False
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
            template_name = entry.get("resourceClaimTemplateName")
            if template_name is None or entry.get("name") in known:
                continue
            claim_name = self._existing(pod, entry["name"])
            if claim_name is None:
                template = self.store.peek(TEMPLATE_KEY, namespace, template_name)
                if template is None:
                    # The real controller retries with backoff and reports the error.
                    self.events.record(
                        pod,
                        "Warning",
                        "FailedResourceClaimCreation",
                        f"PodResourceClaim {entry['name']}: resource claim template "
                        f'"{template_name}": resourceclaimtemplate.resource.k8s.io '
                        f'"{template_name}" not found',
                        component=NAME,
                    )
                    self.enqueue_after(("pod", namespace, name), 1.0)
                    continue
                claim = claim_from_template(pod, entry["name"], template.obj)
                created = self.store.insert(self.rt("resourceclaims.resource.k8s.io"), claim)
                claim_name = created.obj["metadata"]["name"]
            statuses.append({"name": entry["name"], "resourceClaimName": claim_name})
            added = True
        if added:
            obj = stored.copy()
            obj.setdefault("status", {})["resourceClaimStatuses"] = statuses
            self.store.replace(
                self.rt("pods"), obj, namespace=namespace, name=name, subresource="status"
            )

    def _existing(self, pod: dict[str, Any], entry: str) -> str | None:
        uid = pod["metadata"].get("uid", "")
        for dep_key, ns, dep_name in self.store.dependents(uid):
            if dep_key != CLAIM_KEY:
                continue
            found = self.store.peek(dep_key, ns, dep_name)
            if found is None:
                continue
            annotations = found.obj["metadata"].get("annotations") or {}
            if annotations.get(POD_CLAIM_ANNOTATION) == entry:
                return dep_name
        return None

    # ----- claims ------------------------------------------------------------------------------

    def _consumer_live(self, namespace: str, ref: dict[str, Any]) -> bool:
        if ref.get("resource") != "pods" or ref.get("apiGroup"):
            return True  # other consumers are not this controller's business
        pod = self.store.peek(POD_KEY, namespace, ref.get("name", ""))
        if pod is None or pod.obj["metadata"].get("uid") != ref.get("uid"):
            return False
        return (pod.obj.get("status") or {}).get("phase") not in TERMINAL

    def _claim(self, namespace: str, name: str) -> None:
        stored = self.store.peek(CLAIM_KEY, namespace, name)
        if stored is None:
            return
        claim = stored.obj
        rt = self.rt("resourceclaims.resource.k8s.io")
        # A generated claim whose pod is gone or finished is deleted.
        owner = next(
            (
                r
                for r in claim["metadata"].get("ownerReferences") or []
                if r.get("kind") == "Pod" and r.get("controller")
            ),
            None,
        )
        orphaned = owner is not None and not self._consumer_live(
            namespace, {"resource": "pods", "name": owner["name"], "uid": owner["uid"]}
        )
        if orphaned and not claim["metadata"].get("deletionTimestamp"):
            try:
                self.store.remove(rt, namespace, name)
            except errors.ApiError as exc:
                if exc.code != 404:
                    raise
            found = self.store.peek(CLAIM_KEY, namespace, name)
            if found is None:
                return
            stored, claim = found, found.obj
        status = claim.get("status") or {}
        reserved = status.get("reservedFor") or []
        keep = [r for r in reserved if self._consumer_live(namespace, r)]
        if keep != reserved:
            obj = stored.copy()
            obj["status"]["reservedFor"] = keep
            if not keep:
                obj["status"].pop("reservedFor")
            stored = self.store.replace(
                rt, obj, namespace=namespace, name=name, subresource="status"
            )
            claim = stored.obj
            status = claim.get("status") or {}
        if status.get("allocation") and not status.get("reservedFor"):
            obj = stored.copy()
            obj["status"].pop("allocation", None)
            stored = self.store.replace(
                rt, obj, namespace=namespace, name=name, subresource="status"
            )
        finalizers = stored.obj["metadata"].get("finalizers") or []
        if DELETE_PROTECTION in finalizers and not (stored.obj.get("status") or {}).get(
            "allocation"
        ):
            obj = stored.copy()
            obj["metadata"]["finalizers"] = [f for f in finalizers if f != DELETE_PROTECTION]
            self.store.replace(rt, obj, namespace=namespace, name=name)
