"""Endpoints controller: one v1 Endpoints per selector Service, from the pods it selects.

Ready pods become `addresses`, not-ready ones `notReadyAddresses` (all ready with
`publishNotReadyAddresses`); terminating and finished pods and pods without an IP are left out.
Named `targetPort`s are resolved per pod from its container ports; a pod lacking the name is left
out of that port. Services without a selector get nothing from this controller (their Endpoints
are the user's), as upstream.
"""

from __future__ import annotations

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


def selected_pods(store: Store, service: dict[str, Any]) -> list[dict[str, Any]]:
    """The pods in the Service's namespace that its selector selects, by name."""
    namespace = service["metadata"].get("namespace", "")
    return [
        s.obj
        for s in store.scan(POD_KEY, namespace)
        if service_selects(service, s.obj["metadata"].get("labels"))
    ]


def batch_delay(selected: int) -> float:
    """How long pod changes of a Service selecting this many pods are gathered before a sync.

    A sync rebuilds the Service's whole address list, so syncing on every pod change costs
    O(pods squared) while thousands of pods start; like kube-controller-manager's
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

    def pods(self, service: dict[str, Any]) -> list[dict[str, Any]]:
        """The selected pods (built by one namespace scan the first time, or after the
        selector changed)."""
        return [s.obj for s in self._of(service).values()]

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

    def pod_changed(self, event: Event) -> list[tuple[str, str]]:
        """Update membership for a pod event; the keys of the Services it concerns."""
        meta = event.new.obj["metadata"]
        namespace = meta.get("namespace", "")
        labels = meta.get("labels")
        old_labels = event.old.obj["metadata"].get("labels") if event.old is not None else None
        affected = []
        for stored in self.store.scan(SERVICE_KEY, namespace):
            service = stored.obj
            selects = service_selects(service, labels)
            if not (selects or service_selects(service, old_labels)):
                continue
            key = (namespace, service["metadata"]["name"])
            affected.append(key)
            members = self._members.get(key)
            if members is None:
                continue  # built on first use
            if selects and event.type != "DELETED":
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

    def initial_keys(self) -> list[Any]:
        return self.keys_of(SERVICE_KEY)

    def enqueue_batched(self, key: tuple[str, str]) -> None:
        self.enqueue_after(key, batch_delay(self.selected.count(key)))

    def on_event(self, event: Event) -> None:
        if event.key == SERVICE_KEY:
            meta = event.new.obj["metadata"]
            key = (meta["namespace"], meta["name"])
            if event.type == "DELETED":
                self.selected.forget(key)
                self.memo.pop(key, None)
            self.enqueue(key)
        elif event.key == POD_KEY:
            for key in self.selected.pod_changed(event):
                self.enqueue_batched(key)


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
        memo = self.memo.setdefault(key, {})
        subsets, truncated = truncate(
            build_subsets(self.store, service, self.selected.pods(service), memo)
        )
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


def build_subsets(
    store: Store,
    service: dict[str, Any],
    pods: list[dict[str, Any]] | None = None,
    memo: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """EndpointSubsets for a Service, packed so addresses with the same ports share a subset
    (`pods`: the selected pods when the caller keeps them, else found by a namespace scan;
    `memo`: the caller's per-pod results of the last call, reused for unchanged pods)."""
    # (ready, address) per pod, plus the set of ports each address serves
    entries: dict[str, tuple[bool, dict[str, Any], frozenset[tuple[str, int, str]]]] = {}
    previous = dict(memo or {})
    for pod in selected_pods(store, service) if pods is None else pods:
        name = pod["metadata"]["name"]
        cached = previous.get(name)
        if cached is not None and cached[0] is pod and cached[1] is service:
            entry = cached[2]
        else:
            entry = _address(service, pod)
        if memo is not None:
            memo[name] = (pod, service, entry)
        previous.pop(name, None)
        if entry is not None:
            entries[entry[1]["ip"]] = entry
    if memo is not None:
        for gone in previous:
            memo.pop(gone, None)
    groups: dict[frozenset[tuple[str, int, str]], dict[str, list[dict[str, Any]]]] = {}
    for ready, address, ports in entries.values():
        group = groups.setdefault(ports, {"addresses": [], "notReadyAddresses": []})
        group["addresses" if ready else "notReadyAddresses"].append(address)
    subsets = []
    for port_set, group in groups.items():
        subset: dict[str, Any] = {}
        for field in ("addresses", "notReadyAddresses"):
            if group[field]:
                subset[field] = sorted(group[field], key=lambda a: ip_sort_key(a["ip"]))
        if port_set:
            subset["ports"] = [
                {**({"name": name} if name else {}), "port": port, "protocol": protocol}
                for name, port, protocol in sorted(port_set)
            ]
        subsets.append(subset)
    subsets.sort(key=lambda s: [(p.get("name", ""), p["port"]) for p in s.get("ports") or []])
    return subsets


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
