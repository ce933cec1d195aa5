"""Endpoints controller: one v1 Endpoints per selector Service, from the pods it selects.

Ready pods become `addresses`, not-ready ones `notReadyAddresses` (all ready with
`publishNotReadyAddresses`); terminating and finished pods and pods without an IP are left out.
Named `targetPort`s are resolved per pod from its container ports; a pod lacking the name is left
out of that port. Services without a selector get nothing from this controller (their Endpoints
are the user's), as upstream.

Syncs are incremental: each Service keeps its addresses grouped by served ports and in address
order, and a sync re-derives only the pods that changed since the last one. Two pods with the
same IP (host-network pods) are two addresses, as upstream keys addresses by IP and pod.
"""

from __future__ import annotations

import bisect
import contextlib
from typing import Any

from kubesim import errors
from kubesim.controllers import scheduling
from kubesim.controllers.base import Controller
from kubesim.store import Event, Store, Stored, now

SERVICE_KEY = ("", "services")
POD_KEY = ("", "pods")
ENDPOINTS_KEY = ("", "endpoints")
MANAGED_BY = "endpoints.kubernetes.io/managed-by"
CONTROLLER_NAME = "endpoint-controller"
TRIGGER_TIME = "endpoints.kubernetes.io/last-change-trigger-time"
HEADLESS_LABEL = "service.kubernetes.io/headless"
# Since 1.22 the Endpoints controller stores at most 1000 addresses per Endpoints object and
# marks a truncated one with this annotation (EndpointSlices carry the rest).
MAX_ADDRESSES = 1000
OVER_CAPACITY = "endpoints.kubernetes.io/over-capacity"
# Services selecting at most this many pods are synced on every pod change.
BATCH_FREE_PODS = 100
# Label sets remembered with the Services that select them (per namespace, until a Service
# changes); more distinct sets than this start the memory afresh.
_MATCH_LIMIT = 10_000


def service_selects(service: dict[str, Any], labels: dict[str, str] | None) -> bool:
    """Whether a Service's (map) selector selects a label set; no selector selects nothing."""
    selector = (service.get("spec") or {}).get("selector") or {}
    if not selector:
        return False
    labels = labels or {}
    return all(labels.get(k) == v for k, v in selector.items())


def managed(service: dict[str, Any]) -> bool:
    """Whether the endpoint controllers build endpoints for this Service."""
    spec = service.get("spec") or {}
    return bool(spec.get("selector")) and spec.get("type") != "ExternalName"


def batch_delay(selected: int) -> float:
    """How long pod changes of a Service selecting this many pods are gathered before a sync.

    A sync re-derives only the changed pods but still lists (and the store encodes) the
    Service's whole address list, so syncing on every pod change would cost O(pods squared)
    writes while thousands of pods start; like kube-controller-manager's
    --endpoint-updates-batch-period, changes are batched, here for a time that grows with the
    Service (nothing for a few pods, 1 s at 5,000).
    """
    return 0.0 if selected <= BATCH_FREE_PODS else min(1.0, selected / 5000)


