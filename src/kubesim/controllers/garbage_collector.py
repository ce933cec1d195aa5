"""Garbage collector: ownerReference cascades (background, foreground, orphan) and pod GC.

Like kube-controller-manager's, it ignores Events (core and events.k8s.io, its default
`GCIgnoredResources`): it neither follows nor tracks them, so an Event is never collected with
the object it names or owns, and an Event an object names as its owner is checked by a lookup,
as the real collector checks an owner it has no node for.
"""

from __future__ import annotations

import contextlib
from typing import Any

from kubesim import errors
from kubesim.controllers.base import Controller
from kubesim.resources import ResourceType
from kubesim.store import Event, Key

POD_KEY = ("", "pods")
NODE_KEY = ("", "nodes")
# kube-controller-manager's default --gc-ignored-resources (GarbageCollectorController config).
IGNORED = (("", "events"), ("events.k8s.io", "events"))


class GarbageCollector(Controller):
    """Deletes dependents whose owners are gone and finishes orphan/foreground deletions."""

    name = "garbage-collector"
    ignored_resources = IGNORED

    def start(self) -> None:
        self._uids: dict[str, tuple[Key, str, str]] = {}
        for key, stored in self.store.iter_all():
            if key in IGNORED:
                continue
            meta = stored.obj["metadata"]
            self._uids[meta["uid"]] = (key, meta.get("namespace", ""), meta["name"])
        super().start()

    def initial_keys(self) -> list[Any]:
        keys: list[Any] = []
        for key, stored in self.store.iter_all():
            if key in IGNORED:
                continue
            meta = stored.obj["metadata"]
            if meta.get("ownerReferences"):
                keys.append(("dependent", key, meta.get("namespace", ""), meta["name"]))
            if meta.get("deletionTimestamp"):
                keys.append(("owner", key, meta.get("namespace", ""), meta["name"]))
        return keys

    def on_event(self, event: Event) -> None:
        meta = event.new.obj["metadata"]
        ident = (event.key, meta.get("namespace", ""), meta["name"])
        uid = meta["uid"]
        if event.type == "DELETED":
            self._uids.pop(uid, None)
            if self.store.dependents(uid):
                self.enqueue(("owner-gone", uid))
            for ref in meta.get("ownerReferences") or ():
                owner = self._uids.get(ref.get("uid", ""))
                if owner is not None:
                    self.enqueue(("owner", *owner))
            if event.key == NODE_KEY:
                self.enqueue(("node-gone", meta["name"]))
            return
        self._uids[uid] = ident
        finalizers = meta.get("finalizers") or ()
        if meta.get("deletionTimestamp") and (
            "orphan" in finalizers or "foregroundDeletion" in finalizers
        ):
            self.enqueue(("owner", *ident))
        if meta.get("ownerReferences") and (
            event.old is None
            or event.old.obj["metadata"].get("ownerReferences") != meta.get("ownerReferences")
        ):
            self.enqueue(("dependent", *ident))

    def _type(self, key: Key) -> ResourceType | None:
        # Looked up for every new dependent: keep the map until the registry changes (CRDs).
        registry = self.store.registry
        cached = getattr(self, "_types", None)
        if cached is None or cached[0] != registry.generation:
            cached = self._types = (
                registry.generation,
                {rt.key: rt for rt in reversed(registry.storage_types())},
            )
        return cached[1].get(key)

    def reconcile(self, key: Any) -> None:
        kind = key[0]
        if kind == "owner-gone":
            for dep in self._dependents(key[1]):
                self._check_dependent(*dep)
        elif kind == "dependent":
            self._check_dependent(key[1], key[2], key[3])
        elif kind == "owner":
            self._finish_owner(key[1], key[2], key[3])
        elif kind == "node-gone":
            rt = self.rt("pods")
            for stored in list(self.store.scan(POD_KEY)):
                pod = stored.obj
                if (pod.get("spec") or {}).get("nodeName") == key[1]:
                    with contextlib.suppress(errors.ApiError):
                        self.store.remove(
                            rt, pod["metadata"]["namespace"], pod["metadata"]["name"], grace=0
                        )

    def _dependents(self, uid: str) -> list[tuple[Key, str, str]]:
        """The dependents of `uid` this collector follows (no Events)."""
        return [dep for dep in self.store.dependents(uid) if dep[0] not in IGNORED]

    def _ignored_owner(self, ref: dict[str, Any], namespace: str) -> bool:
        """Whether an owner of an ignored kind (an Event) exists: looked up, not tracked."""
        if ref.get("kind") != "Event":
            return False
        name = str(ref.get("name") or "")
        for key in IGNORED:
            found = self.store.peek(key, namespace, name)
            if found is not None and found.obj["metadata"].get("uid") == ref.get("uid"):
                return True
        return False

    def _check_dependent(self, key: Key, namespace: str, name: str) -> None:
        stored = self.store.peek(key, namespace, name)
        rt = self._type(key)
        if stored is None or rt is None:
            return
        refs = stored.obj["metadata"].get("ownerReferences") or []
        alive = [r for r in refs if r.get("uid") in self._uids or self._ignored_owner(r, namespace)]
        if len(alive) == len(refs):
            return
        if alive:
            obj = stored.copy()
            obj["metadata"]["ownerReferences"] = alive
            self.store.replace(rt, obj, namespace=namespace, name=name)
            return
        if stored.obj["metadata"].get("deletionTimestamp"):
            return
        self.store.remove(rt, namespace, name, propagation="Background")

    def _finish_owner(self, key: Key, namespace: str, name: str) -> None:
        stored = self.store.peek(key, namespace, name)
        rt = self._type(key)
        if stored is None or rt is None or not stored.obj["metadata"].get("deletionTimestamp"):
            return
        meta = stored.obj["metadata"]
        uid = meta["uid"]
        finalizers = list(meta.get("finalizers") or [])
        if "orphan" in finalizers:
            for dep_key, dep_ns, dep_name in self._dependents(uid):
                dep = self.store.peek(dep_key, dep_ns, dep_name)
                dep_rt = self._type(dep_key)
                if dep is None or dep_rt is None:
                    continue
                obj = dep.copy()
                obj["metadata"]["ownerReferences"] = [
                    r for r in obj["metadata"].get("ownerReferences") or [] if r.get("uid") != uid
                ]
                if not obj["metadata"]["ownerReferences"]:
                    del obj["metadata"]["ownerReferences"]
                self.store.replace(dep_rt, obj, namespace=dep_ns, name=dep_name)
            finalizers.remove("orphan")
        elif "foregroundDeletion" in finalizers:
            blocking = False
            for dep_key, dep_ns, dep_name in self._dependents(uid):
                dep = self.store.peek(dep_key, dep_ns, dep_name)
                dep_rt = self._type(dep_key)
                if dep is None or dep_rt is None:
                    continue
                if not dep.obj["metadata"].get("deletionTimestamp"):
                    self.store.remove(dep_rt, dep_ns, dep_name, propagation="Foreground")
                dep = self.store.peek(dep_key, dep_ns, dep_name)
                if dep is not None and any(
                    r.get("uid") == uid and r.get("blockOwnerDeletion")
                    for r in dep.obj["metadata"].get("ownerReferences") or []
                ):
                    blocking = True
            if blocking:
                return
            finalizers.remove("foregroundDeletion")
        else:
            return
        current = self.store.peek(key, namespace, name)
        if current is None:
            return
        obj = current.copy()
        if finalizers:
            obj["metadata"]["finalizers"] = finalizers
        else:
            obj["metadata"].pop("finalizers", None)
        self.store.replace(rt, obj, namespace=namespace, name=name)
