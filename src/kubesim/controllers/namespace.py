"""Namespace controller: empties terminating namespaces, then finalizes them."""

from __future__ import annotations

import contextlib
from typing import Any

from kubesim import errors
from kubesim.controllers.base import Controller
from kubesim.store import NAMESPACE_KEY, Event


class NamespaceController(Controller):
    """Keys are namespace names."""

    name = "namespace-controller"
    # Namespaces, and deletions of everything else (one may empty a terminating namespace).
    resources = (NAMESPACE_KEY,)
    deleted_resources = None

    def initial_keys(self) -> list[Any]:
        return [s.obj["metadata"]["name"] for s in self.store.scan(NAMESPACE_KEY)]

    def on_event(self, event: Event) -> None:
        if event.key == NAMESPACE_KEY:
            if event.type != "DELETED":
                self.enqueue(event.new.obj["metadata"]["name"])
            return
        if event.type != "DELETED":
            return  # only deletions in a namespace matter (an Event's dict is built on read)
        namespace = event.new.obj["metadata"].get("namespace")
        if namespace:
            ns = self.store.peek(NAMESPACE_KEY, "", namespace)
            if ns is not None and ns.obj["metadata"].get("deletionTimestamp"):
                self.enqueue(namespace)

    def reconcile(self, key: Any) -> None:
        stored = self.store.peek(NAMESPACE_KEY, "", key)
        if stored is None:
            return
        if not stored.obj["metadata"].get("deletionTimestamp"):
            self._ensure_service_account(key)
            return
        remaining = 0
        for rt in self.store.registry.storage_types():
            if not rt.namespaced:
                continue
            for item in list(self.store.scan(rt.key, key)):
                remaining += 1
                if not item.obj["metadata"].get("deletionTimestamp"):
                    with contextlib.suppress(errors.ApiError):
                        self.store.remove(
                            rt, key, item.obj["metadata"]["name"], propagation="Background"
                        )
        if remaining and any(
            True
            for rt in self.store.registry.storage_types()
            if rt.namespaced
            for _ in self.store.scan(rt.key, key)
        ):
            return
        obj = stored.copy()
        obj.get("spec", {}).pop("finalizers", None)
        self.store.replace(self.rt("namespaces"), obj, namespace="", name=key)

    def _ensure_service_account(self, namespace: str) -> None:
        rt = self.rt("serviceaccounts")
        if self.store.peek(rt.key, namespace, "default") is None:
            with contextlib.suppress(errors.ApiError):
                self.store.insert(
                    rt,
                    {
                        "apiVersion": "v1",
                        "kind": "ServiceAccount",
                        "metadata": {"name": "default", "namespace": namespace},
                    },
                )
