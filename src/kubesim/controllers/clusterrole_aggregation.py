"""ClusterRole aggregation: a ClusterRole with an aggregationRule gets its selected roles' rules."""

from __future__ import annotations

from typing import Any

from kubesim import selectors
from kubesim.controllers.base import Controller
from kubesim.store import Event

CLUSTER_ROLES = ("rbac.authorization.k8s.io", "clusterroles")


class ClusterRoleAggregationController(Controller):
    """Keys are names of aggregated ClusterRoles; any ClusterRole change re-queues them all."""

    name = "clusterrole-aggregation-controller"
    resources = (CLUSTER_ROLES,)

    def initial_keys(self) -> list[Any]:
        return self._aggregated()

    def on_event(self, event: Event) -> None:
        if event.key == CLUSTER_ROLES:
            for name in self._aggregated():
                self.enqueue(name)

    def _aggregated(self) -> list[str]:
        return [
            s.obj["metadata"]["name"]
            for s in self.store.scan(CLUSTER_ROLES)
            if s.obj.get("aggregationRule")
        ]

    def reconcile(self, key: Any) -> None:
        stored = self.store.peek(CLUSTER_ROLES, "", key)
        if stored is None or not stored.obj.get("aggregationRule"):
            return
        rule = stored.obj["aggregationRule"]
        chosen = [
            selectors.from_label_selector_object(s) for s in rule.get("clusterRoleSelectors") or ()
        ]
        rules: list[dict[str, Any]] = []
        # Like the real controller: selected roles in name order, each distinct rule once.
        for other in self.store.scan(CLUSTER_ROLES):
            meta = other.obj["metadata"]
            if meta["name"] == key:
                continue
            if not any(sel.matches(meta.get("labels")) for sel in chosen):
                continue
            for item in other.obj.get("rules") or ():
                if item not in rules:
                    rules.append(item)
        if rules == (stored.obj.get("rules") or []):
            return
        obj = stored.copy()
        obj["rules"] = rules
        self.store.replace(self.rt("clusterroles"), obj, namespace="", name=key)
