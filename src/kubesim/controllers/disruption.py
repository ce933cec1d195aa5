"""PodDisruptionBudgets: the eviction check and the controller that keeps PDB status current."""

from __future__ import annotations

from typing import Any

from kubesim import errors, selectors
from kubesim.controllers import scheduling
from kubesim.controllers.base import Controller
from kubesim.store import Event, Store

PDB_KEY = ("policy", "poddisruptionbudgets")
POD_KEY = ("", "pods")


def budget(store: Store, pdb: dict[str, Any]) -> dict[str, int]:
    """Expected, healthy and desired-healthy pod counts and allowed disruptions of a PDB."""
    spec = pdb.get("spec") or {}
    selector = selectors.from_label_selector_object(spec.get("selector"))
    namespace = pdb["metadata"]["namespace"]
    pods = [
        s.obj
        for s in store.scan(POD_KEY, namespace)
        if selector.matches(s.obj["metadata"].get("labels"))
        and not s.obj["metadata"].get("deletionTimestamp")
        and (s.obj.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]
    expected = len(pods)
    healthy = sum(1 for p in pods if scheduling.pod_ready(p))
    if "minAvailable" in spec:
        desired = scheduling.scaled_value(spec["minAvailable"], expected, True)
    elif "maxUnavailable" in spec:
        desired = max(0, expected - scheduling.scaled_value(spec["maxUnavailable"], expected, True))
    else:
        desired = expected
    return {
        "expectedPods": expected,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "disruptionsAllowed": max(0, healthy - desired),
    }


def check_eviction(store: Store, pod: dict[str, Any]) -> None:
    """Raise 429 when evicting `pod` would violate its PodDisruptionBudget."""
    labels = pod["metadata"].get("labels") or {}
    matching = []
    for stored in store.scan(PDB_KEY, pod["metadata"]["namespace"]):
        selector = selectors.from_label_selector_object(
            (stored.obj.get("spec") or {}).get("selector")
        )
        if selector.matches(labels):
            matching.append(stored.obj)
    if not matching:
        return
    if len(matching) > 1:
        raise errors.ApiError(
            500,
            "This pod has more than one PodDisruptionBudget, "
            "which the eviction subresource does not support.",
        )
    pdb = matching[0]
    counts = budget(store, pdb)
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed", "Pending"):
        return
    if not scheduling.pod_ready(pod):
        policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy", "IfHealthyBudget")
        if policy == "AlwaysAllow" or counts["currentHealthy"] >= counts["desiredHealthy"]:
            return
    elif counts["disruptionsAllowed"] >= 1:
        return
    name = pdb["metadata"]["name"]
    raise errors.ApiError(
        429,
        "Cannot evict pod as it would violate the pod's disruption budget.",
        reason="TooManyRequests",
        details={
            "causes": [
                {
                    "reason": "DisruptionBudget",
                    "message": f"The disruption budget {name} needs "
                    f"{counts['desiredHealthy']} healthy "
                    f"pods and has {counts['currentHealthy']} currently",
                }
            ]
        },
    )


class DisruptionController(Controller):
    """Keeps PodDisruptionBudget status (healthy, desired, allowed disruptions) up to date."""

    name = "disruption-controller"
    resources = (PDB_KEY, POD_KEY)

    def initial_keys(self) -> list[Any]:
        return self.keys_of(PDB_KEY)

    def on_event(self, event: Event) -> None:
        meta = event.new.obj["metadata"]
        if event.key == PDB_KEY and event.type != "DELETED":
            self.enqueue((meta["namespace"], meta["name"]))
        elif event.key == POD_KEY:
            for stored in self.store.scan(PDB_KEY, meta["namespace"]):
                self.enqueue((meta["namespace"], stored.obj["metadata"]["name"]))

    def reconcile(self, key: Any) -> None:
        stored = self.store.peek(PDB_KEY, *key)
        if stored is None:
            return
        counts = budget(self.store, stored.obj)
        old = stored.obj.get("status") or {}
        allowed = counts["disruptionsAllowed"] > 0
        previous = next(
            (c for c in old.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), None
        )
        condition = {
            "type": "DisruptionAllowed",
            "status": "True" if allowed else "False",
            "reason": "SufficientPods" if allowed else "InsufficientPods",
            "message": "",
            "observedGeneration": stored.obj["metadata"].get("generation", 1),
            "lastTransitionTime": previous["lastTransitionTime"]
            if previous and previous.get("status") == ("True" if allowed else "False")
            else _now(),
        }
        status = {
            **counts,
            "observedGeneration": stored.obj["metadata"].get("generation", 1),
            "conditions": [condition],
        }
        if old == status:
            return
        obj = stored.copy()
        obj["status"] = status
        self.store.replace(
            self.rt("poddisruptionbudgets"),
            obj,
            namespace=key[0],
            name=key[1],
            subresource="status",
        )


def _now() -> str:
    from kubesim.store import now

    return now()