class ServicePods:
    """The pods each selector Service selects, kept from store events so that a sync reads only
    its Service's pods instead of scanning every pod in the namespace."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._members: dict[tuple[str, str], dict[str, Stored]] = {}
        self._selectors: dict[tuple[str, str], Any] = {}
        # (namespace, label items) -> the Services selecting that label set: the pods of a
        # workload share a few label sets, so a pod event tests no selector at all.
        self._matches: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[str, str]]] = {}

    def members(self, service: dict[str, Any]) -> dict[str, Stored]:
        """The selected pods by name (the live index, kept up to date by `pod_changed`;
        callers must not change it)."""
        return self._of(service)

    def count(self, key: tuple[str, str]) -> int:
        """How many pods a Service selects (0 when not yet built)."""
        return len(self._members.get(key) or ())

    def _of(self, service: dict[str, Any]) -> dict[str, Stored]:
        meta = service["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        selector = (service.get("spec") or {}).get("selector")
        members = self._members.get(key)
        if members is None or self._selectors.get(key) != selector:
            members = self._members[key] = {
                s.obj["metadata"]["name"]: s
                for s in self.store.scan(POD_KEY, key[0])
                if service_selects(service, s.obj["metadata"].get("labels"))
            }
            self._selectors[key] = selector
        return members

    def forget(self, key: tuple[str, str]) -> None:
        """Drop a deleted Service's members."""
        self._members.pop(key, None)
        self._selectors.pop(key, None)

    def service_changed(self) -> None:
        """A Service was created, changed or deleted: selections are computed afresh."""
        self._matches.clear()

    def _selecting(self, namespace: str, labels: dict[str, str] | None) -> list[tuple[str, str]]:
        """The Services in a namespace whose selector selects a label set."""
        ident = (namespace, tuple(labels.items()) if labels else ())
        found = self._matches.get(ident)
        if found is None:
            found = [
                (namespace, stored.obj["metadata"]["name"])
                for stored in self.store.scan(SERVICE_KEY, namespace)
                if service_selects(stored.obj, labels)
            ]
            if len(self._matches) >= _MATCH_LIMIT:
                self._matches.clear()
            self._matches[ident] = found
        return found

    def pod_changed(self, event: Event) -> list[tuple[str, str]]:
        """Update membership for a pod event; the keys of the Services it concerns."""
        meta = event.new.obj["metadata"]
        namespace = meta.get("namespace", "")
        labels = meta.get("labels")
        selecting = self._selecting(namespace, labels)
        affected = list(selecting)
        if event.old is not None:
            old_labels = event.old.obj["metadata"].get("labels")
            if old_labels != labels:
                affected += [k for k in self._selecting(namespace, old_labels) if k not in affected]
        for key in affected:
            members = self._members.get(key)
            if members is None:
                continue  # built on first use
            if event.type != "DELETED" and key in selecting:
                members[meta["name"]] = event.new
            else:
                members.pop(meta["name"], None)
        return affected


def pod_ip(pod: dict[str, Any]) -> str:
    """The pod's primary IP, or "" before the kubelet reports one."""
    status = pod.get("status") or {}
    ips = status.get("podIPs") or []
    return str((ips[0].get("ip") if ips else None) or status.get("podIP") or "")


def eligible(pod: dict[str, Any], include_terminating: bool) -> bool:
    """Whether a pod belongs in endpoints at all (has an IP, not finished, maybe terminating)."""
    if not pod_ip(pod):
        return False
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    return include_terminating or not pod["metadata"].get("deletionTimestamp")


def resolve_port(pod: dict[str, Any], service_port: dict[str, Any]) -> int | None:
    """The pod port a Service port targets: a number as is, a name via the container ports."""
    target = service_port.get("targetPort", service_port.get("port"))
    if isinstance(target, int):
        return target
    if isinstance(target, str) and target.isdigit():
        return int(target)
    protocol = service_port.get("protocol", "TCP")
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == target and port.get("protocol", "TCP") == protocol:
                return int(port["containerPort"])
    return None


def target_ref(pod: dict[str, Any]) -> dict[str, Any]:
    """The ObjectReference endpoints carry to their pod."""
    meta = pod["metadata"]
    return {
        "kind": "Pod",
        "namespace": meta.get("namespace", ""),
        "name": meta["name"],
        "uid": meta.get("uid", ""),
    }


def hostname(pod: dict[str, Any], service: dict[str, Any]) -> str:
    """The DNS hostname a pod publishes through a Service (`hostname` with a matching subdomain)."""
    spec = pod.get("spec") or {}
    if spec.get("hostname") and spec.get("subdomain") == service["metadata"]["name"]:
        return str(spec["hostname"])
    return ""


