"""The scheduler's DynamicResources plugin: claims of a pod, per-node allocation, reservation.

Kept apart from the scheduler's resource accounting; the Scheduler calls it for pods with
`spec.resourceClaims`. It indexes ResourceSlices by node (node-local slices) and keeps the rest
(node-selector and all-nodes slices) in one list, caches CEL verdicts per device, and tracks
the devices every allocated claim holds. Its allocations are written before the pod is bound
and entered in that index at once, so the next attempt never hands out the same device: this
is the in-flight (assumed) allocation cache of the real plugin.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from kubesim.controllers import dra_allocation as alloc
from kubesim.store import Event, Store, Stored

CLAIM_KEY = ("resource.k8s.io", "resourceclaims")
SLICE_KEY = ("resource.k8s.io", "resourceslices")
CLASS_KEY = ("resource.k8s.io", "deviceclasses")
KEYS = (CLAIM_KEY, SLICE_KEY, CLASS_KEY)
PLUGIN = "DynamicResources"
CANNOT_ALLOCATE = "cannot allocate all claims"
NOT_ON_NODE = "resourceclaim not available on the node"
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"
# Cached CEL verdicts kept at most (they are shared by devices with equal fields, so a fleet of
# a few device models needs a handful per selector).
MAX_VERDICTS = 200_000


# A feasible node's allocations, built only for the node the pod is bound to.
Plan = Callable[[], list[dict[str, Any]]]


def NOTHING() -> list[dict[str, Any]]:
    """The plan of a pod whose claims are all allocated already."""
    return []


@dataclass(frozen=True)
class Simple:
    """The common case, decided per node without a search: one request for `count` devices
    (no firstAvailable, no constraints, no admin access) on a node without shared counters."""

    claim: Mapping[str, Any]
    request: str
    expressions: tuple[str, ...]
    count: int


@dataclass
class PodClaims:
    """A pod's claims as one attempt sees them."""

    claims: list[Stored] = field(default_factory=list)
    to_allocate: list[Stored] = field(default_factory=list)
    waiting: str = ""
    # Worked out once per attempt (`simple`): the fast path's request, or False.
    simple: Simple | bool | None = None


