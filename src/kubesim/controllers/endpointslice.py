"""EndpointSlice controller: discovery.k8s.io/v1 slices for each selector Service.

Endpoints with the same resolved ports share slices of at most 100 endpoints; a Service that
selects no pods keeps one empty placeholder slice, as upstream. Terminating pods stay in with
`ready: false` and `terminating: true`; `serving` follows pod readiness. Slices carry the
`kubernetes.io/service-name` and `endpointslice.kubernetes.io/managed-by` labels and are owned by
the Service (the garbage collector removes them with it).
"""

from __future__ import annotations

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
# Field order of an endpoint as built (kept when a zone changes).
_ENDPOINT_ORDER = ("addresses", "conditions", "hostname", "nodeName", "zone", "targetRef")


class EndpointSliceController(common.ServiceController):
    """Keys are (namespace, name) of Services; `memo` holds each Service's entries by pod name:
    (pod version, Service version, its entry)."""

    name = "endpointslice-controller"
    resources = (SERVICE_KEY, POD_KEY, SLICE_KEY)
    memo: dict[tuple[str, str], dict[str, tuple[dict[str, Any], dict[str, Any], _Entry | None]]]

    def on_event(self, event: Event) -> None:
        if event.key != SLICE_KEY:
            super().on_event(event)
            return
        labels = event.new.obj["metadata"].get("labels") or {}
        if labels.get(MANAGED_BY) == CONTROLLER_NAME and labels.get(SERVICE_NAME):
            # Mostly our own writes: batched like pod changes, so a big Service is not
            # rebuilt once more after every sync.
            self.enqueue_batched((event.new.obj["metadata"]["namespace"], labels[SERVICE_NAME]))

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
                self.store.remove(rt, namespace, slice_.obj["metadata"]["name"])
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
                self.store.insert(
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
            self.store.replace(rt, updated, namespace=namespace, name=updated["metadata"]["name"])
        for slice_ in spare:
            self.store.remove(rt, namespace, slice_.obj["metadata"]["name"])

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
        # Entries are remembered per pod version (and Service version): a sync after a few pod
        # changes rebuilds only theirs, not all of a big Service's endpoints.
        previous = self.memo.get(ident, {})
        entries: dict[str, tuple[dict[str, Any], dict[str, Any], _Entry | None]] = {}
        groups: dict[str, tuple[Ports, list[tuple[tuple[int, ...], dict[str, Any]]]]] = {}
        for pod in self.selected.pods(service):
            name = pod["metadata"]["name"]
            cached = previous.get(name)
            if cached is not None and cached[0] is pod and cached[1] is service:
                entry = cached[2]
            else:
                entry = self._entry(service, pod)
            entries[name] = (pod, service, entry)
            if entry is None:
                continue
            key, ports, endpoint, order = entry
            node_name = endpoint.get("nodeName")
            if node_name:
                node = self.store.peek(NODE_KEY, "", node_name)
                zone = ((node.obj["metadata"].get("labels") or {}) if node else {}).get(ZONE_LABEL)
                if zone != endpoint.get("zone"):
                    endpoint = {k: v for k, v in endpoint.items() if k != "zone"}
                    if zone:
                        endpoint["zone"] = zone
                    endpoint = {k: endpoint[k] for k in _ENDPOINT_ORDER if k in endpoint}
                    entries[name] = (pod, service, (key, ports, endpoint, order))
            groups.setdefault(key, (ports, []))[1].append((order, endpoint))
        self.memo[ident] = entries
        if not groups:
            # A placeholder keeps the Service visible to consumers that watch slices.
            return [(None, None)]
        result: list[tuple[Ports | None, list[Any] | None]] = []
        for key in sorted(groups):
            ports, keyed = groups[key]
            keyed.sort(key=lambda item: item[0])
            endpoint_list = [endpoint for _, endpoint in keyed]
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