class ServiceController(Controller):
    """Keys are (namespace, name) of selector Services; `memo` keeps per-Service state that a
    Service's deletion drops. Pod changes are batched on big Services (`batch_delay`)."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.selected = ServicePods(store)
        self.memo: dict[tuple[str, str], Any] = {}
        # Per Service, the pods whose endpoints may have changed since its last sync.
        self.dirty: dict[tuple[str, str], set[str]] = {}

    def initial_keys(self) -> list[Any]:
        return self.keys_of(SERVICE_KEY)

    def enqueue_batched(self, key: tuple[str, str]) -> None:
        self.enqueue_after(key, batch_delay(self.selected.count(key)))

    def on_event(self, event: Event) -> None:
        if event.key == SERVICE_KEY:
            meta = event.new.obj["metadata"]
            key = (meta["namespace"], meta["name"])
            self.selected.service_changed()
            if event.type == "DELETED":
                self.selected.forget(key)
                self.memo.pop(key, None)
                self.dirty.pop(key, None)
            self.enqueue(key)
        elif event.key == POD_KEY:
            name = event.new.obj["metadata"]["name"]
            for key in self.selected.pod_changed(event):
                self.dirty.setdefault(key, set()).add(name)
                self.enqueue_batched(key)

    def changed_pods(
        self, key: tuple[str, str], service: dict[str, Any], state: Any
    ) -> tuple[dict[str, Stored], set[str]]:
        """The Service's selected pods by name, and those to derive again: the ones changed
        since the last sync, or all when there was none or the Service changed since."""
        members = self.selected.members(service)
        changed = self.dirty.pop(key, set())
        if state is None or state.service is not service:
            changed = set(members)
        return members, changed


class EndpointsController(ServiceController):
    """Keys are (namespace, name) of Services."""

    name = "endpoint-controller"
    resources = (SERVICE_KEY, POD_KEY)

    def reconcile(self, key: Any) -> None:
        namespace, name = key
        rt = self.rt("endpoints")
        current = self.store.peek(ENDPOINTS_KEY, namespace, name)
        stored = self.store.peek(SERVICE_KEY, namespace, name)
        if stored is None or stored.obj["metadata"].get("deletionTimestamp"):
            if current is not None and _ours(current.obj):
                with contextlib.suppress(errors.ApiError):
                    self.store.remove(rt, namespace, name)
            return
        service = stored.obj
        if not managed(service):
            return
        state = self.memo.get(key)
        members, changed = self.changed_pods(key, service, state)
        if state is None or state.service is not service:
            state = self.memo[key] = _Subsets(service)
        for pod_name in changed:
            stored_pod = members.get(pod_name)
            state.put(pod_name, _address(service, stored_pod.obj) if stored_pod else None)
        subsets, truncated = truncate(state.subsets())
        labels = dict(service["metadata"].get("labels") or {})
        labels[MANAGED_BY] = CONTROLLER_NAME
        if (service.get("spec") or {}).get("clusterIP") == "None":
            labels[HEADLESS_LABEL] = ""
        if current is None:
            annotations = {TRIGGER_TIME: now()}
            if truncated:
                annotations[OVER_CAPACITY] = "truncated"
            endpoints: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "Endpoints",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": labels,
                    "annotations": annotations,
                },
            }
            if subsets:
                endpoints["subsets"] = subsets
            self.store.insert(rt, endpoints)
            return
        existing = current.obj
        marked = OVER_CAPACITY in (existing["metadata"].get("annotations") or {})
        if (
            existing.get("subsets", []) == subsets
            and existing["metadata"].get("labels") == labels
            and marked == truncated
        ):
            return
        obj = current.copy()
        obj["metadata"]["labels"] = labels
        annotations = obj["metadata"].setdefault("annotations", {})
        annotations[TRIGGER_TIME] = now()
        if truncated:
            annotations[OVER_CAPACITY] = "truncated"
        else:
            annotations.pop(OVER_CAPACITY, None)
        if subsets:
            obj["subsets"] = subsets
        else:
            obj.pop("subsets", None)
        self.store.replace(rt, obj, namespace=namespace, name=name)


_Address = tuple[bool, dict[str, Any], frozenset[tuple[str, int, str]]]
# (address sort key, pod name, address)
_Keyed = tuple[tuple[int, ...], str, dict[str, Any]]


def _keyed_order(item: _Keyed) -> tuple[tuple[int, ...], str]:
    return (item[0], item[1])


class _Subsets:
    """One Service's addresses as last synced: per pod its address, and per set of served
    ports the ready and not-ready addresses in (address, pod name) order."""

    __slots__ = ("entries", "groups", "service")

    def __init__(self, service: dict[str, Any]) -> None:
        self.service = service
        self.entries: dict[str, _Address] = {}
        self.groups: dict[frozenset[tuple[str, int, str]], tuple[list[_Keyed], list[_Keyed]]] = {}

    def put(self, name: str, entry: _Address | None) -> None:
        """Set or (None) drop one pod's address, keeping the groups sorted."""
        old = self.entries.pop(name, None)
        if old is not None:
            ready, address, ports = old
            group = self.groups[ports]
            keyed = group[0 if ready else 1]
            at = bisect.bisect_left(keyed, (ip_sort_key(address["ip"]), name), key=_keyed_order)
            if at < len(keyed) and keyed[at][1] == name:
                del keyed[at]
            if not group[0] and not group[1]:
                del self.groups[ports]
        if entry is not None:
            self.entries[name] = entry
            ready, address, ports = entry
            group = self.groups.setdefault(ports, ([], []))
            bisect.insort(
                group[0 if ready else 1],
                (ip_sort_key(address["ip"]), name, address),
                key=_keyed_order,
            )

    def subsets(self) -> list[dict[str, Any]]:
        """EndpointSubsets: one per set of served ports, ordered by their ports."""
        result = []
        for port_set, (ready, not_ready) in self.groups.items():
            subset: dict[str, Any] = {}
            if ready:
                subset["addresses"] = [address for _, _, address in ready]
            if not_ready:
                subset["notReadyAddresses"] = [address for _, _, address in not_ready]
            if port_set:
                subset["ports"] = [
                    {**({"name": name} if name else {}), "port": port, "protocol": protocol}
                    for name, port, protocol in sorted(port_set)
                ]
            result.append((sorted(port_set), subset))
        result.sort(key=lambda item: ([(n, p) for n, p, _ in item[0]], item[0]))
        return [subset for _, subset in result]