class DraPlugin:
    """State shared by scheduling attempts."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.local_slices: dict[str, dict[str, Mapping[str, Any]]] = {}
        self.shared_slices: dict[str, Mapping[str, Any]] = {}
        self.claim_devices: dict[tuple[str, str], set[alloc.DeviceId]] = {}
        self.in_use: set[alloc.DeviceId] = set()
        self.verdicts: dict[tuple[Any, ...], bool | str] = {}
        self._inventories: dict[str, alloc.Inventory] = {}

    def start(self) -> None:
        for stored in self.store.scan(SLICE_KEY):
            self._slice(stored.obj, False)
        for stored in self.store.scan(CLAIM_KEY):
            self._claim(stored.obj, False)

    # ----- indexes -----------------------------------------------------------------------------

    def on_event(self, event: Event) -> bool:
        """Index a DRA object change; True when waiting pods may now fit."""
        deleted = event.type == "DELETED"
        if event.key == SLICE_KEY:
            self._slice(event.new.obj, deleted)
            return True
        if event.key == CLAIM_KEY:
            return self._claim(event.new.obj, deleted)
        return event.key == CLASS_KEY

    def _slice(self, obj: Mapping[str, Any], deleted: bool) -> None:
        name = obj["metadata"]["name"]
        node = (obj.get("spec") or {}).get("nodeName")
        for bucket in (*self.local_slices.values(), self.shared_slices):
            if name in bucket:
                del bucket[name]
        if node:
            self._inventories.pop(node, None)
        else:
            self._inventories.clear()
        # Verdicts are keyed by device content (a changed device has new keys); only their
        # number is bounded.
        if len(self.verdicts) > MAX_VERDICTS:
            self.verdicts.clear()
        if deleted:
            return
        if node:
            self.local_slices.setdefault(node, {})[name] = obj
        else:
            self.shared_slices[name] = obj

    def _claim(self, obj: Mapping[str, Any], deleted: bool) -> bool:
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        allocation = (obj.get("status") or {}).get("allocation")
        devices: set[alloc.DeviceId] = set()
        if allocation and not deleted:
            for result in (allocation.get("devices") or {}).get("results") or []:
                if not result.get("adminAccess"):
                    devices.add((result["driver"], result["pool"], result["device"]))
        return self.hold(key, devices)

    def hold(self, key: tuple[str, str], devices: set[alloc.DeviceId]) -> bool:
        """Record the devices a claim holds; True when some were freed."""
        before = self.claim_devices.pop(key, set())
        self.in_use -= before
        if devices:
            self.claim_devices[key] = devices
            self.in_use |= devices
        return bool(before - devices)

    def inventory(self, node: Mapping[str, Any]) -> alloc.Inventory:
        name = node["metadata"]["name"]
        found = self._inventories.get(name)
        if found is None:
            slices = [*self.local_slices.get(name, {}).values(), *self.shared_slices.values()]
            found = self._inventories[name] = alloc.inventory(slices, node)
        return found

    # ----- one attempt -------------------------------------------------------------------------

    def pod_claims(self, pod: Mapping[str, Any]) -> PodClaims:
        """The pod's claims, or why the pod must wait (PreEnqueue: no attempt is made)."""
        result = PodClaims()
        meta = pod["metadata"]
        namespace = meta.get("namespace", "")
        statuses = {
            s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
            name = entry.get("resourceClaimName")
            if name is None and entry.get("resourceClaimTemplateName") is not None:
                if entry.get("name") not in statuses:
                    result.waiting = f'pod "{meta["name"]}": ResourceClaim not created yet'
                    return result
                name = statuses[entry.get("name")]
                if name is None:
                    continue  # no claim needed
            stored = self.store.peek(CLAIM_KEY, namespace, name or "")
            if stored is None:
                result.waiting = f'resourceclaim "{name}" not found'
                return result
            if stored.obj["metadata"].get("deletionTimestamp"):
                result.waiting = f'resourceclaim "{name}" is being deleted'
                return result
            result.claims.append(stored)
            if not (stored.obj.get("status") or {}).get("allocation"):
                result.to_allocate.append(stored)
        return result

    def classes(self) -> dict[str, Mapping[str, Any]]:
        return {s.obj["metadata"]["name"]: s.obj for s in self.store.scan(CLASS_KEY)}

    def _simple(
        self, pod_claims: PodClaims, classes: Mapping[str, Mapping[str, Any]]
    ) -> Simple | None:
        if pod_claims.simple is None:
            pod_claims.simple = False
            if len(pod_claims.to_allocate) == 1:
                claim = pod_claims.to_allocate[0].obj
                devices = (claim.get("spec") or {}).get("devices") or {}
                requests = alloc.requests_of(claim)
                if len(requests) == 1 and not devices.get("constraints"):
                    (request,) = requests
                    alt = request.alternatives[0] if request.alternatives else None
                    if (
                        alt is not None
                        and len(request.alternatives) == 1
                        and alt.mode == "ExactCount"
                        and not alt.admin
                        and alt.class_name in classes
                    ):
                        expressions = tuple(
                            (s.get("cel") or {}).get("expression", "")
                            for s in (classes[alt.class_name].get("spec") or {}).get("selectors")
                            or []
                        ) + tuple(alt.selectors)
                        pod_claims.simple = Simple(claim, request.name, expressions, alt.count)
        return pod_claims.simple if isinstance(pod_claims.simple, Simple) else None

    def filter(
        self,
        pod_claims: PodClaims,
        node: Mapping[str, Any],
        classes: Mapping[str, Mapping[str, Any]],
    ) -> tuple[str, Plan | None]:
        """(reason, plan): no reason means the claims fit this node; the plan builds their
        allocations (only the chosen node's is ever built)."""
        from kubesim.controllers import scheduling

        for stored in pod_claims.claims:
            selector = ((stored.obj.get("status") or {}).get("allocation") or {}).get(
                "nodeSelector"
            )
            if selector:
                pod_like = {
                    "affinity": {
                        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": selector}
                    }
                }
                if not scheduling.node_selected(dict(node), pod_like):
                    return NOT_ON_NODE, None
        if not pod_claims.to_allocate:
            return "", NOTHING
        inventory = self.inventory(node)
        counters: dict[alloc.CounterKey, Fraction] = {}
        for device in inventory.devices if inventory.counters else ():
            if device.ident in self.in_use:
                for key, amount in device.consumes().items():
                    counters[key] = counters.get(key, Fraction(0)) + amount
        allocator = alloc.Allocator(
            inventory, classes, self.in_use, counters, node["metadata"]["name"], self.verdicts
        )
        claims: list[Mapping[str, Any]] = [s.obj for s in pod_claims.to_allocate]
        simple = self._simple(pod_claims, classes)
        try:
            if simple is not None and not inventory.counters:
                # Enough free matching devices is all it takes; the search runs only for the
                # node the pod goes to (and finds the same devices).
                found = inventory.matching.get(simple.expressions)
                if found is None:
                    found = allocator.candidates(simple.claim, simple.expressions, simple.request)
                free = 0
                for device in found:
                    if device.ident not in self.in_use:
                        free += 1
                        if free == simple.count:
                            return "", lambda: allocator.allocate(claims) or []
                return CANNOT_ALLOCATE, None
            allocated = allocator.allocate(claims)
        except alloc.AllocationError as exc:
            return str(exc), None
        if allocated is None:
            return CANNOT_ALLOCATE, None
        return "", lambda: allocated

    def reserve(
        self,
        pod: Mapping[str, Any],
        pod_claims: PodClaims,
        plan: Plan,
        write: Any,
    ) -> None:
        """Write allocations and reservations (before the pod is bound)."""
        allocations = plan()
        meta = pod["metadata"]
        consumer = {"resource": "pods", "name": meta["name"], "uid": meta.get("uid", "")}
        fresh = {id(s): a for s, a in zip(pod_claims.to_allocate, allocations, strict=True)}
        for stored in pod_claims.claims:
            obj = stored.copy()
            status = obj.setdefault("status", {})
            allocation = fresh.get(id(stored))
            if allocation is not None:
                status["allocation"] = allocation
                finalizers = obj["metadata"].setdefault("finalizers", [])
                if DELETE_PROTECTION not in finalizers:
                    finalizers.append(DELETE_PROTECTION)
                key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
                # Assume at once: the next attempt must not see these devices as free.
                self.hold(
                    key,
                    {
                        (r["driver"], r["pool"], r["device"])
                        for r in allocation["devices"]["results"]
                        if not r.get("adminAccess")
                    },
                )
            reserved = status.setdefault("reservedFor", [])
            if not any(r.get("uid") == consumer["uid"] for r in reserved):
                reserved.append(dict(consumer))
            write(obj, allocation is not None)
