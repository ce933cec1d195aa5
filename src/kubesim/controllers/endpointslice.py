"""EndpointSlice controller: discovery.k8s.io/v1 slices for each selector Service.

Endpoints with the same resolved ports share slices of at most 100 endpoints; a Service that
selects no pods keeps one empty placeholder slice, as upstream. Terminating pods stay in with
`ready: false` and `terminating: true`; `serving` follows pod readiness. Slices carry the
`kubernetes.io/service-name` and `endpointslice.kubernetes.io/managed-by` labels and are owned by
the Service (the garbage collector removes them with it).

Syncs are incremental, as upstream's: each Service keeps its endpoints grouped by ports and in
address order, and a sync re-derives only the endpoints of the pods that changed since the last
one (or whose node changed zone: nodes are watched for their `topology.kubernetes.io/zone`),
not the whole Service; its own slice writes do not queue the Service again.
"""

from __future__ import annotations

import bisect
from typing import Any

from kubesim.controllers import endpoints as common
from kubesim.controllers import scheduling
from kubesim.store import Event, Stored, now

SERVICE_KEY = common.SERVICE_KEY
POD_KEY = common.POD_KEY
SLICE_KEY = ("discovery.k8s.io", "endpointslices")
NODE_KEY = ("", "nodes")
SERVICE_NAME = "kubernetes.io/service-name"
MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
CONTROLLER_NAME = "endpointslice-controller.k8s.io"
MAX_ENDPOINTS = 100
ZONE_LABEL = "topology.kubernetes.io/zone"

Ports = list[dict[str, Any]]
# (ports key, ports, endpoint, address sort key)
_Entry = tuple[str, Ports, dict[str, Any], tuple[int, ...]]


class _Groups:
    """One Service's endpoints as last synced: per pod its entry, and per ports key the entries
    in (address, pod name) order, as the slices list them."""

    __slots__ = ("entries", "groups", "service")

    def __init__(self, service: dict[str, Any]) -> None:
        self.service = service
        self.entries: dict[str, _Entry | None] = {}
        # ports key -> (ports, [(address sort key, pod name, endpoint)])
        self.groups: dict[str, tuple[Ports, list[tuple[tuple[int, ...], str, dict[str, Any]]]]] = {}

    def put(self, name: str, entry: _Entry | None) -> None:
        """Set (or with None and no pod, drop) one pod's entry, keeping the groups sorted."""
        old = self.entries.pop(name, None)
        if old is not None:
            group = self.groups[old[0]][1]
            at = bisect.bisect_left(group, (old[3], name), key=_sort_key)
            if at < len(group) and group[at][1] == name:
                del group[at]
            if not group:
                del self.groups[old[0]]
        self.entries[name] = entry
        if entry is not None:
            key, ports, endpoint, order = entry
            bisect.insort(
                self.groups.setdefault(key, (ports, []))[1], (order, name, endpoint), key=_sort_key
            )


def _sort_key(item: tuple[tuple[int, ...], str, dict[str, Any]]) -> tuple[tuple[int, ...], str]:
    return (item[0], item[1])