def _ours(endpoints: dict[str, Any]) -> bool:
    return (endpoints["metadata"].get("labels") or {}).get(MANAGED_BY) == CONTROLLER_NAME


def truncate(subsets: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """At most MAX_ADDRESSES addresses, ready ones first (subsets in order); whether any went."""
    total = sum(
        len(s.get("addresses") or ()) + len(s.get("notReadyAddresses") or ()) for s in subsets
    )
    if total <= MAX_ADDRESSES:
        return subsets, False
    room = MAX_ADDRESSES
    kept: dict[int, dict[str, Any]] = {}
    for field in ("addresses", "notReadyAddresses"):
        for index, subset in enumerate(subsets):
            take = (subset.get(field) or [])[:room]
            room -= len(take)
            if take:
                kept.setdefault(index, {k: v for k, v in subset.items() if k == "ports"})[field] = (
                    take
                )
    return [kept[i] for i in sorted(kept)], True


def _address(
    service: dict[str, Any], pod: dict[str, Any]
) -> tuple[bool, dict[str, Any], frozenset[tuple[str, int, str]]] | None:
    """(ready, address, served ports) of one pod, or None when it has no place in Endpoints."""
    spec = service.get("spec") or {}
    service_ports = spec.get("ports") or []
    if not eligible(pod, include_terminating=False):
        return None
    address: dict[str, Any] = {"ip": pod_ip(pod)}
    host = hostname(pod, service)
    if host:
        address["hostname"] = host
    node = (pod.get("spec") or {}).get("nodeName")
    if node:
        address["nodeName"] = node
    address["targetRef"] = target_ref(pod)
    ready = bool(spec.get("publishNotReadyAddresses")) or scheduling.pod_ready(pod)
    ports: set[tuple[str, int, str]] = set()
    for service_port in service_ports:
        number = resolve_port(pod, service_port)
        if number is not None:
            ports.add((service_port.get("name", ""), number, service_port.get("protocol", "TCP")))
    if service_ports and not ports:
        return None
    return ready, address, frozenset(ports)


def ip_sort_key(ip: str) -> tuple[int, ...]:
    """Sort IPv4 addresses numerically."""
    try:
        return tuple(int(part) for part in ip.split("."))
    except ValueError:
        return (0,)