class EndpointSliceController(common.ServiceController):
    """Keys are (namespace, name) of Services; `memo` holds each Service's `_Groups`, `dirty`
    the pods whose endpoints changed since its last sync."""

    name = "endpointslice-controller"
    resources = (SERVICE_KEY, POD_KEY, SLICE_KEY, NODE_KEY)
    memo: dict[tuple[str, str], _Groups]

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        # True while this controller writes a slice: the store reports the write synchronously,
        # and what the controller wrote itself needs no sync.
        self._writing = False

    def on_event(self, event: Event) -> None:
        if event.key == NODE_KEY:
            self._node_event(event)
            return
        if event.key != SLICE_KEY:
            super().on_event(event)
            return
        if self._writing:
            return
        labels = event.new.obj["metadata"].get("labels") or {}
        if labels.get(MANAGED_BY) == CONTROLLER_NAME and labels.get(SERVICE_NAME):
            # Someone else's write (or deletion) of one of our slices: batched like pod changes.
            self.enqueue_batched((event.new.obj["metadata"]["namespace"], labels[SERVICE_NAME]))

    def _node_event(self, event: Event) -> None:
        """A node whose zone changed (or that went): its endpoints are derived again."""
        zone = (event.new.obj["metadata"].get("labels") or {}).get(ZONE_LABEL)
        if event.type == "DELETED":
            zone = None
        old = event.old.obj["metadata"] if event.old is not None else None
        if ((old.get("labels") or {}) if old is not None else {}).get(ZONE_LABEL) == zone:
            return
        node = event.new.obj["metadata"]["name"]
        for key, state in self.memo.items():
            for pod, entry in state.entries.items():
                if entry is not None and entry[2].get("nodeName") == node:
                    self.dirty.setdefault(key, set()).add(pod)
                    self.enqueue_batched(key)

    def _write(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        self._writing = True
        try:
            return call(*args, **kwargs)
        finally:
            self._writing = False

    def reconcile(self, key: Any) -> None:
        namespace, name = key
        stored = self.store.peek(SERVICE_KEY, namespace, name)
        existing = self._owned_slices(namespace, name)
        rt = self.rt("endpointslices.discovery.k8s.io")
        if (
            stored is None
            or stored.obj["metadata"].get("deletionTimestamp")
            or not common.managed(stored.obj)
        ):
            for slice_ in existing:
                self._write(self.store.remove, rt, namespace, slice_.obj["metadata"]["name"])
            self.memo.pop(key, None)
            self.dirty.pop(key, None)
            return
        service = stored.obj
        desired = self._desired(service)
        labels = dict(service["metadata"].get("labels") or {})
        labels[SERVICE_NAME] = name
        labels[MANAGED_BY] = CONTROLLER_NAME
        if (service.get("spec") or {}).get("clusterIP") == "None":
            labels[common.HEADLESS_LABEL] = ""
        by_ports: dict[str, list[Stored]] = {}
        for slice_ in existing:
            by_ports.setdefault(_ports_key(slice_.obj.get("ports")), []).append(slice_)
        matched: list[tuple[Stored | None, Ports | None, list[Any] | None]] = []
        for ports, endpoint_list in desired:
            candidates = by_ports.get(_ports_key(ports), [])
            matched.append((candidates.pop(0) if candidates else None, ports, endpoint_list))
        # As upstream, a slice that would be deleted is rewritten instead of creating another.
        spare = [s for group in by_ports.values() for s in group]
        for slice_ in existing:
            if slice_.obj["metadata"].get("deletionTimestamp") and slice_ in spare:
                spare.remove(slice_)
        for index, (current, ports, endpoint_list) in enumerate(matched):
            if current is None and spare:
                matched[index] = (spare.pop(0), ports, endpoint_list)
        for current, ports, endpoint_list in matched:
            if current is None:
                self._write(
                    self.store.insert,
                    rt,
                    {
                        "apiVersion": "discovery.k8s.io/v1",
                        "kind": "EndpointSlice",
                        "metadata": {
                            "generateName": f"{name}-",
                            "namespace": namespace,
                            "labels": labels,
                            "annotations": {common.TRIGGER_TIME: now()},
                            "ownerReferences": [_owner(service)],
                        },
                        "addressType": "IPv4",
                        "endpoints": endpoint_list,
                        "ports": ports,
                    },
                )
                continue
            obj = current.obj
            if (
                obj.get("endpoints") == endpoint_list
                and obj.get("ports") == ports
                and obj["metadata"].get("labels") == labels
            ):
                continue
            updated = current.copy()
            updated["endpoints"] = endpoint_list
            updated["ports"] = ports
            updated["metadata"]["labels"] = labels
            updated["metadata"].setdefault("annotations", {})[common.TRIGGER_TIME] = now()
            self._write(
                self.store.replace,
                rt,
                updated,
                namespace=namespace,
                name=updated["metadata"]["name"],
            )
        for slice_ in spare:
            self._write(self.store.remove, rt, namespace, slice_.obj["metadata"]["name"])

    def _owned_slices(self, namespace: str, name: str) -> list[Stored]:
        result = []
        for slice_ in self.store.scan(SLICE_KEY, namespace):
            labels = slice_.obj["metadata"].get("labels") or {}
            if labels.get(SERVICE_NAME) == name and labels.get(MANAGED_BY) == CONTROLLER_NAME:
                result.append(slice_)
        return result

    def _desired(self, service: dict[str, Any]) -> list[tuple[Ports | None, list[Any] | None]]:
        """(ports, endpoints) per slice: grouped by resolved ports, 100 endpoints at most."""
        meta = service["metadata"]
        ident = (meta.get("namespace", ""), meta["name"])
        state = self.memo.get(ident)
        # All pods on the first sync or after the Service changed (selector, ports,
        # publishNotReadyAddresses), else only those changed since.
        members, changed = self.changed_pods(ident, service, state)
        if state is None or state.service is not service:
            state = self.memo[ident] = _Groups(service)
        for name in changed:
            stored = members.get(name)
            if stored is None:
                state.put(name, None)
                del state.entries[name]
            else:
                state.put(name, self._entry(service, stored.obj))
        if not state.groups:
            # A placeholder keeps the Service visible to consumers that watch slices.
            return [(None, None)]
        result: list[tuple[Ports | None, list[Any] | None]] = []
        for key in sorted(state.groups):
            ports, keyed = state.groups[key]
            endpoint_list = [endpoint for _, _, endpoint in keyed]
            for start in range(0, len(endpoint_list), MAX_ENDPOINTS):
                result.append((ports or None, endpoint_list[start : start + MAX_ENDPOINTS]))
        return result

    def _entry(self, service: dict[str, Any], pod: dict[str, Any]) -> _Entry | None:
        """A pod's endpoint (zone filled from its node) with its ports and sort key, or None."""
        spec = service.get("spec") or {}
        publish_not_ready = bool(spec.get("publishNotReadyAddresses"))
        service_ports = spec.get("ports") or []
        if not common.eligible(pod, include_terminating=True):
            return None
        ports: Ports = []
        for service_port in service_ports:
            number = common.resolve_port(pod, service_port)
            if number is None:
                continue
            port: dict[str, Any] = {
                "name": service_port.get("name", ""),
                "port": number,
                "protocol": service_port.get("protocol", "TCP"),
            }
            if service_port.get("appProtocol"):
                port["appProtocol"] = service_port["appProtocol"]
            ports.append(port)
        if service_ports and not ports:
            return None
        terminating = bool(pod["metadata"].get("deletionTimestamp"))
        serving = publish_not_ready or scheduling.pod_ready(pod)
        ip = common.pod_ip(pod)
        endpoint: dict[str, Any] = {
            "addresses": [ip],
            "conditions": {
                "ready": serving and not terminating,
                "serving": serving,
                "terminating": terminating,
            },
        }
        host = common.hostname(pod, service)
        if host:
            endpoint["hostname"] = host
        node_name = (pod.get("spec") or {}).get("nodeName")
        if node_name:
            endpoint["nodeName"] = node_name
            node = self.store.peek(NODE_KEY, "", node_name)
            zone = ((node.obj["metadata"].get("labels") or {}) if node else {}).get(ZONE_LABEL)
            if zone:
                endpoint["zone"] = zone
        endpoint["targetRef"] = common.target_ref(pod)
        return (_ports_key(ports), ports, endpoint, common.ip_sort_key(ip))


def _ports_key(ports: Ports | None) -> str:
    # Called per endpoint: a joined string is much cheaper than JSON.
    if ports and len(ports) > 1:
        ports = sorted(ports, key=lambda p: (p.get("name", ""), p.get("port", 0)))
    return "|".join(
        f"{p.get('name', '')}/{p.get('port', 0)}/{p.get('protocol', '')}/{p.get('appProtocol', '')}"
        for p in ports or ()
    )


def _owner(service: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "name": service["metadata"]["name"],
        "uid": service["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
